//! The initiator of the storage application: writes blocks, reads them back, checks every
//! byte, prints IOPS, GB/s and latencies.
//!
//! `cargo run --release -p examples --bin storage-initiator -- --storage-server
//! tcp://host:7480 [--block-size 64KiB] [--blocks 2000] [--cores 2] [--transactions-per-core
//! 8] [--shutdown yes]` (`--shutdown yes` shuts the service and its targets down afterwards).
//! One connection per core (`--cores`, default: this machine's), each made and used on a
//! thread of its own with its own runtime and transactions. Connection `k` dials the
//! service's address `k` when it lists one per core (`--storage-server
//! tcp://host:7480,tcp://host:7481`, as a service with `--cores 2` prints them), so that each
//! of its cores serves one of the initiator's. `--cpu N` (repeatable) runs one connection
//! per CPU given, its thread pinned there. The service takes calls with its secret only:
//! `--secret` or `STORAGE_SERVICE_SECRET`.

use std::process::ExitCode;

use clap::Parser;
use examples::generated::storage_service::{StorageCommand, StorageServiceClient};
use examples::storage::auth::{Secret, SERVICE_SECRET_ENV};
use examples::storage::flags;
use examples::storage::initiator::{self, CostCounters, InitiatorConfig};
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::Client;
use std::sync::Arc;

/// The initiator: writes blocks, reads them back, checks every byte.
#[derive(Debug, Parser)]
#[command(name = "storage-initiator")]
struct Args {
    /// The storage service: its listeners, one per core (separated by commas), or one;
    /// connection k dials address k, counting round when there are fewer addresses.
    #[arg(long, value_name = "ADDR", required = true, value_delimiter = ',')]
    storage_server: Vec<String>,
    /// Bytes per block.
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = flags::size)]
    block_size: usize,
    /// Blocks written, then read back.
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = flags::at_least_one::<u64>)]
    blocks: u64,
    /// Connections, one per core (default: this machine's).
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<u32>)]
    cores: Option<u32>,
    /// Pins a data path's thread to CPU N (repeatable: one data path per --cpu, as NVIDIA's
    /// application runs one per --cpu; --cores then defaults to their number).
    #[arg(long = "cpu", value_name = "N")]
    cpu: Vec<usize>,
    /// I/O in flight per core.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = flags::at_least_one::<u32>)]
    transactions_per_core: u32,
    /// Shut the service and its targets down afterwards (yes or no).
    #[arg(long, value_name = "yes|no", default_value = "no")]
    shutdown: String,
    /// The secret the service takes (or STORAGE_SERVICE_SECRET).
    #[arg(long, value_name = "S")]
    secret: Option<String>,
}

async fn run(args: Args) -> Result<(), String> {
    let addrs = args.storage_server.clone();
    let secret = Secret::from_flag_or_env(args.secret.as_deref(), "--secret", SERVICE_SECRET_ENV)?;
    // Over DOCA the transport is made here, so that the report can say what each I/O cost
    // this process in memory registrations and imports.
    let doca = if addrs[0].starts_with("doca") {
        Some(DocaTransport::new(DocaConfig::from_env()).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let config = InitiatorConfig {
        block_size: args.block_size,
        blocks: args.blocks,
        cores: flags::cores_for(args.cores.map(|n| n as usize), &args.cpu)?
            .unwrap_or_else(flags::cores) as u32,
        transactions_per_core: args.transactions_per_core,
        progress: true,
        counters: doca
            .clone()
            .map(|t| Arc::new(move || t.counters()) as CostCounters),
        threads: None,
    };
    // A thread per core, each with its own runtime, connection and transactions.
    let cores = config.cores.max(1) as usize;
    let threads = flags::core_threads(cores, &args.cpu)?;
    let mut clients = Vec::new();
    for core in 0..cores {
        let mut builder = Client::builder()
            .initial_receives(examples::storage::RECEIVES)
            .recv_credits(examples::storage::RECEIVES)
            .interceptor(secret.present());
        if let Some(t) = &doca {
            builder = builder.transport(Arc::new(t.clone()));
        }
        let addr = addrs[core % addrs.len()].clone();
        let dial = async move {
            builder
                .connect(&addr)
                .await
                .map_err(|e| format!("cannot reach the service at {addr}: {e}"))
        };
        clients.push(threads.run(core, dial).await?);
    }
    let config = InitiatorConfig {
        threads: Some(threads),
        ..config
    };
    let client = clients[0].clone();
    let report = initiator::run_on(clients, &config)
        .await
        .map_err(|s| s.to_string())?;
    print!("{}", report.table());
    println!("all {} blocks verified", config.blocks);
    if args.shutdown == "yes" {
        let stub = StorageServiceClient::new(client);
        initiator::control(&stub, StorageCommand::Shutdown)
            .await
            .map_err(|s| s.to_string())?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    examples::logging::init();
    flags::exit("storage-initiator", run(args).await)
}
