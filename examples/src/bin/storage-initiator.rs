//! The initiator of the storage application: writes blocks, reads them back, checks every
//! byte, prints IOPS, GB/s and latencies.
//!
//! `cargo run --release -p examples --bin storage-initiator -- --storage-server
//! tcp://host:7480 [--block-size 64KiB] [--blocks 2000] [--cores 2] [--transactions-per-core
//! 8] [--shutdown yes]` (`--shutdown yes` shuts the service and its targets down afterwards).
//! One connection per core (`--cores`, default: this machine's). The service takes calls with
//! its secret only: `--secret` or `STORAGE_SERVICE_SECRET`.

use std::process::ExitCode;

use examples::generated::storage_service::{StorageCommand, StorageServiceClient};
use examples::storage::auth::{Secret, SERVICE_SECRET_ENV};
use examples::storage::flags::{self, Flags};
use examples::storage::initiator::{self, CostCounters, InitiatorConfig};
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::Client;
use std::sync::Arc;

const USAGE: &str = "usage: storage-initiator --storage-server ADDR [--block-size SIZE (64KiB)] \
[--blocks N (2000)] [--cores N (this machine's)] [--transactions-per-core N (8)] [--shutdown \
yes|no (no)] [--secret S (or STORAGE_SERVICE_SECRET)]";

async fn run() -> Result<(), String> {
    let flags = Flags::parse(
        &[
            "--storage-server",
            "--block-size",
            "--blocks",
            "--cores",
            "--transactions-per-core",
            "--shutdown",
            "--secret",
        ],
        USAGE,
    )?;
    let addr = flags.required("--storage-server")?;
    let secret = Secret::from_flag_or_env(flags.get("--secret"), "--secret", SERVICE_SECRET_ENV)?;
    // Over DOCA the transport is made here, so that the report can say what each I/O cost
    // this process in memory registrations and imports.
    let doca = if addr.starts_with("doca") {
        Some(DocaTransport::new(DocaConfig::from_env()).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let config = InitiatorConfig {
        block_size: flags.size("--block-size", 64 << 10)?,
        blocks: flags.number("--blocks", 2000)?,
        cores: flags.number("--cores", flags::cores() as u64)? as u32,
        transactions_per_core: flags.number("--transactions-per-core", 8)? as u32,
        progress: true,
        counters: doca
            .clone()
            .map(|t| Arc::new(move || t.counters()) as CostCounters),
    };
    let mut clients = Vec::new();
    for _ in 0..config.cores.max(1) {
        let mut builder = Client::builder().interceptor(secret.present());
        if let Some(t) = &doca {
            builder = builder.transport(Arc::new(t.clone()));
        }
        clients.push(
            builder
                .connect(&addr)
                .await
                .map_err(|e| format!("cannot reach the service at {addr}: {e}"))?,
        );
    }
    let client = clients[0].clone();
    let report = initiator::run_on(clients, &config)
        .await
        .map_err(|s| s.to_string())?;
    print!("{}", report.table());
    println!("all {} blocks verified", config.blocks);
    if flags.string("--shutdown", "no") == "yes" {
        let stub = StorageServiceClient::new(client);
        initiator::control(&stub, StorageCommand::Shutdown)
            .await
            .map_err(|s| s.to_string())?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    examples::logging::init();
    flags::exit("storage-initiator", run().await)
}
