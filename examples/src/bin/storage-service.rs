//! The storage service of the storage application, between the initiator and three targets.
//!
//! `cargo run --release -p examples --bin storage-service -- --listen tcp://0.0.0.0:7480
//! --data-1-storage tcp://host1:7481 --data-2-storage tcp://host2:7481 --data-p-storage
//! tcp://host3:7481 [--trigger-recovery-read-every-n N] [--control-timeout 5s] [--cores N]`.
//! It takes calls from its initiator only (`--secret` or `STORAGE_SERVICE_SECRET`) and
//! presents the targets' secret to them (`--target-secret` or `STORAGE_TARGET_SECRET`).
//!
//! A data path per core: one thread per core (`--cores`, default: this machine's), each with
//! its own runtime, its own listener for the initiator (consecutive ports from `--listen`, or
//! one `--listen` per core) and its own connection to each target, dialed to that target's
//! address of the same index (`--data-1-storage tcp://host:7481,tcp://host:7482`; a target
//! given one address is dialed there by every core). An I/O the initiator sends to core
//! `k`'s listener is served on core `k`'s thread, over core `k`'s target connections; at
//! shutdown the service prints how many I/Os each core's thread started. `--cpu N`
//! (repeatable) runs one core per CPU given, its thread pinned there. Runs until the
//! initiator shuts it down or Ctrl-C. Logs go to stderr, filtered by `RUST_LOG` (degraded
//! writes and recoveries are warnings).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use examples::storage::auth::{Secret, SERVICE_SECRET_ENV, TARGET_SECRET_ENV};
use examples::storage::flags::{self, Listeners};
use examples::storage::service::{Service, ServiceConfig};
use rdma_rpc_core::transport::transport_for;

/// The storage service: between the initiator and the three targets.
#[derive(Debug, Parser)]
#[command(name = "storage-service")]
struct Args {
    /// Where to listen for the initiator: one address (each core listens on the next port)
    /// or one per core (repeated, or separated by commas).
    #[arg(long, value_name = "ADDR", required = true, value_delimiter = ',')]
    listen: Vec<String>,
    /// The data 1 target: its listeners, one per core (separated by commas), or one; core k
    /// dials address k, counting round when there are fewer addresses than cores.
    #[arg(
        long = "data-1-storage",
        value_name = "ADDR",
        required = true,
        value_delimiter = ','
    )]
    data_1: Vec<String>,
    /// The data 2 target, as --data-1-storage.
    #[arg(
        long = "data-2-storage",
        value_name = "ADDR",
        required = true,
        value_delimiter = ','
    )]
    data_2: Vec<String>,
    /// The parity target, as --data-1-storage.
    #[arg(
        long = "data-p-storage",
        value_name = "ADDR",
        required = true,
        value_delimiter = ','
    )]
    parity: Vec<String>,
    /// Every Nth read goes through the parity target (0: only when needed).
    #[arg(long, value_name = "N", default_value_t = 0)]
    trigger_recovery_read_every_n: u64,
    /// Longest wait for a target's answer to a control command.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = flags::duration)]
    control_timeout: Duration,
    /// Cores, each with a thread, a runtime, a listener and a connection to each target
    /// (default: this machine's, or one per --listen address).
    #[arg(long, value_name = "N", value_parser = flags::at_least_one::<usize>)]
    cores: Option<usize>,
    /// Pins a data path's thread to CPU N (repeatable: one data path per --cpu, as NVIDIA's
    /// application runs one per --cpu; --cores then defaults to their number).
    #[arg(long = "cpu", value_name = "N")]
    cpu: Vec<usize>,
    /// The secret its initiator presents (or STORAGE_SERVICE_SECRET).
    #[arg(long, value_name = "S")]
    secret: Option<String>,
    /// The secret it presents to the targets (or STORAGE_TARGET_SECRET).
    #[arg(long, value_name = "S")]
    target_secret: Option<String>,
}

async fn run(args: Args) -> Result<(), String> {
    let cores = flags::cores_for(args.cores, &args.cpu)?;
    let binds = flags::listen_addrs(&args.listen, cores)?;
    let secret = Secret::from_flag_or_env(args.secret.as_deref(), "--secret", SERVICE_SECRET_ENV)?;
    let threads = flags::core_threads(binds.len(), &args.cpu)?;
    let config = ServiceConfig {
        recovery_every: args.trigger_recovery_read_every_n,
        control_timeout: args.control_timeout,
        cores: binds.len(),
        codec: None,
        target_secret: Secret::from_flag_or_env(
            args.target_secret.as_deref(),
            "--target-secret",
            TARGET_SECRET_ENV,
        )?,
        threads: Some(threads.clone()),
    };
    let transport = transport_for(&args.data_1[0]).map_err(|e| e.to_string())?;
    let service = Service::connect(
        transport,
        [&args.data_1, &args.data_2, &args.parity],
        config,
    )
    .await
    .map_err(|s| s.to_string())?;
    let service = Arc::new(service);
    let listeners = Listeners::bind(&threads, &binds, || {
        examples::storage::service::server(&service, &secret)
    })
    .await?;
    println!(
        "storage service on {}: {service:?}",
        listeners.addrs.join(",")
    );
    let served = listeners
        .serve_until(service.shut_down(), "the initiator")
        .await;
    println!("{}", service.ios_by_core_line());
    served
}

// The main thread only starts the cores' threads and waits: the data path runs on those.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    examples::logging::init();
    flags::exit("storage-service", run(args).await)
}
