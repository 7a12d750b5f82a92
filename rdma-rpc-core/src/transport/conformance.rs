//! Checks every transport must pass, shared by the transports' test suites.

use std::sync::Arc;

use bytes::Bytes;

use super::{
    Connection, Descriptor, Fencing, Grant, RecvCompletion, RecvOpcode, SendData, Transport,
};
use crate::memory::{Access, RegisteredBuf};
use crate::tests::wakes::Wakes;

/// A connected pair from a listener at `addr`: (client side, server side).
pub(crate) async fn pair_on(
    t: &dyn Transport,
    addr: &str,
) -> (Arc<dyn Connection>, Arc<dyn Connection>) {
    let listener = t.listen(addr).await.unwrap();
    let addr = listener.local_addr();
    let (client, server) = tokio::join!(t.connect(&addr), listener.accept());
    (client.unwrap(), server.unwrap())
}

pub(crate) fn recv_buf(cap: usize) -> RegisteredBuf {
    RegisteredBuf::new(cap, Access::LOCAL_WRITE).unwrap()
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Two sends land in order in posted receives, the second with immediate data.
pub(crate) async fn send_with_immediate(a: &Arc<dyn Connection>, b: &Arc<dyn Connection>) {
    b.post_recv(recv_buf(1024)).unwrap();
    b.post_recv(recv_buf(1024)).unwrap();
    a.send(SendData::Bytes(Bytes::from_static(b"first")), None)
        .await
        .unwrap();
    a.send(SendData::Bytes(Bytes::from_static(b"second")), Some(0xfeed))
        .await
        .unwrap();
    let c1 = b.recv().await.unwrap();
    assert_eq!(c1.buf.to_vec(), b"first");
    assert_eq!((c1.opcode, c1.imm), (RecvOpcode::Send, None));
    let c2 = b.recv().await.unwrap();
    assert_eq!(c2.buf.to_vec(), b"second");
    assert_eq!((c2.opcode, c2.imm), (RecvOpcode::SendWithImm, Some(0xfeed)));
}

/// A reader whose polls find nothing stays registered, however many times it polls (the
/// transport may skip its lock for those polls): the next message wakes it, and is there when
/// it polls again.
pub(crate) async fn polls_that_find_nothing_keep_the_reader_registered(
    a: &Arc<dyn Connection>,
    b: &Arc<dyn Connection>,
) {
    let (wakes, waker) = Wakes::new();
    let mut cx = std::task::Context::from_waker(&waker);
    b.post_recv(recv_buf(64)).unwrap();
    b.post_recv(recv_buf(64)).unwrap();
    for (message, polls_before) in [(&b"one"[..], 1), (&b"two"[..], 3)] {
        for _ in 0..polls_before {
            assert!(b.poll_recv(&mut cx).is_pending());
        }
        let before = wakes.count();
        a.send(SendData::Bytes(Bytes::from_static(message)), None)
            .await
            .unwrap();
        // A bound on a hang, not a sequencing sleep: the wake is what is awaited.
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while wakes.count() == before {
                wakes.next().await;
            }
        })
        .await
        .expect("the reader stays registered and is woken by the next message");
        // Woken by it: the completion is there for the next poll.
        match b.poll_recv(&mut cx) {
            std::task::Poll::Ready(Ok(c)) => assert_eq!(c.buf.as_slice(), message),
            other => panic!("woken for a message that is not there: {other:?}"),
        }
        b.post_recv(recv_buf(64)).unwrap();
    }
}

/// Unsignaled sends (every protocol frame is one) land in order in posted receives of
/// `max_recv`, the last with immediate data; a frame sent from memory its sender reuses at
/// once (`send_frame`, as the protocol does) lands as it was when sent.
pub(crate) async fn unsignaled_sends_in_order(
    a: &Arc<dyn Connection>,
    b: &Arc<dyn Connection>,
    max_recv: usize,
) {
    for _ in 0..3 {
        b.post_recv(recv_buf(max_recv)).unwrap();
    }
    a.send_unsignaled(SendData::Bytes(Bytes::from_static(b"one")), None)
        .unwrap();
    let mut frame = *b"frame";
    a.send_frame(&frame).unwrap();
    frame.copy_from_slice(b"XXXXX");
    a.send_unsignaled(SendData::Bytes(Bytes::from_static(b"two")), Some(2))
        .unwrap();
    assert_eq!(b.recv().await.unwrap().buf.as_slice(), b"one");
    let second = b.recv().await.unwrap();
    assert_eq!((second.buf.as_slice(), second.imm), (&b"frame"[..], None));
    let third = b.recv().await.unwrap();
    assert_eq!((third.buf.as_slice(), third.imm), (&b"two"[..], Some(2)));
}

/// Writes then reads back every size up to 16 MiB through a window, with no code on the
/// peer; `check` looks at each descriptor.
pub(crate) async fn write_and_read_exact(
    a: &Arc<dyn Connection>,
    b: &Arc<dyn Connection>,
    check: impl Fn(&Descriptor),
) {
    for len in [0usize, 1, 4095, 4096, 65_537, 16 << 20] {
        let data = pattern(len, len as u8);
        let target = RegisteredBuf::new(len, Access::ALL).unwrap();
        let grant = b
            .grant(target, 0, len, Access::REMOTE_WRITE | Access::REMOTE_READ)
            .unwrap();
        let desc = grant.descriptor().clone();
        check(&desc);
        a.write(SendData::Bytes(Bytes::from(data.clone())), &desc, None)
            .await
            .unwrap();
        let back = a
            .read(&desc, RegisteredBuf::new(len, Access::LOCAL_WRITE).unwrap())
            .await
            .unwrap();
        assert_eq!(back.to_vec(), &data[..], "read back {len} bytes");
        let mut target = grant.revoke().await.unwrap();
        target.set_len(len);
        assert_eq!(target.to_vec(), &data[..], "the peer sees {len} bytes");
    }
}

/// A write with immediate data completes a receive on the peer; returns that completion and
/// the window written.
pub(crate) async fn write_with_immediate(
    a: &Arc<dyn Connection>,
    b: &Arc<dyn Connection>,
) -> (RecvCompletion, Grant) {
    let grant = b
        .grant(
            RegisteredBuf::new(64, Access::ALL).unwrap(),
            0,
            64,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    b.post_recv(recv_buf(16)).unwrap();
    a.write(
        SendData::Bytes(Bytes::from_static(b"hello")),
        grant.descriptor(),
        Some(7),
    )
    .await
    .unwrap();
    let c = b.recv().await.unwrap();
    assert_eq!((c.opcode, c.imm), (RecvOpcode::WriteWithImm, Some(7)));
    assert!(c.buf.is_empty());
    (c, grant)
}

/// Fetch-and-add and compare-and-swap on two 8-byte words of a window.
pub(crate) async fn atomics(a: &Arc<dyn Connection>, b: &Arc<dyn Connection>) {
    let grant = b
        .grant(
            RegisteredBuf::new(16, Access::ALL).unwrap(),
            0,
            16,
            Access::REMOTE_ATOMIC,
        )
        .unwrap();
    let d = grant.descriptor().clone();
    assert_eq!(a.fetch_and_add(&d, 5).await.unwrap(), 0);
    assert_eq!(a.fetch_and_add(&d, 3).await.unwrap(), 5);
    assert_eq!(a.compare_and_swap(&d, 1, 100).await.unwrap(), 8, "no swap");
    assert_eq!(a.compare_and_swap(&d, 8, 100).await.unwrap(), 8, "swap");
    let second = d.slice(8, 8).unwrap();
    assert_eq!(a.fetch_and_add(&second, u64::MAX).await.unwrap(), 0);
    let mut buf = grant.revoke().await.unwrap();
    buf.set_len(16);
    let word = |i: usize| u64::from_ne_bytes(buf.to_vec()[i..i + 8].try_into().unwrap());
    assert_eq!(word(0), 100);
    assert_eq!(word(8), u64::MAX);
}

/// A send posted after a write reaches the peer after the write's bytes (RC ordering), in
/// both directions, for a [`write`](Connection::write) and a
/// [`write_posted`](Connection::write_posted): the protocol's write slots and pushed results
/// rely on it, and so does a handler that posts a write ahead of its response.
pub(crate) async fn writes_land_before_later_sends(
    a: &Arc<dyn Connection>,
    b: &Arc<dyn Connection>,
) {
    let ways = [false, true].map(|posted| [(a, b, posted), (b, a, posted)]);
    for (from, to, posted) in ways.into_iter().flatten() {
        let len = 1 << 20;
        let data = pattern(len, 9);
        let target = RegisteredBuf::new(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        let grant = to.grant(target, 0, len, Access::REMOTE_WRITE).unwrap();
        to.post_recv(recv_buf(64)).unwrap();
        // Neither is awaited before the other is posted.
        let src = SendData::Bytes(Bytes::from(data.clone()));
        let write = if posted {
            from.write_posted(src, grant.descriptor())
        } else {
            from.write(src, grant.descriptor(), None)
        };
        let send = from.send(SendData::Bytes(Bytes::from_static(b"after")), None);
        let done = to.recv().await.unwrap();
        assert_eq!(done.buf.to_vec(), b"after");
        let mut target = grant.revoke().await.unwrap();
        target.set_len(len);
        assert!(
            target.to_vec() == data[..],
            "the write was not in place before the send"
        );
        write.await.unwrap();
        send.await.unwrap();
    }
}

/// One-sided operations on leases of memory regions, on both sides: the bytes land exactly in
/// the leased range of the target region, a write sends from a lease and a read lands in one,
/// with nothing copied or touched around them.
pub(crate) async fn region_leases_in_place(a: &Arc<dyn Connection>, b: &Arc<dyn Connection>) {
    use crate::memory::MemoryRegion;
    const AT: usize = 4096 + 104;
    const LEN: usize = 1000;
    let (ours, theirs) = (
        MemoryRegion::new(64 << 10).unwrap(),
        MemoryRegion::new(64 << 10).unwrap(),
    );
    let grant = b
        .grant(
            theirs.lease(AT, LEN).unwrap(),
            0,
            LEN,
            Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        )
        .unwrap();
    let desc = grant.descriptor().clone();
    // When a write completes the transport holds nothing of its source: the same bytes can be
    // leased again at once (a caller reusing its slot must not race the transport).
    for round in 0..2000u32 {
        let src = ours.lease(100, 64).unwrap();
        a.write(SendData::Registered(src), &desc.slice(0, 64).unwrap(), None)
            .await
            .unwrap();
        assert!(
            ours.lease(100, LEN).is_ok(),
            "round {round}: the write's source is still held after it completed"
        );
    }
    let mut src = ours.lease(100, LEN).unwrap();
    src.as_mut_slice().copy_from_slice(&pattern(LEN, 3));
    a.write(SendData::Registered(src), &desc, None)
        .await
        .unwrap();
    assert_eq!(
        a.fetch_and_add(&desc.slice(8, 8).unwrap(), 1)
            .await
            .unwrap(),
        u64::from_ne_bytes(pattern(LEN, 3)[8..16].try_into().unwrap())
    );
    let back = a.read(&desc, ours.lease(8192, LEN).unwrap()).await.unwrap();
    let mut want = pattern(LEN, 3);
    let added = u64::from_ne_bytes(want[8..16].try_into().unwrap()).wrapping_add(1);
    want[8..16].copy_from_slice(&added.to_ne_bytes());
    assert_eq!(back.to_vec(), &want[..], "read into a lease");
    drop(back);
    drop(grant.revoke().await);
    let whole = theirs.lease(0, theirs.len()).unwrap();
    assert_eq!(
        &whole.to_vec()[AT..AT + LEN],
        &want[..],
        "in the leased range"
    );
    assert!(
        whole.to_vec()[..AT].iter().all(|&x| x == 0),
        "nothing before"
    );
    assert!(
        whole.to_vec()[AT + LEN..].iter().all(|&x| x == 0),
        "nothing after"
    );
    let ours = ours.lease(0, ours.len()).unwrap();
    assert_eq!(&ours.to_vec()[8192..8192 + LEN], &want[..]);
    assert!(ours.to_vec()[8192 + LEN..].iter().all(|&x| x == 0));
}

/// A fenced grant of a lease: the peer reaches the window's bytes and no others, even with a
/// descriptor that lies about its length, and nothing once the grant is revoked. A transport
/// that can revoke refuses those accesses; one that cannot (DOCA) serves the window from
/// bounce memory, where they may land, but never in the lease. Each refusal is fatal to the
/// connection (as on RDMA), so `pair` makes a fresh one per case.
pub(crate) async fn fenced_grants_cut_the_peer_off<F, Fut>(pair: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (Arc<dyn Connection>, Arc<dyn Connection>)>,
{
    use crate::memory::MemoryRegion;
    let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
    // Past the end: the descriptor claims 32 more bytes than the window has.
    let (a, b) = pair().await;
    let region = MemoryRegion::new(8192).unwrap();
    let grant = b
        .grant_fenced(region.lease(4096, 64).unwrap(), 0, 64, rw)
        .unwrap();
    let mut lying = grant.descriptor().clone();
    lying.len += 32;
    let data = Bytes::from(vec![0xAB; 96]);
    let refused = b.fencing() == Fencing::Revocable;
    let lied = a.write(SendData::Bytes(data), &lying, None).await;
    assert!(lied.is_err() || !refused, "refused where the transport can");
    drop(grant.revoke().await);
    let whole = region.lease(0, 8192).unwrap();
    assert!(
        whole.to_vec()[4096 + 64..].iter().all(|&x| x == 0),
        "nothing past the window"
    );
    drop(whole);
    // After revocation.
    let (a, b) = pair().await;
    let grant = b
        .grant_fenced(region.lease(0, 64).unwrap(), 0, 64, rw)
        .unwrap();
    let d = grant.descriptor().clone();
    let first = Bytes::from(vec![1u8; 64]);
    a.write(SendData::Bytes(first), &d, None).await.unwrap();
    let buf = grant
        .revoke()
        .await
        .expect("the connection is up: the buffer comes back");
    assert_eq!(buf.to_vec(), &[1u8; 64]);
    let late = Bytes::from(vec![2u8; 64]);
    let wrote = a.write(SendData::Bytes(late), &d, None).await;
    assert!(
        wrote.is_err() || !refused,
        "refused where the transport can"
    );
    let read = a.read(&d, recv_buf(64)).await;
    assert!(read.is_err() || !refused, "refused where the transport can");
    assert_eq!(
        buf.to_vec(),
        &[1u8; 64],
        "a revoked window is never written"
    );
}
