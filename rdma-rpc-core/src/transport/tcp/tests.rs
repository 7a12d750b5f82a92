use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{TcpConfig, TcpConnection, TcpTransport};
use crate::error::{AccessViolation, Error};
use crate::memory::{Access, RegisteredBuf};
use crate::tests::bounded;
use crate::transport::conformance::{self, recv_buf};
use crate::transport::{Connection, SendData, Transport};

fn transport() -> TcpTransport {
    TcpTransport::with_config(TcpConfig {
        rnr_timeout: Duration::from_millis(50),
        ..TcpConfig::default()
    })
}

async fn pair() -> (Arc<dyn Connection>, Arc<dyn Connection>) {
    conformance::pair_on(&transport(), "tcp://127.0.0.1:0").await
}

/// A connection of `t` as this transport's own type (for what only tests see of it), and the
/// other end, accepted.
async fn connected_pair(t: &TcpTransport) -> (Arc<TcpConnection>, Arc<dyn Connection>) {
    let listener = t.listen("tcp://127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let (connected, accepted) = tokio::join!(t.connect_tcp(&addr), listener.accept());
    (connected.unwrap(), accepted.unwrap())
}

#[tokio::test]
async fn writes_land_before_later_sends() {
    let (a, b) = pair().await;
    conformance::writes_land_before_later_sends(&a, &b).await;
}

#[tokio::test]
async fn polls_that_find_nothing_keep_the_reader_registered() {
    let (a, b) = pair().await;
    conformance::polls_that_find_nothing_keep_the_reader_registered(&a, &b).await;
}

#[tokio::test]
async fn send_lands_in_posted_receive_with_immediate() {
    let (a, b) = pair().await;
    conformance::send_with_immediate(&a, &b).await;
}

#[tokio::test]
async fn send_without_posted_receive_fails_receiver_not_ready() {
    let (a, b) = pair().await;
    let err = a
        .send(SendData::Bytes(Bytes::from_static(b"x")), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReceiverNotReady { .. }), "{err}");
    // The connection is in error on both sides now.
    let later = a
        .send(SendData::Bytes(Bytes::new()), None)
        .await
        .unwrap_err();
    assert!(later.is_connection_fatal(), "{later}");
    assert!(b.recv().await.is_err());
}

/// A send that finds no posted receive waits, within the RNR budget, for the receive posted
/// late. The budget is one no test reaches: the receive is posted once the send is seen
/// waiting for it, never after a guess at how long that takes.
#[tokio::test]
async fn send_waits_for_a_late_receive_within_the_rnr_budget() {
    let t = TcpTransport::with_config(TcpConfig {
        rnr_timeout: Duration::from_secs(3600),
        ..TcpConfig::default()
    });
    let (b, a) = connected_pair(&t).await;
    let send = a.send(SendData::Bytes(Bytes::from_static(b"late")), None);
    bounded("the send waits for a receive", async {
        while b.rnr_waits() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    b.post_recv(recv_buf(16)).unwrap();
    send.await.unwrap();
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"late");
}

/// The writer lets the tasks that became ready after it run before it writes: a packet one of
/// them queues leaves with the packet that woke the writer, in one write. The test runs on one
/// thread, where the runtime runs ready tasks in the order they were woken: the writer (woken
/// by the first send) comes before the task the first send's caller wakes next.
#[tokio::test]
async fn packets_queued_by_tasks_woken_after_the_writer_leave_in_its_write() {
    let (a, b) = connected_pair(&transport()).await;
    for _ in 0..2 {
        b.post_recv(recv_buf(16)).unwrap();
    }
    let go = Arc::new(tokio::sync::Notify::new());
    let (waiting, waits) = tokio::sync::oneshot::channel();
    let second = tokio::spawn({
        let (a, go) = (a.clone(), go.clone());
        async move {
            let mut woken = std::pin::pin!(go.notified());
            woken.as_mut().enable();
            waiting.send(()).unwrap();
            woken.await;
            a.send_unsignaled(SendData::Bytes(Bytes::from_static(b"second")), None)
        }
    });
    waits.await.unwrap();
    let before = a.writes();
    a.send_unsignaled(SendData::Bytes(Bytes::from_static(b"first")), None)
        .unwrap();
    go.notify_one();
    second.await.unwrap().unwrap();
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"first");
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"second");
    assert_eq!(a.writes() - before, 1, "both packets in one write");
}

/// A posted write asks the peer for no acknowledgement: the peer's reader lands it and sends
/// nothing back (a plain write is acknowledged), and a send after it finds the bytes there.
#[tokio::test]
async fn a_posted_write_lands_unacknowledged_before_the_next_send() {
    let (peer, ours) = connected_pair(&transport()).await;
    for posted in [false, true] {
        let len = 4096;
        let data = conformance::pattern(len, u8::from(posted));
        let target = RegisteredBuf::new(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        let grant = peer.grant(target, 0, len, Access::REMOTE_WRITE).unwrap();
        peer.post_recv(recv_buf(16)).unwrap();
        let acks = peer.acks();
        let src = SendData::Bytes(Bytes::from(data.clone()));
        if posted {
            ours.write_posted(src, grant.descriptor()).await.unwrap();
        } else {
            ours.write(src, grant.descriptor(), None).await.unwrap();
        }
        ours.send_unsignaled(SendData::Bytes(Bytes::from_static(b"after")), None)
            .unwrap();
        assert_eq!(peer.recv().await.unwrap().buf.as_slice(), b"after");
        // The reader queues an ACK before it reads the next packet: all are counted by now.
        assert_eq!(peer.acks() - acks, usize::from(!posted), "posted: {posted}");
        let mut landed = grant.revoke().await.unwrap();
        landed.set_len(len);
        assert!(landed.as_slice() == data, "posted: {posted}");
    }
}

/// A posted write the peer refuses (its window was revoked) fails the connection on both
/// sides with the refusal, and what was sent after it never arrives.
#[tokio::test]
async fn a_posted_write_the_peer_refuses_fails_the_connection() {
    let (a, b) = pair().await;
    let target = RegisteredBuf::new(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let grant = b.grant(target, 0, 64, Access::REMOTE_WRITE).unwrap();
    let stale = grant.descriptor().clone();
    grant.revoke().await.unwrap();
    b.post_recv(recv_buf(16)).unwrap();
    // Posted (or refused already, if the peer was quicker): nothing is reported here.
    let _ = a
        .write_posted(SendData::Bytes(Bytes::from(vec![1; 64])), &stale)
        .await;
    expect_violation(
        a.send(SendData::Bytes(Bytes::from_static(b"after")), None),
        AccessViolation::UnknownKey,
    )
    .await;
    assert!(b.recv().await.is_err(), "the send after it arrived");
}

#[tokio::test]
async fn message_larger_than_the_posted_receive_fails_the_connection() {
    let (a, b) = pair().await;
    b.post_recv(recv_buf(4)).unwrap();
    let err = a
        .send(SendData::Bytes(Bytes::from_static(b"too long")), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ReceiveTooSmall {
                len: 8,
                capacity: 4
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn write_and_read_move_bytes_exactly_with_no_peer_code() {
    let (a, b) = pair().await;
    conformance::write_and_read_exact(&a, &b, |d| assert!(d.blob.is_empty())).await;
}

#[tokio::test]
async fn write_with_immediate_completes_a_receive() {
    let (a, b) = pair().await;
    let (c, _) = conformance::write_with_immediate(&a, &b).await;
    assert_eq!(c.write_len, 5);
}

#[tokio::test]
async fn atomics_compare_and_swap_and_fetch_and_add() {
    let (a, b) = pair().await;
    conformance::atomics(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sided_operations_on_region_leases_land_in_place() {
    let (a, b) = pair().await;
    conformance::region_leases_in_place(&a, &b).await;
}

#[tokio::test]
async fn fenced_grants_reach_their_window_only_and_end_at_revocation() {
    conformance::fenced_grants_cut_the_peer_off(pair).await;
}

async fn expect_violation(
    fut: crate::transport::BoxFuture<'static, crate::Result<impl Sized>>,
    want: AccessViolation,
) {
    match fut.await {
        Err(Error::RemoteAccess { violation, .. }) => assert_eq!(violation, want),
        Err(other) => panic!("expected {want:?}, got {other}"),
        Ok(_) => panic!("expected {want:?}, the operation succeeded"),
    }
}

#[tokio::test]
async fn out_of_bounds_write_fails_and_touches_nothing_outside() {
    let (a, b) = pair().await;
    // A window over bytes 8..24 of a 32-byte buffer.
    let grant = b
        .grant(
            RegisteredBuf::new(32, Access::ALL).unwrap(),
            8,
            16,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    let mut d = grant.descriptor().clone();
    d.len = 32; // lie about the length
    expect_violation(
        a.write(SendData::Bytes(Bytes::from(vec![0xff; 32])), &d, None),
        AccessViolation::OutOfBounds,
    )
    .await;
    // The connection is in error now, on both sides.
    assert!(a.send(SendData::Bytes(Bytes::new()), None).await.is_err());
    let _ = b.closed().await;
    let mut buf = grant.revoke().await.expect("buffer comes back");
    buf.set_len(32);
    assert!(
        buf.as_slice().iter().all(|&x| x == 0),
        "no byte was written"
    );
}

#[tokio::test]
async fn writes_into_read_only_windows_are_refused() {
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(8, Access::ALL).unwrap(),
            0,
            8,
            Access::REMOTE_READ,
        )
        .unwrap();
    expect_violation(
        a.write(
            SendData::Bytes(Bytes::from_static(b"x")),
            grant.descriptor(),
            None,
        ),
        AccessViolation::NotPermitted,
    )
    .await;
}

#[tokio::test]
async fn reads_of_write_only_windows_and_misaligned_atomics_are_refused() {
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(16, Access::ALL).unwrap(),
            0,
            16,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    expect_violation(
        a.read(grant.descriptor(), recv_buf(16)),
        AccessViolation::NotPermitted,
    )
    .await;
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(16, Access::ALL).unwrap(),
            0,
            16,
            Access::REMOTE_ATOMIC,
        )
        .unwrap();
    let d = grant.descriptor().slice(4, 8).unwrap();
    expect_violation(a.fetch_and_add(&d, 1), AccessViolation::Misaligned).await;
}

#[tokio::test]
async fn revoked_windows_and_other_connections_keys_are_unknown() {
    let t = transport();
    let listener = t.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let (a1, b1) = tokio::join!(t.connect(&addr), listener.accept());
    let (a2, b2) = tokio::join!(t.connect(&addr), listener.accept());
    let (a1, b1, a2, _b2) = (a1.unwrap(), b1.unwrap(), a2.unwrap(), b2.unwrap());

    let grant = b1
        .grant(
            RegisteredBuf::new(8, Access::ALL).unwrap(),
            0,
            8,
            Access::REMOTE_READ,
        )
        .unwrap();
    let d = grant.descriptor().clone();
    // The key of connection 1 means nothing on connection 2.
    expect_violation(a2.read(&d, recv_buf(8)), AccessViolation::UnknownKey).await;
    // Connection 1 can read until the grant is revoked.
    a1.read(&d, recv_buf(8)).await.unwrap();
    grant.revoke().await.unwrap();
    expect_violation(a1.read(&d, recv_buf(8)), AccessViolation::UnknownKey).await;
}

#[tokio::test]
async fn pending_operations_fail_when_the_peer_goes_away() {
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(8, Access::ALL).unwrap(),
            0,
            8,
            Access::REMOTE_READ,
        )
        .unwrap();
    let d = grant.descriptor().clone();
    // A send that waits for a receive (RNR budget 50 ms) and a read queued behind it.
    let send = a.send(SendData::Bytes(Bytes::from_static(b"x")), None);
    let read = a.read(&d, recv_buf(8));
    drop(b);
    drop(grant);
    let (send, read) = tokio::join!(send, read);
    assert!(send.unwrap_err().is_connection_fatal());
    assert!(read.unwrap_err().is_connection_fatal());
    let err = a.closed().await;
    assert!(err.is_connection_fatal(), "{err}");
}

#[tokio::test]
async fn garbage_from_the_peer_closes_only_that_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = transport();
    let listener = t.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let mut raw = tokio::net::TcpStream::connect(addr.trim_start_matches("tcp://"))
        .await
        .unwrap();
    raw.write_all(b"RDRPCt01").await.unwrap();
    let mut magic = [0u8; 8];
    raw.read_exact(&mut magic).await.unwrap();
    let bad = listener.accept().await.unwrap();
    let (good_client, good_server) = tokio::join!(t.connect(&addr), listener.accept());
    let (good_client, good_server) = (good_client.unwrap(), good_server.unwrap());
    raw.write_all(&[0xee; 56]).await.unwrap();
    let err = bad.closed().await;
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    good_server.post_recv(recv_buf(8)).unwrap();
    good_client
        .send(SendData::Bytes(Bytes::from_static(b"ok")), None)
        .await
        .unwrap();
    assert_eq!(good_server.recv().await.unwrap().buf.as_slice(), b"ok");
}

#[tokio::test]
async fn oversized_operations_are_refused_before_sending() {
    let t = TcpTransport::with_config(TcpConfig {
        max_message: 1024,
        ..TcpConfig::default()
    });
    let listener = t.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let (a, _b) = tokio::join!(t.connect(&addr), listener.accept());
    let err = a
        .unwrap()
        .send(SendData::Bytes(Bytes::from(vec![0; 2048])), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit: "max_message",
                max: 1024,
                actual: 2048
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn bad_addresses_are_reported() {
    let t = transport();
    let err = t.connect("udp://1.2.3.4:5").await.unwrap_err();
    assert!(err.to_string().contains("tcp://"), "{err}");
    let err = t.connect("localhost").await.unwrap_err();
    assert!(err.to_string().contains("host:port"), "{err}");
}

#[tokio::test]
async fn unsignaled_sends_arrive_in_order_and_fail_the_connection_without_a_receive() {
    let (a, b) = pair().await;
    conformance::unsignaled_sends_in_order(&a, &b, 16).await;
    // No receive posted: receiver not ready ends the connection on both sides.
    a.send_unsignaled(SendData::Bytes(Bytes::from_static(b"three")), None)
        .unwrap();
    let err = a.closed().await;
    assert!(matches!(err, Error::ReceiverNotReady { .. }), "{err}");
    assert!(a
        .send_unsignaled(SendData::Bytes(Bytes::new()), None)
        .is_err());
}

/// A raw peer that completes the preamble and then reads nothing; the connection of ours.
async fn peer_that_reads_nothing(t: &TcpTransport) -> (tokio::net::TcpStream, Arc<dyn Connection>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = t.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let mut raw = tokio::net::TcpStream::connect(addr.trim_start_matches("tcp://"))
        .await
        .unwrap();
    raw.write_all(b"RDRPCt01").await.unwrap();
    let mut magic = [0u8; 8];
    raw.read_exact(&mut magic).await.unwrap();
    (raw, listener.accept().await.unwrap())
}

/// Unsignaled sends to a peer that reads nothing fail once `max_queued_sends` of them wait for
/// the socket, and the connection ends, instead of queueing without bound (before: every
/// send was queued, gigabytes of them).
#[tokio::test]
async fn unsignaled_sends_to_a_peer_that_reads_nothing_are_bounded() {
    let t = TcpTransport::with_config(TcpConfig {
        max_queued_sends: 64,
        ..TcpConfig::default()
    });
    let (_raw, ours) = peer_that_reads_nothing(&t).await;
    let chunk = Bytes::from(vec![7u8; 64 * 1024]);
    let mut refused = None;
    for _ in 0..100_000 {
        if let Err(e) = ours.send_unsignaled(SendData::Bytes(chunk.clone()), None) {
            refused = Some(e);
            break;
        }
    }
    let err = refused.expect("the queue towards a silent peer is bounded");
    assert!(err.to_string().contains("max_queued_sends = 64"), "{err}");
    assert!(ours.closed().await.is_connection_fatal());
}

/// A packet the peer's socket does not take within `stall_timeout` fails the connection and
/// every operation on it (before: the writer waited forever, and so did its callers).
#[tokio::test]
async fn writes_to_a_peer_that_reads_nothing_time_out() {
    let t = TcpTransport::with_config(TcpConfig {
        stall_timeout: Duration::from_millis(200),
        ..TcpConfig::default()
    });
    let (_raw, ours) = peer_that_reads_nothing(&t).await;
    let big = SendData::Bytes(Bytes::from(vec![1u8; 64 << 20]));
    let err = bounded("the send ends", ours.send(big, None))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("stall_timeout"), "{err}");
}

/// A peer that starts a write into a window and stops in the middle of the payload loses its
/// connection after `stall_timeout`, and the window's owner gets its buffer back (before: the
/// reader held the window's lock forever, and so revocation waited forever).
#[tokio::test]
async fn a_write_that_stalls_mid_payload_frees_the_window() {
    use super::wire::{Header, Kind};
    use tokio::io::AsyncWriteExt;
    let t = TcpTransport::with_config(TcpConfig {
        stall_timeout: Duration::from_millis(200),
        ..TcpConfig::default()
    });
    let (mut raw, ours) = peer_that_reads_nothing(&t).await;
    let grant = ours
        .grant(
            RegisteredBuf::new(4096, Access::ALL).unwrap(),
            0,
            4096,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    let d = grant.descriptor().clone();
    let mut header = Header::new(Kind::Write, 1);
    (header.rkey, header.addr, header.len) = (d.rkey, d.addr, 4096);
    raw.write_all(&header.encode()).await.unwrap();
    raw.write_all(&[1u8; 2048]).await.unwrap(); // half the payload, then silence
    let err = bounded("the stalled connection ends", ours.closed()).await;
    assert!(err.to_string().contains("stall_timeout"), "{err}");
    let buf = bounded("revocation ends", grant.revoke()).await;
    assert!(buf.is_some(), "the owner gets its buffer back");
}

proptest::proptest! {
    /// Any 56 bytes decode to a header or a reason, never a panic; every header that decodes
    /// encodes back to the same bytes (the reader trusts nothing it did not check).
    #[test]
    fn arbitrary_headers_decode_or_are_refused(raw in proptest::array::uniform32(proptest::num::u8::ANY), rest in proptest::collection::vec(proptest::num::u8::ANY, 24)) {
        let mut bytes = [0u8; super::wire::HEADER_LEN];
        bytes[..32].copy_from_slice(&raw);
        bytes[32..].copy_from_slice(&rest);
        if let Ok(header) = super::wire::Header::decode(&bytes) {
            proptest::prop_assert_eq!(super::wire::Header::decode(&header.encode()), Ok(header));
        }
    }
}
