//! Hostile peers: clients that speak the protocol but lie. Each test is a case of the hostile
//! peer review (issue 10): it failed before the fix it names and passes now, and the server
//! keeps serving everyone else.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::e2e::{inbound, req, BLOB_WRITE};
use super::raw::RawClient;
use super::{bounded, tcp_backend, Backend, Harness};
use crate::protocol::frames::{Hello, Kind, RequestFrame};
use crate::service::OpKind;
use crate::{Access, Code, ServerConfig};

pub(super) async fn still_serving(h: &Harness) {
    let client = h.client().await;
    assert!(
        inbound(&client, BLOB_WRITE, 100_000, 9)
            .await
            .unwrap()
            .exact
    );
}

/// A request that offers a pull window to a server whose handshake said it does not pull is
/// refused with a status: the server never reads the window (before: it read it, with no
/// deadline, holding a pool buffer on the client's behalf).
pub(crate) async fn pull_windows_are_refused_when_pull_is_off_on(b: &Backend) {
    let config = ServerConfig {
        pull_writes: Some(false),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let raw = RawClient::connect(&h).await;
    assert!(!raw.ack.pull_writes);
    let len = 100_000usize;
    let buf = crate::RegisteredBuf::new(len, Access::ALL).unwrap();
    let window = raw.conn().grant(buf, 0, len, Access::REMOTE_READ).unwrap();
    raw.send_request(RequestFrame {
        id: 1,
        path: "/blob".into(),
        op: OpKind::Write.as_u32(),
        metadata: Bytes::from(prost::Message::encode_to_vec(&req(len, 7))),
        payload_len: len as u64,
        source: Some(window.descriptor().into()),
        ..Default::default()
    })
    .await;
    match raw.next().await {
        Kind::Response(r) => {
            let status = r.status.expect("refused");
            assert_eq!(Code::from_u32(status.code), Code::InvalidArgument);
            assert!(
                status.message.contains("does not pull"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a response, got {other:?}"),
    }
    assert_eq!(h.service.inbound_runs.load(Ordering::SeqCst), 0);
    still_serving(&h).await;
}

#[tokio::test]
async fn pull_windows_are_refused_when_pull_is_off() {
    pull_windows_are_refused_when_pull_is_off_on(&tcp_backend()).await;
}

/// A Hello that announces no receives (`credits: 0`) ends the connection at once (before:
/// the server waited forever for a credit to send its HelloAck, past the handshake timeout).
pub(crate) async fn a_hello_without_credits_is_refused_on(b: &Backend) {
    let config = ServerConfig {
        handshake_timeout: std::time::Duration::from_secs(3600),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let channel = RawClient::open(&h).await;
    channel
        .send_priority(Kind::Hello(Hello {
            credits: 0,
            ..RawClient::hello()
        }))
        .await
        .unwrap();
    let err = bounded("a Hello without credits", channel.conn().closed()).await;
    assert!(err.is_connection_fatal(), "{err}");
    still_serving(&h).await;
}

#[tokio::test]
async fn a_hello_without_credits_is_refused() {
    a_hello_without_credits_is_refused_on(&tcp_backend()).await;
}

/// A peer is believed only up to `MAX_PEER_CREDITS` receives, whatever its handshake
/// announces or its frames return: a side never has more frames in flight towards a peer
/// than that (before: a Hello with 2^31 credits let the server queue responses without bound
/// to a client that never reads).
#[tokio::test]
async fn announced_and_returned_credits_are_bounded() {
    use crate::protocol::channel::FrameChannel;
    use crate::protocol::frames::Frame;
    use crate::protocol::MAX_PEER_CREDITS;
    use crate::transport::SendData;
    let (a, b) =
        crate::transport::conformance::pair_on(super::tcp().as_ref(), "tcp://127.0.0.1:0").await;
    let a = FrameChannel::new(a, 4, 16 * 1024, false).unwrap();
    a.set_peer(1 << 31, 1 << 31, 16 * 1024);
    assert_eq!(a.available_credits(), MAX_PEER_CREDITS);
    // The peer returns far more credits than it has receives: ignored past the cap.
    let lie = Frame {
        kind: None,
        credits: 1 << 30,
        starved: false,
    };
    b.send(
        SendData::Bytes(Bytes::from(prost::Message::encode_to_vec(&lie))),
        None,
    )
    .await
    .unwrap();
    bounded("a credit update", a.recv()).await.unwrap();
    // (One credit may have gone into announcing the receive that frame used.)
    assert!(
        a.available_credits() <= MAX_PEER_CREDITS,
        "{}",
        a.available_credits()
    );
}

/// The connection count is exact: right after clients leave, the next one is admitted
/// (before: finished connections were counted until the accept loop reaped them, so the
/// first client after a flood was refused).
pub(crate) async fn the_count_is_exact_when_clients_leave_on(b: &Backend) {
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let mut h = Harness::start_on(b, config).await;
    let first = h.client().await;
    let second = h.client().await;
    assert_eq!(
        bounded("two connections", h.count.wait_for(|n| n == 2)).await,
        Some(2)
    );
    drop((first, second));
    assert_eq!(
        bounded("none left", h.count.wait_for(|n| n == 0)).await,
        Some(0)
    );
    still_serving(&h).await;
}

#[tokio::test]
async fn the_count_is_exact_when_clients_leave() {
    the_count_is_exact_when_clients_leave_on(&tcp_backend()).await;
}

/// One peer address may hold `max_connections_per_peer` connections; the next is refused
/// with the limit named, and the others keep working (before: one peer could take every
/// connection slot).
pub(crate) async fn one_peer_cannot_take_every_connection_on(b: &Backend) {
    let config = ServerConfig {
        max_connections_per_peer: 2,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let first = h.client().await;
    let _second = h.client().await;
    let err = h.refused().await;
    assert!(
        err.to_string().contains("max_connections_per_peer = 2"),
        "{err}"
    );
    assert!(inbound(&first, BLOB_WRITE, 10_000, 2).await.unwrap().exact);
}

#[tokio::test]
async fn one_peer_cannot_take_every_connection() {
    one_peer_cannot_take_every_connection_on(&tcp_backend()).await;
}

/// With `idle_timeout`, a handshaken connection that sends nothing is told why and closed,
/// and the server keeps serving (before: idle sockets held their slots forever).
pub(crate) async fn idle_connections_are_closed_on(b: &Backend) {
    let config = ServerConfig {
        idle_timeout: Some(std::time::Duration::from_millis(200)),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let raw = RawClient::connect(&h).await;
    match bounded("an idle connection's goaway", raw.next()).await {
        Kind::Goaway(status) => {
            assert_eq!(Code::from_u32(status.code), Code::Unavailable);
            assert!(
                status.message.contains("idle_timeout"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a goaway, got {other:?}"),
    }
    let err = bounded("the idle connection closed", raw.conn().closed()).await;
    assert!(err.is_connection_fatal(), "{err}");
    still_serving(&h).await;
}

#[tokio::test]
async fn idle_connections_are_closed() {
    idle_connections_are_closed_on(&tcp_backend()).await;
}

/// Grant mode: a client that takes a window, writes nothing and acks gets zeros in its
/// handler, never the bytes an earlier call of another client left in the pool buffer
/// (before: the handler was handed the earlier client's payload, which a read echoed back).
pub(crate) async fn an_unwritten_grant_discloses_nothing_on(b: &Backend) {
    let config = ServerConfig {
        pull_writes: Some(false),
        min_buffers: 1,
        max_buffers: 1,
        write_slots: 0,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let len = 200_000usize;
    // Another client's secret goes through the path's only buffer.
    let victim = h.client().await;
    assert!(inbound(&victim, BLOB_WRITE, len, 3).await.unwrap().exact);
    let thief = RawClient::connect(&h).await;
    let mut keep = req(len, 3);
    keep.keep = true;
    thief
        .send_request(RequestFrame {
            id: 1,
            path: "/blob".into(),
            op: OpKind::Write.as_u32(),
            metadata: Bytes::from(prost::Message::encode_to_vec(&keep)),
            payload_len: len as u64,
            ..Default::default()
        })
        .await;
    let _window = thief.grant().await;
    thief.ack(1).await; // without writing a byte
    match thief.next().await {
        Kind::Response(r) => assert!(r.status.is_none(), "{:?}", r.status),
        other => panic!("expected a response, got {other:?}"),
    }
    let kept = h.service.kept.lock().unwrap().clone();
    assert_eq!(kept.len(), 1);
    assert!(
        kept[0].iter().all(|&b| b == 0),
        "the handler saw another client's bytes"
    );
    // The kept bytes hold the path's only buffer: give it back.
    h.service.kept.lock().unwrap().clear();
    drop(kept);
    still_serving(&h).await;
}

#[tokio::test]
async fn an_unwritten_grant_discloses_nothing() {
    an_unwritten_grant_discloses_nothing_on(&tcp_backend()).await;
}

/// A call that finds its path's pool empty waits at most `buffer_wait`, then fails with
/// `RESOURCE_EXHAUSTED` naming the path, whether or not it has a deadline (before: a call
/// without a deadline waited forever behind a handler that held the only buffer).
pub(crate) async fn waiting_for_a_buffer_is_bounded_on(b: &Backend) {
    let config = ServerConfig {
        min_buffers: 1,
        max_buffers: 1,
        write_slots: 0,
        buffer_wait: std::time::Duration::from_millis(100),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let client = h.client().await;
    // A held call keeps the path's only buffer in its handler.
    let held = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut r = req(100_000, 4);
            r.gated = true;
            crate::codegen::call_inbound::<_, super::service::TestResponse>(
                &client,
                &super::service::ENDPOINTS[BLOB_WRITE],
                crate::Request::new(r),
                Bytes::from(super::pattern(100_000, 4)),
            )
            .await
        })
    };
    h.service.entered(1).await;
    let err = bounded(
        "a call behind a held buffer",
        inbound(&client, BLOB_WRITE, 100_000, 5),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(
        err.message().contains("/blob") && err.message().contains("buffer_wait"),
        "{err}"
    );
    h.service.open_gate();
    assert!(held.await.unwrap().unwrap().exact);
    still_serving(&h).await;
}

#[tokio::test]
async fn waiting_for_a_buffer_is_bounded() {
    waiting_for_a_buffer_is_bounded_on(&tcp_backend()).await;
}

/// One connection holds at most its share of a path's pool (`pool_share_percent`, half by
/// default): a client that takes grants and never finishes them gets `RESOURCE_EXHAUSTED`
/// past its share, and other clients are still served (before: it could hold the whole pool
/// until `transfer_timeout`, again and again).
pub(crate) async fn one_connection_cannot_hold_a_whole_pool_on(b: &Backend) {
    let config = ServerConfig {
        pull_writes: Some(false),
        min_buffers: 4,
        max_buffers: 4,
        write_slots: 0,
        buffer_wait: std::time::Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let hog = RawClient::connect(&h).await;
    for id in 1..=4 {
        hog.request(id, "/blob", OpKind::Write, 100_000).await;
    }
    let (mut grants, mut refused) = (0, 0);
    while grants + refused < 4 {
        match bounded("the hog's answers", hog.next()).await {
            Kind::Grant(_) => grants += 1,
            Kind::Response(r) => {
                let status = r.status.expect("an error");
                assert_eq!(
                    Code::from_u32(status.code),
                    Code::ResourceExhausted,
                    "{status:?}"
                );
                assert!(status.message.contains("pool_share_percent"), "{status:?}");
                assert!(status.message.contains("2 of the 4"), "{status:?}");
                refused += 1;
            }
            other => panic!("expected a grant or a response, got {other:?}"),
        }
    }
    assert_eq!((grants, refused), (2, 2));
    // The hog still holds two buffers (it never acks): everyone else has the other two.
    bounded("another client's call", still_serving(&h)).await;
    let other = h.client().await;
    let (a, b2) = tokio::join!(
        inbound(&other, BLOB_WRITE, 100_000, 1),
        inbound(&other, BLOB_WRITE, 100_000, 2)
    );
    assert!(a.unwrap().exact && b2.unwrap().exact);
}

#[tokio::test]
async fn one_connection_cannot_hold_a_whole_pool() {
    one_connection_cannot_hold_a_whole_pool_on(&tcp_backend()).await;
}

/// The share is a percentage: 0 and more than 100 are refused when the server binds.
#[tokio::test]
async fn a_pool_share_outside_one_to_a_hundred_percent_is_refused() {
    for percent in [0, 101] {
        let err = crate::Server::builder()
            .pool_share_percent(percent)
            .add_service(super::TestService::default())
            .bind("tcp://127.0.0.1:0")
            .await
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool_share_percent"), "{err}");
    }
}

/// A wire-level peer of a one-buffer server with `transfer_timeout` of 200 ms: it says
/// Hello, then sends a 100,000-byte call of `op` on `/blob` whose window (rights `access`)
/// does not exist on its side; `window` puts it in the request.
async fn peer_with_a_dead_window(
    op: OpKind,
    access: Access,
    window: fn(&mut RequestFrame, crate::protocol::frames::DescriptorFrame),
    pull_writes: Option<bool>,
) -> (Harness, crate::transport::tcp::raw_peer::RawPeer) {
    use crate::protocol::frames::{DescriptorFrame, Frame};
    let config = ServerConfig {
        pull_writes,
        min_buffers: 1,
        max_buffers: 1,
        write_slots: 0,
        transfer_timeout: std::time::Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let h = Harness::start(super::tcp(), config).await;
    let mut peer = crate::transport::tcp::raw_peer::RawPeer::connect(&h.addr).await;
    let frame = |kind| {
        prost::Message::encode_to_vec(&Frame {
            kind: Some(kind),
            credits: 0,
            starved: false,
        })
    };
    peer.send(&frame(Kind::Hello(RawClient::hello()))).await;
    let len = 100_000u64;
    let mut request = RequestFrame {
        id: 1,
        path: "/blob".into(),
        op: op.as_u32(),
        metadata: Bytes::from(prost::Message::encode_to_vec(&req(len as usize, 1))),
        ..Default::default()
    };
    let dead = DescriptorFrame {
        addr: 0x10000,
        len,
        rkey: 7,
        access: access.bits(),
        blob: Bytes::new(),
    };
    window(&mut request, dead);
    peer.send(&frame(Kind::Request(request))).await;
    (h, peer)
}

/// Reads whatever the server still sends until it closes the connection.
pub(super) async fn closed_by_the_server(peer: &mut crate::transport::tcp::raw_peer::RawPeer) {
    while bounded("the server closes the connection", peer.next())
        .await
        .is_some()
    {}
}

/// A pull-mode write whose window the peer offers and never serves: returns once the server
/// has asked for the window's bytes (a read that will never be answered).
async fn pull_the_peer_never_answers() -> (Harness, crate::transport::tcp::raw_peer::RawPeer) {
    use crate::transport::tcp::raw_peer::READ_REQUEST;
    let (h, mut peer) = peer_with_a_dead_window(
        OpKind::Write,
        Access::REMOTE_READ,
        |r, w| {
            r.payload_len = w.len;
            r.source = Some(Box::new(w));
        },
        Some(true),
    )
    .await;
    loop {
        match bounded("the server's read", peer.next()).await {
            Some((kind, _)) if kind == READ_REQUEST => return (h, peer),
            Some(_) => continue,
            None => panic!("closed before reading the window"),
        }
    }
}

/// Pull mode: a client that offers a window and never answers the server's read of it loses
/// its connection after `transfer_timeout`, and the pool buffer the read held comes back
/// (before: the read had no deadline, and a few such requests pinned every buffer of a path).
#[tokio::test]
async fn an_unanswered_pull_frees_its_buffer() {
    let (h, mut peer) = pull_the_peer_never_answers().await;
    closed_by_the_server(&mut peer).await;
    assert_eq!(h.service.inbound_runs.load(Ordering::SeqCst), 0);
    still_serving(&h).await;
}

/// The same, when the client also cancels the call while the server reads: the stopped call's
/// read is watched on, and the connection still goes at `transfer_timeout` (dropping the call
/// must not leave the read, and the pool buffer it holds, without a bound).
#[tokio::test]
async fn an_unanswered_pull_of_a_cancelled_call_frees_its_buffer() {
    use crate::protocol::frames::{CallId, Frame};
    let (h, mut peer) = pull_the_peer_never_answers().await;
    let cancel = Frame {
        kind: Some(Kind::Cancel(CallId { id: 1 })),
        credits: 0,
        starved: false,
    };
    peer.send(&prost::Message::encode_to_vec(&cancel)).await;
    closed_by_the_server(&mut peer).await;
    assert_eq!(h.service.inbound_runs.load(Ordering::SeqCst), 0);
    still_serving(&h).await;
}

/// A pushed result is posted ahead of its response (`Connection::write_posted`): over TCP it
/// needs no acknowledgement, so a client that acknowledges nothing still gets its bytes and its
/// response, keeps its connection, and the pool buffer the push held comes back once the bytes
/// are written (before: once the client's ACK came, or after `transfer_timeout` closed the
/// connection of a client that sent none).
#[tokio::test]
async fn a_push_needs_no_acknowledgement_and_frees_its_buffer_once_written() {
    use crate::protocol::codec::Decoder;
    use crate::transport::tcp::raw_peer::{SEND, WRITE};
    let (h, mut peer) = peer_with_a_dead_window(
        OpKind::Read,
        Access::REMOTE_WRITE,
        |r, w| r.reply_to = Some(Box::new(w)),
        None,
    )
    .await;
    let mut written = 0;
    let response = bounded("the pushed bytes, then the response", async {
        let mut decoder = Decoder::default();
        loop {
            let p = peer.next_packet().await.expect("the connection stays open");
            if p.kind == WRITE {
                assert!(p.unsignaled, "the push asks for an acknowledgement");
                written += p.payload.len();
            } else if p.kind == SEND {
                if let Some(Kind::Response(r)) = decoder.decode(&p.payload).unwrap().kind {
                    return r;
                }
            }
        }
    })
    .await;
    assert_eq!((written, response.pushed_len), (100_000, 100_000));
    assert_eq!(response.status.map_or(0, |s| s.code), 0, "OK");
    bounded("the pool buffer back", async {
        while h.handle.pools().iter().any(|p| p.in_use > 0) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(h.service.outbound_runs.load(Ordering::SeqCst), 1);
    still_serving(&h).await;
}

/// A peer that revokes offers it never made, more of them than a connection remembers, and
/// confirms revocations nobody asked for: each `Revoke` is answered, the confirmations are
/// ignored, and the server serves on (what it remembers is bounded: `protocol::handles`).
pub(crate) async fn stray_revocations_are_answered_and_bounded_on(b: &Backend) {
    use crate::protocol::frames::Offers;
    use crate::protocol::handles::REMEMBERED_REVOCATIONS;
    let h = Harness::default_on(b).await;
    let raw = RawClient::connect(&h).await;
    let n = REMEMBERED_REVOCATIONS as u64 + 500;
    let mut answered = Vec::new();
    // In batches of 100 (a raw peer reads what arrives while it waits for a credit).
    for first in (1..=n).step_by(100) {
        let offers: Vec<u64> = (first..(first + 100).min(n + 1)).collect();
        let stray = offers.iter().map(|o| o * 7).collect();
        raw.send(Kind::Revoke(Offers { offers })).await;
        raw.send(Kind::Revoked(Offers { offers: stray })).await;
    }
    while (answered.len() as u64) < n {
        match bounded("the answers to the revocations", raw.next()).await {
            Kind::Revoked(r) => answered.extend(r.offers),
            other => panic!("expected Revoked, got {other:?}"),
        }
    }
    answered.sort_unstable();
    assert!(
        answered.iter().copied().eq(1..=n),
        "each revocation answered once"
    );
    still_serving(&h).await;
}

#[tokio::test]
async fn stray_revocations_are_answered_and_bounded() {
    stray_revocations_are_answered_and_bounded_on(&tcp_backend()).await;
}

/// Handlers that keep their payloads hold the path's pool buffers after they return: a call
/// then fails at once with `RESOURCE_EXHAUSTED` saying so, instead of waiting `buffer_wait`
/// (an hour here) for a buffer nothing will give back; once the handlers let go, calls go
/// through again.
pub(crate) async fn buffers_kept_by_handlers_fail_calls_at_once_on(b: &Backend) {
    let config = ServerConfig {
        min_buffers: 2,
        max_buffers: 2,
        write_slots: 0,
        buffer_wait: std::time::Duration::from_secs(3600),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let client = h.client().await;
    let len = 100_000;
    for seed in 0..2 {
        let mut keep = req(len, seed);
        keep.keep = true;
        let done = crate::codegen::call_inbound::<_, super::service::TestResponse>(
            &client,
            &super::service::ENDPOINTS[BLOB_WRITE],
            crate::Request::new(keep),
            Bytes::from(super::pattern(len, seed)),
        );
        assert!(done.await.unwrap().exact);
    }
    let err = bounded(
        "a call behind kept buffers",
        inbound(&client, BLOB_WRITE, len, 7),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(
        err.message().contains("kept by handlers") && err.message().contains("/blob"),
        "{err}"
    );
    h.service.kept.lock().unwrap().clear();
    assert!(inbound(&client, BLOB_WRITE, len, 8).await.unwrap().exact);
}

#[tokio::test]
async fn buffers_kept_by_handlers_fail_calls_at_once() {
    buffers_kept_by_handlers_fail_calls_at_once_on(&tcp_backend()).await;
}
