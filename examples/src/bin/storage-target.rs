//! A storage target of the storage application: keeps one kind of half of every block.
//!
//! `cargo run --release -p examples --bin storage-target -- --listen tcp://0.0.0.0:7481
//! --slot data1 --block-size 64KiB --block-count 4096 [--cores N]` (`--slot` is `data1`,
//! `data2` or `parity`; `doca://<ip>:<port>` listens over DOCA).
//!
//! A data path per core: one thread per core (`--cores`, default: this machine's), each with
//! its own runtime and its own listener on consecutive ports from the one given (7481, 7482,
//! ...), or on each `--listen` when several are given. The service dials one connection per
//! core to each listener (`--data-1-storage tcp://host:7481,tcp://host:7482`), so that each of
//! its cores talks to one of this target's. `--cpu N` (repeatable) runs one core per CPU
//! given, its thread pinned there. It prints the addresses it listens on. Runs until the
//! service shuts it down or Ctrl-C. Logs go to stderr, filtered by `RUST_LOG`.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use examples::storage::auth::{Secret, TARGET_SECRET_ENV};
use examples::storage::codec::Slot;
use examples::storage::flags::{self, Listeners};
use examples::storage::target::{Target, TargetConfig};

/// A storage target: keeps one kind of half (data 1, data 2 or parity) of every block.
#[derive(Debug, Parser)]
#[command(name = "storage-target")]
struct Args {
    /// Where to listen (`tcp://0.0.0.0:7481`, `doca://IP:PORT`): one address (each core
    /// listens on the next port) or one per core (repeated, or separated by commas).
    #[arg(long, value_name = "ADDR", required = true, value_delimiter = ',')]
    listen: Vec<String>,
    /// Cores, each with a thread, a runtime and a listener (default: this machine's, or one
    /// per --listen address).
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>)]
    cores: Option<usize>,
    /// Pins a data path's thread to CPU N (repeatable: one data path per --cpu, as NVIDIA's
    /// application runs one per --cpu; --cores then defaults to their number).
    #[arg(long = "cpu", value_name = "N")]
    cpu: Vec<usize>,
    /// Which halves it keeps: data1, data2 or parity.
    #[arg(long, value_parser = slot)]
    slot: Slot,
    /// The block size the halves are for.
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = flags::size)]
    block_size: usize,
    /// How many halves it holds.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = flags::at_least_one::<u64>)]
    block_count: u64,
    /// The secret its service presents (or STORAGE_TARGET_SECRET).
    #[arg(long, value_name = "S")]
    secret: Option<String>,
}

fn slot(s: &str) -> Result<Slot, String> {
    match s {
        "data1" | "data-1" | "1" => Ok(Slot::Data1),
        "data2" | "data-2" | "2" => Ok(Slot::Data2),
        "parity" | "p" => Ok(Slot::Parity),
        _ => Err(format!("`{s}` is not data1, data2 or parity")),
    }
}

async fn run(args: Args) -> Result<(), String> {
    let secret = Secret::from_flag_or_env(args.secret.as_deref(), "--secret", TARGET_SECRET_ENV)?;
    let cores = flags::cores_for(args.cores, &args.cpu)?;
    let binds = flags::listen_addrs(&args.listen, cores)?;
    let slot = args.slot;
    let config = TargetConfig {
        cores: binds.len(),
        ..TargetConfig::new(slot, args.block_size, args.block_count)
            .map_err(|s| s.message().to_owned())?
    };
    let target = Arc::new(Target::new(config).map_err(|s| s.message().to_owned())?);
    let threads = flags::core_threads(binds.len(), &args.cpu)?;
    let listeners = Listeners::bind(&threads, &binds, || {
        examples::storage::target::server(&target, &secret)
    })
    .await?;
    println!(
        "{slot} target on {}: {} halves of {} bytes, {} cores",
        listeners.addrs.join(","),
        config.half_count,
        config.half_size,
        binds.len()
    );
    let served = listeners
        .serve_until(target.shut_down(), "the service")
        .await;
    println!("{}", target.halves_by_core_line());
    served
}

// The main thread only starts the cores' threads and waits: the data path runs on those.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    examples::logging::init();
    flags::exit("storage-target", run(args).await)
}
