//! The CPU cost of one small call: `N` 64 B send calls over `mem://`, `DEPTH` in flight on one
//! connection, client and server on one thread (no wake-ups, no I/O), so every instruction
//! counted is the framework's. The figure the CHANGELOG and the issues quote as "instructions
//! per 64 B `mem://` call" comes from two runs under callgrind, so that setup and teardown
//! cancel out:
//!
//! ```sh
//! cargo build --release -p examples --bin callcost
//! for n in 20000 60000; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$n target/release/callcost --calls $n
//! done
//! # instructions per call: (total of cg.60000 - total of cg.20000) / 40000
//! ```
//!
//! Without valgrind it prints calls per second, a noisier figure than the benchmark's
//! (`bench --transport mem:// --runtime single`), which is the one of record.

use std::process::ExitCode;
use std::time::Instant;

use bytes::Bytes;
use clap::Parser;
use examples::bench::service::{BenchClient, BenchServer, Len, Sink};
use rdma_rpc_core::{Client, Server};

/// `N` 64 B send calls over `mem://` on one thread, `DEPTH` in flight.
#[derive(Debug, Parser)]
#[command(name = "callcost")]
struct Options {
    /// Calls in all (rounded down to a multiple of the depth).
    #[arg(long, value_name = "N", default_value_t = 400_000)]
    calls: usize,
    /// Calls in flight on the one connection.
    #[arg(long, value_name = "DEPTH", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    depth: u16,
}

fn main() -> ExitCode {
    let options = Options::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("callcost: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("callcost: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: &Options) -> Result<(), Box<dyn std::error::Error>> {
    let server = Server::builder()
        .add_service(BenchServer::new(Sink))
        .bind("mem://")
        .await?;
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    let client = BenchClient::new(Client::builder().connect(&addr).await?);
    let depth = usize::from(options.depth);
    let each = options.calls / depth;
    let data = Bytes::from(vec![0x5a; 64]);
    let start = Instant::now();
    let callers: Vec<_> = (0..depth)
        .map(|_| {
            let (client, data) = (client.clone(), data.clone());
            tokio::spawn(async move {
                for _ in 0..each {
                    client.send_bytes(Len { len: 64 }, data.clone()).await?;
                }
                Ok::<(), rdma_rpc_core::Status>(())
            })
        })
        .collect();
    for caller in callers {
        caller.await??;
    }
    let elapsed = start.elapsed();
    let calls = each * depth;
    println!(
        "{calls} calls of 64 B over mem://, {depth} in flight, one thread: {:.3} s, {:.0} calls/s",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}
