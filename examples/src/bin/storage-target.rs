//! A storage target of the storage application: keeps one kind of half of every block.
//!
//! `cargo run --release -p examples --bin storage-target -- --listen tcp://0.0.0.0:7481
//! --slot data1 --block-size 64KiB --block-count 4096` (`--slot` is `data1`, `data2` or
//! `parity`; `doca://<ip>:<port>` listens over DOCA). Runs until the service shuts it down or
//! Ctrl-C. Logs go to stderr, filtered by `RUST_LOG`.

use std::process::ExitCode;
use std::sync::Arc;

use examples::generated::storage_target::StorageTargetServer;
use examples::storage::auth::{Secret, TARGET_SECRET_ENV};
use examples::storage::codec::Slot;
use examples::storage::flags::{self, Flags};
use examples::storage::target::{Target, TargetConfig};
use rdma_rpc_core::Server;

const USAGE: &str = "usage: storage-target --listen ADDR --slot data1|data2|parity \
[--block-size SIZE (64KiB)] [--block-count N (4096)] [--secret S (or STORAGE_TARGET_SECRET)]";

fn slot(s: &str) -> Result<Slot, String> {
    match s {
        "data1" | "data-1" | "1" => Ok(Slot::Data1),
        "data2" | "data-2" | "2" => Ok(Slot::Data2),
        "parity" | "p" => Ok(Slot::Parity),
        _ => Err(format!("--slot: `{s}` is not data1, data2 or parity")),
    }
}

async fn run() -> Result<(), String> {
    let flags = Flags::parse(
        &[
            "--listen",
            "--slot",
            "--block-size",
            "--block-count",
            "--secret",
        ],
        USAGE,
    )?;
    let listen = flags.required("--listen")?;
    let slot = slot(&flags.required("--slot")?)?;
    let secret = Secret::from_flag_or_env(flags.get("--secret"), "--secret", TARGET_SECRET_ENV)?;
    let config = TargetConfig::new(
        slot,
        flags.size("--block-size", 64 << 10)?,
        flags.number("--block-count", 4096)?,
    )
    .map_err(|s| s.message().to_owned())?;
    let target = Arc::new(Target::new(config).map_err(|s| s.message().to_owned())?);
    let server = Server::builder()
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
    examples::logging::init();
    flags::exit("storage-target", run().await)
}
