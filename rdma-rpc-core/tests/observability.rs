//! Metrics (feature `metrics`) and the server's listing of connections and pools, read back
//! after known calls. A test binary of its own: the recorder is global.

mod common;

use std::time::Duration;

use bytes::Bytes;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use rdma_rpc_core::{Client, Code, Server};

/// What the recorder holds: its snapshots report what changed since the last one.
type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The value of one metric with exactly these labels.
fn value<'a>(
    snap: &'a Snapshot,
    kind: MetricKind,
    name: &str,
    labels: &[(&str, &str)],
) -> &'a DebugValue {
    let found = snap.iter().find(|(key, ..)| {
        let key_labels: Vec<(&str, &str)> =
            key.key().labels().map(|l| (l.key(), l.value())).collect();
        key.kind() == kind
            && key.key().name() == name
            && key_labels.len() == labels.len()
            && labels.iter().all(|l| key_labels.contains(l))
    });
    match found {
        Some((_, _, _, value)) => value,
        None => panic!("no {kind:?} {name} {labels:?}"),
    }
}

fn counter(snap: &Snapshot, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(snap, MetricKind::Counter, name, labels) {
        DebugValue::Counter(n) => *n,
        other => panic!("{name}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_bytes_refusals_connections_and_pools_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let stall = common::Stall::default();
    let server = Server::builder()
        .add_service(common::Echo)
        .add_service(stall.clone())
        .max_call_duration(Some(Duration::from_millis(300)))
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    tokio::spawn(server.serve());

    let client = Client::connect(&addr).await.unwrap();
    for len in [10, 20, 30] {
        let (message, _) = client
            .call_raw(
                &common::ENDPOINTS[0],
                Bytes::new(),
                Some(Bytes::from(vec![7; len])),
                None,
            )
            .await
            .unwrap();
        assert_eq!(message, Bytes::from(len.to_string()));
    }
    let err = client
        .call_raw(
            &common::UNKNOWN,
            Bytes::new(),
            None,
            Duration::from_secs(30),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    client.ping().await.unwrap();
    // A call the client gives up on (it drops the call: CANCELLED), and one that runs past
    // the server's max_call_duration (DEADLINE_EXCEEDED): both handlers stopped, both counted.
    let abandoned = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .call_raw(&common::STALL[0], Bytes::new(), Some(Bytes::new()), None)
                .await
        })
    };
    let mut started = stall.started.subscribe();
    started.wait_for(|n| *n >= 1).await.unwrap();
    abandoned.abort();
    let mut stopped = stall.stopped.subscribe();
    stopped.wait_for(|n| *n >= 1).await.unwrap();
    let err = client
        .call_raw(&common::STALL[0], Bytes::new(), Some(Bytes::new()), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    stopped.wait_for(|n| *n >= 2).await.unwrap();
    let snap: Snapshot = snapshotter.snapshot().into_vec();
    let stalled = |code| {
        counter(
            &snap,
            "rdma_rpc_server_calls_total",
            &[("service", "Stall"), ("method", "stall"), ("code", code)],
        )
    };
    assert_eq!(stalled("CANCELLED"), 1, "the abandoned call");
    assert_eq!(
        stalled("DEADLINE_EXCEEDED"),
        1,
        "the call past max_call_duration"
    );

    // The server side, recorded before each response left.
    let server_calls = |code| {
        counter(
            &snap,
            "rdma_rpc_server_calls_total",
            &[("service", "Echo"), ("method", "echo"), ("code", code)],
        )
    };
    assert_eq!(server_calls("OK"), 3);
    assert_eq!(
        counter(
            &snap,
            "rdma_rpc_server_bytes_total",
            &[("service", "Echo"), ("method", "echo"), ("direction", "in")]
        ),
        60
    );
    assert_eq!(
        counter(
            &snap,
            "rdma_rpc_server_calls_refused_total",
            &[("code", "UNIMPLEMENTED")]
        ),
        1
    );
    match value(
        &snap,
        MetricKind::Histogram,
        "rdma_rpc_server_call_duration_seconds",
        &[("service", "Echo"), ("method", "echo")],
    ) {
        DebugValue::Histogram(samples) => assert_eq!(samples.len(), 3),
        other => panic!("{other:?}"),
    }
    match value(&snap, MetricKind::Gauge, "rdma_rpc_server_connections", &[]) {
        DebugValue::Gauge(n) => assert_eq!(n.into_inner(), 1.0),
        other => panic!("{other:?}"),
    }
    match value(
        &snap,
        MetricKind::Gauge,
        "rdma_rpc_server_pool_buffers_in_use",
        &[("path", "/echo")],
    ) {
        DebugValue::Gauge(n) => assert_eq!(n.into_inner(), 0.0, "inline payloads take none"),
        other => panic!("{other:?}"),
    }

    // The client side.
    let client_calls = |path, code| {
        counter(
            &snap,
            "rdma_rpc_client_calls_total",
            &[("path", path), ("op", "send"), ("code", code)],
        )
    };
    assert_eq!(client_calls("/echo", "OK"), 3);
    assert_eq!(client_calls("/nowhere", "UNIMPLEMENTED"), 1);

    // The listing.
    let conns = handle.connections();
    assert_eq!(conns.len(), 1, "{conns:?}");
    assert_eq!(
        conns[0].calls_answered, 5,
        "three echoes and the two stopped calls"
    );
    assert_eq!(conns[0].calls_in_flight, 0);
    let pools = handle.pools();
    assert_eq!(pools.len(), 2, "{pools:?}");
    let echo = pools.iter().find(|p| p.path == "/echo").unwrap();
    assert_eq!(echo.buffer_size, 1 << 20);
    assert_eq!(echo.in_use, 0);

    // A connection that ends leaves the listing and the gauge.
    client.close();
    drop(client);
    handle.connection_count().wait_for(|n| n == 0).await;
    assert!(handle.connections().is_empty());
    let snap: Snapshot = snapshotter.snapshot().into_vec();
    // The gauge is set to the count, not moved by one.
    match value(&snap, MetricKind::Gauge, "rdma_rpc_server_connections", &[]) {
        DebugValue::Gauge(n) => assert_eq!(n.into_inner(), 0.0),
        other => panic!("{other:?}"),
    }
}
