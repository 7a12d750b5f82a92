//! The storage service of the storage application, between the initiator and three targets.
//!
//! `cargo run --release -p examples --bin storage-service -- --listen tcp://0.0.0.0:7480
//! --data-1-storage tcp://host1:7481 --data-2-storage tcp://host2:7481 --data-p-storage
//! tcp://host3:7481 [--trigger-recovery-read-every-n N] [--control-timeout 5s] [--cores N]`.
//! It takes calls from its initiator only (`--secret` or `STORAGE_SERVICE_SECRET`) and
//! presents the targets' secret to them (`--target-secret` or `STORAGE_TARGET_SECRET`);
//! `--cores` connections to each target (one per core of the data path; default: this
//! machine's). Runs until the initiator shuts it down or Ctrl-C. Logs go to stderr, filtered
//! by `RUST_LOG` (degraded writes and recoveries are warnings).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use examples::generated::storage_service::StorageServiceServer;
use examples::storage::auth::{Secret, SERVICE_SECRET_ENV, TARGET_SECRET_ENV};
use examples::storage::flags;
use examples::storage::service::{Service, ServiceConfig};
use rdma_rpc_core::transport::transport_for;
use rdma_rpc_core::Server;

/// The storage service: between the initiator and the three targets.
#[derive(Debug, Parser)]
#[command(name = "storage-service")]
struct Args {
    /// Where to listen for the initiator.
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// The data 1 target.
    #[arg(long = "data-1-storage", value_name = "ADDR")]
    data_1: String,
    /// The data 2 target.
    #[arg(long = "data-2-storage", value_name = "ADDR")]
    data_2: String,
    /// The parity target.
    #[arg(long = "data-p-storage", value_name = "ADDR")]
    parity: String,
    /// Every Nth read goes through the parity target (0: only when needed).
    #[arg(long, value_name = "N", default_value_t = 0)]
    trigger_recovery_read_every_n: u64,
    /// Longest wait for a target's answer to a control command.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = flags::duration)]
    control_timeout: Duration,
    /// Connections to each target, one per core of the data path (default: this machine's).
    #[arg(long, value_name = "N")]
    cores: Option<usize>,
    /// The secret its initiator presents (or STORAGE_SERVICE_SECRET).
    #[arg(long, value_name = "S")]
    secret: Option<String>,
    /// The secret it presents to the targets (or STORAGE_TARGET_SECRET).
    #[arg(long, value_name = "S")]
    target_secret: Option<String>,
}

async fn run(args: Args) -> Result<(), String> {
    let listen = args.listen;
    let targets = [args.data_1, args.data_2, args.parity];
    let secret = Secret::from_flag_or_env(args.secret.as_deref(), "--secret", SERVICE_SECRET_ENV)?;
    let config = ServiceConfig {
        recovery_every: args.trigger_recovery_read_every_n,
        control_timeout: args.control_timeout,
        cores: args.cores.unwrap_or_else(flags::cores),
        codec: None,
        target_secret: Secret::from_flag_or_env(
            args.target_secret.as_deref(),
            "--target-secret",
            TARGET_SECRET_ENV,
        )?,
        threads: None,
    };
    let transport = transport_for(&targets[0]).map_err(|e| e.to_string())?;
    let [d1, d2, p] = targets.map(|addr| vec![addr]);
    let service = Service::connect(transport, [&d1, &d2, &p], config)
        .await
        .map_err(|s| s.to_string())?;
    let service = Arc::new(service);
    let server = Server::builder()
        .initial_receives(examples::storage::RECEIVES)
        .recv_credits(examples::storage::RECEIVES)
        .interceptor(secret.require("its initiator"))
        .add_service(StorageServiceServer::new(service.clone()))
        .bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    println!("storage service on {}: {service:?}", server.local_addr());
    let down = service.shut_down();
    flags::serve_until(server, down, "the initiator").await
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    examples::logging::init();
    flags::exit("storage-service", run(args).await)
}
