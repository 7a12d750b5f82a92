//! `ping` and `bench`: a running server, measured from here (`bench` with the request and
//! metadata options of `call`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rdma_rpc_core::{Bytes, CallOptions, EndpointDef, OpKind};

use crate::call;
use crate::request::{self, RequestArgs, RequestError};
use crate::tls::TlsArgs;

/// Connects, then pings `count` times, `interval_ms` apart, and prints each round trip and a
/// summary as ping(8) does. Fails if a ping fails.
pub(crate) async fn ping(addr: &str, tls: &TlsArgs, count: u32, interval_ms: u64) -> ExitCode {
    let connector = match tls.connector(addr) {
        Ok(connector) => connector,
        Err(code) => return code,
    };
    let started = Instant::now();
    let client = match connector.builder().connect(addr).await {
        Ok(client) => client,
        Err(e) => return crate::fail(&format!("cannot connect to {addr}"), &e),
    };
    println!(
        "connected to {} in {:.1} us (connection and handshake)",
        client.peer(),
        micros(started.elapsed())
    );
    let mut rtts = Latencies::new();
    for seq in 0..count {
        if seq > 0 {
            tokio::time::sleep(Duration::from_millis(interval_ms)).await;
        }
        match client.ping().await {
            Ok(rtt) => {
                println!("ping {seq}: {:.1} us", micros(rtt));
                rtts.record(rtt);
            }
            Err(status) => return crate::fail(&format!("ping {seq} to {addr}"), &status),
        }
    }
    if let Some(s) = rtts.summary() {
        println!(
            "{count} pings: min {:.1} / avg {:.1} / p50 {:.1} / max {:.1} us",
            s.min, s.avg, s.p50, s.max
        );
    }
    // Goodbye to the server before the runtime stops: a client that left, not a lost one.
    client.shutdown().await;
    ExitCode::SUCCESS
}

/// What `bench` calls, and how.
pub(crate) struct BenchArgs {
    pub(crate) addr: String,
    pub(crate) tls: TlsArgs,
    /// The spec that types the endpoint's request; with it, `method` or `path` and `op`
    /// find the endpoint there.
    pub(crate) spec: Option<PathBuf>,
    pub(crate) method: Option<String>,
    pub(crate) path: Option<String>,
    pub(crate) op: Option<OpKind>,
    pub(crate) request: RequestArgs,
    pub(crate) size: u64,
    pub(crate) calls: u64,
    pub(crate) in_flight: u32,
    pub(crate) connections: u32,
    pub(crate) timeout_ms: u64,
}

/// What every call of a bench sends.
struct Target {
    endpoint: &'static EndpointDef,
    message: Bytes,
    payload: Option<Bytes>,
    options: CallOptions,
}

impl BenchArgs {
    /// The endpoint, as the spec describes it or (without one) as `path` and `op` say, and
    /// what each call sends.
    fn target(&self) -> Result<Target, ExitCode> {
        let options = CallOptions::new()
            .timeout(Duration::from_millis(self.timeout_ms))
            .metadata(request::metadata(&self.request.metadata).map_err(|e| call::refuse(&e))?);
        let filler = || Bytes::from(vec![0xa5; self.size as usize]);
        let Some(spec) = &self.spec else {
            let (Some(path), Some(op)) = (&self.path, self.op) else {
                eprintln!("error: --path and --op name the endpoint when no --spec types it");
                return Err(ExitCode::from(2));
            };
            // The endpoint as this client sees it: its path lives as long as the process.
            let endpoint: &'static EndpointDef = Box::leak(Box::new(EndpointDef {
                path: Box::leak(path.clone().into_boxed_str()),
                op,
                // Sends and writes move `size` bytes; results may be as large as the server
                // makes them.
                buffer_size: if op.is_inbound() {
                    self.size.max(1)
                } else {
                    rdma_rpc_core::memory::MAX_BUFFER as u64
                },
                method: "bench",
                timeout_ms: Some(self.timeout_ms),
                stream: rdma_rpc_core::StreamKind::Unary,
            }));
            return Ok(Target {
                endpoint,
                message: Bytes::new(),
                payload: op.is_inbound().then(filler),
                options,
            });
        };
        let service = crate::specs::load(spec).ok_or(ExitCode::FAILURE)?;
        let found = match (&self.method, &self.path, self.op) {
            (Some(method), _, _) => request::by_method(&service, method),
            (None, Some(path), Some(op)) => request::by_route(&service, path, op),
            _ => {
                eprintln!("error: --method, or --path and --op, name the endpoint of the spec");
                return Err(ExitCode::from(2));
            }
        };
        let ep = found.map_err(|e| call::refuse(&e))?;
        if matches!(ep.stream, rdma_rpc_codegen::StreamKind::Messages { .. }) {
            return Err(call::refuse(&RequestError::Unsupported {
                method: ep.method.clone(),
                what: "a message stream; bench calls unary endpoints and bulk streams".into(),
            }));
        }
        let message = request::message(&service, ep, self.request.request.as_deref())
            .map_err(|e| call::refuse(&e))?;
        let payload = match (ep.op.is_inbound(), ep.payload) {
            (false, _) => None,
            (true, true) => Some(filler()),
            (true, false) => Some(Bytes::new()),
        };
        Ok(Target {
            endpoint: request::endpoint_def(ep),
            message,
            payload,
            options,
        })
    }
}

/// Calls one endpoint `calls` times over `connections` connections with `in_flight` calls
/// each, and prints calls/s, MB/s and the latency percentiles.
pub(crate) async fn bench(args: BenchArgs) -> ExitCode {
    if args.calls == 0 || args.in_flight == 0 || args.connections == 0 {
        eprintln!("error: --calls, --in-flight and --connections must be at least 1");
        return ExitCode::from(2);
    }
    let target = match args.target() {
        Ok(target) => target,
        Err(code) => return code,
    };
    let endpoint = target.endpoint;
    let (op, path) = (endpoint.op, endpoint.path);
    let connector = match args.tls.connector(&args.addr) {
        Ok(connector) => connector,
        Err(code) => return code,
    };
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        match connector
            .builder()
            .max_in_flight(args.in_flight)
            .connect(&args.addr)
            .await
        {
            Ok(client) => clients.push(client),
            Err(e) => return crate::fail(&format!("cannot connect to {}", args.addr), &e),
        }
    }
    let workers = u64::from(args.connections) * u64::from(args.in_flight);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let client = clients[(w % u64::from(args.connections)) as usize].clone();
        let (message, payload) = (target.message.clone(), target.payload.clone());
        let options = target.options.clone();
        // Spread the calls: the first `calls % workers` workers make one more.
        let share = args.calls / workers + u64::from(w < args.calls % workers);
        tasks.spawn(async move {
            let mut latencies = Latencies::new();
            let mut bytes = 0u64;
            for _ in 0..share {
                let t = Instant::now();
                let (_, data) = client
                    .call_raw(endpoint, message.clone(), payload.clone(), options.clone())
                    .await?;
                latencies.record(t.elapsed());
                bytes += payload.as_ref().map_or(data.len(), Bytes::len) as u64;
            }
            Ok::<_, rdma_rpc_core::Status>((latencies, bytes))
        });
    }
    let mut latencies = Latencies::new();
    let mut bytes = 0;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok((l, b))) => {
                latencies.add(&l);
                bytes += b;
            }
            Ok(Err(status)) => {
                return crate::fail(&format!("{op} {path} on {}", args.addr), &status)
            }
            Err(e) => return crate::fail("a bench task failed", &e),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls = latencies.len();
    let Some(s) = latencies.summary() else {
        return ExitCode::SUCCESS;
    };
    println!(
        "{op} {path} on {}: {calls} calls over {} connection(s), {} in flight each",
        args.addr, args.connections, args.in_flight
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
    for client in &clients {
        client.shutdown().await;
    }
    ExitCode::SUCCESS
}

/// Microseconds, for printing.
fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Latencies as an HDR histogram (the `hdrhistogram` crate, as the examples' `Latencies`):
/// nanoseconds to 3 significant digits, so a percentile is within 0.1% of the sample it stands
/// for, from 1 ns to an hour (longer ones count as an hour), in memory that does not grow with
/// the calls. The mean is exact.
struct Latencies {
    histogram: Histogram<u64>,
    total: Duration,
}

impl Latencies {
    fn new() -> Latencies {
        Latencies {
            histogram: Histogram::new_with_bounds(1, LONGEST.as_nanos() as u64, 3)
                .expect("valid bounds and precision"),
            total: Duration::ZERO,
        }
    }

    fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(nanos.max(1));
        self.total += latency;
    }

    /// Adds another's samples.
    fn add(&mut self, other: &Latencies) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms of the same bounds");
        self.total += other.total;
    }

    fn len(&self) -> u64 {
        self.histogram.len()
    }

    /// The figures printed; `None` without samples.
    fn summary(&self) -> Option<Summary> {
        if self.histogram.is_empty() {
            return None;
        }
        // The middle of the sample's bucket: the same sample reads the same as min, p50 or max.
        let h = &self.histogram;
        let at = |q: f64| h.median_equivalent(h.value_at_quantile(q)) as f64 / 1e3;
        Some(Summary {
            min: at(0.0),
            avg: micros(self.total) / self.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        })
    }
}

/// The longest latency told apart from longer ones.
const LONGEST: Duration = Duration::from_secs(3600);

/// Percentiles of some durations, in microseconds.
struct Summary {
    min: f64,
    avg: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_samples() {
        let mut samples = Latencies::new();
        for us in (1..=100).rev() {
            samples.record(Duration::from_micros(us));
        }
        let s = samples.summary().unwrap();
        // Within the histogram's precision (3 significant digits).
        let near = |got: f64, want: f64| (got - want).abs() <= want * 1e-3;
        assert_eq!(s.min, 1.0);
        assert!(near(s.max, 100.0), "{}", s.max);
        assert!(near(s.p50, 50.0), "{}", s.p50);
        assert!(near(s.p99, 99.0), "{}", s.p99);
        assert_eq!(s.avg, 50.5, "exact");
        let mut merged = Latencies::new();
        merged.add(&samples);
        merged.add(&samples);
        assert_eq!(merged.len(), 200);
        assert!(near(merged.summary().unwrap().p50, 50.0));
        assert!(Latencies::new().summary().is_none());
    }
}
