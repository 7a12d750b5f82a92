//! A standalone server of the doca-cpp endpoints, for two terminals or two machines.
//!
//! `cargo run --release -p examples --bin server -- [ADDRESS]` (default `tcp://0.0.0.0:7470`;
//! `doca://<ip>:<port>` for the DOCA transport). Ctrl-C shuts down gracefully. Logs go to
//! stderr, filtered by `RUST_LOG` (default `warn`: every dropped connection with its reason;
//! `RUST_LOG=rdma_rpc_core=debug` for more).

use std::process::ExitCode;

use examples::buffers::PathBuffers;
use examples::generated::doca_cpp::{DocaCppEndpointsServer, DOCA_CPP_ENDPOINTS_ENDPOINTS};
use rdma_rpc_core::Server;

#[tokio::main]
async fn main() -> ExitCode {
    examples::logging::init();
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tcp://0.0.0.0:7470".into());
    let server = match Server::builder()
        .add_service(DocaCppEndpointsServer::new(PathBuffers::default()))
        .bind(&addr)
        .await
    {
        Ok(server) => server,
        Err(e) => {
            eprintln!("server: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("serving on {}", server.local_addr());
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
