//! Register once, proven by counting: over DOCA, once warmed up, no call of any operation or
//! route registers, exports or imports memory. The software provider counts what a NIC would
//! pay for (`DocaTransport::counters`); these tests assert the counts, never times.
//!
//! Routes covered, each checked byte for byte: inline, write slot, pull (send and write);
//! inline, pushed, and grown results (receive and read); results landed in a caller's lease
//! (through the connection's bounce memory) and in a lease of a shared region (in place);
//! writes from bytes frozen from a lease; remote buffers offered by the client (read, written,
//! updated by atomics; leases of a plain region and of a shared one) and by a handler (read by
//! the client); bulk streams both ways (from plain bytes and from a lease) and message streams
//! both ways. The grant route (`pull_writes: Some(false)`) is refused over DOCA at bind.
//!
//! The tests use the device `mlx5_1`, which no other test of this process uses, and run one at
//! a time, so the counters see only their work (client and server together).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::e2e::{req, BLOB_READ, BLOB_WRITE, MSG_RECEIVE, MSG_SEND};
use super::remote::{self, Remote, RemoteRequest, COUNT, PULL, PUSH, RECLAIM};
use super::service::{TestRequest, TestResponse, ENDPOINTS};
use super::streams;
use super::{bounded, pattern, Backend, Harness, TestService};
use crate::codegen::encode_message;
use crate::memory::{Access, MemoryRegion, RegisteredBuf, SharedRegion};
use crate::remote::Share;
use crate::transport::doca::{Counters, DocaConfig, DocaTransport, ProgressMode};
use crate::{Client, ClientConfig, ServerConfig};

/// The counters of one device see one test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DEVICE: &str = "mlx5_1";

/// Receives each side posts for control frames, from the start (the default ceiling).
const RECEIVES: u32 = 64;

struct Fixture {
    transport: DocaTransport,
    _h: Harness,
    /// The test service, whose gate the remote service shares.
    service: TestService,
    client: Client,
    /// The client's memory, registered once.
    region: MemoryRegion,
    /// The client's memory shared with its connection.
    shared: SharedRegion,
    _share: Share,
}

async fn fixture(oob: bool, progress: ProgressMode) -> Fixture {
    let transport = DocaTransport::new(DocaConfig {
        device: Some(DEVICE.into()),
        progress,
        rnr_timeout: Duration::from_secs(5),
        ..DocaConfig::default()
    })
    .expect("the provider's second device");
    let backend = Backend {
        transport: Arc::new(transport.clone()),
        bind: if oob {
            "doca+oob://127.0.0.1:0".into()
        } else {
            "doca://127.0.0.1:0".into()
        },
    };
    let service = TestService::default();
    let remote = Remote::gated_by(&service);
    // Eight calls of a path held in their handlers at once (the lockstep warm-up) need eight
    // of its buffers for one connection.
    // Receives start at their ceiling on both sides, as the server's docs advise a service
    // that must register nothing mid-run: growing receives (doubled whenever a peer waited for
    // a credit, which depends on timing) register staging receives over DOCA, one chunk per
    // 64. Under load one such chunk landed after warm-up and failed this test.
    let config = ServerConfig {
        min_buffers: 8,
        pool_share_percent: 100,
        initial_receives: RECEIVES,
        recv_credits: RECEIVES,
        ..ServerConfig::default()
    };
    let h = Harness::start_serving(&backend, config, service.clone(), |b| {
        b.add_service(remote)
            .add_service(streams::Streams::default())
    })
    .await;
    let client = h
        .client_with(ClientConfig {
            initial_receives: RECEIVES,
            recv_credits: RECEIVES,
            ..ClientConfig::default()
        })
        .await;
    let shared = SharedRegion::new(4 << 20).unwrap();
    let share = client
        .remote_memory()
        .share(&shared, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    Fixture {
        transport,
        _h: h,
        service,
        client,
        region: MemoryRegion::new(16 << 20).unwrap(),
        shared,
        _share: share,
    }
}

fn response(bytes: Bytes) -> TestResponse {
    prost::Message::decode(bytes).expect("a response message")
}

fn test_req(len: usize, seed: u32, gated: bool) -> Bytes {
    encode_message(&TestRequest {
        gated,
        ..req(len, seed)
    })
}

/// One kind of call, on one route.
#[derive(Debug, Clone, Copy)]
enum Route {
    /// A send or write of `len` bytes: inline, through a write slot, or pulled.
    Inbound(usize, usize),
    /// A receive or read of `len` bytes: inline, pushed, or (after a smaller one) grown.
    Outbound(usize, usize),
    /// A result landed in a lease of a plain region (through the bounce memory).
    Into(usize, usize),
    /// A result landed in a lease of the shared region, in place.
    IntoShared(usize),
    /// A write of bytes frozen from a lease, sent from where they are.
    FrozenWrite(usize),
    /// The handler reads a lent lease of a plain region (bounce) or of the shared one.
    LendRead { shared: bool },
    /// The handler writes an offered lease of a plain region (bounce) or of the shared one.
    OfferWrite { shared: bool },
    /// The handler updates an offered lease by atomics.
    OfferAtomic,
    /// The handler lends its memory, the client reads it, the handler revokes.
    HandlerLends,
    /// A bulk write stream of `len` bytes, from plain bytes (staged) or from a lease.
    StreamWrite { len: usize, frozen: bool },
    /// A bulk read stream of `len` bytes.
    StreamRead(usize),
    /// A server stream of this many messages, and a client stream of as many.
    Messages(u64),
}

/// Every route, one call at a time: inline, slot and pulled payloads; inline, pushed and
/// grown results (the 1.5 MB read outgrows the window the 300 KB one taught).
const EVERY_ROUTE: &[Route] = &[
    Route::Inbound(MSG_SEND, 64),
    Route::Inbound(BLOB_WRITE, 64),
    Route::Inbound(MSG_SEND, 32 << 10),
    Route::Inbound(BLOB_WRITE, 32 << 10),
    Route::Inbound(MSG_SEND, 1 << 20),
    Route::Inbound(BLOB_WRITE, 1 << 20),
    Route::Outbound(MSG_RECEIVE, 64),
    Route::Outbound(BLOB_READ, 64),
    Route::Outbound(MSG_RECEIVE, 200_000),
    Route::Outbound(BLOB_READ, 300_000),
    Route::Outbound(BLOB_READ, 1_500_000),
    Route::Into(BLOB_READ, 200_000),
    Route::Into(MSG_RECEIVE, 64),
    Route::IntoShared(200_000),
    Route::FrozenWrite(200_000),
    Route::LendRead { shared: false },
    Route::OfferWrite { shared: false },
    Route::OfferAtomic,
    Route::LendRead { shared: true },
    Route::OfferWrite { shared: true },
    Route::HandlerLends,
    Route::StreamWrite {
        len: 3 << 20,
        frozen: false,
    },
    Route::StreamWrite {
        len: 1 << 20,
        frozen: true,
    },
    Route::StreamRead(3 << 20),
    Route::Messages(5000),
];

/// Whether eight workers take `route` at once. A worker holds at most one window of a size at
/// a time on each route, so once every route ran with all eight holding theirs together (the
/// lockstep warm-up), no pool can need more. Left out: results whose window depends on the
/// order of other workers' calls (inline results, which reset the size a client learned, and
/// the grown one), and the handler's offers (one per service at a time).
fn concurrent(route: &Route) -> bool {
    // Streams are left out too: their handlers do not wait at the test service's gate.
    !matches!(
        route,
        Route::Outbound(_, 64)
            | Route::Outbound(_, 1_500_000)
            | Route::HandlerLends
            | Route::StreamWrite { .. }
            | Route::StreamRead(_)
            | Route::Messages(_)
    )
}

/// The routes of [`EVERY_ROUTE`] eight workers take at once.
fn concurrent_routes() -> Vec<Route> {
    EVERY_ROUTE.iter().copied().filter(concurrent).collect()
}

/// Makes one call of `route` with worker `slot`'s part of the fixture's memory (so that
/// concurrent workers never share a lease), checks its bytes, and returns the calls made.
/// `gated`: the handler waits at the service's gate.
async fn run(f: &Fixture, route: Route, slot: usize, seed: u32, gated: bool) -> u64 {
    let client = &f.client;
    let memory = client.remote_memory();
    // Per worker: 2 MiB of the plain region, 128 KiB of the shared one past its first 2 MiB
    // (where `IntoShared` lands, 250 KB per worker).
    let base = slot * (2 << 20);
    let shared_base = (2 << 20) + slot * (128 << 10);
    let remote_req = |h: &crate::RemoteBuf, len: u64| RemoteRequest {
        gated,
        ..remote::req(h, 0, len, seed)
    };
    match route {
        Route::Inbound(ep, len) => {
            inbound(client, ep, Bytes::from(pattern(len, seed)), seed, gated).await
        }
        Route::FrozenWrite(len) => {
            let mut lease = f.region.lease(base + 300_000, len).unwrap();
            lease.as_mut_slice().copy_from_slice(&pattern(len, seed));
            inbound(client, BLOB_WRITE, lease.freeze(), seed, gated).await;
        }
        Route::Outbound(ep, len) => {
            let (_, data) = client
                .call_raw(&ENDPOINTS[ep], test_req(len, seed, gated), None, None)
                .await
                .unwrap();
            assert!(
                data == pattern(len, seed),
                "{} of {len} bytes",
                ENDPOINTS[ep].method
            );
        }
        Route::Into(ep, len) => {
            let dst = f.region.lease(base, 250_000).unwrap();
            let (_, dst) = client
                .call_raw_into(&ENDPOINTS[ep], test_req(len, seed, gated), dst, None)
                .await
                .unwrap();
            assert!(
                dst.as_slice() == &pattern(len, seed)[..],
                "{len} bytes landed"
            );
        }
        Route::IntoShared(len) => {
            let dst = f.shared.lease(slot * 250_000, 250_000).unwrap();
            let (_, dst) = client
                .call_raw_into(&ENDPOINTS[BLOB_READ], test_req(len, seed, gated), dst, None)
                .await
                .unwrap();
            assert!(
                dst.to_vec() == pattern(len, seed),
                "landed in the shared lease"
            );
        }
        Route::LendRead { shared } => {
            let data = pattern(64 << 10, seed);
            let pulled = if shared {
                let mut block = f.shared.lease(shared_base, 64 << 10).unwrap();
                block.write(&data).unwrap();
                let rq = remote_req;
                let lent = memory.lend(block, Access::REMOTE_READ, |h| async move {
                    remote::call(client, PULL, rq(&h, 64 << 10)).await
                });
                lent.await.unwrap().0
            } else {
                let mut block = f.region.lease(base + (1 << 20), 64 << 10).unwrap();
                block.as_mut_slice().copy_from_slice(&data);
                let rq = remote_req;
                let lent = memory.lend(block, Access::REMOTE_READ, |h| async move {
                    remote::call(client, PULL, rq(&h, 64 << 10)).await
                });
                lent.await.unwrap().0
            };
            assert!(
                pulled.unwrap().exact,
                "the handler read the lease (shared: {shared})"
            );
        }
        Route::OfferWrite { shared } => {
            let mut got = vec![0u8; 3000];
            if shared {
                let lease = f.shared.lease(shared_base, 4096).unwrap();
                let offer = memory.offer(lease, Access::REMOTE_WRITE).unwrap();
                remote::call(client, PUSH, remote_req(&offer.handle(), 3000))
                    .await
                    .unwrap();
                offer.revoke().await.unwrap().read_at(0, &mut got).unwrap();
            } else {
                let lease = f.region.lease(base + (1 << 20), 4096).unwrap();
                let offer = memory.offer(lease, Access::REMOTE_WRITE).unwrap();
                remote::call(client, PUSH, remote_req(&offer.handle(), 3000))
                    .await
                    .unwrap();
                got.copy_from_slice(&offer.revoke().await.unwrap().as_slice()[..3000]);
            }
            assert!(
                got == pattern(3000, seed),
                "written back (shared: {shared})"
            );
        }
        Route::OfferAtomic => {
            let mut counter = f.region.lease(base + (1 << 20) + 8192, 64).unwrap();
            counter.as_mut_slice()[..8].copy_from_slice(&40u64.to_ne_bytes());
            let offer = memory.offer(counter, Access::REMOTE_ATOMIC).unwrap();
            let counted = remote::call(client, COUNT, remote_req(&offer.handle(), 2))
                .await
                .unwrap();
            assert_eq!((counted.added_to, counted.swapped), (40, 42));
            let counter = offer.revoke().await.unwrap();
            assert_eq!(&counter.as_slice()[..8], &7u64.to_ne_bytes());
        }
        Route::HandlerLends => {
            let lent = remote::lent_by_the_handler(client, 10_000, seed).await;
            let dst = f.region.lease(base + (1 << 20) + 16384, 10_000).unwrap();
            let got = memory.read(&lent, 0, dst).await.unwrap();
            assert!(
                got.as_slice() == &pattern(10_000, seed)[..],
                "read the handler's lease"
            );
            drop(got);
            remote::call(client, RECLAIM, RemoteRequest::default())
                .await
                .unwrap();
            return 3;
        }
        Route::StreamWrite { len, frozen } => {
            let data = if frozen {
                let mut lease = f.region.lease(base, len).unwrap();
                lease.as_mut_slice().copy_from_slice(&pattern(len, seed));
                lease.freeze()
            } else {
                Bytes::from(pattern(len, seed))
            };
            let ask = streams::Ask {
                seed,
                ..Default::default()
            };
            let (summary, _) = client
                .call_raw(
                    &streams::ENDPOINTS[streams::PUT],
                    encode_message(&ask),
                    Some(data),
                    None,
                )
                .await
                .unwrap();
            let summary: streams::Summary = prost::Message::decode(summary).unwrap();
            assert!(summary.exact, "streamed {len} bytes (frozen: {frozen})");
        }
        Route::StreamRead(len) => {
            let ask = streams::Ask {
                count: len as u64,
                seed,
                ..Default::default()
            };
            let (_, got) = client
                .call_raw(
                    &streams::ENDPOINTS[streams::GET],
                    encode_message(&ask),
                    None,
                    None,
                )
                .await
                .unwrap();
            assert!(got == pattern(len, seed), "read a stream of {len} bytes");
        }
        Route::Messages(n) => {
            let ask = streams::Ask {
                count: n,
                pad: 40,
                ..Default::default()
            };
            let mut listed = streams::list(client, ask).await.unwrap();
            let mut got = 0;
            while listed.message().await.unwrap().is_some() {
                got += 1;
            }
            assert_eq!(got, n, "listed");
            let items: Vec<Bytes> = (0..n)
                .map(|seq| {
                    encode_message(&streams::Item {
                        seq,
                        pad: vec![1; 40],
                    })
                })
                .collect();
            let summary = client
                .call_raw_client_stream(
                    &streams::ENDPOINTS[streams::SUM],
                    Box::pin(VecStream(items.into())),
                    None,
                )
                .await
                .unwrap();
            let summary: streams::Summary = prost::Message::decode(summary).unwrap();
            assert_eq!(summary.count, n, "summed");
            return 2;
        }
    }
    1
}

/// The messages of a client stream.
struct VecStream(std::collections::VecDeque<Bytes>);

impl futures_core::Stream for VecStream {
    type Item = Bytes;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        std::task::Poll::Ready(self.0.pop_front())
    }
}

async fn inbound(client: &Client, ep: usize, data: Bytes, seed: u32, gated: bool) {
    let len = data.len();
    let (got, _) = client
        .call_raw(&ENDPOINTS[ep], test_req(len, seed, gated), Some(data), None)
        .await
        .unwrap();
    assert!(
        response(got).exact,
        "{} of {len} bytes",
        ENDPOINTS[ep].method
    );
}

/// Every route of `routes` once, in order, by one worker.
async fn in_order(f: &Fixture, routes: &[Route], slot: usize, seed: u32) -> u64 {
    let mut calls = 0;
    for &route in routes {
        calls += run(f, route, slot, seed, false).await;
    }
    calls
}

/// Runs each route with eight workers at once, every handler held at the gate until all eight
/// are in: each pool sees eight windows of each size held together.
async fn warm_in_lockstep(f: &Fixture, seed: u32) {
    for route in concurrent_routes() {
        f.service.close_gate();
        let base = f.service.entered_now();
        let mut all: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = u64> + '_>>> = (0..8)
            .map(|w| Box::pin(run(f, route, w, seed, true)) as _)
            .collect();
        all.push(Box::pin(async move {
            f.service.entered(base + 8).await;
            f.service.open_gate();
            0
        }));
        join_all(all).await;
    }
}

fn read(f: &Fixture) -> Counters {
    f.transport
        .counters()
        .expect("the software provider counts")
}

/// What `rounds` of `work` cost once warmed up by `warm` rounds, per call, checked to be
/// zero registrations, exports and imports.
async fn steady_state<W, Fut>(f: &Fixture, what: &str, warm: u32, rounds: u32, work: W)
where
    W: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    for seed in 0..warm {
        work(seed).await;
    }
    let before = read(f);
    let mut calls = 0;
    for seed in warm..warm + rounds {
        calls += work(seed).await;
    }
    let cost = read(f).since(&before);
    println!(
        "{what}: {calls} calls: {:.3} registrations, {:.3} imports, {:.3} exports, {:.3} task \
         submissions, {:.3} buffers taken per call",
        cost.registrations as f64 / calls as f64,
        cost.imports as f64 / calls as f64,
        cost.exports as f64 / calls as f64,
        cost.task_submissions as f64 / calls as f64,
        cost.buffers_taken as f64 / calls as f64,
    );
    assert_eq!(
        (
            cost.registrations,
            cost.registered_bytes,
            cost.deregistrations
        ),
        (0, 0, 0),
        "{what}: memory registered or deregistered once warmed up ({calls} calls)"
    );
    assert_eq!(
        (cost.exports, cost.imports, cost.imports_destroyed),
        (0, 0, 0),
        "{what}: exports or imports once warmed up ({calls} calls)"
    );
    assert!(
        cost.task_submissions >= calls,
        "the calls did run on this device"
    );
    let violations = doca_sys::take_contract_violations();
    assert!(
        violations.is_empty(),
        "DOCA contract violations: {violations:#?}"
    );
}

async fn one_at_a_time(oob: bool, progress: ProgressMode) {
    let _one = ONE_AT_A_TIME.lock().await;
    let f = fixture(oob, progress).await;
    let what = format!("{progress:?}, oob {oob}, one call at a time");
    let work = |seed| in_order(&f, EVERY_ROUTE, 0, seed);
    bounded(&what, steady_state(&f, &what, 2, 3, work)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cm_event_no_call_registers_once_warm() {
    one_at_a_time(false, ProgressMode::Event).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cm_spin_no_call_registers_once_warm() {
    one_at_a_time(false, ProgressMode::Spin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cm_busy_poll_no_call_registers_once_warm() {
    one_at_a_time(false, ProgressMode::BusyPoll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oob_event_no_call_registers_once_warm() {
    one_at_a_time(true, ProgressMode::Event).await;
}

/// Eight workers making their calls at once: pools grow to what eight hold together while
/// warming up (in lockstep, so that they surely do), then never again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_in_flight_no_call_registers_once_warm() {
    let _one = ONE_AT_A_TIME.lock().await;
    let f = fixture(false, ProgressMode::Event).await;
    let what = "Event, 8 workers";
    // Every route once first (result sizes learned as the workers will have them, slots
    // armed), then the lockstep warm-up.
    let routes = concurrent_routes();
    in_order(&f, &routes, 0, 0).await;
    bounded("lockstep warm-up", warm_in_lockstep(&f, 1)).await;
    let routes = &routes;
    let all = |seed: u32| {
        let f = &f;
        async move {
            let workers = (0..8)
                .map(|w| in_order(f, routes, w, seed * 8 + w as u32))
                .collect();
            join_all(workers).await.into_iter().sum::<u64>()
        }
    };
    bounded(what, steady_state(&f, what, 0, 4, all)).await;
}

/// Buffers taken from an inventory per call of `routes`, one call at a time, once warm.
async fn buffers_per_call(f: &Fixture, what: &str, routes: &[Route]) -> f64 {
    let work = |seed| in_order(f, routes, 0, seed);
    bounded(what, async {
        for seed in 0..3 {
            work(seed).await;
        }
        let before = read(f);
        let mut calls = 0;
        for seed in 3..53 {
            calls += work(seed).await;
        }
        let cost = read(f).since(&before);
        println!(
            "{what}: {calls} calls, {} buffers taken, {} task submissions",
            cost.buffers_taken, cost.task_submissions
        );
        assert!(
            cost.task_submissions >= 2 * calls,
            "a request and a response each"
        );
        cost.buffers_taken as f64 / calls as f64
    })
    .await
}

/// Frames and payload bytes copied into staging take no `doca_buf` from an inventory once
/// warm: they go from buffers the context keeps over whole staging slabs, whose data sections
/// it moves to them (`doca_buf_set_data`). Small calls take none; a payload written into a
/// write slot takes only its destination, a buffer over the peer's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_bytes_take_no_buffer_once_warm() {
    let _one = ONE_AT_A_TIME.lock().await;
    let f = fixture(false, ProgressMode::Event).await;
    let small = [
        Route::Inbound(MSG_SEND, 64),
        Route::Outbound(MSG_RECEIVE, 64),
    ];
    let taken = buffers_per_call(&f, "small calls", &small).await;
    assert_eq!(taken, 0.0, "small calls: buffers taken per call");
    let slot = [Route::Inbound(MSG_SEND, 32 << 10)];
    let taken = buffers_per_call(&f, "32 KiB through a write slot", &slot).await;
    assert_eq!(taken, 1.0, "slot writes: buffers taken per call");
}

/// Runs the futures concurrently on this task.
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futures.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}

/// The counters do see a registration per call where one happens: a one-sided read into a
/// buffer made for the call (what applications must not do) costs one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_made_per_call_is_counted() {
    let _one = ONE_AT_A_TIME.lock().await;
    let f = fixture(false, ProgressMode::Event).await;
    let memory = f.client.remote_memory();
    let lent = remote::lent_by_the_handler(&f.client, 4096, 1).await;
    let fresh = || RegisteredBuf::new(4096, Access::LOCAL_WRITE).unwrap();
    drop(memory.read(&lent, 0, fresh()).await.unwrap());
    let before = read(&f);
    for _ in 0..5 {
        let got = memory.read(&lent, 0, fresh()).await.unwrap();
        assert!(got.as_slice() == &pattern(4096, 1)[..]);
    }
    let cost = read(&f).since(&before);
    assert_eq!(cost.registrations, 5, "one registration per fresh buffer");
    assert_eq!(cost.registered_bytes, 5 * 4096);
    assert_eq!(
        cost.deregistrations, 5,
        "and one deregistration when it goes"
    );
}
