//! The storage application in one command: three targets, the service and the initiator on
//! loopback. Exits 0 when every block was read back exactly.
//!
//! `cargo run --release -p examples --bin storage-demo -- [--transport tcp|mem|doca]
//! [--block-size 64KiB] [--blocks 8000] [--cores N] [--transactions-per-core 8]
//! [--trigger-recovery-read-every-n 10] [--kill-target-after N] [--control-timeout 5s]`.
//! `--kill-target-after N` takes the data 2 target off the network once it has stored N
//! halves: later writes are degraded, reads are rebuilt from data 1 and the parity. `--cores`
//! (default: this machine's) is the data paths: a thread per core, each with its own
//! single-threaded runtime, on which that core's initiator connection, service and target
//! listeners, and the service's connections to each target run (`--one-runtime` runs them all
//! on the demo's multi-threaded runtime instead, for comparison). `--cpu N` (repeatable) pins
//! one data path's thread to each CPU given, as NVIDIA's application does with its `--cpu`.
//!
//! It measures, in the same process and printed next to the storage figures: the codec alone
//! on one core over the same blocks (before the run and again after it, since this VM's speed
//! drifts over seconds; the ratios use the mean of the two, and both are printed), raw TCP
//! bulk and a memory copy, with the ratios the targets are set in (docs/bench/storage.txt).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use examples::bench::measure::{process_cpu, process_cpu_since};
use examples::generated::storage_service::{StorageCommand, StorageServiceClient};
use examples::storage::auth::Secret;
use examples::storage::cluster::{Cluster, ClusterConfig};
use examples::storage::codec::baseline::{self, Baseline};
use examples::storage::codec::CpuCodec;
use examples::storage::flags;
use examples::storage::initiator::{self, CostCounters, InitiatorConfig};
use examples::storage::service::ServiceConfig;
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::{transport_for, Transport};
use std::sync::Arc;

/// The storage application in one command: three targets, the service and the initiator on
/// loopback; exits 0 when every block was read back exactly.
#[derive(Debug, Parser)]
#[command(name = "storage-demo")]
struct Args {
    /// The transport everything uses.
    #[arg(long, value_enum, default_value_t = Scheme::Tcp)]
    transport: Scheme,
    /// Bytes per block.
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = flags::size)]
    block_size: usize,
    /// Blocks written, then read back.
    #[arg(long, value_name = "N", default_value_t = 8000, value_parser = flags::at_least_one::<u64>)]
    blocks: u64,
    /// Data paths: initiator connections, and service connections to each target (default:
    /// this machine's cores).
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>)]
    cores: Option<usize>,
    /// Pins a data path's thread to CPU N (repeatable: one data path per --cpu, as NVIDIA's
    /// application runs one per --cpu; --cores then defaults to their number).
    #[arg(long = "cpu", value_name = "N")]
    cpu: Vec<usize>,
    /// I/O in flight per core.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = flags::at_least_one::<u32>)]
    transactions_per_core: u32,
    /// Every part on the demo's one multi-threaded runtime instead of a thread per core (the
    /// data paths then share its workers; for comparison).
    #[arg(long)]
    one_runtime: bool,
    /// Every Nth read goes through the parity target (0: only when needed).
    #[arg(long, value_name = "N", default_value_t = 10)]
    trigger_recovery_read_every_n: u64,
    /// Takes the data 2 target off the network once it stored N halves.
    #[arg(long, value_name = "N")]
    kill_target_after: Option<u64>,
    /// Longest wait for a target's answer to a control command.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = flags::duration)]
    control_timeout: Duration,
}

/// The transports the demo runs on.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scheme {
    Tcp,
    Mem,
    Doca,
}

async fn run(args: Args) -> Result<(), String> {
    let bind = match args.transport {
        Scheme::Tcp => "tcp://127.0.0.1:0",
        Scheme::Mem => "mem://",
        Scheme::Doca => "doca://127.0.0.1:0",
    };
    let block_size = args.block_size;
    let blocks = args.blocks;
    let cores = flags::cores_for(args.cores, &args.cpu)?
        .unwrap_or_else(flags::cores)
        .max(1);
    let threads = match (args.one_runtime, args.cpu.is_empty()) {
        (true, true) => None,
        (true, false) => {
            return Err("--cpu pins the threads of the data paths; --one-runtime has none".into())
        }
        (false, _) => Some(flags::core_threads(cores, &args.cpu)?),
    };
    let config = ClusterConfig {
        block_size,
        block_count: blocks,
        service: ServiceConfig {
            recovery_every: args.trigger_recovery_read_every_n,
            control_timeout: args.control_timeout,
            cores,
            codec: None,
            // Every part runs here: fresh secrets for this run.
            target_secret: Secret::random(),
            threads: threads.clone(),
        },
        service_secret: Secret::random(),
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
    // The codec alone, before the run and again after it: this VM's speed drifts over
    // seconds, and the storage figures are read against the mean of the two.
    let codec_before = codec_alone(block_size, blocks).await?;
    let cluster = Cluster::start(transport, bind, &config)
        .await
        .map_err(|s| s.to_string())?;
    println!("machine: {}", examples::bench::machine::Machine::this());
    println!(
        "targets {} | service {} | {blocks} blocks of {block_size} bytes | {}",
        cluster.target_addrs.join(", "),
        cluster.service_addrs.join(", "),
        match &threads {
            Some(_) if args.cpu.is_empty() => {
                format!("{cores} data paths, a thread and a runtime each")
            }
            Some(_) => format!(
                "{cores} data paths, a thread and a runtime each, pinned to CPUs {:?}",
                args.cpu
            ),
            None => format!("{cores} data paths on one multi-threaded runtime"),
        }
    );
    let mut clients = Vec::new();
    for core in 0..cores {
        clients.push(cluster.client_on(core).await.map_err(|s| s.to_string())?);
    }
    let client = clients[0].clone();
    let initiator_config = InitiatorConfig {
        block_size,
        blocks,
        cores: cores as u32,
        transactions_per_core: args.transactions_per_core,
        progress: true,
        counters: doca.map(|t| Arc::new(move || t.counters()) as CostCounters),
        threads,
    };
    let run = tokio::spawn(async move { initiator::run_on(clients, &initiator_config).await });
    if let Some(n) = args.kill_target_after {
        cluster.targets[1].stored(n).await;
        cluster.kill_target(1);
        println!("data 2 target killed after {n} halves");
    }
    let report = run
        .await
        .map_err(|e| e.to_string())?
        .map_err(|s| s.to_string())?;
    print!("{}", report.table());
    println!("{}", cluster.service.ios_by_core_line());
    // A read's writes are posted ahead of their responses (`RemoteMemory::write_posted`):
    // over the software transports they take no round trip of their own; over DOCA they
    // still wait for their completion.
    let read_trips = match args.transport {
        Scheme::Tcp | Scheme::Mem => {
            "read 2 (the call, the RDMA write of the block posted ahead of its response; the two \
             data target calls in parallel, each with one RDMA write posted ahead of its response)"
        }
        Scheme::Doca => {
            "read 4 (the call; the two data target calls in parallel, each with one RDMA write \
             that completes before its response; the RDMA write of the block)"
        }
    };
    println!(
        "round trips one after the other per I/O: write 4 (the call; the RDMA read of the \
         block; the three target calls in parallel, each with one RDMA read of its half's data \
         and trailer), {read_trips}; calls per I/O: write 4, read 3 (4 on a recovery read); \
         only the bytes of a half that carry data move"
    );
    print!(
        "{}",
        baselines(&report, codec_before, block_size, blocks).await?
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

/// The codec alone on one core, over the blocks the run writes (at most 256 of them).
async fn codec_alone(block_size: usize, blocks: u64) -> Result<Baseline, String> {
    let codec = CpuCodec::new(block_size).map_err(|e| e.to_string())?;
    let sample: Vec<Vec<u8>> = (0..blocks.min(256))
        .map(|i| initiator::block_contents(i, block_size))
        .collect();
    tokio::task::spawn_blocking(move || {
        baseline::measure(&codec, &sample, Duration::from_millis(500))
    })
    .await
    .map_err(|e| e.to_string())
}

/// The same-run baselines and the storage figures' ratios to them: the codec alone measured
/// before the run (`codec_before`) and again now, raw TCP bulk and a memory copy.
async fn baselines(
    report: &initiator::Report,
    codec_before: Baseline,
    block_size: usize,
    blocks: u64,
) -> Result<String, String> {
    let codec_after = codec_alone(block_size, blocks).await?;
    let mean = |f: fn(&Baseline) -> f64| (f(&codec_before) + f(&codec_after)) / 2.0 / 1e9;
    // A plain TCP stream of 4 MiB writes (and the CPU it took, both ends), and one thread
    // copying memory.
    let (chunk, chunks) = (4 << 20, 64);
    let cpu_before = process_cpu();
    let bulk = examples::bench::tcp_baseline::bulk_stream(
        &tokio::runtime::Handle::current(),
        chunk,
        chunks,
    )
    .await
    .map_err(|e| format!("measuring raw TCP bulk: {e}"))?
        / 1e9;
    let blocks_moved = (chunk * chunks / block_size.max(1)) as u64;
    let bulk_cpu = process_cpu_since(cpu_before).map(|cpu| cpu.per_us(blocks_moved).0);
    let copy = examples::bench::copy_baseline::measure(8, 64, 1 << 30);
    let (write, read) = (report.write.gb_per_s(), report.read.gb_per_s());
    let (codec_write, codec_read) = (
        mean(|b| b.write_bytes_per_sec),
        mean(|b| b.read_bytes_per_sec),
    );
    let mut out = String::from("same run, same machine (GB/s of blocks):\n");
    out.push_str(&format!(
        "  codec alone, one core, mean of before and after the run: write {codec_write:.2} \
         (compress, split, parity, checksums), read {codec_read:.2} (verify, decompress), \
         recovery read {:.2}\n",
        mean(|b| b.recover_bytes_per_sec)
    ));
    out.push_str(&format!(
        "    before: write {:.2}, read {:.2}; after: write {:.2}, read {:.2}\n",
        codec_before.write_bytes_per_sec / 1e9,
        codec_before.read_bytes_per_sec / 1e9,
        codec_after.write_bytes_per_sec / 1e9,
        codec_after.read_bytes_per_sec / 1e9
    ));
    // The codec's time per block, to read against the storage path's CPU per I/O.
    let per_block = |bytes_per_sec: f64| block_size as f64 / (bytes_per_sec * 1e9) * 1e6;
    out.push_str(&format!(
        "    per block: write {:.1} us, read {:.1} us of one core's time (against the CPU per \
         I/O above, every part and the transport included)\n",
        per_block(codec_write),
        per_block(codec_read)
    ));
    match bulk_cpu {
        Some(us) => out.push_str(&format!(
            "  raw TCP bulk: {bulk:.2} ({us:.1} us of CPU per block's bytes, both ends)\n"
        )),
        None => out.push_str(&format!("  raw TCP bulk: {bulk:.2}\n")),
    }
    out.push_str(&format!(
        "  memory copy, one thread: {:.2} among 8 MiB, {:.2} among 64 MiB\n",
        copy.few_gb_per_s, copy.many_gb_per_s
    ));
    out.push_str(&format!(
        "storage ÷ codec alone: write {:.2}, read {:.2}\n",
        write / codec_write,
        read / codec_read
    ));
    out.push_str(&format!(
        "storage ÷ min(codec alone, raw TCP bulk): write {:.2}, read {:.2} (tcp:// target 0.7; \
         mem:// target 0.8 of codec alone)\n",
        write / codec_write.min(bulk),
        read / codec_read.min(bulk)
    ));
    Ok(out)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    examples::logging::init();
    flags::exit("storage-demo", run(args).await)
}
