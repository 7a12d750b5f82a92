//! A fault-injection transport over the software transport, and the tests on it:
//! - a randomized one: operations are delayed (which reorders what different connections do)
//!   and connections are dropped at random points, on both sides; every call still completes
//!   exactly once, with its exact bytes or a status, and no server buffer leaks;
//! - a connection whose frames never stop arriving still lets the runtime serve the others;
//! - a frame that lands just as a client's handshake looked for one still wakes it;
//! - a call that starts to wait while another call reads its connection reads nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use super::e2e::{inbound, outbound, BLOB_READ, BLOB_WRITE, MSG_RECEIVE, MSG_SEND};
use super::{bounded, pattern, tcp, Harness};
use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::protocol::frames::{Frame, Kind};
use crate::transport::{
    BoxFuture, Connection, Descriptor, Fencing, Grant, Listener, RecvCompletion, RecvOpcode,
    SendData, Transport,
};
use crate::ServerConfig;

/// A small deterministic generator (xorshift), one per connection, seeded by the test.
#[derive(Debug)]
struct Dice(AtomicU64);

impl Dice {
    fn roll(&self, below: u64) -> u64 {
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        x % below.max(1)
    }
}

/// How often things go wrong: one operation in `disconnect_one_in` drops the connection
/// before it is posted; every operation's completion is delayed up to `max_delay_us`. Both
/// 0: no faults. With `flood`, a connection that has received a request finds another frame
/// every time it looks, without end (see [`FaultyConnection::flooded`]). With
/// `late_first_read`, a connection's first read finds nothing and its waker is woken at once,
/// as when a frame lands right after the reader looked.
#[derive(Debug, Default)]
struct Faults {
    disconnect_one_in: AtomicU64,
    max_delay_us: AtomicU64,
    flood: AtomicBool,
    late_first_read: AtomicBool,
    /// Posted writes are refused when posted, as a full send queue refuses them (the
    /// connection stays up).
    refuse_posted_writes: AtomicBool,
    /// Reads of the connections the client dialled (not a fault: a count).
    client_reads: AtomicU64,
}

impl Faults {
    fn set(&self, disconnect_one_in: u64, max_delay_us: u64) {
        self.disconnect_one_in
            .store(disconnect_one_in, Ordering::Relaxed);
        self.max_delay_us.store(max_delay_us, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct FaultyTransport {
    inner: Arc<dyn Transport>,
    faults: Arc<Faults>,
    seeds: AtomicU64,
}

impl FaultyTransport {
    fn wrap(&self, conn: Arc<dyn Connection>, dialled: bool) -> Arc<dyn Connection> {
        let seed = self
            .seeds
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            | 1;
        Arc::new(FaultyConnection {
            inner: conn,
            faults: self.faults.clone(),
            dice: Dice(AtomicU64::new(seed)),
            requested: AtomicBool::new(false),
            read: AtomicBool::new(false),
            dialled,
        })
    }
}

/// A faulty transport over TCP with `faults`, its connections' dice seeded from `seed`.
fn faulty_tcp(faults: Arc<Faults>, seed: u64) -> Arc<Faulty> {
    Arc::new(Faulty(Arc::new(FaultyTransport {
        inner: tcp(),
        faults,
        seeds: AtomicU64::new(seed),
    })))
}

#[derive(Debug)]
struct FaultyListener {
    inner: Box<dyn Listener>,
    transport: Arc<FaultyTransport>,
}

impl Listener for FaultyListener {
    fn accept(&self) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        Box::pin(async move { Ok(self.transport.wrap(self.inner.accept().await?, false)) })
    }

    fn local_addr(&self) -> String {
        self.inner.local_addr()
    }
}

/// The transport, shared so that listeners wrap what they accept.
#[derive(Debug, Clone)]
struct Faulty(Arc<FaultyTransport>);

impl Transport for Faulty {
    fn listen(&self, addr: &str) -> BoxFuture<'_, Result<Box<dyn Listener>>> {
        let addr = addr.to_owned();
        Box::pin(async move {
            let inner = self.0.inner.listen(&addr).await?;
            Ok(Box::new(FaultyListener {
                inner,
                transport: self.0.clone(),
            }) as Box<dyn Listener>)
        })
    }

    fn connect(&self, addr: &str) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        let addr = addr.to_owned();
        Box::pin(async move { Ok(self.0.wrap(self.0.inner.connect(&addr).await?, true)) })
    }

    fn fencing(&self) -> Fencing {
        self.0.inner.fencing()
    }
}

#[derive(Debug)]
struct FaultyConnection {
    inner: Arc<dyn Connection>,
    faults: Arc<Faults>,
    dice: Dice,
    /// A request frame has come through (the flood starts after it).
    requested: AtomicBool,
    /// The connection was read once.
    read: AtomicBool,
    /// A client's connection (counted in `Faults::client_reads`).
    dialled: bool,
}

/// The capacity of the receives the flood makes up: no receive the framework posts is this
/// small, so a made-up receive given back is recognized and not posted to the connection.
const FLOODED: usize = 1;

impl FaultyConnection {
    /// With the flood on, once a request came through: an empty frame (a credit update that
    /// grants nothing), as from a peer whose frames arrive faster than they are read.
    fn flooded(&self) -> Option<Result<RecvCompletion>> {
        if !(self.faults.flood.load(Ordering::Relaxed) && self.requested.load(Ordering::Relaxed)) {
            return None;
        }
        Some(
            RegisteredBuf::new(FLOODED, Access::LOCAL_WRITE).map(|buf| RecvCompletion {
                buf,
                opcode: RecvOpcode::Send,
                imm: None,
                write_len: 0,
            }),
        )
    }

    /// Maybe drops the connection; returns the delay to wait before posting.
    fn strike(&self) -> Duration {
        let one_in = self.faults.disconnect_one_in.load(Ordering::Relaxed);
        if one_in > 0 && self.dice.roll(one_in) == 0 {
            self.inner.close();
        }
        let max = self.faults.max_delay_us.load(Ordering::Relaxed);
        Duration::from_micros(self.dice.roll(max + 1))
    }

    /// Posts `op` after the delay (the operation keeps its place in this connection's order:
    /// RDMA never reorders one connection's operations, only connections among each other).
    fn delayed<T: Send + 'static>(
        &self,
        op: BoxFuture<'static, Result<T>>,
    ) -> BoxFuture<'static, Result<T>> {
        let delay = self.strike();
        Box::pin(async move {
            let result = op.await;
            tokio::time::sleep(delay).await;
            result
        })
    }
}

impl Connection for FaultyConnection {
    fn peer(&self) -> &str {
        self.inner.peer()
    }

    fn post_recv(&self, buf: RegisteredBuf) -> Result<()> {
        if buf.capacity() == FLOODED {
            return Ok(());
        }
        self.inner.post_recv(buf)
    }

    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<RecvCompletion>> {
        if self.dialled {
            self.faults.client_reads.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(made_up) = self.flooded() {
            return Poll::Ready(made_up);
        }
        if self.faults.late_first_read.load(Ordering::Relaxed)
            && !self.read.swap(true, Ordering::Relaxed)
        {
            // Nothing yet; then a frame lands at once and the transport wakes the waker this
            // read left, before the reader looks again. (The frame is the inner transport's,
            // found by the next read: this one leaves no waker there.)
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let received = ready!(self.inner.poll_recv(cx));
        if let Ok(c) = &received {
            let frame = <Frame as prost::Message>::decode(c.buf.as_slice());
            if matches!(
                frame,
                Ok(Frame {
                    kind: Some(Kind::Request(_)),
                    ..
                })
            ) {
                self.requested.store(true, Ordering::Relaxed);
            }
        }
        Poll::Ready(received)
    }

    fn send(&self, data: SendData, imm: Option<u32>) -> BoxFuture<'static, Result<()>> {
        self.delayed(self.inner.send(data, imm))
    }

    fn send_unsignaled(&self, data: SendData, imm: Option<u32>) -> Result<()> {
        self.strike();
        self.inner.send_unsignaled(data, imm)
    }

    fn write(
        &self,
        src: SendData,
        dst: &Descriptor,
        imm: Option<u32>,
    ) -> BoxFuture<'static, Result<()>> {
        self.delayed(self.inner.write(src, dst, imm))
    }

    fn write_posted(&self, src: SendData, dst: &Descriptor) -> BoxFuture<'static, Result<()>> {
        if self.faults.refuse_posted_writes.load(Ordering::Relaxed) {
            return Box::pin(std::future::ready(Err(Error::LimitExceeded {
                limit: "max_outstanding",
                max: 0,
                actual: 1,
            })));
        }
        self.delayed(self.inner.write_posted(src, dst))
    }

    fn read(
        &self,
        src: &Descriptor,
        dst: RegisteredBuf,
    ) -> BoxFuture<'static, Result<RegisteredBuf>> {
        self.delayed(self.inner.read(src, dst))
    }

    fn compare_and_swap(
        &self,
        dst: &Descriptor,
        expected: u64,
        new: u64,
    ) -> BoxFuture<'static, Result<u64>> {
        self.delayed(self.inner.compare_and_swap(dst, expected, new))
    }

    fn fetch_and_add(&self, dst: &Descriptor, add: u64) -> BoxFuture<'static, Result<u64>> {
        self.delayed(self.inner.fetch_and_add(dst, add))
    }

    fn grant(
        &self,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant> {
        self.inner.grant(buf, offset, len, access)
    }

    fn fencing(&self) -> Fencing {
        self.inner.fencing()
    }

    fn close(&self) {
        self.inner.close()
    }

    fn closed(&self) -> BoxFuture<'_, Error> {
        self.inner.closed()
    }
}

/// Calls of every operation and size from several clients while connections drop at random
/// and operations are delayed: each call ends once, byte-exact or with a status, and after
/// the storm every server buffer is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_completes_once_and_no_buffer_leaks_under_faults() {
    for seed in 1..=4u64 {
        let faults = Arc::new(Faults::default());
        let transport = faulty_tcp(faults.clone(), seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let config = ServerConfig {
            min_buffers: 2,
            max_buffers: 2,
            transfer_timeout: Duration::from_secs(2),
            buffer_wait: Duration::from_secs(2),
            // The leak check below takes both buffers from one connection.
            pool_share_percent: 100,
            ..ServerConfig::default()
        };
        let h = Harness::start(transport.clone(), config).await;
        faults.set(40, 300);
        let (mut ok, mut failed) = (0u32, 0u32);
        for round in 0..6u32 {
            let Ok(client) = crate::Client::builder()
                .transport(transport.clone())
                .connect(&h.addr)
                .await
            else {
                failed += 8;
                continue;
            };
            let calls: Vec<_> = (0..8u32)
                .map(|i| {
                    let client = client.clone();
                    let seed = round * 8 + i;
                    let len = [10, 9_000, 70_000, 300_000][i as usize % 4];
                    let small = len.min(4000);
                    tokio::spawn(async move {
                        match i % 4 {
                            0 => inbound(&client, MSG_SEND, small, seed)
                                .await
                                .map(|r| r.exact),
                            1 => inbound(&client, BLOB_WRITE, len, seed)
                                .await
                                .map(|r| r.exact),
                            2 => outbound(&client, MSG_RECEIVE, small, seed)
                                .await
                                .map(|d| d == pattern(small, seed)),
                            _ => outbound(&client, BLOB_READ, len, seed)
                                .await
                                .map(|d| d == pattern(len, seed)),
                        }
                    })
                })
                .collect();
            for call in calls {
                match bounded("a call under faults", call).await.unwrap() {
                    Ok(exact) => {
                        assert!(exact, "a call that succeeded returned wrong bytes");
                        ok += 1;
                    }
                    Err(_status) => failed += 1,
                }
            }
        }
        assert_eq!(ok + failed, 6 * 8, "every call ended once");
        // No leak: with the faults off, two calls hold both buffers of the blob path at once.
        faults.set(0, 0);
        let client = crate::Client::builder()
            .transport(transport.clone())
            .connect(&h.addr)
            .await
            .expect("a connection without faults");
        let before = h.service.inbound_runs.load(Ordering::SeqCst)
            + h.service.outbound_runs.load(Ordering::SeqCst);
        let held: Vec<_> = (0..2u32)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let mut r = super::e2e::req(100_000, i);
                    r.gated = true;
                    crate::codegen::call_inbound::<_, super::service::TestResponse>(
                        &client,
                        &super::service::ENDPOINTS[BLOB_WRITE],
                        crate::Request::new(r),
                        bytes::Bytes::from(pattern(100_000, i)),
                    )
                    .await
                })
            })
            .collect();
        bounded("both buffers taken", h.service.entered(before + 2)).await;
        h.service.open_gate();
        for call in held {
            let resp = bounded("a held call", call).await.unwrap();
            assert_eq!(
                resp.map(|r| r.exact).map_err(|s| s.code()),
                Ok(true),
                "seed {seed}"
            );
        }
    }
}

/// A connection whose frames never stop arriving (a peer faster than the server, or a hostile
/// one) must not keep its server task from yielding. On a one-thread runtime, where only the
/// tasks' own yields let anything else run, each accepted connection floods right after its
/// first request: the first client must still get its answer, and a second client must still
/// connect and be answered. Run on a thread of its own, so that a task that never yields
/// fails the test at its bound instead of hanging it.
#[test]
fn a_connection_whose_frames_never_stop_leaves_the_runtime_to_the_others() {
    super::on_a_thread_of_its_own("calls beside flooding connections", || async {
        let faults = Arc::new(Faults::default());
        faults.flood.store(true, Ordering::Relaxed);
        let transport = faulty_tcp(faults, 1);
        let h = Harness::start(transport, ServerConfig::default()).await;
        // The clients' own transport is not faulty: only the server's connections flood.
        let mut clients = Vec::new();
        for seed in 0..2u32 {
            let client = crate::Client::builder()
                .transport(tcp())
                .connect(&h.addr)
                .await
                .expect("connect while another connection floods");
            let answer = inbound(&client, MSG_SEND, 100, seed).await;
            assert!(answer.expect("an answer").exact, "client {seed}");
            // Kept open, so that its server connection goes on flooding.
            clients.push(client);
        }
    });
}

/// A frame that lands just after a client's handshake looked for one wakes the handshake. The
/// transport wakes whichever task reads the connection; the handshake made itself that reader
/// only after its first read, so a frame landing in between woke nobody, and the handshake
/// waited for its connect timeout (10 s, taken as success: the answer was there by then). Here
/// the connect timeout is an hour: with the race back, the test hangs until its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_landing_as_the_handshake_looked_wakes_it() {
    let faults = Arc::new(Faults::default());
    faults.late_first_read.store(true, Ordering::Relaxed);
    let transport = faulty_tcp(faults, 1);
    let h = Harness::start(transport.clone(), ServerConfig::default()).await;
    let client = bounded(
        "the handshake",
        crate::Client::builder()
            .transport(transport)
            .config(crate::ClientConfig {
                connect_timeout: Duration::from_secs(3600),
                ..crate::ClientConfig::default()
            })
            .connect(&h.addr),
    )
    .await
    .expect("connected");
    let answer = bounded("a call", inbound(&client, MSG_SEND, 100, 1)).await;
    assert!(answer.expect("an answer").exact);
}

/// A pushed result the transport refuses when it is posted (its send queue full) is answered
/// with an error, never with a success whose bytes were not sent (before: the client got
/// `OK, pushed_len = n` and handed out whatever its window held); the connection serves on.
#[tokio::test]
async fn a_refused_push_is_never_reported_as_a_success() {
    let faults = Arc::new(Faults::default());
    let config = ServerConfig {
        write_slots: 0,
        ..ServerConfig::default()
    };
    let h = Harness::start(faulty_tcp(faults.clone(), 1), config).await;
    let client = h.client().await;
    let len = 100_000;
    // The first read learns the result's size; the next ones have it pushed.
    for (seed, refused) in [(1, false), (2, false), (3, true), (4, false)] {
        faults
            .refuse_posted_writes
            .store(refused, Ordering::Relaxed);
        match outbound(&client, BLOB_READ, len, seed).await {
            Ok(data) => {
                assert!(!refused, "a refused push was reported as a success");
                assert!(data == pattern(len, seed), "wrong bytes");
            }
            Err(status) => {
                assert!(refused, "{status}");
                assert_eq!(status.code(), crate::Code::Unavailable, "{status}");
            }
        }
    }
}

/// With one call waiting for its response (its handler waits at the gate), seven more calls
/// made from the same task start and wait while the first reads the connection: they read
/// nothing (before, each looked at the connection once when it began to wait, and took the
/// reader's role). Then every call is answered once the gate opens: the first call's task
/// reads for all, and the role is handed on as calls complete.
#[tokio::test]
async fn calls_that_wait_while_another_reads_read_nothing() {
    use crate::codegen::call_inbound;
    use crate::tests::service::{TestRequest, TestResponse, ENDPOINTS};
    let faults = Arc::new(Faults::default());
    let transport = faulty_tcp(faults.clone(), 1);
    // Receives for every call from the start: no credit update comes while they wait.
    let config = ServerConfig {
        initial_receives: 16,
        ..ServerConfig::default()
    };
    let h = Harness::start(transport.clone(), config).await;
    let client = bounded(
        "the handshake",
        crate::Client::builder()
            .transport(transport)
            .connect(&h.addr),
    )
    .await
    .expect("connected");
    let started = h.service.entered_now();
    let call = |seed| {
        call_inbound::<_, TestResponse>(
            &client,
            &ENDPOINTS[MSG_SEND],
            crate::Request::new(TestRequest {
                gated: true,
                ..super::e2e::req(10, seed)
            }),
            bytes::Bytes::from(pattern(10, seed)),
        )
    };
    let mut first = std::pin::pin!(call(1));
    tokio::select! {
        _ = &mut first => panic!("a gated call answered before the gate opened"),
        () = bounded("the first handler starts", h.service.entered(started + 1)) => {}
    }
    let before = faults.client_reads.load(Ordering::Relaxed);
    let mut more = std::pin::pin!(async {
        tokio::join!(
            call(2),
            call(3),
            call(4),
            call(5),
            call(6),
            call(7),
            call(8)
        )
    });
    tokio::select! {
        _ = &mut more => panic!("gated calls answered before the gate opened"),
        () = bounded("seven more handlers start", h.service.entered(started + 8)) => {}
    }
    assert_eq!(
        faults.client_reads.load(Ordering::Relaxed) - before,
        0,
        "calls that began to wait while the first call read the connection read it"
    );
    h.service.open_gate();
    let (one, rest) = bounded("the calls answer", async { tokio::join!(first, more) }).await;
    for answer in [one, rest.0, rest.1, rest.2, rest.3, rest.4, rest.5, rest.6] {
        assert!(answer.expect("an answer").exact);
    }
}
