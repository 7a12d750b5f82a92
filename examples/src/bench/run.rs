//! One run of the benchmark, phase by phase: the raw TCP and memory-copy baselines, rdma-rpc's
//! four operations at each payload size (latency, one connection, many connections), results
//! landed in the caller's memory, streams, `tls://` next to `tcp://`, DOCA over many
//! connections, and gRPC at each payload size; then the targets (`targets.rs`) the figures
//! are checked against. The `bench` binary turns its command line into [`Settings`] and runs
//! [`run`] on the runtimes it chose.

use std::sync::Arc;

use bytes::Bytes;
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport, ProgressMode};
use rdma_rpc_core::transport::Transport;
use tokio::runtime::Handle;

use super::measure::{latency, peak_rss_mib, throughput, BenchError, Progress};
use super::rdma_rpc::{
    call, calls_over_object, client_builder, op_throughput, registration_cost, start_server,
    tls_vs_tcp,
};
use super::report::{GrpcRow, OpRow, Results};
use super::service::{BenchClient, Len};
use super::streams;
use super::targets::targets;
use super::{copy_baseline, grpc, tcp_baseline};

/// What one run measures and how it is reported: the `bench` binary's options.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A short run (a smoke test; figures are noisier).
    pub quick: bool,
    /// Where the rdma-rpc server listens (`tcp://IP:PORT`, `mem://`, `doca://IP:PORT`).
    pub transport: String,
    /// Calls in flight on one connection (and stream windows in flight).
    pub depth: usize,
    /// Connections of the many-connection figures.
    pub connections: usize,
    /// How client and server share threads, as the report says it.
    pub runtime: &'static str,
    /// The DOCA transport's progress mode, when one was asked for (with a `doca://`
    /// transport).
    pub doca_progress: Option<ProgressMode>,
}

/// The server's pool budget per path.
pub(super) const POOL_BUDGET: usize = 128 << 20;

pub(super) const SIZES: [usize; 6] = [64, 4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20];
pub(super) const OPS: [&str; 4] = ["send", "receive", "write", "read"];

/// For a DOCA address, the DOCA transport with the progress mode asked for (made here so that
/// its counters can be read); `None`: the transport the address names.
fn chosen_transport(o: &Settings) -> Result<Option<DocaTransport>, BenchError> {
    if !o.transport.starts_with("doca") {
        return Ok(None);
    }
    let progress = o.doca_progress.unwrap_or_default();
    let config = DocaConfig::from_env().with_progress(progress);
    Ok(Some(DocaTransport::new(config)?))
}

/// Calls of each kind counted for registrations and imports (after the latency run warmed
/// them up).
fn cost_calls(quick: bool) -> usize {
    if quick {
        8
    } else {
        40
    }
}

/// Calls each of the other connections makes before any measurement (as many as its
/// receives grow by, so that it is measured at its ceiling, as the main connection is).
const WARM_CALLS: usize = 64;

/// Calls per measurement: (latency, throughput). A bulk throughput measurement moves about
/// 1 GB (a few hundred milliseconds here): shorter ones swung by ±20% from run to run on this
/// VM, and the 64-connection targets compare two of them.
pub(super) fn calls(size: usize, quick: bool) -> (usize, usize) {
    let (lat, tput) = match size {
        0..=4096 => (3000, 20_000),
        4097..=65_536 => (1000, 4000),
        65_537..=1_048_576 => (200, 800),
        1_048_577..=4_194_304 => (60, 240),
        _ => (20, 80),
    };
    if quick {
        ((lat / 20).max(4), (tput / 20).max(8))
    } else {
        (lat, tput)
    }
}

/// Runs of a one-connection throughput figure and calls per run: for the smallest size, whose
/// calls/s a target is judged on, three runs (the median is kept) of a third of ten times the
/// size's usual count. At 20,000 calls a `mem://` run lasts about 30 ms and, on the 2-core VM
/// of 2026-11-29, gave 704,000 to 790,000 calls/s in three runs of one binary, against 778,000
/// to 790,000 at 200,000 calls (`callcost --calls N`); a single longer run still took a pause
/// of the VM whole (625,000 in one benchmark run, 722,000 to 734,000 in three others).
fn one_connection_runs(size: usize, tput_calls: usize) -> (usize, usize) {
    if size == SIZES[0] {
        (3, tput_calls * 10 / 3)
    } else {
        (1, tput_calls)
    }
}

/// The payload size above which `connections` calls in flight, each holding about twice its
/// payload, would not fit in `budget` bytes (`None`: every size of `sizes` fits).
fn many_skipped_above(connections: usize, sizes: &[usize], budget: u64) -> Option<usize> {
    let fits = |size: usize| (connections as u64).saturating_mul(size as u64 * 2) <= budget;
    let largest = sizes
        .iter()
        .copied()
        .filter(|&s| fits(s))
        .max()
        .unwrap_or(0);
    sizes.iter().any(|&s| s > largest).then_some(largest)
}

/// Runs every phase of the benchmark, the serving side on `server`, and checks the figures
/// against their targets.
pub async fn run(o: &Settings, server: &Handle) -> Result<Results, BenchError> {
    let steps = 6 + SIZES.len() * (OPS.len() * 3 + 4);
    let mut progress = Progress::new(steps);

    // The 64 B round-trip baseline is taken in blocks: one now and one right before each
    // 64 B latency measurement, so that it spans the same minutes as what it is compared
    // with (this machine's wake-up latency drifts by tens of percent over a run).
    progress.step("raw TCP: 64 B ping-pong");
    let block = if o.quick { 100 } else { 1000 };
    let mut ping = tcp_baseline::PingPong::open(server, 64).await?;
    let mut tcp_samples = ping.rounds(block).await?;
    progress.step("memory copy: the one-connection and many-connection working sets");
    let copy = copy_baseline::measure(
        o.depth,
        o.connections,
        if o.quick { 256 << 20 } else { 2 << 30 },
    );
    progress.step("raw TCP: bulk stream of 4 MiB writes");
    let tcp_bulk =
        tcp_baseline::bulk_stream(server, 4 << 20, if o.quick { 25 } else { 250 }).await? / 1e9;

    let doca = chosen_transport(o)?;
    let chosen = doca.clone().map(|t| Arc::new(t) as Arc<dyn Transport>);
    let (addr, serving) = start_server(server, &o.transport, chosen.clone()).await?;
    let client_builder = || client_builder(&chosen);
    // Staging for results as deep as the server's pools: 8 results of 16 MiB in flight.
    // Streams keep as many windows in flight as the throughput rows keep calls.
    let client = BenchClient::new(
        client_builder()
            .staging_budget(128 << 20)
            .stream_depth(o.depth)
            .connect(&addr)
            .await?,
    );
    let mut others = Vec::with_capacity(o.connections);
    for _ in 0..o.connections {
        others.push(BenchClient::new(client_builder().connect(&addr).await?));
    }
    let others = Arc::new(others);
    // The main connection is warm from its latency measurement when its throughput is taken;
    // the others get as warm before theirs: a fresh connection's receives grow by one per
    // frame to their ceiling, and first-touching them costs its first calls (page faults).
    progress.step(&format!(
        "rdma-rpc: warming the {} connections ({WARM_CALLS} calls each)",
        o.connections
    ));
    let small = Bytes::from(vec![0x5a; 64]);
    let warming: Vec<_> = (0..others.len())
        .map(|w| {
            let (others, small) = (others.clone(), small.clone());
            tokio::spawn(async move {
                for _ in 0..WARM_CALLS {
                    call(&others[w], "send", &small).await?;
                }
                Ok::<_, BenchError>(())
            })
        })
        .collect();
    for warm in warming {
        warm.await.map_err(|e| format!("warming: {e}"))??;
    }

    // The many-connection figure keeps one call of the size in flight per connection: its
    // payloads, results and their staging take about twice that, on top of the pools. Sizes
    // that would not fit in half the memory available now are not run (1,000 connections of
    // 16 MiB calls would need 32 GiB; the kernel ends such a run, or the pool waits time out).
    let many_budget = super::measure::available_memory().unwrap_or(8 << 30) / 2;
    let many_skipped_above = many_skipped_above(o.connections, &SIZES, many_budget);
    let fits = |size: usize| many_skipped_above.is_none_or(|above| size <= above);
    let mut rows = Vec::new();
    for &size in &SIZES {
        let data = Bytes::from(vec![0x5a; size]);
        let (lat_calls, tput_calls) = calls(size, o.quick);
        for op in OPS {
            progress.step(&format!("rdma-rpc {op} {size} B: latency"));
            if size == SIZES[0] {
                tcp_samples.extend(ping.rounds(block).await?);
            }
            let before = client.inner().stats();
            let lat = latency(lat_calls, || call(&client, op, &data)).await?;
            let round_trips = client.inner().stats().round_trips_since(&before);
            let cost = registration_cost(doca.as_ref(), cost_calls(o.quick), || {
                call(&client, op, &data)
            })
            .await?;
            progress.step(&format!("rdma-rpc {op} {size} B: {} in flight", o.depth));
            let (one_runs, one_calls) = one_connection_runs(size, tput_calls);
            let mut runs = Vec::with_capacity(one_runs);
            for _ in 0..one_runs {
                let run = op_throughput(op, one_calls, &data, o.depth, |_| client.clone()).await?;
                runs.push(run);
            }
            let one = super::measure::median_throughput(runs);
            progress.step(&format!(
                "rdma-rpc {op} {size} B: {} connections",
                o.connections
            ));
            let many = if fits(size) {
                // Several calls per connection, so that the figure is not one cold call each.
                let many_calls = tput_calls.max(o.connections * if o.quick { 1 } else { 4 });
                Some(
                    op_throughput(op, many_calls, &data, o.connections, |w| others[w].clone())
                        .await?,
                )
            } else {
                None
            };
            rows.push(OpRow {
                op,
                size,
                latency: lat,
                round_trips,
                registrations_per_call: cost.map(|c| c.registrations_per_call),
                imports_per_call: cost.map(|c| c.imports_per_call),
                one_connection: one,
                many_connections: many,
            });
        }
    }
    // Results landed in the caller's memory (registered once, as a region), warmed up once
    // per size first.
    let region = rdma_rpc_core::MemoryRegion::new(16 << 20)?;
    let into = |size: usize| {
        let (client, region) = (client.clone(), region.clone());
        async move {
            let lease = region.lease(0, size)?;
            let (got, back) = client
                .read_bytes_into(Len { len: size as u64 }, lease)
                .await?;
            if got.len != size as u64 || back.len() != size {
                return Err(
                    format!("read_bytes_into: {} bytes instead of {size}", back.len()).into(),
                );
            }
            Ok::<_, BenchError>(())
        }
    };
    let into_sizes = [64 << 10, 1 << 20, 16 << 20];
    for size in into_sizes {
        into(size).await?;
    }
    let mut turn = 0;
    let read_into = registration_cost(doca.as_ref(), cost_calls(o.quick) * 3, || {
        turn += 1;
        into(into_sizes[turn % into_sizes.len()])
    })
    .await?;
    let object = if o.quick { 64 << 20 } else { 1 << 30 };
    let messages = if o.quick { 20_000 } else { 100_000 };
    progress.step(&format!(
        "rdma-rpc streams: {} MiB each way through 4 MiB buffers, {messages} messages of 64 B",
        object >> 20
    ));
    let mut stream_figures =
        streams::measure(client.inner(), object, messages, POOL_BUDGET, o.depth).await?;
    stream_figures.calls_over_object_gb_per_s =
        Some(calls_over_object(&client, object as usize, o.depth).await?);
    serving.abort();
    ping.close().await?;
    let tcp_round_trip = super::measure::Latency::of(tcp_samples);
    progress.step("rdma-rpc over tls:// next to tcp://: 64 B send latency, 4 MiB write and read");
    let tls = tls_vs_tcp(o, server).await?;
    progress.step("DOCA (software provider): 64 B calls over 1, 64 and 1,000 connections");
    let doca_connections = super::scale::doca_connections(server, o.quick).await?;

    let grpc_server = grpc::start(server).await?;
    let grpc_client = grpc::connect(grpc_server.addr).await?;
    let mut grpc_rows = Vec::new();
    for &size in &SIZES {
        let data = Bytes::from(vec![0x5a; size]);
        let (lat_calls, tput_calls) = calls(size, o.quick);
        let c = grpc_client.clone();
        progress.step(&format!("gRPC upload {size} B: latency"));
        let upload = latency(lat_calls, || {
            let (mut c, data) = (c.clone(), data.clone());
            async move {
                grpc::upload(&mut c, data)
                    .await
                    .map(drop)
                    .map_err(BenchError::from)
            }
        })
        .await?;
        progress.step(&format!("gRPC download {size} B: latency"));
        let download = latency(lat_calls, || {
            let mut c = c.clone();
            async move {
                grpc::download(&mut c, size)
                    .await
                    .map(drop)
                    .map_err(BenchError::from)
            }
        })
        .await?;
        progress.step(&format!("gRPC upload {size} B: {} in flight", o.depth));
        let upload_throughput = throughput(tput_calls, size, o.depth, |_| {
            let (c, data) = (c.clone(), data.clone());
            move || {
                let (mut c, data) = (c.clone(), data.clone());
                async move {
                    grpc::upload(&mut c, data)
                        .await
                        .map(drop)
                        .map_err(BenchError::from)
                }
            }
        })
        .await?;
        progress.step(&format!("gRPC download {size} B: {} in flight", o.depth));
        let download_throughput = throughput(tput_calls, size, o.depth, |_| {
            let c = c.clone();
            move || {
                let mut c = c.clone();
                async move {
                    grpc::download(&mut c, size)
                        .await
                        .map(drop)
                        .map_err(BenchError::from)
                }
            }
        })
        .await?;
        grpc_rows.push(GrpcRow {
            size,
            upload,
            download,
            upload_throughput,
            download_throughput,
        });
    }
    progress.finish();

    let mut results = Results {
        machine: super::machine::Machine::this(),
        transport: match o.doca_progress {
            Some(ProgressMode::BusyPoll) => format!("{addr} (DOCA progress: busy poll)"),
            Some(ProgressMode::Spin) => format!("{addr} (DOCA progress: spin)"),
            Some(_) => format!("{addr} (DOCA progress: events)"),
            None => addr,
        },
        runtime: o.runtime.into(),
        quick: o.quick,
        depth: o.depth,
        connections: o.connections,
        many_skipped_above,
        tcp_round_trip,
        tcp_bulk_gb_per_s: tcp_bulk,
        copy,
        grpc: grpc_rows,
        rows,
        read_into,
        streams: Some(stream_figures),
        tls: Some(tls),
        doca_connections: Some(doca_connections),
        peak_rss_mib: peak_rss_mib(),
        targets: Vec::new(),
    };
    results.targets = targets(&results);
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::many_skipped_above;

    #[test]
    fn many_connection_runs_stop_at_the_largest_size_that_fits() {
        const GIB: u64 = 1 << 30;
        let sizes = [64, 4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20];
        // 64 connections of 16 MiB: 2 GiB with their copies.
        assert_eq!(many_skipped_above(64, &sizes, 11 * GIB), None);
        // 1,000 of 4 MiB need 8 GiB, of 16 MiB 32 GiB.
        assert_eq!(many_skipped_above(1000, &sizes, 11 * GIB), Some(4 << 20));
        assert_eq!(many_skipped_above(1000, &sizes, 40 * GIB), None);
        // Not even the smallest fits: every size is skipped.
        assert_eq!(many_skipped_above(1 << 40, &sizes, GIB), Some(0));
    }
}
