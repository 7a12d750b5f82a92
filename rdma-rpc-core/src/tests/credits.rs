//! A server's receives grow on its client's demand, end to end over the software transport,
//! seen from a client that speaks frames by hand: calls one at a time never make the server
//! post a receive more; a frame that says its sender waited for a credit (`starved`) doubles
//! the server's receives, up to `recv_credits`, and their credits come back at once. And a
//! server that shuts down short of credits waits for them only so long: a client that never
//! returns any holds the connection for `LAST_WORDS` at most.

use bytes::Bytes;

use super::e2e::req;
use super::raw::RawClient;
use super::service::TestRequest;
use super::{bounded, tcp_backend, Harness};
use crate::protocol::codec::{frame_bytes, Decoder};
use crate::protocol::frames::{Frame, Hello, Kind, RequestFrame};
use crate::protocol::INITIAL_RECEIVES;
use crate::server::ServerConfig;
use crate::service::OpKind;
use crate::transport::tcp::raw_peer::{RawPeer, SEND};

/// A client speaking frames by hand, returning the server's credits as it reads its frames.
struct Peer {
    raw: RawPeer,
    /// Frames of the server received since this side last sent (each took a receive here,
    /// which this side gives back with its next frame).
    owed: u32,
}

impl Peer {
    async fn send(&mut self, kind: Kind, starved: bool) {
        let frame = frame_bytes(Some(&kind), std::mem::take(&mut self.owed), starved);
        self.raw.send(&frame).await;
    }

    async fn next(&mut self) -> Frame {
        loop {
            let (kind, payload) = bounded("a frame from the server", self.raw.next())
                .await
                .expect("the server closed the connection");
            if kind == SEND {
                self.owed += 1;
                return Decoder::default().decode(&payload).expect("a frame");
            }
        }
    }

    /// Makes call `id` (an empty send), the request saying whether this side was `starved`:
    /// the credits the server returned until the call's response.
    async fn call(&mut self, id: u64, starved: bool) -> u32 {
        self.send(Kind::Request(msg(id, false)), starved).await;
        let mut credits = 0;
        loop {
            let frame = self.next().await;
            credits += frame.credits;
            match frame.kind {
                Some(Kind::Response(r)) if r.id == id => return credits,
                None => {} // a credit update
                other => panic!("call {id}: unexpected {other:?}"),
            }
        }
    }
}

/// Call `id` of `/msg` (an empty send), whose handler waits for the service's gate if `gated`.
fn msg(id: u64, gated: bool) -> RequestFrame {
    let request = TestRequest { gated, ..req(0, 7) };
    RequestFrame {
        id,
        path: Bytes::from_static(b"/msg"),
        op: OpKind::Send.as_u32(),
        metadata: Bytes::from(prost::Message::encode_to_vec(&request)),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_servers_receives_grow_only_when_its_client_says_it_waited_for_a_credit() {
    let config = ServerConfig::default();
    let ceiling = config.recv_credits;
    let h = Harness::start_on(&tcp_backend(), config).await;
    let mut peer = Peer {
        raw: RawPeer::connect(&h.addr).await,
        owed: 0,
    };
    peer.send(Kind::Hello(RawClient::hello()), false).await;
    let Some(Kind::HelloAck(ack)) = peer.next().await.kind else {
        panic!("no HelloAck");
    };
    assert_eq!(ack.credits, INITIAL_RECEIVES);
    // One call at a time: each response gives back the one receive its request used.
    for id in 1..=50 {
        assert_eq!(peer.call(id, false).await, 1, "call {id}: no receive added");
    }
    // Each starved request doubles the server's receives (their credits come with the
    // request's own), until the ceiling.
    let mut posted = INITIAL_RECEIVES;
    let mut id = 100;
    while posted < ceiling {
        let added = posted.min(ceiling - posted);
        assert_eq!(
            peer.call(id, true).await,
            1 + added,
            "{posted} receives posted"
        );
        posted += added;
        id += 1;
    }
    assert_eq!(peer.call(id, true).await, 1, "never beyond recv_credits");
    assert_eq!(peer.call(id + 1, false).await, 1);
}

/// The server shuts down with an answer queued behind credits its client never returns: the
/// connection still closes (after `LAST_WORDS`), without the answer, and the server's shutdown
/// returns. The grace for calls is far longer than the test's bound, so only the drain's own
/// limit can end the connection.
#[tokio::test]
async fn a_client_that_returns_no_credits_holds_a_shutting_down_server_only_briefly() {
    let config = ServerConfig {
        shutdown_grace: std::time::Duration::from_secs(3600),
        ..ServerConfig::default()
    };
    let mut h = Harness::start_on(&tcp_backend(), config).await;
    let mut peer = Peer {
        raw: RawPeer::connect(&h.addr).await,
        owed: 0,
    };
    let hello = Hello {
        credits: 4,
        max_credits: 4,
        ..RawClient::hello()
    };
    peer.send(Kind::Hello(hello), false).await;
    let Some(Kind::HelloAck(_)) = peer.next().await.kind else {
        panic!("no HelloAck");
    };
    // From here on this side returns no credit: the server's four are spent on the HelloAck,
    // two answers, and its last one is kept for a goaway or a credit update.
    for id in 1..=2 {
        peer.owed = 0;
        peer.send(Kind::Request(msg(id, false)), false).await;
        loop {
            match peer.next().await.kind {
                Some(Kind::Response(r)) if r.id == id => break,
                None => {} // a credit update
                other => panic!("call {id}: unexpected {other:?}"),
            }
        }
    }
    peer.owed = 0;
    peer.send(Kind::Request(msg(3, true)), false).await;
    h.service.entered(3).await;
    h.shutdown();
    h.service.open_gate();
    // Whatever still comes (a credit update, with the last credit), the answer to call 3 has no
    // credit to go with; the connection ends all the same.
    loop {
        match bounded("the end of the connection", peer.raw.next()).await {
            None => break,
            Some((kind, payload)) if kind == SEND => {
                let frame = Decoder::default().decode(&payload).expect("a frame");
                assert!(
                    !matches!(frame.kind, Some(Kind::Response(_))),
                    "an answer went without a credit: {frame:?}"
                );
            }
            Some(_) => {}
        }
    }
    let served = bounded("the server's shutdown", &mut h.task).await;
    served
        .expect("the server task")
        .expect("a graceful shutdown");
}
