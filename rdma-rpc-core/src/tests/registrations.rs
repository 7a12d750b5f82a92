//! Register once, proven by counting: over DOCA, once warmed up, no call of any operation or
//! route registers, exports or imports memory. The software provider counts what a NIC would
//! pay for (`DocaTransport::counters`); these tests assert the counts, never times.
//!
//! Routes covered, each checked byte for byte: inline, write slot, pull (send and write);
//! inline, pushed, and grown results (receive and read); results landed in a caller's lease
//! (through the connection's bounce memory) and in a lease of a shared region (in place);
//! writes from bytes frozen from a lease; remote buffers offered by the client (read, written,
//! updated by atomics; leases of a plain region and of a shared one) and by a handler (read by
//! the client). The grant route (`pull_writes: Some(false)`) is refused over DOCA at bind.
//!
//! The tests use the device `mlx5_1`, which no other test of this process uses, and run one at
//! a time, so the counters see only their work (client and server together).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::e2e::{req, BLOB_READ, BLOB_WRITE, MSG_RECEIVE, MSG_SEND};
use super::remote::{self, Remote, RemoteRequest, COUNT, PULL, PUSH, RECLAIM};
use super::service::{TestResponse, ENDPOINTS};
use super::{bounded, pattern, Backend, Harness};
use crate::codegen::encode_message;
use crate::memory::{Access, MemoryRegion, RegisteredBuf, SharedRegion};
use crate::remote::Share;
use crate::transport::doca::{Counters, DocaConfig, DocaTransport, ProgressMode};
use crate::{Client, ServerConfig};

/// The counters of one device see one test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DEVICE: &str = "mlx5_1";

struct Fixture {
    transport: DocaTransport,
    _h: Harness,
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
    let h = Harness::start_built(&backend, ServerConfig::default(), |b| {
        b.add_service(Remote::default())
    })
    .await;
    let client = h.client().await;
    let shared = SharedRegion::new(4 << 20).unwrap();
    let share = client
        .remote_memory()
        .share(&shared, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    Fixture {
        transport,
        _h: h,
        client,
        region: MemoryRegion::new(16 << 20).unwrap(),
        shared,
        _share: share,
    }
}

fn response(bytes: Bytes) -> TestResponse {
    prost::Message::decode(bytes).expect("a response message")
}

async fn inbound(client: &Client, ep: usize, data: Bytes, seed: u32) {
    let len = data.len();
    let (got, _) = client
        .call_raw(
            &ENDPOINTS[ep],
            encode_message(&req(len, seed)),
            Some(data),
            None,
        )
        .await
        .unwrap();
    assert!(
        response(got).exact,
        "{} of {len} bytes",
        ENDPOINTS[ep].method
    );
}

async fn outbound(client: &Client, ep: usize, len: usize, seed: u32) {
    let (_, data) = client
        .call_raw(&ENDPOINTS[ep], encode_message(&req(len, seed)), None, None)
        .await
        .unwrap();
    assert!(
        data == pattern(len, seed),
        "{} of {len} bytes",
        ENDPOINTS[ep].method
    );
}

/// One call of every operation and route that a client makes with `slot` of the fixture's
/// memory (slots of 2 MiB, so concurrent workers never share a lease); each checks its
/// bytes. The number of calls.
async fn every_route(f: &Fixture, slot: usize, seed: u32) -> u64 {
    every_route_lending(f, slot, seed, true).await
}

/// [`every_route`]; with `lend`, also the handler's offer the client reads (one worker only:
/// its reclaim revokes every offer of the service).
async fn every_route_lending(f: &Fixture, slot: usize, seed: u32, lend: bool) -> u64 {
    let client = &f.client;
    let base = slot * (2 << 20);
    let mut calls = 0;
    // Inline, write slot, pull.
    for len in [64, 32 << 10, 1 << 20] {
        for ep in [MSG_SEND, BLOB_WRITE] {
            inbound(client, ep, Bytes::from(pattern(len, seed)), seed).await;
            calls += 1;
        }
    }
    // Inline and pushed results, and a result that outgrows the window the client offers
    // (learned from the one before): two round trips.
    for (ep, len) in [
        (MSG_RECEIVE, 64),
        (BLOB_READ, 64),
        (MSG_RECEIVE, 200_000),
        (BLOB_READ, 300_000),
        (BLOB_READ, 1_500_000),
    ] {
        outbound(client, ep, len, seed).await;
        calls += 1;
    }
    // Results landed in the caller's lease: through the bounce memory, and (small) copied
    // from the response.
    for (ep, len) in [(BLOB_READ, 200_000), (MSG_RECEIVE, 64)] {
        let dst = f.region.lease(base, 250_000).unwrap();
        let (_, dst) = client
            .call_raw_into(&ENDPOINTS[ep], encode_message(&req(len, seed)), dst, None)
            .await
            .unwrap();
        assert!(
            dst.as_slice() == &pattern(len, seed)[..],
            "{len} bytes landed"
        );
        calls += 1;
    }
    // A result landed in place in a lease of the shared region.
    let dst = f.shared.lease(slot * 250_000, 250_000).unwrap();
    let (_, dst) = client
        .call_raw_into(
            &ENDPOINTS[BLOB_READ],
            encode_message(&req(200_000, seed)),
            dst,
            None,
        )
        .await
        .unwrap();
    assert!(
        dst.to_vec() == pattern(200_000, seed),
        "landed in the shared lease"
    );
    drop(dst);
    calls += 1;
    // A write from bytes frozen from a lease: sent from where they are.
    let mut lease = f.region.lease(base + 300_000, 200_000).unwrap();
    lease
        .as_mut_slice()
        .copy_from_slice(&pattern(200_000, seed));
    inbound(client, BLOB_WRITE, lease.freeze(), seed).await;
    calls += 1;
    calls + remote_buffers(f, slot, seed, lend).await
}

/// Remote buffers both ways; the number of calls.
async fn remote_buffers(f: &Fixture, slot: usize, seed: u32, lend: bool) -> u64 {
    let client = &f.client;
    let memory = client.remote_memory();
    let base = slot * (2 << 20) + (1 << 20);
    let rq = |h: &crate::RemoteBuf, len: u64| remote::req(h, 0, len, seed);
    // The handler reads a lease of a plain region (through bounce memory)...
    let mut block = f.region.lease(base, 64 << 10).unwrap();
    block
        .as_mut_slice()
        .copy_from_slice(&pattern(64 << 10, seed));
    let (pulled, _) = memory
        .lend(block, Access::REMOTE_READ, |h| async move {
            remote::call(client, PULL, rq(&h, 64 << 10)).await
        })
        .await
        .unwrap();
    assert!(pulled.unwrap().exact, "the handler read the lease");
    // ... writes into one ...
    let offer = memory
        .offer(f.region.lease(base, 4096).unwrap(), Access::REMOTE_WRITE)
        .unwrap();
    remote::call(client, PUSH, rq(&offer.handle(), 3000))
        .await
        .unwrap();
    let back = offer.revoke().await.unwrap();
    assert!(
        back.as_slice()[..3000] == pattern(3000, seed)[..],
        "written back"
    );
    drop(back);
    // ... and updates one by atomics.
    let mut counter = f.region.lease(base + 8192, 64).unwrap();
    counter.as_mut_slice()[..8].copy_from_slice(&40u64.to_ne_bytes());
    let offer = memory.offer(counter, Access::REMOTE_ATOMIC).unwrap();
    let counted = remote::call(client, COUNT, rq(&offer.handle(), 2))
        .await
        .unwrap();
    assert_eq!((counted.added_to, counted.swapped), (40, 42));
    let counter = offer.revoke().await.unwrap();
    assert_eq!(&counter.as_slice()[..8], &7u64.to_ne_bytes());
    drop(counter);
    // Leases of the shared region, used in place.
    let shared_base = (2 << 20) + slot * (128 << 10);
    let mut block = f.shared.lease(shared_base, 64 << 10).unwrap();
    block.write(&pattern(64 << 10, seed)).unwrap();
    let (pulled, _) = memory
        .lend(block, Access::REMOTE_READ, |h| async move {
            remote::call(client, PULL, rq(&h, 64 << 10)).await
        })
        .await
        .unwrap();
    assert!(pulled.unwrap().exact, "the handler read the shared lease");
    let offer = memory
        .offer(
            f.shared.lease(shared_base, 4096).unwrap(),
            Access::REMOTE_WRITE,
        )
        .unwrap();
    remote::call(client, PUSH, rq(&offer.handle(), 3000))
        .await
        .unwrap();
    let back = offer.revoke().await.unwrap();
    let mut got = vec![0u8; 3000];
    back.read_at(0, &mut got).unwrap();
    assert!(got == pattern(3000, seed), "written in place");
    drop(back);
    if !lend {
        return 5;
    }
    // The handler lends its memory; the client reads it into a lease.
    let lent = remote::lent_by_the_handler(client, 10_000, seed).await;
    let got = memory
        .read(&lent, 0, f.region.lease(base + 16384, 10_000).unwrap())
        .await
        .unwrap();
    assert!(
        got.as_slice() == &pattern(10_000, seed)[..],
        "read the handler's lease"
    );
    drop(got);
    remote::call(client, RECLAIM, RemoteRequest::default())
        .await
        .unwrap();
    7
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
         submissions per call",
        cost.registrations as f64 / calls as f64,
        cost.imports as f64 / calls as f64,
        cost.exports as f64 / calls as f64,
        cost.task_submissions as f64 / calls as f64,
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
    bounded(
        &what,
        steady_state(&f, &what, 2, 3, |seed| every_route(&f, 0, seed)),
    )
    .await;
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

/// Eight workers making every call at once: pools grow while warming up, then stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_in_flight_no_call_registers_once_warm() {
    let _one = ONE_AT_A_TIME.lock().await;
    let f = fixture(false, ProgressMode::Event).await;
    let what = "Event, 8 workers";
    let all = |seed: u32| {
        let f = &f;
        async move {
            let workers = (0..8)
                .map(|w| every_route_lending(f, w, seed * 8 + w as u32, w == 0))
                .collect();
            join_all(workers).await.into_iter().sum::<u64>()
        }
    };
    bounded(what, steady_state(&f, what, 5, 3, all)).await;
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
