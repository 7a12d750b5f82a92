//! The CPU cost of one small call: `N` 64 B send calls over `mem://`, `DEPTH` in flight on one
//! connection, client and server on one thread (no wake-ups, no I/O), so every instruction
//! counted is the framework's. The calls go through the benchmark's own loop
//! (`bench::measure::throughput`), as its "calls/s 1c" column over `mem://`. The figure the CHANGELOG and the issues quote as "instructions
//! per 64 B `mem://` call" comes from two runs under callgrind, so that setup and teardown
//! cancel out:
//!
//! ```sh
//! cargo build --profile perf -p examples --bin callcost    # or --release
//! for n in 20000 60000; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$n target/perf/callcost --calls $n
//! done
//! # instructions per call: (total of cg.60000 - total of cg.20000) / 40000
//! ```
//!
//! The `perf` profile (the workspace's `Cargo.toml`) is the release profile with fat LTO, as
//! the benchmark's figures are built. Adding `--cache-sim=yes --branch-sim=yes` counts
//! instruction-cache misses too: a call's code (both sides, one thread) does not fit this
//! VM's 32 KiB L1 instruction cache, so a change that saves instructions can still run slower
//! if it adds misses (docs/protocol.md, "What a small call costs").
//!
//! Without valgrind it prints calls per second, a noisier figure than the benchmark's
//! (`bench --transport mem:// --runtime single`), which is the one of record.
//!
//! `--deadline-ms MS` gives every call a deadline (the client's default timeout): run both
//! ways under callgrind, the difference is what a deadline costs a call. `--handler-waits`
//! makes the handler yield once before it answers, so that each call waits on the server, as
//! one whose handler awaits anything does.
//!
//! `--connections N` measures instead what a call costs when `N` clients each make calls one
//! at a time, all at once (the benchmark's many-connection figure, on one thread), over
//! `--transport mem` or `doca` (the software provider). With callgrind's cache simulation
//! sized as the machine's L2 it also counts the cache misses per call; docs/doca.md has the
//! figures for 64 and 1,000 connections:
//!
//! ```sh
//! for n in 50000 100000; do
//!   valgrind --tool=callgrind --cache-sim=yes --D1=49152,12,64 --LL=4194304,16,64 \
//!     --callgrind-out-file=cs.$n target/release/callcost --calls $n --connections 1000 \
//!     --transport doca
//! done
//! # per call: (totals of cs.100000 - totals of cs.50000) / 50000
//! python3 examples/scripts/misses_per_call.py cs.50000 cs.100000 50000
//! ```
//!
//! Over `doca` it also prints what the software provider counted per call (task submissions,
//! doorbells, buffers taken from inventories, sends that waited for a receive, and the
//! registrations of the whole run): what the NIC would do, which a change to the transport
//! must not raise unseen.
//!
//! The script prints the totals per call and the misses by function; given the pair of
//! another build before the call count, the difference by function. Two pairs of the same
//! build differ by about 3 misses per call with 1,000 connections. With `--lines` first it
//! prints them by source line instead (run it from the workspace's root for short paths).
//!
//! With `--split` the server runs on a thread of its own, as in the benchmark's default
//! `split` mode: its many-connection figures for one connection count at a time, without the
//! rest of the benchmark (under `perf record`, for example). `--raw` and `--channels` measure
//! its baselines beneath the framework instead (`bench::round_trips`): 64 B echoes over the
//! transport alone, and between tokio tasks over channels. Where the CPU goes with few and with
//! many connections, by layer (the provider, the DOCA transport, the RPC layers, copies, the
//! kernel) and by thread, from two `perf record` runs per count:
//!
//! ```sh
//! for c in 64 1000; do for n in 200000 600000; do
//!   perf record -q -F 2999 -o pf.$c.$n.data target/perf/callcost --split --calls $n \
//!     --connections $c --transport doca
//! done; done
//! python3 examples/scripts/cpu_by_layer.py 400000 \
//!   pf.64.200000.data pf.64.600000.data pf.1000.200000.data pf.1000.600000.data
//! ```
//!
//! Instructions are not the whole cost: an atomic read-modify-write (every lock and unlock,
//! reference count and task wake) took about 7 ns on the VM of earlier sessions, the time of
//! some 20 plain instructions (about 2 ns on the AMD EPYC VM of 2026-11-29), and callgrind
//! counts it as one. `examples/scripts/atomics_per_call.py`
//! counts them per call and by function, from the same pair of runs with callgrind told to
//! record every instruction:
//!
//! ```sh
//! for n in 20000 60000; do
//!   valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no \
//!     --callgrind-out-file=ca.$n target/release/callcost --calls $n
//! done
//! python3 examples/scripts/atomics_per_call.py target/release/callcost ca.20000 ca.60000 40000
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use bytes::Bytes;
use clap::Parser;
use examples::bench::measure::{throughput, BenchError};
use examples::bench::round_trips;
use examples::bench::scale::calls_per_second;
use examples::bench::service::{Bench, BenchClient, BenchServer, Len, Sink};
use examples::storage::flags::at_least_one;
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::mem::MemTransport;
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, RegisteredBuf, Request, Server, Status};
use tokio::runtime::Handle;

/// `N` 64 B send calls on one thread: over `mem://` with `DEPTH` in flight on one connection,
/// or over `--connections` clients each making one call at a time.
#[derive(Debug, Parser)]
#[command(name = "callcost")]
struct Options {
    /// Timed calls in all (after one untimed call per caller).
    #[arg(long, value_name = "N", default_value_t = 400_000, value_parser = at_least_one::<usize>)]
    calls: usize,
    /// Calls in flight on the one connection.
    #[arg(long, value_name = "DEPTH", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    depth: u16,
    /// Clients, each making calls one at a time, all at once (instead of one connection with
    /// `DEPTH` in flight).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    connections: Option<u16>,
    /// The transport of `--connections`.
    #[arg(long, value_enum, default_value_t = Scheme::Mem, requires = "connections")]
    transport: Scheme,
    /// Gives every call of the one connection a deadline this many milliseconds away (the
    /// client's default timeout): what a deadline adds to a call.
    #[arg(long, value_name = "MS", conflicts_with = "connections")]
    deadline_ms: Option<u64>,
    /// The handler yields to the runtime once before it answers, as one that awaits anything
    /// does: the call then waits, and watches for its end (a cancel, its deadline).
    #[arg(long, conflicts_with = "connections")]
    handler_waits: bool,
    /// With `--connections`: the server runs on a thread of its own, as in the benchmark's
    /// default `split` mode, instead of on the clients' thread.
    #[arg(long, requires = "connections")]
    split: bool,
    /// With `--connections`: 64 B echoes over the transport alone (no RPC protocol), each
    /// client one at a time: the benchmark's "transport alone" baseline for one count.
    #[arg(long, requires = "connections")]
    raw: bool,
    /// With `--connections`: 64 B echoes between tokio tasks over channels (no rdma-rpc at
    /// all): the benchmark's "tokio channels" baseline for one count.
    #[arg(long, requires = "connections", conflicts_with = "raw")]
    channels: bool,
}

/// The benchmark's handlers, each yielding once first (`--handler-waits`).
#[derive(Debug, Clone, Copy)]
struct Waiting;

impl Bench for Waiting {
    async fn send_bytes(&self, request: Request<Len>, data: Bytes) -> Result<Len, Status> {
        tokio::task::yield_now().await;
        Sink.send_bytes(request, data).await
    }

    async fn receive_bytes(
        &self,
        request: Request<Len>,
        buf: &mut RegisteredBuf,
    ) -> Result<Len, Status> {
        tokio::task::yield_now().await;
        Sink.receive_bytes(request, buf).await
    }

    async fn write_bytes(&self, request: Request<Len>, data: Bytes) -> Result<Len, Status> {
        tokio::task::yield_now().await;
        Sink.write_bytes(request, data).await
    }

    async fn read_bytes(
        &self,
        request: Request<Len>,
        buf: &mut RegisteredBuf,
    ) -> Result<Len, Status> {
        tokio::task::yield_now().await;
        Sink.read_bytes(request, buf).await
    }
}

/// The transports `--connections` runs over.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Scheme {
    /// `mem://`, in process.
    Mem,
    /// `doca://` over the software provider (or a device with the SDK).
    Doca,
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

async fn run(options: &Options) -> Result<(), BenchError> {
    if let Some(n) = options.connections {
        if options.raw || options.channels {
            return beneath(options, usize::from(n)).await;
        }
        return many(options, usize::from(n)).await;
    }
    let builder = if options.handler_waits {
        Server::builder().add_service(BenchServer::new(Waiting))
    } else {
        Server::builder().add_service(BenchServer::new(Sink))
    };
    let server = builder.bind("mem://").await?;
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    let mut builder = Client::builder();
    if let Some(ms) = options.deadline_ms {
        builder = builder.default_timeout(std::time::Duration::from_millis(ms));
    }
    let client = BenchClient::new(builder.connect(&addr).await?);
    let depth = usize::from(options.depth);
    let data = Bytes::from(vec![0x5a; 64]);
    // The benchmark's own loop for its calls/s with calls in flight on one connection.
    let figures = throughput(options.calls, data.len(), depth, |_| {
        let (client, data) = (client.clone(), data.clone());
        move || {
            let (client, data) = (client.clone(), data.clone());
            async move {
                client.send_bytes(Len { len: 64 }, data).await?;
                Ok(())
            }
        }
    })
    .await?;
    let mut deadline = options.deadline_ms.map_or(String::new(), |ms| {
        format!(", each with a {ms} ms deadline")
    });
    if options.handler_waits {
        deadline.push_str(", a handler that yields once");
    }
    println!(
        "{} calls of 64 B over mem://, {depth} in flight, one thread{deadline}: {:.0} calls/s",
        options.calls, figures.calls_per_s
    );
    Ok(())
}

/// The transport of `--connections N` (one for both sides, with room for `n` connections),
/// and the address to bind.
fn transport_of(
    options: &Options,
    n: usize,
) -> Result<(Arc<dyn Transport>, &'static str), BenchError> {
    let (transport, bind) = doca_or_mem(options, n)?;
    Ok(match transport {
        Ok(doca) => (doca, bind),
        Err(mem) => (mem, bind),
    })
}

/// As [`transport_of`], the DOCA transport as itself (`Ok`), for its provider's counters.
#[allow(clippy::type_complexity)]
fn doca_or_mem(
    options: &Options,
    n: usize,
) -> Result<(Result<Arc<DocaTransport>, Arc<dyn Transport>>, &'static str), BenchError> {
    Ok(match options.transport {
        Scheme::Mem => (Err(Arc::new(MemTransport::new())), "mem://"),
        Scheme::Doca => {
            let mut config = DocaConfig::from_env();
            config.max_connections = config.max_connections.max(n as u16);
            (
                Ok(Arc::new(DocaTransport::new(config)?)),
                "doca://127.0.0.1:0",
            )
        }
    })
}

/// Where the server runs: on a runtime of its own, on a thread of its own, with `--split`
/// (living until the process ends), else on this thread's; and how the threads are laid out.
fn server_runtime(options: &Options) -> Result<(Handle, &'static str), BenchError> {
    if !options.split {
        return Ok((Handle::current(), "one thread"));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = runtime.handle().clone();
    std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    Ok((handle, "client and server on a thread each"))
}

/// Runs `serve` (which starts a server and returns its address) where [`server_runtime`]
/// says; returns the address and how the threads are laid out.
async fn start_server<F>(options: &Options, serve: F) -> Result<(String, &'static str), BenchError>
where
    F: std::future::Future<Output = Result<String, BenchError>> + Send + 'static,
{
    let (handle, threads) = server_runtime(options)?;
    Ok((handle.spawn(serve).await??, threads))
}

/// `--connections N`: the benchmark's many-connection loop against a server on this thread.
async fn many(options: &Options, n: usize) -> Result<(), BenchError> {
    let (transport, bind) = doca_or_mem(options, n)?;
    let doca = transport.as_ref().ok().cloned();
    let transport: Arc<dyn Transport> = match transport {
        Ok(doca) => doca,
        Err(mem) => mem,
    };
    let serve = {
        let transport = transport.clone();
        async move {
            let server = Server::builder()
                .transport(transport)
                .max_connections(n)
                .add_service(BenchServer::new(Sink))
                .bind(bind)
                .await?;
            let addr = server.local_addr();
            tokio::spawn(server.serve());
            Ok::<_, BenchError>(addr)
        }
    };
    let (addr, threads) = start_server(options, serve).await?;
    let before = doca.as_ref().and_then(|d| d.counters());
    let rate = calls_per_second(&transport, &addr, n, options.calls).await?;
    println!(
        "{} calls of 64 B over {bind}, {n} connections with one call each, {threads}: \
         {rate:.0} calls/s",
        options.calls
    );
    if let (Some(before), Some(after)) = (before, doca.as_ref().and_then(|d| d.counters())) {
        // Connecting the clients is counted too: with few calls per connection it shows.
        let c = after.since(&before);
        let per_call = |v: u64| v as f64 / options.calls as f64;
        println!(
            "the software provider counted, per call (connecting included): {:.2} task \
             submissions, {:.2} doorbells, {:.2} buffers taken from inventories, {:.4} sends \
             that waited for a receive (receiver not ready), {} connections failed so; \
             {} registrations of {} MiB in all",
            per_call(c.task_submissions),
            per_call(c.doorbells),
            per_call(c.buffers_taken),
            per_call(c.rnr_waits),
            c.rnr_failures,
            c.registrations,
            c.registered_bytes >> 20,
        );
    }
    Ok(())
}

/// `--raw` and `--channels`: the benchmark's baselines beneath the framework
/// (`bench::round_trips`), for one connection count.
async fn beneath(options: &Options, n: usize) -> Result<(), BenchError> {
    let (rate, what, threads) = if options.raw {
        let (transport, bind) = transport_of(options, n)?;
        let serve = {
            let transport = transport.clone();
            async move {
                let server = round_trips::echo_server(transport, bind).await?;
                Ok::<_, BenchError>(server.detach())
            }
        };
        let (addr, threads) = start_server(options, serve).await?;
        let rate = round_trips::over_transport(&transport, &addr, n, options.calls).await?;
        (rate, format!("over {bind}, the transport alone"), threads)
    } else {
        let (handle, threads) = server_runtime(options)?;
        let rate = round_trips::over_channels(&handle, n, options.calls).await?;
        (rate, "between tokio tasks over channels".into(), threads)
    };
    println!(
        "round trips of 64 B {what}, {n} clients with one message each, {threads}: \
         {rate:.0} round trips/s"
    );
    Ok(())
}
