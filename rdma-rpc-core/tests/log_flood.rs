//! A flood of refused calls costs the log little and the metrics nothing: 100,000 calls an
//! interceptor refuses write less than 1 MB of log (before: a WARN line each, tens of MB),
//! while `rdma_rpc_server_calls_refused_total` counts every one. A test binary of its own
//! with one test: the log capture and the metrics recorder are process-wide.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use rdma_rpc_core::interceptor::IncomingCall;
use rdma_rpc_core::{Client, Code, Server, Status};

const CALLS: u64 = 100_000;
/// Connections, and calls in flight on each.
const CONNECTIONS: u64 = 4;
const IN_FLIGHT: u64 = 25;
/// Calls each of the `CONNECTIONS * IN_FLIGHT` tasks makes.
const EACH: u64 = CALLS / (CONNECTIONS * IN_FLIGHT);

#[test]
fn a_flood_of_refused_calls_writes_little_log_and_counts_every_one() {
    let captured = common::capture_logs();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let intercepted = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let counted = intercepted.clone();
        let server = Server::builder()
            .add_service(common::Echo)
            .interceptor(move |_: &mut IncomingCall<'_>| {
                counted.fetch_add(1, Ordering::Relaxed);
                Err(Status::new(Code::Unauthenticated, "no valid token"))
            })
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap();
        let addr = server.local_addr();
        tokio::spawn(server.serve());
        let mut clients = Vec::new();
        for _ in 0..CONNECTIONS {
            clients.push(Client::connect(&addr).await.unwrap());
        }
        let mut tasks = tokio::task::JoinSet::new();
        for client in clients {
            for _ in 0..IN_FLIGHT {
                let client = client.clone();
                tasks.spawn(async move {
                    for _ in 0..EACH {
                        let err = client
                            .call_raw(
                                &common::ENDPOINTS[0],
                                Bytes::new(),
                                Some(Bytes::new()),
                                None,
                            )
                            .await
                            .unwrap_err();
                        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
                    }
                });
            }
        }
        assert_eq!(EACH * CONNECTIONS * IN_FLIGHT, CALLS);
        // A failure bound, never the thing measured: the flood takes seconds.
        let flood = async {
            while let Some(done) = tasks.join_next().await {
                done.unwrap();
            }
        };
        // At the bound the flood is not polled again (see `common::bounded`), and the
        // message says how far it got.
        let stalled = tokio::time::sleep(Duration::from_secs(300));
        tokio::pin!(flood, stalled);
        tokio::select! {
            biased;
            () = &mut stalled => panic!(
                "the flood stalled after {} refused calls",
                intercepted.load(Ordering::Relaxed)
            ),
            () = &mut flood => {}
        }
    });
    drop(rt);
    let log = captured.text();
    let bytes = captured.len();
    eprintln!(
        "{CALLS} refused calls wrote {bytes} bytes of log in {} lines",
        log.lines().count()
    );
    assert!(bytes < 1 << 20, "{bytes} bytes of log:\n{log}");
    let refusals = log
        .lines()
        .filter(|l| l.contains("call refused") && l.contains("UNAUTHENTICATED"))
        .count();
    assert!(refusals >= 1, "the refusals are still logged:\n{log}");
    let snapshot = snapshotter.snapshot().into_vec();
    let counted = snapshot
        .iter()
        .find(|(key, _, _, _)| {
            key.kind() == MetricKind::Counter
                && key.key().name() == "rdma_rpc_server_calls_refused_total"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "code" && l.value() == "UNAUTHENTICATED")
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => *n,
            other => panic!("{other:?}"),
        })
        .expect("refusals counted");
    assert_eq!(counted, CALLS, "every refused call is counted");
    assert_eq!(intercepted.load(Ordering::Relaxed), CALLS);
}
