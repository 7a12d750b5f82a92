//! Metrics that tell the truth (issue 30, item 6), read back from a recorder that keeps every
//! value as last set (no reset on reading):
//!
//! - a recorder installed after the first calls gets every series from then on;
//! - `pool_buffers_in_use` follows the pool: what `ServerHandle::pools` says, after each call;
//! - a client that closes or drops its `Client` is not a dropped connection; one that
//!   vanishes is;
//! - a failed reconnection is counted, and the calls refused during its backoff carry one
//!   message and the wait apart.
//!
//! One test in its own binary: the recorder is global, and the first part needs none yet.
#![cfg(feature = "metrics")]

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use rdma_rpc_core::service::{EndpointDef, OpKind, ServerCall, Service};
use rdma_rpc_core::transport::BoxFuture;
use rdma_rpc_core::{Client, Code, Server, Status};
use tokio::sync::{watch, Semaphore};

/// A recorder that keeps what was recorded, to read at any time.
#[derive(Clone)]
struct Reading {
    registry: Arc<Registry<Key, AtomicStorage>>,
    described: Arc<Mutex<Vec<String>>>,
}

impl Reading {
    fn new() -> Reading {
        Reading {
            registry: Arc::new(Registry::atomic()),
            described: Arc::default(),
        }
    }

    fn find<T>(
        handles: impl IntoIterator<Item = (Key, T)>,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Option<T> {
        handles.into_iter().find_map(|(key, handle)| {
            let key_labels: Vec<(&str, &str)> =
                key.labels().map(|l| (l.key(), l.value())).collect();
            (key.name() == name
                && key_labels.len() == labels.len()
                && labels.iter().all(|l| key_labels.contains(l)))
            .then_some(handle)
        })
    }

    /// A counter's value; `None` if the recorder never got the series.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        Self::find(self.registry.get_counter_handles(), name, labels)
            .map(|c| c.load(Ordering::SeqCst))
    }

    /// A gauge's value as last set; `None` if the recorder never got the series.
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        Self::find(self.registry.get_gauge_handles(), name, labels)
            .map(|g| f64::from_bits(g.load(Ordering::SeqCst)))
    }

    fn described(&self, name: &str) -> bool {
        self.described.lock().unwrap().iter().any(|d| d == name)
    }
}

impl Recorder for Reading {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }

    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }

    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

static HOLD: &[EndpointDef] = &[EndpointDef {
    path: "/hold",
    op: OpKind::Send,
    buffer_size: 1 << 20,
    method: "hold",
    timeout_ms: None,
    stream: rdma_rpc_core::StreamKind::Unary,
}];

/// Its handler holds its payload (a pool buffer, for a payload over the write slots) until a
/// permit of `release` comes, and says when it holds it.
#[derive(Clone)]
struct Hold {
    holding: Arc<watch::Sender<usize>>,
    release: Arc<Semaphore>,
}

impl Service for Hold {
    fn name(&self) -> &'static str {
        "Hold"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        HOLD
    }

    fn call<'a>(&'a self, _: usize, call: ServerCall<'a>) -> BoxFuture<'a, Result<Bytes, Status>> {
        Box::pin(async move {
            let ServerCall::Inbound { data, .. } = call else {
                return Err(Status::unimplemented("only send"));
            };
            self.holding.send_modify(|n| *n += 1);
            self.release.acquire().await.unwrap().forget();
            Ok(Bytes::from(data.len().to_string()))
        })
    }
}

const ECHO_OK: &[(&str, &str)] = &[("service", "Echo"), ("method", "echo"), ("code", "OK")];

async fn echo(client: &Client, len: usize) {
    let (reply, _) = client
        .call_raw(
            &common::ENDPOINTS[0],
            Bytes::new(),
            Some(Bytes::from(vec![1; len])),
            None,
        )
        .await
        .unwrap();
    assert_eq!(reply, Bytes::from(len.to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_tell_the_truth() {
    // The test's failure bound: it takes about a second.
    common::bounded("the test", 120, async {
        let recorder = a_recorder_installed_late_gets_every_series().await;
        pool_gauges_follow_the_pools(&recorder).await;
        clients_that_leave_are_not_dropped_connections(&recorder).await;
        reconnections_are_counted_and_their_errors_group(&recorder).await;
    })
    .await;
}

/// Series registered before any recorder (with the no-op one) are registered again with the
/// recorder installed later, from the next event on; gauges then say their whole value.
async fn a_recorder_installed_late_gets_every_series() -> Reading {
    let server = Server::builder()
        .add_service(common::Echo)
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    let early = Client::connect(&addr).await.unwrap();
    echo(&early, 10).await;

    let recorder = Reading::new();
    metrics::set_global_recorder(recorder.clone()).expect("the only recorder of this binary");

    echo(&early, 10).await;
    echo(&early, 20).await;
    assert_eq!(
        recorder.counter("rdma_rpc_server_calls_total", ECHO_OK),
        Some(2),
        "the calls made once the recorder is in"
    );
    assert_eq!(
        recorder.counter(
            "rdma_rpc_client_calls_total",
            &[("path", "/echo"), ("op", "send"), ("code", "OK")]
        ),
        Some(2)
    );
    assert_eq!(
        recorder.counter(
            "rdma_rpc_server_bytes_total",
            &[("service", "Echo"), ("method", "echo"), ("direction", "in")]
        ),
        Some(30)
    );
    // The connection gauge is set to the count at its next change: both connections, not
    // one.
    let late = Client::connect(&addr).await.unwrap();
    echo(&late, 1).await;
    assert_eq!(
        recorder.gauge("rdma_rpc_server_connections", &[]),
        Some(2.0)
    );
    // Each series is described to the recorder (units and help for an exporter).
    for name in [
        "rdma_rpc_server_calls_total",
        "rdma_rpc_server_connections_dropped_total",
        "rdma_rpc_client_reconnects_total",
    ] {
        assert!(recorder.described(name), "{name} not described");
    }
    early.shutdown().await;
    late.shutdown().await;
    recorder
}

/// The pool gauge of a path says what `ServerHandle::pools` says: one while a handler holds
/// a buffer, none once the call is done.
async fn pool_gauges_follow_the_pools(recorder: &Reading) {
    let hold = Hold {
        holding: Arc::new(watch::channel(0).0),
        release: Arc::new(Semaphore::new(0)),
    };
    let server = Server::builder()
        .add_service(hold.clone())
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    tokio::spawn(server.serve());
    let client = Client::connect(&addr).await.unwrap();
    let in_use = || {
        let listed = handle.pools()[0].in_use;
        let gauge = recorder.gauge("rdma_rpc_server_pool_buffers_in_use", &[("path", "/hold")]);
        (listed, gauge)
    };
    assert_eq!(in_use(), (0, Some(0.0)), "set when the server binds");
    for round in 1..=2 {
        // Over the write slots (64 KiB): the payload lands in a pool buffer.
        let call = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .call_raw(
                        &HOLD[0],
                        Bytes::new(),
                        Some(Bytes::from(vec![2; 200 << 10])),
                        None,
                    )
                    .await
            })
        };
        hold.holding
            .subscribe()
            .wait_for(|n| *n == round)
            .await
            .unwrap();
        assert_eq!(
            in_use(),
            (1, Some(1.0)),
            "round {round}: the handler holds one"
        );
        hold.release.add_permits(1);
        let (reply, _) = call.await.unwrap().unwrap();
        assert_eq!(reply, Bytes::from((200 << 10).to_string()));
        assert_eq!(in_use(), (0, Some(0.0)), "round {round}: given back");
    }
    client.shutdown().await;
}

/// `close`, `shutdown` and dropping the last handle say goodbye: the server does not count
/// a dropped connection (nor did it for the clients of the parts before, which shut down).
/// A peer that vanishes is counted (`closed`).
async fn clients_that_leave_are_not_dropped_connections(recorder: &Reading) {
    let server = Server::builder()
        .add_service(common::Echo)
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    let mut count = server.connection_count();
    tokio::spawn(server.serve());
    let dropped = |reason| {
        recorder
            .counter(
                "rdma_rpc_server_connections_dropped_total",
                &[("reason", reason)],
            )
            .unwrap_or(0)
    };

    let closed = Client::connect(&addr).await.unwrap();
    echo(&closed, 1).await;
    closed.close();
    count.wait_for(|n| n == 0).await;

    let shut = Client::connect(&addr).await.unwrap();
    echo(&shut, 1).await;
    shut.shutdown().await;
    count.wait_for(|n| n == 0).await;

    let dropped_client = Client::connect(&addr).await.unwrap();
    echo(&dropped_client, 1).await;
    drop(dropped_client);
    count.wait_for(|n| n == 0).await;
    assert_eq!(dropped("closed"), 0, "the clients of this test all left");
    assert_eq!(dropped("protocol"), 0);
    assert_eq!(dropped("other"), 0);

    // A peer that connects and goes away without a word (as a process that crashed).
    let transport = rdma_rpc_core::transport::transport_for(&addr).unwrap();
    let vanishing = transport.connect(&addr).await.unwrap();
    count.wait_for(|n| n == 1).await;
    vanishing.close();
    drop(vanishing);
    count.wait_for(|n| n == 0).await;
    assert_eq!(dropped("closed"), 1, "the peer that vanished");
}

/// A failed reconnection counts as `failed`; the calls refused during its backoff carry the
/// same message (no countdown) and the wait in `retry_after`.
async fn reconnections_are_counted_and_their_errors_group(recorder: &Reading) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .add_service(common::Echo)
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    let mut count = server.connection_count();
    let serving = tokio::spawn(server.serve_with_shutdown(async {
        let _ = stopped.await;
    }));
    let backoff = Duration::from_secs(3600);
    let client = Client::builder()
        .reconnect_backoff(backoff)
        .connect(&addr)
        .await
        .unwrap();
    echo(&client, 1).await;
    let outcome = |outcome| {
        recorder
            .counter("rdma_rpc_client_reconnects_total", &[("outcome", outcome)])
            .unwrap_or(0)
    };
    let failed_before = outcome("failed");
    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
    count.wait_for(|n| n == 0).await;

    let mut errors = Vec::new();
    while errors.len() < 3 {
        let err = client
            .call_raw(
                &common::ENDPOINTS[0],
                Bytes::new(),
                Some(Bytes::from_static(b"x")),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        // Calls may find the old connection before the client has seen it end.
        if err.message().contains("reconnecting") {
            errors.push(err);
        }
    }
    assert_eq!(
        outcome("failed"),
        failed_before + 1,
        "one attempt, then the wait"
    );
    for err in &errors {
        assert_eq!(err.message(), errors[0].message(), "{errors:?}");
        assert_eq!(err, &errors[0]);
        assert!(
            err.retry_after().is_some_and(|wait| wait <= backoff),
            "{err:?}"
        );
    }
    assert!(
        errors[0]
            .message()
            .contains("waiting before the next attempt"),
        "{}",
        errors[0]
    );
}
