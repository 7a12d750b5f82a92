//! The storage application in one command: three targets, the service and the initiator on
//! loopback. Exits 0 when every block was read back exactly.
//!
//! `cargo run --release -p examples --bin storage-demo -- [--transport tcp|mem|doca]
//! [--block-size 64KiB] [--blocks 2000] [--cores 2] [--transactions-per-core 8]
//! [--trigger-recovery-read-every-n 10] [--kill-target-after N] [--control-timeout 5s]`.
//! `--kill-target-after N` takes the data 2 target off the network once it has stored N
//! halves: later writes are degraded, reads are rebuilt from data 1 and the parity.

use std::process::ExitCode;
use std::time::Duration;

use examples::generated::storage_service::{StorageCommand, StorageServiceClient};
use examples::storage::cluster::{Cluster, ClusterConfig};
use examples::storage::flags::{self, Flags};
use examples::storage::initiator::{self, CostCounters, InitiatorConfig};
use examples::storage::service::ServiceConfig;
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::{transport_for, Transport};
use std::sync::Arc;

const USAGE: &str = "usage: storage-demo [--transport tcp|mem|doca (tcp)] [--block-size SIZE \
(64KiB)] [--blocks N (2000)] [--cores N (2)] [--transactions-per-core N (8)] \
[--trigger-recovery-read-every-n N (10)] [--kill-target-after N] [--control-timeout DURATION (5s)]";

async fn run() -> Result<(), String> {
    let flags = Flags::parse(
        &[
            "--transport",
            "--block-size",
            "--blocks",
            "--cores",
            "--transactions-per-core",
            "--trigger-recovery-read-every-n",
            "--kill-target-after",
            "--control-timeout",
        ],
        USAGE,
    )?;
    let bind = match flags.string("--transport", "tcp").as_str() {
        "tcp" => "tcp://127.0.0.1:0",
        "mem" => "mem://",
        "doca" => "doca://127.0.0.1:0",
        other => return Err(format!("--transport: `{other}` is not tcp, mem or doca")),
    };
    let block_size = flags.size("--block-size", 64 << 10)?;
    let blocks = flags.number("--blocks", 2000)?;
    let config = ClusterConfig {
        block_size,
        block_count: blocks,
        service: ServiceConfig {
            recovery_every: flags.number("--trigger-recovery-read-every-n", 10)?,
            control_timeout: flags.duration("--control-timeout", Duration::from_secs(5))?,
        },
    };
    // Over DOCA the transport is made here, so that the report can say what each I/O cost in
    // memory registrations and imports (every part of the demo runs in this process).
    let doca = if bind.starts_with("doca") {
        Some(DocaTransport::new(DocaConfig::from_env()).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let transport = match &doca {
        Some(t) => Arc::new(t.clone()) as Arc<dyn Transport>,
        None => transport_for(bind).map_err(|e| e.to_string())?,
    };
    let cluster = Cluster::start(transport, bind, &config)
        .await
        .map_err(|s| s.to_string())?;
    println!(
        "targets {} | service {} | {blocks} blocks of {block_size} bytes",
        cluster.target_addrs.join(", "),
        cluster.service_addr
    );
    let client = cluster.client().await.map_err(|s| s.to_string())?;
    let initiator_config = InitiatorConfig {
        block_size,
        blocks,
        cores: flags.number("--cores", 2)? as u32,
        transactions_per_core: flags.number("--transactions-per-core", 8)? as u32,
        progress: true,
        counters: doca.map(|t| Arc::new(move || t.counters()) as CostCounters),
    };
    let run = {
        let client = client.clone();
        tokio::spawn(async move { initiator::run(client, &initiator_config).await })
    };
    if let Some(n) = flags.get("--kill-target-after") {
        let n: u64 = n
            .parse()
            .map_err(|_| format!("--kill-target-after: `{n}` is not a whole number"))?;
        cluster.targets[1].stored(n).await;
        cluster.kill_target(1);
        println!("data 2 target killed after {n} halves");
    }
    let report = run
        .await
        .map_err(|e| e.to_string())?
        .map_err(|s| s.to_string())?;
    print!("{}", report.table());
    // The baseline, measured now on the same machine: a plain TCP stream of 4 MiB writes.
    let bulk =
        examples::bench::tcp_baseline::bulk_stream(&tokio::runtime::Handle::current(), 4 << 20, 64)
            .await
            .map_err(|e| format!("measuring raw TCP bulk: {e}"))?;
    println!(
        "raw TCP bulk, same machine, same run: {:.2} GB/s (storage write {:.2}x, read {:.2}x of it)",
        bulk / 1e9,
        report.write.gb_per_s() * 1e9 / bulk,
        report.read.gb_per_s() * 1e9 / bulk
    );
    println!("all {blocks} blocks verified");
    let stub = StorageServiceClient::new(client);
    initiator::control(&stub, StorageCommand::Shutdown)
        .await
        .map_err(|s| s.to_string())?;
    tokio::time::timeout(Duration::from_secs(30), cluster.join())
        .await
        .map_err(|_| "the service and targets did not stop within 30 s".to_owned())?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    examples::logging::init();
    flags::exit("storage-demo", run().await)
}
