//! A standalone server of the doca-cpp endpoints, for two terminals or two machines.
//!
//! `cargo run --release -p examples --bin server -- [ADDRESS] [--metrics HOST:PORT]
//! [--report-every SECONDS] [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE
//! [--tls-client-crl FILE]]]` (default `tcp://0.0.0.0:7470`; `doca://<ip>:<port>` for the DOCA
//! transport; `tls://<ip>:<port>` with the server's certificate and key for TLS,
//! `--tls-client-ca` to require client certificates of that CA (mutual TLS) and
//! `--tls-client-crl` to refuse those a revocation list names; the same flags with
//! `doca+oob://<ip>:<port>` put its side channel in TLS, the client's certificate then the
//! identity over RDMA too; SIGHUP reads the TLS files again, and closes the connections of
//! clients they now refuse). Ctrl-C
//! shuts down gracefully. Logs go to stderr, filtered by `RUST_LOG`
//! (default `warn`: every dropped connection and refused call with its reason;
//! `RUST_LOG=rdma_rpc_core=debug` for every call). `--metrics` serves Prometheus metrics at
//! `http://HOST:PORT/metrics`; `--report-every` prints the connections and pool use. It serves
//! the standard health service too (`rdma-rpc health ADDR`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use examples::buffers::PathBuffers;
use examples::generated::doca_cpp::{DocaCppEndpointsServer, DOCA_CPP_ENDPOINTS_ENDPOINTS};
use examples::tls::ServerTlsArgs;
use rdma_rpc_core::health::HealthReporter;
use rdma_rpc_core::transport::tls::TlsTransport;
use rdma_rpc_core::{Server, ServerHandle};

/// The doca-cpp example server: four endpoints over any transport.
#[derive(Debug, clap::Parser)]
#[command(name = "server")]
struct Args {
    /// Where to listen.
    #[arg(value_name = "ADDRESS", default_value = "tcp://0.0.0.0:7470")]
    addr: String,
    /// Serve Prometheus metrics on this HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    metrics: Option<SocketAddr>,
    /// Print the connections and pools every N seconds.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    report_every: Option<Duration>,
    #[command(flatten)]
    tls: ServerTlsArgs,
}

/// A whole number of seconds, at least 1.
fn seconds(v: &str) -> Result<Duration, String> {
    let secs: u64 = v
        .parse()
        .map_err(|e| format!("not a number of seconds ({e})"))?;
    Ok(Duration::from_secs(secs.max(1)))
}

async fn report(handle: ServerHandle, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let conns = handle.connections();
        println!("{} connection(s)", conns.len());
        for c in &conns {
            println!(
                "  #{} {}: {} call(s) in flight, {} answered",
                c.id, c.peer, c.calls_in_flight, c.calls_answered
            );
        }
        for p in handle.pools() {
            println!(
                "  pool {}: {} of {} buffers of {} bytes in use ({} by calls in flight)",
                p.path, p.in_use, p.buffers, p.buffer_size, p.held_by_calls
            );
        }
    }
}

/// Reads the TLS files again on every SIGHUP: new handshakes use what they hold (a renewed
/// certificate, a new revocation list), and clients connected that they refuse are closed;
/// unusable files leave the settings as they were.
#[cfg(unix)]
async fn reload_on_hangup(flags: ServerTlsArgs, tls: TlsTransport) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(e) => {
            eprintln!("server: no TLS reload on SIGHUP: {e}");
            return;
        }
    };
    while hangups.recv().await.is_some() {
        match flags.reload(&tls) {
            Ok(recheck) => {
                println!(
                    "TLS settings read again from their files; clients connected: {} kept, {} \
                     closed",
                    recheck.kept,
                    recheck.closed.len()
                );
                for closed in &recheck.closed {
                    println!("  closed {}: {}", closed.peer, closed.reason);
                }
            }
            Err(e) => eprintln!("server: TLS settings not reloaded, the old ones stay: {e}"),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    examples::logging::init();
    let args = <Args as clap::Parser>::parse();
    if let Some(at) = args.metrics {
        let installed = metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(at)
            .install();
        if let Err(e) = installed {
            eprintln!("server: cannot serve metrics on {at}: {e}");
            return ExitCode::FAILURE;
        }
        println!("metrics on http://{at}/metrics");
    }
    let addr = args.addr;
    // The standard health service: `rdma-rpc health ADDR [DocaCppEndpoints]` asks it.
    let health = HealthReporter::new();
    let mut builder = Server::builder()
        .add_service(DocaCppEndpointsServer::new(PathBuffers::default()))
        .add_health(&health);
    let mut tls_settings = None;
    match args.tls.transports(&addr) {
        Ok(Some((transport, tls))) => {
            builder = builder.transport(transport);
            tls_settings = Some(tls);
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("server: {e}");
            return ExitCode::from(2);
        }
    }
    let server = match builder.bind(&addr).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("server: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("serving on {}", server.local_addr());
    #[cfg(unix)]
    if let Some(tls) = tls_settings {
        tokio::spawn(reload_on_hangup(args.tls.clone(), tls));
    }
    #[cfg(not(unix))]
    drop(tls_settings);
    if let Some(every) = args.report_every {
        tokio::spawn(report(server.handle(), every));
    }
    for ep in DOCA_CPP_ENDPOINTS_ENDPOINTS {
        println!(
            "  {:<8} {:<10} buffer {} bytes",
            ep.op, ep.path, ep.buffer_size
        );
    }
    let shutdown = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        println!("shutting down: finishing calls in flight");
    };
    match server.serve_with_shutdown(shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server: {e}");
            ExitCode::FAILURE
        }
    }
}
