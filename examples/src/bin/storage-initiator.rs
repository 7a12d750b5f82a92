//! The initiator of the storage application: writes blocks, reads them back, checks every
//! byte, prints IOPS, GB/s and latencies.
//!
//! `cargo run --release -p examples --bin storage-initiator -- --storage-server
//! tcp://host:7480 [--block-size 64KiB] [--blocks 2000] [--cores 2] [--transactions-per-core
//! 8] [--shutdown yes]` (`--shutdown yes` shuts the service and its targets down afterwards).

use std::process::ExitCode;

use examples::generated::storage_service::{StorageCommand, StorageServiceClient};
use examples::storage::flags::{self, Flags};
use examples::storage::initiator::{self, InitiatorConfig};
use rdma_rpc_core::Client;

const USAGE: &str = "usage: storage-initiator --storage-server ADDR [--block-size SIZE (64KiB)] \
[--blocks N (2000)] [--cores N (2)] [--transactions-per-core N (8)] [--shutdown yes|no (no)]";

async fn run() -> Result<(), String> {
    let flags = Flags::parse(
        &[
            "--storage-server",
            "--block-size",
            "--blocks",
            "--cores",
            "--transactions-per-core",
            "--shutdown",
        ],
        USAGE,
    )?;
    let addr = flags.required("--storage-server")?;
    let config = InitiatorConfig {
        block_size: flags.size("--block-size", 64 << 10)?,
        blocks: flags.number("--blocks", 2000)?,
        cores: flags.number("--cores", 2)? as u32,
        transactions_per_core: flags.number("--transactions-per-core", 8)? as u32,
        progress: true,
    };
    let client = Client::connect(&addr)
        .await
        .map_err(|e| format!("cannot reach the service at {addr}: {e}"))?;
    let report = initiator::run(client.clone(), &config)
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
