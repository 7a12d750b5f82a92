//! The benchmark: rdma-rpc's four operations at payload sizes from 64 B to 16 MiB, next to raw
//! TCP and gRPC (tonic) measured in the same run, and rdma-rpc over `tls://` next to `tcp://`
//! (64 B latency, 4 MiB GB/s). Prints a table of ratios and writes JSON and an SVG chart.
//!
//! `cargo run --release -p examples --bin bench -- [--quick] [--transport ADDR] [--out DIR]
//! [--depth N] [--connections N] [--runtime split|shared|single]
//! [--doca-progress event|busy-poll|spin]`
//!
//! `--transport mem://` runs the rdma-rpc figures over the in-process transport: no I/O, so
//! they show what the framework itself costs per call (the baselines stay on TCP).
//!
//! `--doca-progress` (with a `doca://` or `doca+oob://` ADDR) says how DOCA's progress engines
//! are driven: by their notification fd (`event`, the default), by one polling thread per
//! transport (`busy-poll`), or by each context's owner task polling on its own runtime while
//! the context is active and sleeping on the fd after (`spin`).
//!
//! `--runtime` says how the serving side (the rdma-rpc server, the TCP echo and sink, the gRPC
//! server) and the client side run; every figure of a run, baselines included, is measured
//! the same way:
//! - `split` (default): each side on its own thread with a single-threaded runtime, as two
//!   machines would; every message wakes the other thread, so on a VM the wake-up latency
//!   dominates small-message figures;
//! - `shared`: both sides on one multi-threaded runtime (tokio's default);
//! - `single`: both sides on one thread: the CPU cost per call, without wake-ups.

use std::path::PathBuf;
use std::process::ExitCode;

use examples::bench::measure::BenchError;
use examples::bench::report::Results;
use examples::bench::run::{run, Settings};
use examples::storage::flags::at_least_one;
use rdma_rpc_core::transport::doca::ProgressMode;
use tokio::runtime::Builder;

/// The benchmark: rdma-rpc next to raw TCP and gRPC (tonic), same machine, same run.
#[derive(Debug, clap::Parser)]
#[command(name = "bench")]
struct Options {
    /// A short run (a smoke test; figures are noisier).
    #[arg(long)]
    quick: bool,
    /// Where the rdma-rpc server listens: tcp://IP:PORT, mem:// for the in-process transport
    /// (the framework alone), doca://IP:PORT for DOCA.
    #[arg(long, value_name = "ADDR", default_value = "tcp://127.0.0.1:0")]
    transport: String,
    /// Where bench.json and bench.svg go.
    #[arg(long, value_name = "DIR", default_value = "bench-results")]
    out: PathBuf,
    /// Calls in flight on one connection (and stream windows in flight).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = at_least_one::<usize>)]
    depth: usize,
    /// Connections of the many-connection figures (sizes whose calls, one in flight per
    /// connection, would not fit in half the available memory are not run, and say so).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = at_least_one::<usize>)]
    connections: usize,
    /// How client and server share threads.
    #[arg(long, value_enum, default_value_t = RuntimeMode::Split)]
    runtime: RuntimeMode,
    /// The DOCA transport's progress mode (with a doca:// --transport).
    #[arg(long, value_enum)]
    doca_progress: Option<DocaProgress>,
}

/// A count of at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RuntimeMode {
    Split,
    Shared,
    Single,
}

/// `--doca-progress` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DocaProgress {
    Event,
    BusyPoll,
    Spin,
}

impl From<DocaProgress> for ProgressMode {
    fn from(p: DocaProgress) -> ProgressMode {
        match p {
            DocaProgress::Event => ProgressMode::Event,
            DocaProgress::BusyPoll => ProgressMode::BusyPoll,
            DocaProgress::Spin => ProgressMode::Spin,
        }
    }
}

impl RuntimeMode {
    fn describe(self) -> &'static str {
        match self {
            RuntimeMode::Split => {
                "client and server each on its own thread (single-threaded runtimes)"
            }
            RuntimeMode::Shared => "client and server on one multi-threaded runtime",
            RuntimeMode::Single => "client and server on one thread (CPU cost, no wake-ups)",
        }
    }
}

impl Options {
    /// What the run measures, from the command line.
    fn settings(&self) -> Settings {
        Settings {
            quick: self.quick,
            transport: self.transport.clone(),
            depth: self.depth,
            connections: self.connections,
            runtime: self.runtime.describe(),
            doca_progress: self.doca_progress.map(ProgressMode::from),
        }
    }
}

/// Runs the benchmark with the serving side on its own runtime (see the module docs).
fn with_runtimes(o: &Options) -> Result<Results, BenchError> {
    let settings = o.settings();
    if o.runtime != RuntimeMode::Split {
        let rt = match o.runtime {
            RuntimeMode::Shared => Builder::new_multi_thread().enable_all().build()?,
            _ => Builder::new_current_thread().enable_all().build()?,
        };
        let handle = rt.handle().clone();
        return rt.block_on(run(&settings, &handle));
    }
    let server_rt = Builder::new_current_thread().enable_all().build()?;
    let handle = server_rt.handle().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server_thread = std::thread::Builder::new()
        .name("bench-server".into())
        .spawn(move || {
            server_rt.block_on(async {
                let _ = stopped.await;
            })
        })?;
    let client_rt = Builder::new_current_thread().enable_all().build()?;
    let results = client_rt.block_on(run(&settings, &handle));
    let _ = stop.send(());
    let _ = server_thread.join();
    results
}

fn main() -> ExitCode {
    let options = <Options as clap::Parser>::parse();
    if options.doca_progress.is_some() && !options.transport.starts_with("doca") {
        eprintln!("bench: --doca-progress needs a doca:// or doca+oob:// --transport");
        return ExitCode::from(2);
    }
    let results = match with_runtimes(&options) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("\nbench failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", results.table());
    let written = std::fs::create_dir_all(&options.out).and_then(|()| {
        let json = serde_json::to_string_pretty(&results).map_err(std::io::Error::other)?;
        std::fs::write(options.out.join("bench.json"), json)?;
        std::fs::write(options.out.join("bench.svg"), results.svg())
    });
    match written {
        Ok(()) => {
            println!(
                "wrote {0}/bench.json and {0}/bench.svg",
                options.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "bench: cannot write results to {}: {e}",
                options.out.display()
            );
            ExitCode::FAILURE
        }
    }
}
