use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{MemConfig, MemTransport};
use crate::error::{AccessViolation, Error};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::conformance::{self, pattern, recv_buf};
use crate::transport::{BoxFuture, Connection, RecvOpcode, SendData, Transport};

/// A short receiver-not-ready budget, for the tests that wait for it to run out.
fn transport() -> MemTransport {
    MemTransport::with_config(MemConfig {
        rnr_timeout: Duration::from_millis(50),
        ..MemConfig::default()
    })
}

/// A budget no test reaches: a send that waits is let through by the test, never by time.
fn patient() -> MemTransport {
    MemTransport::with_config(MemConfig {
        rnr_timeout: Duration::from_secs(3600),
        ..MemConfig::default()
    })
}

async fn pair() -> (Arc<dyn Connection>, Arc<dyn Connection>) {
    conformance::pair_on(&transport(), "mem://").await
}

async fn patient_pair() -> (Arc<dyn Connection>, Arc<dyn Connection>) {
    conformance::pair_on(&patient(), "mem://").await
}

/// Polls once with a waker that does nothing: whether the operation has completed by now.
/// (Operations that need not wait complete when posted, so this is deterministic here.)
fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    std::pin::Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

fn bytes(b: &'static [u8]) -> SendData {
    SendData::Bytes(Bytes::from_static(b))
}

fn window(conn: &Arc<dyn Connection>, cap: usize, access: Access) -> crate::transport::Grant {
    conn.grant(
        RegisteredBuf::new(cap, Access::ALL).unwrap(),
        0,
        cap,
        access,
    )
    .unwrap()
}

async fn expect_violation<T>(fut: BoxFuture<'static, crate::Result<T>>, want: AccessViolation) {
    match fut.await {
        Err(Error::RemoteAccess { violation, .. }) => assert_eq!(violation, want),
        Err(other) => panic!("expected {want:?}, got {other}"),
        Ok(_) => panic!("expected {want:?}, the operation succeeded"),
    }
}

/// The peer of a refused one-sided operation is in error too, and says who broke the rules.
async fn peer_reports_the_violation(peer: &Arc<dyn Connection>) {
    let err = peer.closed().await;
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    assert!(err.to_string().contains("was refused"), "{err}");
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
async fn write_and_read_move_bytes_exactly_with_no_peer_code() {
    let (a, b) = pair().await;
    conformance::write_and_read_exact(&a, &b, |d| assert!(d.blob.is_empty())).await;
}

#[tokio::test]
async fn write_with_immediate_completes_a_receive() {
    let (a, b) = pair().await;
    let (c, grant) = conformance::write_with_immediate(&a, &b).await;
    assert_eq!(c.write_len, 5);
    let mut buf = grant.revoke().await.unwrap();
    buf.set_len(5);
    assert_eq!(buf.as_slice(), b"hello");
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

#[tokio::test]
async fn writes_land_before_later_sends() {
    let (a, b) = pair().await;
    conformance::writes_land_before_later_sends(&a, &b).await;
}

#[tokio::test]
async fn send_without_posted_receive_fails_receiver_not_ready() {
    let (a, b) = pair().await;
    let err = a.send(bytes(b"x"), None).await.unwrap_err();
    assert!(
        matches!(err, Error::ReceiverNotReady { retry_ms: 50 }),
        "{err}"
    );
    // The connection is in error on both sides now.
    let later = a
        .send(SendData::Bytes(Bytes::new()), None)
        .await
        .unwrap_err();
    assert!(later.is_connection_fatal(), "{later}");
    let theirs = b.recv().await.unwrap_err();
    assert!(matches!(theirs, Error::ReceiverNotReady { .. }), "{theirs}");
    assert!(b.post_recv(recv_buf(8)).is_err());
}

#[tokio::test]
async fn send_waits_for_a_late_receive_within_the_rnr_budget() {
    let (a, b) = patient_pair().await;
    let mut send = a.send(bytes(b"late"), None);
    assert!(
        poll_once(&mut send).is_pending(),
        "no receive is posted yet"
    );
    b.post_recv(recv_buf(16)).unwrap();
    assert!(
        matches!(poll_once(&mut send), Poll::Ready(Ok(()))),
        "posting the receive delivered it"
    );
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"late");
}

/// A frame sent before any receive is posted waits as a copy of its own (its sender's memory
/// is reused at once), behind nothing, and lands once a receive is posted.
#[tokio::test]
async fn a_frame_waits_for_a_late_receive_as_a_copy() {
    let (a, b) = patient_pair().await;
    let mut frame = *b"early";
    a.send_frame(&frame).unwrap();
    frame.copy_from_slice(b"XXXXX");
    let mut later = a.send(bytes(b"later"), None);
    assert!(
        poll_once(&mut later).is_pending(),
        "it waits behind the frame"
    );
    b.post_recv(recv_buf(16)).unwrap();
    b.post_recv(recv_buf(16)).unwrap();
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"early");
    assert!(matches!(poll_once(&mut later), Poll::Ready(Ok(()))));
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"later");
}

#[tokio::test]
async fn message_larger_than_the_posted_receive_fails_the_connection() {
    let (a, b) = pair().await;
    b.post_recv(recv_buf(4)).unwrap();
    let err = a.send(bytes(b"too long"), None).await.unwrap_err();
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
    let theirs = b.recv().await.unwrap_err();
    assert!(matches!(theirs, Error::ReceiveTooSmall { .. }), "{theirs}");
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
    peer_reports_the_violation(&b).await;
    let mut buf = grant.revoke().await.expect("buffer comes back");
    buf.set_len(32);
    assert!(
        buf.as_slice().iter().all(|&x| x == 0),
        "no byte was written"
    );

    // Below the window, on a fresh connection.
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(32, Access::ALL).unwrap(),
            8,
            16,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    let mut d = grant.descriptor().clone();
    d.addr -= 8;
    expect_violation(
        a.write(SendData::Bytes(Bytes::from(vec![0xff; 8])), &d, None),
        AccessViolation::OutOfBounds,
    )
    .await;
    let mut buf = grant.revoke().await.expect("buffer comes back");
    buf.set_len(32);
    assert!(
        buf.as_slice().iter().all(|&x| x == 0),
        "no byte was written"
    );
}

#[tokio::test]
async fn writes_into_read_only_windows_are_refused_and_touch_nothing() {
    let (a, b) = pair().await;
    let grant = window(&b, 8, Access::REMOTE_READ);
    expect_violation(
        a.write(bytes(b"x"), grant.descriptor(), None),
        AccessViolation::NotPermitted,
    )
    .await;
    peer_reports_the_violation(&b).await;
    let mut buf = grant.revoke().await.unwrap();
    buf.set_len(8);
    assert!(buf.as_slice().iter().all(|&x| x == 0));
}

#[tokio::test]
async fn reads_of_write_only_windows_and_bad_atomics_are_refused() {
    let (a, b) = pair().await;
    let grant = window(&b, 16, Access::REMOTE_WRITE);
    expect_violation(
        a.read(grant.descriptor(), recv_buf(16)),
        AccessViolation::NotPermitted,
    )
    .await;

    // Misaligned: refused before anything is looked up, and the word is untouched.
    let (a, b) = pair().await;
    let grant = window(&b, 16, Access::REMOTE_ATOMIC);
    let d = grant.descriptor().slice(4, 8).unwrap();
    expect_violation(a.fetch_and_add(&d, 1), AccessViolation::Misaligned).await;
    let mut buf = grant.revoke().await.unwrap();
    buf.set_len(16);
    assert!(buf.as_slice().iter().all(|&x| x == 0));

    // Atomics need the atomic right, and stay inside the window.
    let (a, b) = pair().await;
    let grant = window(&b, 16, Access::REMOTE_WRITE | Access::REMOTE_READ);
    expect_violation(
        a.compare_and_swap(grant.descriptor(), 0, 1),
        AccessViolation::NotPermitted,
    )
    .await;
    let (a, b) = pair().await;
    let grant = window(&b, 16, Access::REMOTE_ATOMIC);
    let mut d = grant.descriptor().clone();
    d.addr += 16;
    expect_violation(a.fetch_and_add(&d, 1), AccessViolation::OutOfBounds).await;
    let mut buf = grant.revoke().await.unwrap();
    buf.set_len(16);
    assert!(buf.as_slice().iter().all(|&x| x == 0));
}

#[tokio::test]
async fn revoked_windows_and_other_connections_keys_are_unknown() {
    let t = transport();
    let listener = t.listen("mem://").await.unwrap();
    let addr = listener.local_addr();
    let (a1, b1) = tokio::join!(t.connect(&addr), listener.accept());
    let (a2, b2) = tokio::join!(t.connect(&addr), listener.accept());
    let (a1, b1, a2, b2) = (a1.unwrap(), b1.unwrap(), a2.unwrap(), b2.unwrap());

    let grant = window(&b1, 8, Access::REMOTE_READ);
    let d = grant.descriptor().clone();
    // The key of connection 1 means nothing on connection 2 (and ends it).
    expect_violation(a2.read(&d, recv_buf(8)), AccessViolation::UnknownKey).await;
    peer_reports_the_violation(&b2).await;
    // Connection 1 can read until the grant is revoked.
    a1.read(&d, recv_buf(8)).await.unwrap();
    grant.revoke().await.unwrap();
    expect_violation(a1.read(&d, recv_buf(8)), AccessViolation::UnknownKey).await;
}

#[tokio::test]
async fn a_dropped_grant_is_unknown_and_its_buffer_is_freed() {
    let (a, b) = pair().await;
    let pool = crate::BufferPool::new(64, 1, Access::ALL).unwrap();
    let grant = b
        .grant(pool.try_acquire().unwrap(), 0, 64, Access::REMOTE_WRITE)
        .unwrap();
    let d = grant.descriptor().clone();
    drop(grant);
    assert_eq!(pool.available(), 1, "the buffer went back to its pool");
    expect_violation(a.write(bytes(b"x"), &d, None), AccessViolation::UnknownKey).await;
}

#[tokio::test]
async fn pending_operations_fail_when_the_peer_goes_away() {
    let (a, b) = patient_pair().await;
    let grant = window(&b, 8, Access::REMOTE_READ);
    let d = grant.descriptor().clone();
    // A send that waits for a receive, and a read queued behind it.
    let mut send = a.send(bytes(b"x"), None);
    let mut read = a.read(&d, recv_buf(8));
    assert!(poll_once(&mut send).is_pending() && poll_once(&mut read).is_pending());
    drop(b);
    drop(grant);
    let (send, read) = tokio::join!(send, read);
    assert!(send.unwrap_err().is_connection_fatal());
    assert!(read.unwrap_err().is_connection_fatal());
    let err = a.closed().await;
    assert!(
        err.to_string().contains("closed by the peer"),
        "{err} names the cause"
    );
}

#[tokio::test]
async fn close_fails_what_waits_and_leaves_completed_receives_to_take() {
    let (a, b) = patient_pair().await;
    let grant = window(&a, 8, Access::REMOTE_WRITE);
    b.post_recv(recv_buf(8)).unwrap();
    a.send(bytes(b"kept"), None).await.unwrap();
    let stalled = a.send(bytes(b"lost"), None);
    a.close();
    assert!(stalled.await.unwrap_err().is_connection_fatal());
    assert!(a.closed().await.to_string().contains("closed locally"));
    // A receive that completed before the close is still handed out, then the error.
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"kept");
    assert!(b.recv().await.unwrap_err().is_connection_fatal());
    assert!(b.closed().await.to_string().contains("closed by the peer"));
    // Nothing new starts; a window granted earlier still gives its buffer back.
    assert!(a.grant(recv_buf(8), 0, 8, Access::LOCAL_WRITE).is_err());
    assert!(grant.revoke().await.is_some());
}

#[tokio::test]
async fn oversized_operations_are_refused_before_sending() {
    let t = MemTransport::with_config(MemConfig {
        max_message: 1024,
        ..MemConfig::default()
    });
    let (a, b) = conformance::pair_on(&t, "mem://").await;
    b.post_recv(recv_buf(4096)).unwrap();
    let err = a
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
    let grant = window(&b, 4096, Access::REMOTE_READ);
    let err = a
        .read(grant.descriptor(), recv_buf(4096))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    // Refused locally: the connection is fine.
    a.send(bytes(b"ok"), None).await.unwrap();
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"ok");
}

#[tokio::test]
async fn operations_waiting_behind_a_stalled_send_are_bounded() {
    let t = MemTransport::with_config(MemConfig {
        max_outstanding: 2,
        rnr_timeout: Duration::from_secs(3600),
        ..MemConfig::default()
    });
    let (a, b) = conformance::pair_on(&t, "mem://").await;
    let first = a.send(bytes(b"1"), None);
    let second = a.send(bytes(b"2"), None);
    // A third signaled operation is refused when posted; the connection goes on.
    let err = a.send(bytes(b"3"), None).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit: "max_outstanding",
                max: 2,
                actual: 3
            }
        ),
        "{err}"
    );
    b.post_recv(recv_buf(8)).unwrap();
    b.post_recv(recv_buf(8)).unwrap();
    first.await.unwrap();
    second.await.unwrap();
    // An unsignaled send past the bound ends the connection: nothing else would report it.
    a.send_unsignaled(bytes(b"4"), None).unwrap();
    a.send_unsignaled(bytes(b"5"), None).unwrap();
    let err = a.send_unsignaled(bytes(b"6"), None).unwrap_err();
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    let closed = a.closed().await;
    assert!(
        closed.to_string().contains("max_outstanding = 2"),
        "{closed}"
    );
}

#[tokio::test]
async fn unsignaled_sends_arrive_in_order_and_fail_the_connection_without_a_receive() {
    let (a, b) = pair().await;
    conformance::unsignaled_sends_in_order(&a, &b, 16).await;
    // No receive posted: receiver not ready ends the connection on both sides.
    a.send_unsignaled(bytes(b"three"), None).unwrap();
    let err = a.closed().await;
    assert!(matches!(err, Error::ReceiverNotReady { .. }), "{err}");
    assert!(a
        .send_unsignaled(SendData::Bytes(Bytes::new()), None)
        .is_err());
    assert!(b.closed().await.is_connection_fatal());
}

/// Everything posted after a send that waits for a receive takes effect after it, in order:
/// writes, reads, atomics and further sends all queue behind it.
#[tokio::test]
async fn nothing_overtakes_a_send_that_waits_for_a_receive() {
    let (a, b) = patient_pair().await;
    let data = pattern(4096, 3);
    let target = window(&b, 4096, Access::REMOTE_WRITE);
    let counter = window(&b, 8, Access::REMOTE_ATOMIC | Access::REMOTE_READ);

    let mut first = a.send(bytes(b"first"), None);
    let mut write = a.write(
        SendData::Bytes(Bytes::from(data.clone())),
        target.descriptor(),
        None,
    );
    let mut second = a.send(bytes(b"second"), Some(2));
    let mut add = a.fetch_and_add(counter.descriptor(), 5);
    let mut read = a.read(counter.descriptor(), recv_buf(8));
    a.send_unsignaled(bytes(b"third"), None).unwrap();
    for pending in [&mut first, &mut write, &mut second] {
        assert!(
            poll_once(pending).is_pending(),
            "queued behind the first send"
        );
    }
    assert!(poll_once(&mut add).is_pending() && poll_once(&mut read).is_pending());

    // One receive: the first send, then the write; the second send waits again.
    b.post_recv(recv_buf(16)).unwrap();
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"first");
    first.await.unwrap();
    write.await.unwrap();
    assert!(poll_once(&mut second).is_pending());
    assert!(
        poll_once(&mut add).is_pending(),
        "still behind the second send"
    );

    // Two more: the rest, in order.
    b.post_recv(recv_buf(16)).unwrap();
    b.post_recv(recv_buf(16)).unwrap();
    let c = b.recv().await.unwrap();
    assert_eq!((c.buf.as_slice(), c.imm), (&b"second"[..], Some(2)));
    second.await.unwrap();
    assert_eq!(add.await.unwrap(), 0);
    let word = read.await.unwrap();
    assert_eq!(word.as_slice(), 5u64.to_ne_bytes(), "the read saw the add");
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"third");

    let mut target = target.revoke().await.unwrap();
    target.set_len(4096);
    assert!(target.as_slice() == &data[..]);
}

/// A write with immediate that finds no receive waits like a send, and its bytes land only
/// when it is carried out.
#[tokio::test]
async fn a_write_with_immediate_waits_for_a_receive() {
    let (a, b) = patient_pair().await;
    let grant = window(&b, 8, Access::REMOTE_WRITE);
    let mut write = a.write(bytes(b"imm"), grant.descriptor(), Some(9));
    assert!(poll_once(&mut write).is_pending());
    b.post_recv(recv_buf(4)).unwrap();
    write.await.unwrap();
    let c = b.recv().await.unwrap();
    assert_eq!(
        (c.opcode, c.imm, c.write_len, c.buf.len()),
        (RecvOpcode::WriteWithImm, Some(9), 3, 0)
    );
}

#[tokio::test]
async fn recv_is_cancel_safe_and_serves_every_waiter() {
    let (a, b) = pair().await;
    b.post_recv(recv_buf(8)).unwrap();
    b.post_recv(recv_buf(8)).unwrap();
    // A receive that is given up loses nothing.
    let mut abandoned = b.recv();
    assert!(poll_once(&mut abandoned).is_pending());
    drop(abandoned);
    a.send(bytes(b"1"), None).await.unwrap();
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"1");
    // Two tasks waiting at once: each gets one.
    let b2 = b.clone();
    let one = tokio::spawn(async move { b2.recv().await.unwrap().buf.as_slice().to_vec() });
    let b3 = b.clone();
    let other = tokio::spawn(async move { b3.recv().await.unwrap().buf.as_slice().to_vec() });
    // (One runtime thread: yielding lets both tasks reach their wait.)
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    b.post_recv(recv_buf(8)).unwrap();
    a.send(bytes(b"2"), None).await.unwrap();
    a.send(bytes(b"3"), None).await.unwrap();
    let mut got = vec![one.await.unwrap(), other.await.unwrap()];
    got.sort();
    assert_eq!(got, vec![b"2".to_vec(), b"3".to_vec()]);
}

#[tokio::test]
async fn bad_addresses_and_names_are_reported() {
    let t = transport();
    let err = t.connect("tcp://1.2.3.4:5").await.unwrap_err();
    assert!(err.to_string().contains("mem://"), "{err}");
    let err = t.connect("nothing").await.unwrap_err();
    assert!(err.to_string().contains("mem://NAME"), "{err}");
    let err = t.connect("mem://").await.unwrap_err();
    assert!(err.to_string().contains("mem://NAME"), "{err}");
    let err = t.listen("mem://two words").await.unwrap_err();
    assert!(matches!(err, Error::InvalidAddress { .. }), "{err}");

    let err = t.connect("mem://nobody-listens-here").await.unwrap_err();
    assert!(
        err.to_string().contains("mem://nobody-listens-here"),
        "{err} names the address"
    );

    let listener = t.listen("mem://tests-bound-once").await.unwrap();
    assert_eq!(listener.local_addr(), "mem://tests-bound-once");
    let err = t.listen("mem://tests-bound-once").await.unwrap_err();
    assert!(err.to_string().contains("already bound"), "{err}");
    // Dropping the listener frees the name, and closes what nobody accepted.
    let waiting = t.connect("mem://tests-bound-once").await.unwrap();
    drop(listener);
    assert!(waiting.closed().await.is_connection_fatal());
    let again = t.listen("mem://tests-bound-once").await.unwrap();
    drop(again);
    assert!(t.connect("mem://tests-bound-once").await.is_err());
}

#[tokio::test]
async fn fresh_names_are_distinct_and_connections_name_their_peers() {
    let t = transport();
    let one = t.listen("mem://").await.unwrap();
    let two = t.listen("mem://0").await.unwrap();
    assert_ne!(one.local_addr(), two.local_addr());
    assert!(one.local_addr().starts_with("mem://"));
    let client = t.connect(&one.local_addr()).await.unwrap();
    let server = one.accept().await.unwrap();
    assert_eq!(client.peer(), one.local_addr());
    assert!(server.peer().starts_with(&format!("{}#", one.local_addr())));
    assert!(crate::transport::transport_for("mem://x").is_ok());
}

#[tokio::test]
async fn a_full_backlog_refuses_with_the_limit_named() {
    let t = MemTransport::with_config(MemConfig {
        backlog: 1,
        ..MemConfig::default()
    });
    let listener = t.listen("mem://").await.unwrap();
    let addr = listener.local_addr();
    let _first = t.connect(&addr).await.unwrap();
    let err = t.connect(&addr).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit: "backlog",
                ..
            }
        ),
        "{err}"
    );
    listener.accept().await.unwrap();
    t.connect(&addr).await.unwrap();
}

/// Server and client on two runtimes on two threads, as the benchmark runs them: messages
/// both ways, a send that waits for the other thread's receive, windows across threads.
#[test]
fn two_runtimes_on_two_threads() {
    let t = patient();
    let rt = |_| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let listener = rt(0).block_on(t.listen("mem://")).unwrap();
    let addr = listener.local_addr();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        rt(1).block_on(async move {
            let conn = listener.accept().await.unwrap();
            // The client's first send is waiting for this receive by now.
            go_rx.await.unwrap();
            for _ in 0..4 {
                conn.post_recv(recv_buf(64)).unwrap();
            }
            let window = conn
                .grant(
                    RegisteredBuf::new(64, Access::ALL).unwrap(),
                    0,
                    64,
                    Access::REMOTE_WRITE,
                )
                .unwrap();
            let d = window.descriptor().clone();
            let mut desc = Vec::new();
            desc.extend_from_slice(&d.addr.to_ne_bytes());
            desc.extend_from_slice(&d.rkey.to_ne_bytes());
            for i in 0..1000u32 {
                let c = conn.recv().await.unwrap();
                let echo = Bytes::copy_from_slice(c.buf.as_slice());
                conn.post_recv(c.buf).unwrap();
                if i == 0 {
                    conn.send(SendData::Bytes(Bytes::from(desc.clone())), None)
                        .await
                        .unwrap();
                } else {
                    conn.send_unsignaled(SendData::Bytes(echo), Some(i))
                        .unwrap();
                }
            }
            // The client wrote into the window before its last message.
            let mut buf = window.revoke().await.unwrap();
            buf.set_len(5);
            buf.as_slice().to_vec()
        })
    });
    rt(2).block_on(async move {
        let conn = t.connect(&addr).await.unwrap();
        for _ in 0..4 {
            conn.post_recv(recv_buf(64)).unwrap();
        }
        let first = conn.send(bytes(b"hello"), None);
        go_tx.send(()).unwrap();
        first.await.unwrap();
        let c = conn.recv().await.unwrap();
        let addr = u64::from_ne_bytes(c.buf.as_slice()[..8].try_into().unwrap());
        let rkey = u32::from_ne_bytes(c.buf.as_slice()[8..12].try_into().unwrap());
        conn.post_recv(c.buf).unwrap();
        for i in 1..1000u32 {
            if i == 999 {
                let d = crate::transport::Descriptor {
                    addr,
                    len: 64,
                    rkey,
                    access: Access::REMOTE_WRITE,
                    blob: Bytes::new(),
                };
                conn.write(bytes(b"there"), &d, None).await.unwrap();
            }
            conn.send(SendData::Bytes(Bytes::from(i.to_ne_bytes().to_vec())), None)
                .await
                .unwrap();
            let c = conn.recv().await.unwrap();
            assert_eq!(c.imm, Some(i));
            assert_eq!(c.buf.as_slice(), i.to_ne_bytes());
            if i < 999 {
                // (After the last echo the server is done and closes.)
                conn.post_recv(c.buf).unwrap();
            }
        }
    });
    assert_eq!(server.join().unwrap(), b"there");
}

/// Send + receive pairs per second on one thread (64-byte messages), and round trips per
/// second between two runtimes on two threads. A measurement, not a check.
#[test]
#[ignore = "a measurement: cargo test --release -p rdma-rpc-core --lib mem::tests::measure -- --ignored --nocapture"]
fn measure_send_recv_rates() {
    const N: u32 = 1_000_000;
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let t = MemTransport::new();
    let payload = Bytes::from(vec![7u8; 64]);
    rt().block_on(async {
        let (a, b) = conformance::pair_on(&t, "mem://").await;
        let pool = crate::BufferPool::new(1024, 16, Access::LOCAL_WRITE).unwrap();
        while let Some(buf) = pool.try_acquire() {
            b.post_recv(buf).unwrap();
        }
        for (what, signaled) in [("unsignaled", false), ("signaled", true)] {
            let start = Instant::now();
            for _ in 0..N {
                let data = SendData::Bytes(payload.clone());
                if signaled {
                    a.send(data, None).await.unwrap();
                } else {
                    a.send_unsignaled(data, None).unwrap();
                }
                let c = b.recv().await.unwrap();
                b.post_recv(c.buf).unwrap();
            }
            let rate = f64::from(N) / start.elapsed().as_secs_f64();
            println!("one thread, {what} send + recv + post_recv: {rate:.0} per second");
        }
    });

    let listener = rt().block_on(t.listen("mem://")).unwrap();
    let addr = listener.local_addr();
    let echo = std::thread::spawn(move || {
        rt().block_on(async move {
            let conn = listener.accept().await.unwrap();
            for _ in 0..16 {
                conn.post_recv(recv_buf(1024)).unwrap();
            }
            for _ in 0..N / 10 {
                let c = conn.recv().await.unwrap();
                let reply = SendData::Bytes(Bytes::copy_from_slice(c.buf.as_slice()));
                conn.post_recv(c.buf).unwrap();
                conn.send_unsignaled(reply, None).unwrap();
            }
        })
    });
    rt().block_on(async {
        let conn = t.connect(&addr).await.unwrap();
        for _ in 0..16 {
            conn.post_recv(recv_buf(1024)).unwrap();
        }
        let start = Instant::now();
        for i in 0..N / 10 {
            conn.send_unsignaled(SendData::Bytes(payload.clone()), None)
                .unwrap();
            let c = conn.recv().await.unwrap();
            if i + 1 < N / 10 {
                // (After the last echo the other side is done and closes.)
                conn.post_recv(c.buf).unwrap();
            }
        }
        let rate = f64::from(N / 10) / start.elapsed().as_secs_f64();
        println!("two threads, two runtimes, ping-pong: {rate:.0} round trips per second");
    });
    echo.join().unwrap();
}
