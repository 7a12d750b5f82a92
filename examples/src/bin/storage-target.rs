//! A storage target of the storage application: keeps one kind of half of every block.
//!
//! `cargo run --release -p examples --bin storage-target -- --listen tcp://0.0.0.0:7481
//! --slot data1 --block-size 64KiB --block-count 4096` (`--slot` is `data1`, `data2` or
//! `parity`; `doca://<ip>:<port>` listens over DOCA). Runs until the service shuts it down or
//! Ctrl-C. Logs go to stderr, filtered by `RUST_LOG`.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use examples::generated::storage_target::StorageTargetServer;
use examples::storage::auth::{Secret, TARGET_SECRET_ENV};
use examples::storage::codec::Slot;
use examples::storage::flags;
use examples::storage::target::{Target, TargetConfig};
use rdma_rpc_core::Server;

/// A storage target: keeps one kind of half (data 1, data 2 or parity) of every block.
#[derive(Debug, Parser)]
#[command(name = "storage-target")]
struct Args {
    /// Where to listen (`tcp://0.0.0.0:7481`, `doca://IP:PORT`).
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// Which halves it keeps: data1, data2 or parity.
    #[arg(long, value_parser = slot)]
    slot: Slot,
    /// The block size the halves are for.
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = flags::size)]
    block_size: usize,
    /// How many halves it holds.
    #[arg(long, value_name = "N", default_value_t = 4096)]
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
    let listen = args.listen;
    let slot = args.slot;
    let config = TargetConfig::new(slot, args.block_size, args.block_count)
        .map_err(|s| s.message().to_owned())?;
    let target = Arc::new(Target::new(config).map_err(|s| s.message().to_owned())?);
    let server = Server::builder()
        .initial_receives(examples::storage::RECEIVES)
        .recv_credits(examples::storage::RECEIVES)
        .transfer_timeout(examples::storage::target::IO_TIMEOUT)
        .interceptor(secret.require("their storage service"))
        .add_service(StorageTargetServer::new(target.clone()))
        .bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    println!(
        "{slot} target on {}: {} halves of {} bytes",
        server.local_addr(),
        config.half_count,
        config.half_size
    );
    let down = target.shut_down();
    flags::serve_until(server, down, "the service").await
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    examples::logging::init();
    flags::exit("storage-target", run(args).await)
}
