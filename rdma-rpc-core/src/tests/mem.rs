//! The end-to-end suite over the in-process transport (`mem://`). Its windows are revocable
//! like the software transport's, so every suite test that takes a backend runs here, in
//! both write modes (pulled and granted). Not here:
//! - `one_peer_cannot_take_every_connection_on`: the per-peer limit is keyed by the peer's IP
//!   address, and an in-process peer has none (as over RDMA CM), so the limit does not apply.
//! - the tests that speak the TCP wire format by hand (`an_unanswered_pull_frees_its_buffer`,
//!   `a_push_needs_no_acknowledgement_and_frees_its_buffer_once_written`), or are built on a
//!   TCP transport or its settings (`a_refused_push_is_never_reported_as_a_success` and the
//!   other fault-injection tests,
//!   `announced_and_returned_credits_are_bounded`, `a_window_that_does_not_fit_the_payload_is_refused`,
//!   and the two window tests of `faults.rs` that are not written against a backend).

use std::sync::Arc;
use std::time::Duration;

use super::e2e::{
    all_operations_all_sizes, deadlines_end_calls_with_deadline_exceeded_on,
    graceful_shutdown_drains_calls_in_flight_on,
    many_calls_in_flight_on_one_connection_complete_out_of_order_on, many_connections_mixed,
};
use super::ends::*;
use super::fast_paths::*;
use super::faults::*;
use super::hostile::*;
use super::malicious::*;
use super::remote::*;
use super::sessions::*;
use super::stream_rules::{
    a_client_that_stops_reading_loses_its_stream_on, a_stream_that_never_ends_is_bounded_on,
    broken_offers_in_a_request_refuse_the_call_on, stream_rule_breakers_lose_their_connection_on,
};
use super::streams::{
    a_server_streams_a_hundred_thousand_messages_on, a_slow_reader_holds_the_server_back_on,
    a_slow_write_handler_holds_the_client_back_on, bulk_streams_move_payloads_many_buffers_long_on,
    clients_stream_and_both_sides_stream_on, dropping_a_stream_cancels_its_call_on,
};
use super::{bounded, Backend, Harness};
use crate::transport::mem::{MemConfig, MemTransport};

/// A fresh `mem://` name per server, so tests run in parallel.
fn b() -> Backend {
    Backend {
        transport: Arc::new(MemTransport::with_config(MemConfig {
            rnr_timeout: Duration::from_secs(5),
            ..MemConfig::default()
        })),
        bind: "mem://".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_operations_all_sizes_byte_exact() {
    let h = Harness::default_on(&b()).await;
    bounded("all operations", all_operations_all_sizes(&h)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_64_mixed_operations() {
    let h = Harness::default_on(&b()).await;
    bounded("64 connections", many_connections_mixed(&h)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_path_with_pulled_writes() {
    bounded("round trips", round_trips_per_path_on(&b(), true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_path_with_granted_writes() {
    bounded("round trips", round_trips_per_path_on(&b(), false)).await;
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs a default server over `mem://` on its own thread and runtime, and `body` with a
/// client of it on a second runtime on this thread, as the benchmark runs them.
fn across_two_runtimes<F, Fut>(body: F)
where
    F: FnOnce(crate::Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let server_rt = current_thread_runtime();
    let h = server_rt.block_on(Harness::default_on(&b()));
    let (addr, transport) = (h.addr.clone(), h.transport.clone());
    // The server's tasks run on its runtime, driven by its own thread.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        server_rt.block_on(async move {
            let _ = stopped.await;
            drop(h);
        })
    });
    current_thread_runtime().block_on(async move {
        let client = crate::Client::builder()
            .transport(transport)
            .connect(&addr)
            .await
            .expect("connect");
        body(client).await;
    });
    stop.send(()).unwrap();
    server.join().unwrap();
}

/// Server and client on two single-threaded runtimes on two threads, as the benchmark runs
/// them.
#[test]
fn server_and_client_on_two_runtimes() {
    across_two_runtimes(|client| async move {
        bounded("calls across runtimes", async {
            for i in 0..200u32 {
                let len = [0, 64, 9000, 70_000][i as usize % 4];
                let resp = super::e2e::inbound(&client, super::e2e::MSG_SEND, len, i)
                    .await
                    .unwrap();
                assert!(resp.exact);
                let data = super::e2e::outbound(&client, super::e2e::BLOB_READ, len, i)
                    .await
                    .unwrap();
                assert!(data == super::pattern(len, i));
            }
        })
        .await;
    });
}

/// Each test of the suite that takes a backend, over `mem://`.
macro_rules! mem_suite {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            bounded(stringify!($name), super::$name(&b())).await;
        }
    )*};
}

mod suite {
    use super::*;

    with_suite!(mem_suite);
    // Grant mode and pool shares: over DOCA, pool buffers are never granted (pull mode).
    mem_suite!(
        pull_windows_are_refused_when_pull_is_off_on,
        an_unwritten_grant_discloses_nothing_on,
        one_connection_cannot_hold_a_whole_pool_on,
    );
}

/// Calls per second of the whole stack over `mem://` (64-byte sends, the test service): one
/// after another and 32 at a time, with server and client on one thread and on two runtimes
/// on two threads. A measurement, not a check.
#[test]
#[ignore = "a measurement: cargo test --release -p rdma-rpc-core --lib tests::mem::measure -- --ignored --nocapture"]
fn measure_calls_per_second() {
    const N: u32 = 20_000;
    async fn run(client: crate::Client, what: &str) {
        use super::e2e::{inbound, MSG_SEND};
        let start = std::time::Instant::now();
        for i in 0..N {
            assert!(inbound(&client, MSG_SEND, 64, i).await.unwrap().exact);
        }
        let rate = f64::from(N) / start.elapsed().as_secs_f64();
        println!("{what}, one call at a time: {rate:.0} calls per second");
        let start = std::time::Instant::now();
        let tasks: Vec<_> = (0..32u32)
            .map(|t| {
                let client = client.clone();
                tokio::spawn(async move {
                    for i in 0..N / 32 {
                        assert!(inbound(&client, MSG_SEND, 64, t + i).await.unwrap().exact);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let rate = f64::from(N / 32 * 32) / start.elapsed().as_secs_f64();
        println!("{what}, 32 in flight: {rate:.0} calls per second");
    }

    current_thread_runtime().block_on(async {
        let h = Harness::default_on(&b()).await;
        run(h.client().await, "one thread").await;
    });
    across_two_runtimes(|client| run(client, "two runtimes on two threads"));
}

/// Clock reads ([`crate::session::now`]) on this thread so far.
fn clock_reads() -> u64 {
    crate::session::CLOCK_READS.with(std::cell::Cell::get)
}

/// Locks of sessions' states ([`crate::session::Session::lock`]) on this thread so far.
fn session_locks() -> u64 {
    crate::session::LOCKS.with(std::cell::Cell::get)
}

/// What `count` counts on this thread per 64 B send, both sides on it: 25 rounds of 8 calls at
/// once (after a first call, which opens the connection).
async fn per_call_8_in_flight(count: fn() -> u64) -> f64 {
    use super::e2e::{inbound, MSG_SEND};
    const ROUNDS: u32 = 25;
    let h = Harness::default_on(&b()).await;
    let client = h.client().await;
    assert!(inbound(&client, MSG_SEND, 64, 0).await.unwrap().exact);
    let before = count();
    for round in 0..ROUNDS {
        let call = |k: u32| inbound(&client, MSG_SEND, 64, round * 8 + k);
        let answers = tokio::join!(
            call(0),
            call(1),
            call(2),
            call(3),
            call(4),
            call(5),
            call(6),
            call(7)
        );
        let answers = [
            answers.0, answers.1, answers.2, answers.3, answers.4, answers.5, answers.6, answers.7,
        ];
        assert!(answers.into_iter().all(|a| a.unwrap().exact));
    }
    (count() - before) as f64 / f64::from(ROUNDS * 8)
}

/// A call sent at once while another call reads the connection starts to wait under the lock
/// it was sent under: its first wait takes no lock of its own. With 8 calls in flight on one
/// thread, both sides together, 6.46 locks per call instead of 7.34 (7 of 8 calls find another
/// reading). The schedule of one task on a current-thread runtime is the same on every run.
#[tokio::test]
async fn a_call_sent_while_another_reads_waits_without_a_lock_of_its_own() {
    let locks = per_call_8_in_flight(session_locks).await;
    println!("{locks} session locks per call with 8 in flight");
    assert!(
        locks <= 6.75,
        "{locks} session locks per call with 8 in flight"
    );
}

/// A server reads the clock once for the requests it reads together (up to 8), not once per
/// request: with 8 calls in flight that took one read per call, about 2% of a small call's
/// time. A deadline still counts from its request's arrival (the deadline suites check that).
/// On a current-thread runtime, so that both sides' reads are this thread's.
#[tokio::test]
async fn a_server_reads_the_clock_once_for_the_requests_it_reads_together() {
    let batched = per_call_8_in_flight(clock_reads).await;
    println!("{batched} clock reads per call with 8 in flight");
    // A call whose answer is recorded reads the clock once more, for its duration; with the
    // `metrics` feature a debug build cannot tell `metrics`' no-op recorder from a real one
    // (`observe::recording`), so every call there counts as recorded.
    let recorded = if crate::observe::recording().is_some() {
        1.0
    } else {
        0.0
    };
    assert!(
        batched <= 0.25 + recorded,
        "{batched} clock reads per call with 8 in flight (recorded: {recorded})"
    );
    // The reads are counted: one call at a time costs one read per call.
    let h = Harness::default_on(&b()).await;
    let client = h.client().await;
    let before = clock_reads();
    for i in 0..10 {
        let answer = super::e2e::inbound(&client, super::e2e::MSG_SEND, 64, i).await;
        assert!(answer.unwrap().exact);
    }
    let one = clock_reads() - before;
    assert!(one >= 10, "{one} clock reads for 10 calls one at a time");
}
