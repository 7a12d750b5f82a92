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

use examples::generated::storage_service::StorageServiceServer;
use examples::storage::auth::{Secret, SERVICE_SECRET_ENV, TARGET_SECRET_ENV};
use examples::storage::flags::{self, Flags};
use examples::storage::service::{Service, ServiceConfig};
use rdma_rpc_core::transport::transport_for;
use rdma_rpc_core::Server;

const USAGE: &str = "usage: storage-service --listen ADDR --data-1-storage ADDR \
--data-2-storage ADDR --data-p-storage ADDR [--trigger-recovery-read-every-n N (0: never)] \
[--control-timeout DURATION (5s)] [--cores N (this machine's)] [--secret S (or \
STORAGE_SERVICE_SECRET)] [--target-secret S (or STORAGE_TARGET_SECRET)]";

async fn run() -> Result<(), String> {
    let flags = Flags::parse(
        &[
            "--listen",
            "--data-1-storage",
            "--data-2-storage",
            "--data-p-storage",
            "--trigger-recovery-read-every-n",
            "--control-timeout",
            "--cores",
            "--secret",
            "--target-secret",
        ],
        USAGE,
    )?;
    let listen = flags.required("--listen")?;
    let targets = [
        flags.required("--data-1-storage")?,
        flags.required("--data-2-storage")?,
        flags.required("--data-p-storage")?,
    ];
    let secret = Secret::from_flag_or_env(flags.get("--secret"), "--secret", SERVICE_SECRET_ENV)?;
    let config = ServiceConfig {
        recovery_every: flags.number("--trigger-recovery-read-every-n", 0)?,
        control_timeout: flags.duration("--control-timeout", Duration::from_secs(5))?,
        cores: flags.number("--cores", flags::cores() as u64)? as usize,
        codec: None,
        target_secret: Secret::from_flag_or_env(
            flags.get("--target-secret"),
            "--target-secret",
            TARGET_SECRET_ENV,
        )?,
    };
    let transport = transport_for(&targets[0]).map_err(|e| e.to_string())?;
    let service = Service::connect(transport, [&targets[0], &targets[1], &targets[2]], config)
        .await
        .map_err(|s| s.to_string())?;
    let service = Arc::new(service);
    let server = Server::builder()
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
    examples::logging::init();
    flags::exit("storage-service", run().await)
}
