//! The metrics the examples' server exports (`--metrics`) in Prometheus' text format, after
//! known calls: the exporter the server installs, with the same server and service, read
//! through its handle instead of HTTP. A test binary of its own: the recorder is global.

use examples::buffers::PathBuffers;
use examples::generated::doca_cpp::{DocaCppEndpointsServer, DOCA_CPP_ENDPOINTS_ENDPOINTS};
use rdma_rpc_core::{Bytes, Client, Server};

/// The value of the sample whose line starts with `series` (name and labels as rendered).
fn sample(text: &str, series: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_exports_calls_bytes_and_connections() {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this binary");

    let server = Server::builder()
        .add_service(DocaCppEndpointsServer::new(PathBuffers::default()))
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    let client = Client::connect(&addr).await.unwrap();
    let send = DOCA_CPP_ENDPOINTS_ENDPOINTS
        .iter()
        .find(|ep| ep.op == rdma_rpc_core::OpKind::Send)
        .unwrap();
    for _ in 0..4 {
        client
            .call_raw(
                send,
                Bytes::new(),
                Some(Bytes::from_static(&[1; 100])),
                None,
            )
            .await
            .unwrap();
    }

    let text = prometheus.render();
    let labels = format!("{{service=\"DocaCppEndpoints\",method=\"{}\"", send.method);
    assert_eq!(
        sample(
            &text,
            &format!("rdma_rpc_server_calls_total{labels},code=\"OK\"}}")
        ),
        4.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("rdma_rpc_server_bytes_total{labels},direction=\"in\"}}")
        ),
        400.0
    );
    assert_eq!(sample(&text, "rdma_rpc_server_connections "), 1.0);
    assert_eq!(
        sample(
            &text,
            &format!(
                "rdma_rpc_client_calls_total{{path=\"{}\",op=\"send\",code=\"OK\"}}",
                send.path
            )
        ),
        4.0
    );
    // Latencies are summaries (quantiles) by default.
    assert!(
        text.contains("rdma_rpc_server_call_duration_seconds{"),
        "{text}"
    );
}
