//! A server's receives grow on its client's demand, end to end over the software transport,
//! seen from a client that speaks frames by hand: calls one at a time never make the server
//! post a receive more; a frame that says its sender waited for a credit (`starved`) doubles
//! the server's receives, up to `recv_credits`, and their credits come back at once.

use bytes::Bytes;

use super::e2e::req;
use super::raw::RawClient;
use super::{bounded, tcp_backend, Harness};
use crate::protocol::frames::{Frame, Kind, RequestFrame};
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
        let frame = Frame {
            kind: Some(kind),
            credits: std::mem::take(&mut self.owed),
            starved,
        };
        self.raw.send(&prost::Message::encode_to_vec(&frame)).await;
    }

    async fn next(&mut self) -> Frame {
        loop {
            let (kind, payload) = bounded("a frame from the server", self.raw.next())
                .await
                .expect("the server closed the connection");
            if kind == SEND {
                self.owed += 1;
                return prost::Message::decode(&payload[..]).expect("a frame");
            }
        }
    }

    /// Makes call `id` (an empty send), the request saying whether this side was `starved`:
    /// the credits the server returned until the call's response.
    async fn call(&mut self, id: u64, starved: bool) -> u32 {
        let request = RequestFrame {
            id,
            path: Bytes::from_static(b"/msg"),
            op: OpKind::Send.as_u32(),
            metadata: Bytes::from(prost::Message::encode_to_vec(&req(0, 7))),
            ..Default::default()
        };
        self.send(Kind::Request(request), starved).await;
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
