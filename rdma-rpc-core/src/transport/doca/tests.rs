//! Transport-level tests over the software provider (the hardware runs the same code).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{list_devices, DocaConfig, DocaTransport, ProgressMode};
use crate::error::{AccessViolation, Error};
use crate::memory::{Access, RegisteredBuf};
use crate::tests::bounded;
use crate::transport::conformance::{self, pattern, recv_buf};
use crate::transport::{Connection, SendData, Transport};

fn transport_with(progress: ProgressMode) -> DocaTransport {
    DocaTransport::new(DocaConfig {
        rnr_timeout: Duration::from_millis(50),
        progress,
        ..DocaConfig::default()
    })
    .unwrap()
}

fn transport() -> DocaTransport {
    transport_with(ProgressMode::Event)
}

async fn pair_on(t: &DocaTransport, addr: &str) -> (Arc<dyn Connection>, Arc<dyn Connection>) {
    conformance::pair_on(t, addr).await
}

async fn pair() -> (Arc<dyn Connection>, Arc<dyn Connection>) {
    pair_on(&transport(), "doca://127.0.0.1:0").await
}

async fn expect_violation<T>(fut: crate::transport::BoxFuture<'static, crate::Result<T>>) -> Error {
    match fut.await {
        Err(e @ Error::RemoteAccess { .. }) => e,
        Err(other) => panic!("expected a remote access error, got {other}"),
        Ok(_) => panic!("expected a remote access error, the operation succeeded"),
    }
}

#[test]
fn devices_are_listed_with_capabilities() {
    let devices = list_devices().unwrap();
    assert!(!devices.is_empty());
    let d = &devices[0];
    assert!(!d.name.is_empty() && !d.pci_addr.is_empty(), "{d:?}");
    assert!(d.capabilities.send_recv && d.capabilities.atomics, "{d:?}");
    let err = DocaTransport::new(DocaConfig {
        device: Some("nope0".into()),
        ..DocaConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("nope0"), "{err}");
}

#[tokio::test]
async fn devices_open_by_name_and_pci_address() {
    // Not `mlx5_1`: the registration tests count that device's work alone.
    let d = list_devices()
        .unwrap()
        .into_iter()
        .find(|d| d.name != "mlx5_1")
        .unwrap();
    for selector in [d.name.clone(), d.pci_addr.clone()] {
        let t = DocaTransport::new(DocaConfig {
            device: Some(selector),
            ..DocaConfig::default()
        })
        .unwrap();
        assert_eq!(t.device().name, d.name);
    }
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
    // And the other way, from a registered buffer (no copy).
    a.post_recv(recv_buf(16)).unwrap();
    let reg = RegisteredBuf::from_slice(b"reply", Access::LOCAL_READ).unwrap();
    b.send(SendData::Registered(reg), None).await.unwrap();
    assert_eq!(a.recv().await.unwrap().buf.to_vec(), b"reply");
}

#[tokio::test]
async fn receiver_not_ready_fails_the_connection_on_both_sides() {
    let (a, b) = pair().await;
    // The peer context takes the messages, but no receive is posted on the connection: the
    // first waits for the application to take the connection (see the next test), the second
    // has the RNR budget; after it the receiving side fails and the sender sees the
    // connection end.
    for message in [&b"first"[..], b"x"] {
        a.send(SendData::Bytes(Bytes::from_static(message)), None)
            .await
            .unwrap();
    }
    let err = bounded("the connection closes", b.closed()).await;
    assert!(matches!(err, Error::ReceiverNotReady { .. }), "{err}");
    let err = bounded("the connection closes", a.closed()).await;
    assert!(err.is_connection_fatal(), "{err}");
    let later = a
        .send(SendData::Bytes(Bytes::new()), None)
        .await
        .unwrap_err();
    assert!(later.is_connection_fatal(), "{later}");
}

/// A client connection of `t` to `listener` (the end that receives in these tests), and the
/// server's end of it (the one that sends).
async fn receiving(
    t: &DocaTransport,
    listener: &dyn crate::transport::Listener,
) -> (Arc<dyn Connection>, super::DocaConnection) {
    let addr = listener.local_addr();
    let (receiver, sender) = tokio::join!(t.connect_doca(&addr), listener.accept());
    (sender.unwrap(), receiver.unwrap())
}

async fn send(conn: &Arc<dyn Connection>, message: &'static [u8]) {
    conn.send(SendData::Bytes(Bytes::from_static(message)), None)
        .await
        .unwrap();
}

/// Waits until `n` messages arrived at `conn` before a receive for them.
async fn until_early(conn: &super::DocaConnection, n: usize) {
    bounded("messages arrive before their receive", async {
        while conn.early_messages() < n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// A connection's first message before its application posted any receive (a client's
/// handshake reaching a server that is slow to take the connection) waits for that receive
/// past the RNR budget; a second connection's second early message, which arrived later and
/// has the budget, shows the budget ran out meanwhile (early messages expire in the order
/// they arrived, on one owner for both connections).
#[tokio::test]
async fn a_connections_first_message_waits_for_its_application_past_the_rnr_budget() {
    let t = transport();
    let listener = t.listen("doca://127.0.0.1:0").await.unwrap();
    // `b` and `d` are one context's (this runtime's client context): one owner, one order of
    // expiry.
    let (a, b) = receiving(&t, listener.as_ref()).await;
    let (c, d) = receiving(&t, listener.as_ref()).await;
    send(&a, b"hello").await;
    until_early(&b, 1).await;
    send(&c, b"one").await;
    send(&c, b"two").await;
    let err = bounded("the later connection runs out of budget", d.closed()).await;
    assert!(matches!(err, Error::ReceiverNotReady { .. }), "{err}");
    assert!(
        crate::bounded::poll_once(&mut b.closed()).is_none(),
        "the first message of a connection not taken yet has no budget to run out of"
    );
    b.post_recv(recv_buf(16)).unwrap();
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), b"hello");
}

/// A message that arrives before its receive is posted is kept, within the RNR budget, for
/// the receive posted late. The budget is one no test reaches: the receive is posted once the
/// message is seen kept, never after a guess at how long that takes. (The connection is taken
/// first, by a receive its first message fills: a first message has no budget at all.)
#[tokio::test]
async fn a_late_receive_within_the_rnr_budget_gets_the_message() {
    let t = DocaTransport::new(DocaConfig {
        rnr_timeout: Duration::from_secs(3600),
        ..DocaConfig::default()
    })
    .unwrap();
    let listener = t.listen("doca://127.0.0.1:0").await.unwrap();
    let (a, b) = receiving(&t, listener.as_ref()).await;
    b.post_recv(recv_buf(16)).unwrap();
    send(&a, b"first").await;
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), b"first");
    send(&a, b"late").await;
    until_early(&b, 1).await;
    b.post_recv(recv_buf(16)).unwrap();
    assert_eq!(b.early_messages(), 0, "the late receive took the message");
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), b"late");
}

#[tokio::test]
async fn message_larger_than_the_posted_receive_fails_the_connection() {
    let (a, b) = pair().await;
    b.post_recv(recv_buf(4)).unwrap();
    a.send(SendData::Bytes(Bytes::from_static(b"too long")), None)
        .await
        .unwrap();
    let err = b.closed().await;
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
    assert!(a.closed().await.is_connection_fatal());
}

/// A context's staging receives are reserved by its connections' receives, up to
/// `recv_queue_size`: past it a receive is refused, naming the setting, and the connection's
/// earlier receives still work (nothing was posted that a peer could overrun).
#[tokio::test]
async fn receives_beyond_the_contexts_staging_are_refused_naming_recv_queue_size() {
    let t = DocaTransport::new(DocaConfig {
        recv_queue_size: 4,
        ..DocaConfig::default()
    })
    .unwrap();
    let (a, b) = pair_on(&t, "doca://127.0.0.1:0").await;
    for _ in 0..4 {
        b.post_recv(recv_buf(64)).unwrap();
    }
    let err = b.post_recv(recv_buf(64)).unwrap_err();
    assert!(
        matches!(&err, Error::LimitExceeded { limit, max: 4, .. } if limit.contains("recv_queue_size")),
        "{err}"
    );
    for i in 0..4u8 {
        a.send(SendData::Bytes(Bytes::from(vec![i; 8])), None)
            .await
            .unwrap();
        assert_eq!(b.recv().await.unwrap().buf.to_vec(), vec![i; 8]);
    }
}

#[tokio::test]
async fn message_larger_than_the_staging_receive_fails_both_sides() {
    let (a, b) = pair().await;
    // A receive larger than the staging receives would promise the peer more than DOCA can
    // take: refused, naming the setting.
    let err = b.post_recv(recv_buf(1 << 20)).unwrap_err();
    assert!(
        matches!(&err, Error::LimitExceeded { limit, max, .. }
            if limit.contains("max_recv_size") && *max == 16 * 1024),
        "{err}"
    );
    b.post_recv(recv_buf(16 * 1024)).unwrap();
    let err = a
        .send(SendData::Bytes(Bytes::from(vec![1; 64 * 1024])), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReceiveTooSmall { .. }), "{err}");
    assert!(b.closed().await.is_connection_fatal());
}

/// An unsignaled send that cannot even be posted (here: bytes too large for any staging
/// buffer, refused before anything is allocated for them) is refused at once and ends the
/// connection: a protocol frame is never lost while the connection looks healthy.
#[tokio::test]
async fn an_unsignaled_send_that_cannot_be_posted_ends_the_connection() {
    let (a, _b) = pair().await;
    // Zeroed and never written: the pages are not touched.
    let huge = Bytes::from(vec![0u8; crate::memory::MAX_BUFFER + 1]);
    let err = a.send_unsignaled(SendData::Bytes(huge), None).unwrap_err();
    assert!(
        matches!(&err, Error::LimitExceeded { limit, .. } if *limit == "buffer_size"),
        "{err}"
    );
    let ended = bounded("the connection closes", a.closed()).await;
    assert!(
        ended.is_connection_fatal() && ended.to_string().contains("buffer_size"),
        "{ended}"
    );
    let later = a
        .send_unsignaled(SendData::Bytes(Bytes::from_static(b"x")), None)
        .unwrap_err();
    assert!(later.is_connection_fatal(), "{later}");
}

/// Unsignaled sends (every protocol frame) have no completion anyone waits for: they arrive
/// in order, and one that fails still ends the connection, on the sender's side too.
#[tokio::test]
async fn unsignaled_sends_arrive_in_order_and_a_failed_one_ends_the_connection() {
    let (a, b) = pair().await;
    conformance::unsignaled_sends_in_order(&a, &b, 16 * 1024).await;
    // Larger than any staging receive: the operation fails, nobody waits for it, and the
    // connection ends all the same.
    b.post_recv(recv_buf(16 * 1024)).unwrap();
    a.send_unsignaled(SendData::Bytes(Bytes::from(vec![1; 64 * 1024])), None)
        .unwrap();
    let err = bounded("the connection closes", a.closed()).await;
    assert!(matches!(err, Error::ReceiveTooSmall { .. }), "{err}");
    let later = a
        .send_unsignaled(SendData::Bytes(Bytes::new()), None)
        .unwrap_err();
    assert!(later.is_connection_fatal(), "{later}");
}
#[tokio::test]
async fn write_and_read_move_bytes_exactly_with_no_peer_code() {
    let (a, b) = pair().await;
    conformance::write_and_read_exact(&a, &b, |d| {
        assert!(!d.blob.is_empty(), "the descriptor carries the mmap export")
    })
    .await;
}

#[tokio::test]
async fn write_with_immediate_completes_a_receive() {
    let (a, b) = pair().await;
    let (_, grant) = conformance::write_with_immediate(&a, &b).await;
    let mut buf = grant.revoke().await.unwrap();
    buf.set_len(5);
    assert_eq!(buf.to_vec(), b"hello");
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

/// Bounce windows: the peer reaches the bounce memory, never the buffer: with a kept
/// descriptor after revocation, or past the window. Each set of rights has its own bounce
/// memory, so a read-only window's key writes nothing.
#[tokio::test]
async fn bounce_windows_never_reach_the_buffer_and_keep_their_rights() {
    use crate::memory::MemoryRegion;
    let (a, b) = pair().await;
    let region = MemoryRegion::new(8192).unwrap();
    let mut lease = region.lease(0, 100).unwrap();
    lease.as_mut_slice().fill(7);
    let reader = b.grant_fenced(lease, 0, 100, Access::REMOTE_READ).unwrap();
    let d = reader.descriptor().clone();
    assert_ne!(
        d.addr,
        region.lease(100, 1).unwrap().addr() - 100,
        "not the lease's address"
    );
    let got = a.read(&d, recv_buf(100)).await.unwrap();
    assert_eq!(got.to_vec(), vec![7u8; 100], "the lease's bytes, copied in");
    // The read-only key does not write (the device refuses; the connection ends).
    let mut as_writer = d.clone();
    as_writer.access = Access::REMOTE_WRITE;
    assert!(a
        .write(
            SendData::Bytes(Bytes::from(vec![1u8; 10])),
            &as_writer,
            None
        )
        .await
        .is_err());
    let back = reader.revoke().await.expect("the buffer comes back");
    assert_eq!(back.as_slice(), &[7u8; 100], "unchanged");
    drop(back);

    // A writer: a kept descriptor writes the bounce memory after revocation, not the lease.
    let (a, b) = pair().await;
    let writer = b
        .grant_fenced(region.lease(0, 100).unwrap(), 0, 100, Access::REMOTE_WRITE)
        .unwrap();
    let d = writer.descriptor().clone();
    a.write(SendData::Bytes(Bytes::from(vec![2u8; 50])), &d, None)
        .await
        .unwrap();
    let back = writer.revoke().await.unwrap();
    assert_eq!(&back.as_slice()[..50], &[2u8; 50], "written, copied back");
    assert_eq!(&back.as_slice()[50..], &[7u8; 50], "bytes not written kept");
    a.write(SendData::Bytes(Bytes::from(vec![3u8; 100])), &d, None)
        .await
        .unwrap();
    assert_eq!(
        &back.as_slice()[..50],
        &[2u8; 50],
        "the late write never lands here"
    );
    drop(back);
    assert!(region.lease(0, 8192).unwrap().as_slice()[100..]
        .iter()
        .all(|&x| x == 0));
}

/// A region shared with a connection: its windows need no copy, and the peer reaches the
/// whole region (the trust the application chose) until the share and its windows are gone;
/// then its accesses fail. The share registers once; its windows register nothing.
#[tokio::test]
async fn a_shared_region_is_reachable_whole_until_the_share_ends() {
    use crate::memory::SharedRegion;
    let (a, b) = pair().await;
    let region = SharedRegion::new(8192).unwrap();
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let share = b.share(&region, rw).unwrap();
    let mut lease = region.lease(4096, 64).unwrap();
    lease.write(&[5u8; 64]).unwrap();
    let grant = b
        .grant_fenced(crate::memory::into_registered(lease), 0, 64, rw)
        .unwrap();
    let d = grant.descriptor().clone();
    assert_eq!(
        d.addr,
        region.region().addr() + 4096,
        "in place: the lease's own bytes"
    );
    let got = a.read(&d, recv_buf(64)).await.unwrap();
    assert_eq!(got.to_vec(), vec![5u8; 64]);
    // Past the window, elsewhere in the region: reachable while shared.
    let mut elsewhere = d.clone();
    elsewhere.addr -= 4096;
    a.write(
        SendData::Bytes(Bytes::from(vec![9u8; 16])),
        &elsewhere,
        None,
    )
    .await
    .unwrap();
    let mut seen = [0u8; 16];
    region.lease(0, 16).unwrap().read_at(0, &mut seen).unwrap();
    assert_eq!(
        seen, [9u8; 16],
        "the whole region is the peer's while shared"
    );
    // The share ends once it and its windows are gone: the key is dead.
    drop(grant.revoke().await);
    drop(share);
    assert!(a
        .write(
            SendData::Bytes(Bytes::from(vec![1u8; 16])),
            &elsewhere,
            None
        )
        .await
        .is_err());
    region.lease(0, 16).unwrap().read_at(0, &mut seen).unwrap();
    assert_eq!(seen, [9u8; 16], "nothing written after the share ended");
}

#[tokio::test]
async fn writes_outside_the_region_fail_and_touch_nothing() {
    let (a, b) = pair().await;
    // A window over bytes 8..24 of a 32-byte buffer; the peer lies about the length and
    // writes past the end of the region.
    let grant = b
        .grant(
            RegisteredBuf::new(32, Access::ALL).unwrap(),
            8,
            16,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    let mut d = grant.descriptor().clone();
    d.len = 32;
    let err =
        expect_violation(a.write(SendData::Bytes(Bytes::from(vec![0xff; 32])), &d, None)).await;
    assert!(err.is_connection_fatal(), "{err}");
    assert!(a.send(SendData::Bytes(Bytes::new()), None).await.is_err());
    let _ = bounded("the connection closes", b.closed()).await;
    let mut buf = grant.revoke().await.expect("buffer comes back");
    buf.set_len(32);
    assert!(buf.to_vec().iter().all(|&x| x == 0), "no byte was written");
}

#[tokio::test]
async fn rights_are_enforced_by_the_device_even_for_lying_descriptors() {
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(8, Access::ALL).unwrap(),
            0,
            8,
            Access::REMOTE_READ,
        )
        .unwrap();
    // Honest descriptor: refused before posting.
    let err = expect_violation(a.write(
        SendData::Bytes(Bytes::from_static(b"x")),
        grant.descriptor(),
        None,
    ))
    .await;
    assert!(matches!(
        err,
        Error::RemoteAccess {
            violation: AccessViolation::NotPermitted,
            ..
        }
    ));
    // A descriptor that claims write access: the read-only mmap refuses it.
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(8, Access::ALL).unwrap(),
            0,
            8,
            Access::REMOTE_READ,
        )
        .unwrap();
    let mut d = grant.descriptor().clone();
    d.access = Access::REMOTE_WRITE | Access::REMOTE_READ;
    expect_violation(a.write(SendData::Bytes(Bytes::from_static(b"x")), &d, None)).await;
    let mut buf = grant.revoke().await.unwrap();
    buf.set_len(8);
    assert_eq!(buf.to_vec(), &[0; 8]);
}

#[tokio::test]
async fn misaligned_atomics_and_reads_of_write_only_windows_are_refused() {
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
    let err = expect_violation(a.fetch_and_add(&d, 1)).await;
    assert!(matches!(
        err,
        Error::RemoteAccess {
            violation: AccessViolation::Misaligned,
            ..
        }
    ));
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(16, Access::ALL).unwrap(),
            0,
            16,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    let mut d = grant.descriptor().clone();
    d.access = Access::REMOTE_READ;
    expect_violation(a.read(&d, recv_buf(16))).await;
}

#[tokio::test]
async fn disconnect_completes_every_outstanding_operation() {
    let (a, b) = pair().await;
    let grant = b
        .grant(
            RegisteredBuf::new(1 << 20, Access::ALL).unwrap(),
            0,
            1 << 20,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    let d = grant.descriptor().clone();
    let mut ops = Vec::new();
    for i in 0..64u8 {
        ops.push(a.write(SendData::Bytes(Bytes::from(vec![i; 4096])), &d, None));
    }
    let reads: Vec<_> = (0..16).map(|_| a.read(&d, recv_buf(1 << 20))).collect();
    drop(b);
    // Each completes exactly once, with success or a connection-fatal error.
    for op in ops {
        if let Err(e) = bounded("the write ends", op).await {
            assert!(e.is_connection_fatal(), "{e}");
        }
    }
    for r in reads {
        if let Err(e) = bounded("the read ends", r).await {
            assert!(e.is_connection_fatal(), "{e}");
        }
    }
    let err = bounded("the connection closes", a.closed()).await;
    assert!(err.is_connection_fatal(), "{err}");
    let late = a
        .read(&d.slice(0, 8).unwrap(), recv_buf(8))
        .await
        .unwrap_err();
    assert!(late.is_connection_fatal(), "{late}");
    drop(grant);
}

/// A listener of `t` and `n` clients of it, each with the side the listener accepted: the
/// clients share one context of `t`, the accepted sides another.
async fn clients_of_one_listener(
    t: &DocaTransport,
    n: usize,
) -> (
    Box<dyn crate::transport::Listener>,
    Vec<(super::DocaConnection, Arc<dyn Connection>)>,
) {
    let listener = t.listen("doca://127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let mut pairs = Vec::new();
    for _ in 0..n {
        let (c, s) = tokio::join!(t.connect_doca(&addr), listener.accept());
        pairs.push((c.unwrap(), s.unwrap()));
    }
    (listener, pairs)
}

#[tokio::test]
async fn one_connections_error_leaves_the_others_on_the_same_context_working() {
    let t = transport();
    let (listener, pairs) = clients_of_one_listener(&t, 3).await;
    let addr = listener.local_addr();
    // Connection 0 makes an access error; its server side goes down with it.
    let grant = pairs[0]
        .1
        .grant(
            RegisteredBuf::new(8, Access::ALL).unwrap(),
            0,
            8,
            Access::REMOTE_READ,
        )
        .unwrap();
    let mut d = grant.descriptor().clone();
    d.access = Access::REMOTE_WRITE;
    expect_violation(
        pairs[0]
            .0
            .write(SendData::Bytes(Bytes::from_static(b"x")), &d, None),
    )
    .await;
    let err = bounded("the connection closes", pairs[0].1.closed()).await;
    assert!(err.is_connection_fatal(), "{err}");
    // The others, on the same server context, keep working both ways.
    for (c, s) in &pairs[1..] {
        s.post_recv(recv_buf(8)).unwrap();
        c.send(SendData::Bytes(Bytes::from_static(b"ok")), None)
            .await
            .unwrap();
        assert_eq!(s.recv().await.unwrap().buf.to_vec(), b"ok");
        let g = s
            .grant(
                RegisteredBuf::new(8, Access::ALL).unwrap(),
                0,
                8,
                Access::REMOTE_WRITE,
            )
            .unwrap();
        c.write(
            SendData::Bytes(Bytes::from_static(b"fine")),
            g.descriptor(),
            None,
        )
        .await
        .unwrap();
    }
    // And new connections are still accepted.
    let (c, s) = tokio::join!(t.connect(&addr), listener.accept());
    let (c, s) = (c.unwrap(), s.unwrap());
    s.post_recv(recv_buf(8)).unwrap();
    c.send(SendData::Bytes(Bytes::from_static(b"new")), None)
        .await
        .unwrap();
    assert_eq!(s.recv().await.unwrap().buf.to_vec(), b"new");
}

#[tokio::test]
async fn the_context_connection_limit_refuses_extra_clients() {
    let t = DocaTransport::new(DocaConfig {
        max_connections: 2,
        ..DocaConfig::default()
    })
    .unwrap();
    let listener = t.listen("doca://127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let (c1, s1) = tokio::join!(t.connect(&addr), listener.accept());
    let (c2, s2) = tokio::join!(t.connect(&addr), listener.accept());
    let _keep = (c1.unwrap(), s1.unwrap(), c2.unwrap(), s2.unwrap());
    let err = t.connect(&addr).await.unwrap_err();
    assert!(err.is_connection_fatal(), "{err}");
}

#[tokio::test]
async fn connecting_to_nobody_fails() {
    let t = transport();
    let err = t.connect("doca://127.0.0.1:1").await.unwrap_err();
    assert!(err.to_string().contains("RDMA CM"), "{err}");
    // With the software provider, the error names its one-process limit (a server in another
    // process is the usual reason for this failure there).
    assert!(err.to_string().contains("only within one process"), "{err}");
}

#[tokio::test]
async fn out_of_band_mode_exchanges_blobs_over_a_side_channel() {
    let t = transport();
    let (a, b) = pair_on(&t, "doca+oob://127.0.0.1:0").await;
    assert!(a.peer().starts_with("doca+oob://"), "{}", a.peer());
    b.post_recv(recv_buf(64)).unwrap();
    a.send(SendData::Bytes(Bytes::from_static(b"oob")), Some(3))
        .await
        .unwrap();
    let c = b.recv().await.unwrap();
    assert_eq!((c.buf.to_vec(), c.imm), (b"oob".to_vec(), Some(3)));
    let data = pattern(1 << 20, 9);
    let grant = b
        .grant(
            RegisteredBuf::new(1 << 20, Access::ALL).unwrap(),
            0,
            1 << 20,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    a.write(
        SendData::Bytes(Bytes::from(data.clone())),
        grant.descriptor(),
        None,
    )
    .await
    .unwrap();
    let back = a.read(grant.descriptor(), recv_buf(1 << 20)).await.unwrap();
    assert_eq!(back.to_vec(), &data[..]);
    // Closing one side ends the other through the side channel.
    b.close();
    let err = bounded("the connection closes", a.closed()).await;
    assert!(err.is_connection_fatal(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_mode_moves_bytes() {
    pair_traffic(&transport_with(ProgressMode::BusyPoll)).await;
}

/// A sending connection of `t` (its client side) and the connection it sends to, which has
/// `receives` receives of 16 bytes posted.
async fn sender_and_receiver(
    t: &DocaTransport,
    receives: usize,
) -> (super::DocaConnection, Arc<dyn Connection>) {
    let listener = t.listen("doca://127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr();
    let (sender, receiver) = tokio::join!(t.connect_doca(&addr), listener.accept());
    let (a, b) = (sender.unwrap(), receiver.unwrap());
    for _ in 0..receives {
        b.post_recv(recv_buf(16)).unwrap();
    }
    (a, b)
}

/// A context's idle tasks serve all its connections: the send task that completed on one
/// connection carries the next send of another, named for that connection (its message
/// reaches that connection's peer and nobody else's), also once the connection it last ran
/// on has ended. No task is allocated after the first.
#[tokio::test]
async fn a_contexts_idle_tasks_carry_any_of_its_connections_operations() {
    let t = transport();
    let (_listener, pairs) = clients_of_one_listener(&t, 3).await;
    for (_, s) in &pairs {
        s.post_recv(recv_buf(16)).unwrap();
    }
    let send = |i: usize, message: &'static [u8]| {
        pairs[i]
            .0
            .send(SendData::Bytes(Bytes::from_static(message)), None)
    };
    bounded("the first send", send(0, b"zero")).await.unwrap();
    let (kept, allocated) = pairs[0].0.idle_tasks().expect("event mode");
    assert_eq!(kept, 1, "the completed send task is kept");
    bounded("a send of the next connection", send(1, b"one"))
        .await
        .unwrap();
    assert_eq!(pairs[0].0.idle_tasks(), Some((1, allocated)), "reused");
    for (i, expected) in [(0, &b"zero"[..]), (1, b"one")] {
        let got = bounded("the message", pairs[i].1.recv()).await.unwrap();
        assert_eq!(got.buf.to_vec(), expected, "connection {i}");
    }
    // The task last ran on connection 1, which ends now; connection 2 sends on it.
    pairs[1].0.close();
    bounded("the end reaches the server", pairs[1].1.closed()).await;
    bounded("a send after the task's connection ended", send(2, b"two"))
        .await
        .unwrap();
    let got = bounded("the message", pairs[2].1.recv()).await.unwrap();
    assert_eq!(got.buf.to_vec(), b"two");
    assert_eq!(pairs[0].0.idle_tasks(), Some((1, allocated)), "reused");
}

/// DOCA wants every task of a context freed before the context stops: one whose owner keeps
/// idle tasks for reuse still stops at once (they are freed first), instead of waiting out
/// the stop's limit and leaking the context.
#[tokio::test]
async fn a_context_that_keeps_idle_tasks_stops_cleanly() {
    let t = transport();
    let (a, _b) = sender_and_receiver(&t, 1).await;
    bounded(
        "a send",
        a.send(SendData::Bytes(Bytes::from_static(b"x")), None),
    )
    .await
    .unwrap();
    assert_eq!(a.idle_tasks().map(|(kept, _)| kept), Some(1));
    assert_eq!(a.stop_owner_here(), Some(true), "stopped, not leaked");
}

/// An operation posted while its context's owner is idle is submitted by the posting task
/// itself (no command, no hop to the owner's task). One posted while the owner holds its seat
/// (progressing on another worker thread) goes to it as a command, and so does every later
/// one of the context until that command was handled: the connection's messages arrive in
/// the order they were posted. On a one-thread runtime, so the owner's task runs only where
/// the test awaits.
#[tokio::test]
async fn operations_are_posted_by_their_task_when_the_owner_is_free_and_stay_in_order() {
    let t = transport();
    let (a, b) = sender_and_receiver(&t, 4).await;
    let before = a.direct_posts();
    a.send_frame(b"one").unwrap();
    assert_eq!(a.direct_posts(), before + 1, "posted by the task itself");
    let seat = a.hold_seat().expect("event mode has a seat");
    a.send_frame(b"two").unwrap();
    drop(seat);
    // The owner has not run since: "two" still waits in its queue.
    a.send_frame(b"three").unwrap();
    assert_eq!(
        a.direct_posts(),
        before + 1,
        "queued behind the waiting command"
    );
    for expected in [&b"one"[..], b"two", b"three"] {
        assert_eq!(b.recv().await.unwrap().buf.to_vec(), expected);
    }
    // The owner handled its commands while the test waited: posted directly again.
    a.send_frame(b"four").unwrap();
    assert_eq!(a.direct_posts(), before + 2);
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), b"four");
}

/// On two worker threads the owner progresses, holding its seat, while the sender posts:
/// operations go to it as commands or are submitted directly as the seat allows, and arrive
/// in the order they were posted all the same. Signaled sends keep completions coming, so
/// the owner holds the seat often; the receiver keeps 64 receives posted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_posted_while_the_owner_works_on_another_thread_stay_in_order() {
    const N: u32 = 3_000;
    let t = DocaTransport::new(DocaConfig {
        // Messages that outrun the receiver's receives wait for them, however loaded the
        // machine.
        rnr_timeout: Duration::from_secs(3600),
        ..DocaConfig::default()
    })
    .unwrap();
    let (a, b) = sender_and_receiver(&t, 64).await;
    let a = Arc::new(a);
    let sender = tokio::spawn({
        let a = a.clone();
        async move {
            let mut sent = Vec::with_capacity(32);
            for i in 0..N {
                let message = Bytes::copy_from_slice(&i.to_le_bytes());
                sent.push(a.send(SendData::Bytes(message), None));
                if sent.len() == 32 {
                    for done in sent.drain(..) {
                        done.await.unwrap();
                    }
                }
            }
            for done in sent {
                done.await.unwrap();
            }
        }
    });
    for i in 0..N {
        let got = b.recv().await.unwrap();
        assert_eq!(
            got.buf.as_slice(),
            i.to_le_bytes(),
            "message {i} out of order"
        );
        b.post_recv(recv_buf(16)).unwrap();
    }
    bounded("the sender finishes", sender).await.unwrap();
}

/// A connection whose context's runtime ended fails its operations instead of waiting for
/// completions nobody progresses: the owner left its seat when its task was dropped, so the
/// operation goes to the closed command queue. Both contexts belong to the first runtime.
#[test]
fn operations_on_a_context_whose_runtime_ended_fail() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let t = transport();
    let first = runtime();
    let (a, _b) = first.block_on(sender_and_receiver(&t, 1));
    drop(first);
    runtime().block_on(async {
        let sent = a.send(SendData::Bytes(Bytes::from_static(b"late")), None);
        let err = bounded("the send ends", sent).await.unwrap_err();
        assert!(err.is_connection_fatal(), "{err}");
        assert_eq!(
            a.direct_posts(),
            0,
            "nothing was submitted to the orphaned context"
        );
    });
}

/// A flood of completions is delivered in batches of `DELIVER_BATCH`, with the runtime's
/// other tasks run in between: the receiver reads the first messages while the rest still
/// wait in the engine, so what a batch delivered is still in the cache when it is read. On a
/// one-thread runtime, where the owner's task runs only while the test awaits.
#[tokio::test]
async fn a_flood_of_completions_is_delivered_in_batches_between_other_tasks() {
    use super::engine::DELIVER_BATCH;
    use std::task::{Context, Poll, Waker};
    const N: usize = 4 * DELIVER_BATCH;
    let t = transport();
    let (a, b) = sender_and_receiver(&t, N).await;
    // A round trip first: the receiver's owner registers the staging receives its posts
    // reserved before the flood comes.
    a.send_frame(b"ready").unwrap();
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), b"ready");
    b.post_recv(recv_buf(16)).unwrap();
    // Every message reaches the receiver's context before its owner runs again.
    for i in 0..N {
        a.send_frame(&[i as u8]).unwrap();
    }
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), [0]);
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = 1;
    while let Poll::Ready(message) = b.poll_recv(&mut cx) {
        assert_eq!(message.unwrap().buf.to_vec(), [read as u8]);
        read += 1;
    }
    assert!(
        read <= DELIVER_BATCH,
        "{read} messages were delivered before the receiver ran (batch {DELIVER_BATCH})"
    );
    for i in read..N {
        assert_eq!(b.recv().await.unwrap().buf.to_vec(), [i as u8]);
    }
}

/// DOCA's progress runs one callback per call; the owner gathers up to `GATHER` of them before
/// it handles their events (a first pass asks for their cache lines), and handles them in
/// their order. A flood of sends completes on the sender's engine while its owner waits for
/// the test to await: when it runs, a whole gather waits, and every message arrives in order.
#[tokio::test]
async fn completions_are_handled_a_gather_at_a_time_in_their_order() {
    use super::engine::GATHER;
    const N: usize = 4 * GATHER;
    let t = transport();
    let (a, b) = sender_and_receiver(&t, N).await;
    a.send_frame(b"ready").unwrap();
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), b"ready");
    b.post_recv(recv_buf(16)).unwrap();
    assert!(a.largest_batch() < GATHER, "{}", a.largest_batch());
    for i in 0..N {
        a.send_frame(&[i as u8]).unwrap();
    }
    for i in 0..N {
        assert_eq!(b.recv().await.unwrap().buf.to_vec(), [i as u8]);
    }
    assert_eq!(a.largest_batch(), GATHER);
}

/// The owner's first pass asks the CPU for where each message will be copied: the hint
/// follows the connection's first posted receive as receives are posted and filled, and says
/// nowhere once none is posted or the connection has failed.
#[tokio::test]
async fn the_next_receive_hint_follows_the_first_posted_receive() {
    let t = transport();
    let (a, b) = sender_and_receiver(&t, 1).await;
    let bufs = [recv_buf(16), recv_buf(16), recv_buf(16)];
    let at: Vec<usize> = bufs.iter().map(|b| b.addr() as usize).collect();
    let [first, second, third] = bufs;
    assert_eq!(a.next_receive(), 0);
    a.post_recv(first).unwrap();
    assert_eq!(a.next_receive(), at[0]);
    a.post_recv(second).unwrap();
    assert_eq!(a.next_receive(), at[0]);
    for (i, message) in [&b"one"[..], b"two"].into_iter().enumerate() {
        b.send(SendData::Bytes(Bytes::from_static(message)), None)
            .await
            .unwrap();
        let got = a.recv().await.unwrap();
        assert_eq!(
            (got.buf.to_vec(), got.buf.addr() as usize),
            (message.to_vec(), at[i])
        );
        assert_eq!(a.next_receive(), if i == 0 { at[1] } else { 0 });
    }
    a.post_recv(third).unwrap();
    assert_eq!(a.next_receive(), at[2]);
    a.close();
    a.closed().await;
    assert_eq!(a.next_receive(), 0);
}

/// Busy-poll contexts share the polling thread's engine with other contexts: their operations
/// always go to the thread as commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_poll_operations_go_to_the_polling_thread() {
    let t = transport_with(ProgressMode::BusyPoll);
    let (a, b) = sender_and_receiver(&t, 1).await;
    assert!(a.hold_seat().is_none());
    a.send_frame(b"polled").unwrap();
    assert_eq!(b.recv().await.unwrap().buf.to_vec(), b"polled");
    assert_eq!(a.direct_posts(), 0);
}

/// Sends, receives and atomics between a pair of connections of `t`, in whatever progress mode
/// it runs.
async fn pair_traffic(t: &DocaTransport) {
    let (a, b) = pair_on(t, "doca://127.0.0.1:0").await;
    for i in 0..32u8 {
        b.post_recv(recv_buf(64)).unwrap();
        a.send(SendData::Bytes(Bytes::from(vec![i; 40])), None)
            .await
            .unwrap();
        assert_eq!(b.recv().await.unwrap().buf.to_vec(), &[i; 40][..]);
    }
    let grant = b
        .grant(
            RegisteredBuf::new(8, Access::ALL).unwrap(),
            0,
            8,
            Access::REMOTE_ATOMIC,
        )
        .unwrap();
    assert_eq!(a.fetch_and_add(grant.descriptor(), 2).await.unwrap(), 0);
    assert_eq!(a.fetch_and_add(grant.descriptor(), 2).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spin_mode_moves_bytes() {
    pair_traffic(&transport_with(ProgressMode::Spin)).await;
}

/// With a window longer than the test, the owners never arm their notification or sleep:
/// every command and completion goes through the spinning path, on a one-thread runtime whose
/// other tasks (the test's own) still run between polls. Run on a thread of its own, so that
/// an owner that never yields fails the test instead of hanging it.
#[test]
fn spinning_owners_leave_the_runtime_to_other_tasks() {
    crate::tests::on_a_thread_of_its_own("spin-mode traffic on a one-thread runtime", || async {
        let t = DocaTransport::new(DocaConfig {
            progress: ProgressMode::Spin,
            spin: Duration::from_secs(3600),
            ..DocaConfig::default()
        })
        .unwrap();
        pair_traffic(&t).await;
        // A task of the test's own, gated by another, while the owners spin.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let other = tokio::spawn(async move { rx.await.unwrap() + 1 });
        tx.send(41).unwrap();
        assert_eq!(other.await.unwrap(), 42);
    });
}

#[tokio::test]
async fn bad_addresses_are_reported() {
    let t = transport();
    let err = t.connect("tcp://1.2.3.4:5").await.unwrap_err();
    assert!(err.to_string().contains("doca://"), "{err}");
    let err = t.connect("doca://nohost").await.unwrap_err();
    assert!(err.to_string().contains("<ip>:<port>"), "{err}");
}

#[tokio::test]
async fn frozen_region_leases_are_sent_without_a_staging_copy() {
    use crate::memory::MemoryRegion;
    let t = transport();
    let (a, b) = pair_on(&t, "doca://127.0.0.1:0").await;
    let region = MemoryRegion::new(1 << 20).unwrap();
    let mut lease = region.lease(8192, 100_000).unwrap();
    lease.as_mut_slice().copy_from_slice(&pattern(100_000, 5));
    let frozen = lease.freeze();
    let grant = b
        .grant(
            RegisteredBuf::new(100_000, Access::ALL).unwrap(),
            0,
            100_000,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    let before = t.staging.acquired();
    a.write(
        SendData::Bytes(frozen.slice(1000..)),
        grant.descriptor(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(t.staging.acquired(), before, "no staging copy");
    a.write(
        SendData::Bytes(Bytes::from(pattern(1000, 5))),
        grant.descriptor(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(t.staging.acquired(), before + 1, "plain bytes are copied");
    let mut got = grant.revoke().await.unwrap();
    got.set_len(100_000);
    // The lease's bytes from 1000 on went to the start of the window, then plain bytes over
    // its first 1000.
    let want = pattern(100_000, 5);
    assert!(got.to_vec()[..1000] == want[..1000], "the plain bytes");
    assert!(
        got.to_vec()[1000..99_000] == want[2000..],
        "the lease's bytes"
    );
    drop(frozen);
    assert_eq!(
        region.leased(),
        0,
        "the lease comes back once the bytes are gone"
    );
}

/// In event and spin modes a client context is progressed by a task on the runtime it was
/// made on, so connects share a context only with connects made on the same runtime: each
/// runtime of a thread-per-core application gets contexts of its own, and its connections'
/// completions are handled on its thread. Busy poll shares them across runtimes (its one
/// polling thread progresses every context). A context whose runtime ended is let go, and the
/// next connect makes a new one rather than joining a context nobody progresses.
#[test]
fn connects_share_a_client_context_only_within_their_runtime() {
    for (progress, two_runtimes) in [
        (ProgressMode::Event, 2),
        (ProgressMode::Spin, 2),
        (ProgressMode::BusyPoll, 1),
    ] {
        let t = transport_with(progress);
        let server = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = server.block_on(t.listen("doca://127.0.0.1:0")).unwrap();
        let addr = listener.local_addr();
        // The server keeps what it accepts and echoes the first message of each connection.
        server.spawn(async move {
            while let Ok(c) = listener.accept().await {
                tokio::spawn(async move {
                    c.post_recv(recv_buf(64)).unwrap();
                    let got = c.recv().await.unwrap().buf.to_vec();
                    c.send(SendData::Bytes(Bytes::from(got)), None)
                        .await
                        .unwrap();
                    std::future::pending::<()>().await;
                });
            }
        });
        let contexts = || server.block_on(t.client_contexts());
        // A runtime of its own (as a core's thread has) makes `n` connections and checks each
        // one round trip on it.
        let connect_on_a_runtime = |n: usize| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let conns = runtime.block_on(async {
                let mut conns = Vec::new();
                for i in 0..n {
                    let c = bounded("connect", t.connect(&addr)).await.unwrap();
                    c.post_recv(recv_buf(64)).unwrap();
                    c.send(SendData::Bytes(Bytes::from(vec![i as u8; 8])), None)
                        .await
                        .unwrap();
                    let back = bounded("echo", c.recv()).await.unwrap();
                    assert_eq!(back.buf.to_vec(), vec![i as u8; 8], "{progress:?}");
                    conns.push(c);
                }
                conns
            });
            (runtime, conns)
        };
        let (a, a_conns) = connect_on_a_runtime(2);
        assert_eq!(contexts(), 1, "{progress:?}: one runtime's connects share");
        let (b, b_conns) = connect_on_a_runtime(1);
        assert_eq!(contexts(), two_runtimes, "{progress:?}: another runtime");
        drop(a_conns);
        drop(a);
        // Event and spin: b's context is left, a's ended with its runtime; busy poll: the
        // shared one.
        assert_eq!(contexts(), 1, "{progress:?}: after runtime a ended");
        // And b's connection still works: it never depended on a's runtime.
        b.block_on(async {
            let c = &b_conns[0];
            c.post_recv(recv_buf(64)).unwrap();
            let sent = c.send(SendData::Bytes(Bytes::from_static(b"still here")), None);
            bounded("a send after runtime a ended", sent).await.unwrap();
        });
        // A runtime that comes later works, on a context of its own in event and spin modes.
        let (c, c_conns) = connect_on_a_runtime(1);
        assert_eq!(contexts(), two_runtimes, "{progress:?}: runtimes b and c");
        drop((b_conns, c_conns, b, c));
    }
}
