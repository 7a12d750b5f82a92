//! `ping` and `bench`: a running server, measured from here.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_rpc_core::{Bytes, Client, EndpointDef, OpKind};

/// Connects, then pings `count` times, `interval_ms` apart, and prints each round trip and a
/// summary as ping(8) does. Fails if a ping fails.
pub(crate) async fn ping(addr: &str, count: u32, interval_ms: u64) -> ExitCode {
    let started = Instant::now();
    let client = match Client::builder().reconnect(false).connect(addr).await {
        Ok(client) => client,
        Err(e) => return crate::fail(&format!("cannot connect to {addr}"), &e),
    };
    println!(
        "connected to {} in {:.1} us (connection and handshake)",
        client.peer(),
        micros(started.elapsed())
    );
    let mut rtts = Vec::with_capacity(count as usize);
    for seq in 0..count {
        if seq > 0 {
            tokio::time::sleep(Duration::from_millis(interval_ms)).await;
        }
        match client.ping().await {
            Ok(rtt) => {
                println!("ping {seq}: {:.1} us", micros(rtt));
                rtts.push(rtt);
            }
            Err(status) => return crate::fail(&format!("ping {seq} to {addr}"), &status),
        }
    }
    if let Some(s) = Summary::of(&mut rtts) {
        println!(
            "{count} pings: min {:.1} / avg {:.1} / p50 {:.1} / max {:.1} us",
            s.min, s.avg, s.p50, s.max
        );
    }
    ExitCode::SUCCESS
}

/// What `bench` calls, and how.
pub(crate) struct BenchArgs {
    pub(crate) addr: String,
    pub(crate) path: String,
    pub(crate) op: OpKind,
    pub(crate) size: u64,
    pub(crate) calls: u64,
    pub(crate) in_flight: u32,
    pub(crate) connections: u32,
    pub(crate) timeout_ms: u64,
}

/// Calls one endpoint `calls` times over `connections` connections with `in_flight` calls
/// each, and prints calls/s, MB/s and the latency percentiles.
pub(crate) async fn bench(args: BenchArgs) -> ExitCode {
    if args.calls == 0 || args.in_flight == 0 || args.connections == 0 {
        eprintln!("error: --calls, --in-flight and --connections must be at least 1");
        return ExitCode::from(2);
    }
    // The endpoint as this client sees it: its path lives as long as the process.
    let endpoint: &'static EndpointDef = Box::leak(Box::new(EndpointDef {
        path: Box::leak(args.path.clone().into_boxed_str()),
        op: args.op,
        // Sends and writes move `size` bytes; results may be as large as the server makes them.
        buffer_size: if args.op.is_inbound() {
            args.size.max(1)
        } else {
            rdma_rpc_core::memory::MAX_BUFFER as u64
        },
        method: "bench",
        timeout_ms: Some(args.timeout_ms),
        stream: rdma_rpc_core::StreamKind::Unary,
    }));
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        match Client::builder()
            .reconnect(false)
            .max_in_flight(args.in_flight)
            .connect(&args.addr)
            .await
        {
            Ok(client) => clients.push(client),
            Err(e) => return crate::fail(&format!("cannot connect to {}", args.addr), &e),
        }
    }
    let payload = args
        .op
        .is_inbound()
        .then(|| Bytes::from(vec![0xa5; args.size as usize]));
    let workers = u64::from(args.connections) * u64::from(args.in_flight);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let client = clients[(w % u64::from(args.connections)) as usize].clone();
        let payload = payload.clone();
        // Spread the calls: the first `calls % workers` workers make one more.
        let share = args.calls / workers + u64::from(w < args.calls % workers);
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(share as usize);
            let mut bytes = 0u64;
            for _ in 0..share {
                let t = Instant::now();
                let (_, data) = client
                    .call_raw(endpoint, Bytes::new(), payload.clone(), None)
                    .await?;
                latencies.push(t.elapsed());
                bytes += payload.as_ref().map_or(data.len(), Bytes::len) as u64;
            }
            Ok::<_, rdma_rpc_core::Status>((latencies, bytes))
        });
    }
    let mut latencies = Vec::with_capacity(args.calls as usize);
    let mut bytes = 0;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok((l, b))) => {
                latencies.extend(l);
                bytes += b;
            }
            Ok(Err(status)) => {
                return crate::fail(
                    &format!("{} {} on {}", args.op, args.path, args.addr),
                    &status,
                )
            }
            Err(e) => return crate::fail("a bench task failed", &e),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls = latencies.len();
    let Some(s) = Summary::of(&mut latencies) else {
        return ExitCode::SUCCESS;
    };
    println!(
        "{} {} on {}: {calls} calls over {} connection(s), {} in flight each",
        args.op, args.path, args.addr, args.connections, args.in_flight
    );
    println!(
        "{:.0} calls/s, {:.1} MB/s, latency p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        calls as f64 / elapsed,
        bytes as f64 / elapsed / 1e6,
        s.p50,
        s.p99,
        s.max
    );
    let rts = clients
        .iter()
        .map(|c| c.stats())
        .fold((0, 0), |(c, t), s| (c + s.calls, t + s.transfers));
    if rts.0 > 0 {
        println!(
            "{:.2} protocol round trips per call",
            (rts.0 + rts.1) as f64 / rts.0 as f64
        );
    }
    ExitCode::SUCCESS
}

/// Microseconds, for printing.
fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Percentiles of some durations, in microseconds.
struct Summary {
    min: f64,
    avg: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Summary {
    fn of(samples: &mut [Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |q: f64| micros(samples[((samples.len() - 1) as f64 * q).round() as usize]);
        let total: Duration = samples.iter().sum();
        Some(Summary {
            min: at(0.0),
            avg: micros(total) / samples.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_samples() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = Summary::of(&mut samples).unwrap();
        assert_eq!((s.min, s.max), (1.0, 100.0));
        assert_eq!(s.p50, 51.0);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.avg, 50.5);
        assert!(Summary::of(&mut []).is_none());
    }
}
