//! Measuring calls and printing the demo's table.

use std::time::{Duration, Instant};

use crate::bench::measure::Latencies;

/// Latencies of a run of calls.
#[derive(Debug, Default)]
pub struct Samples {
    latencies: Latencies,
}

impl Samples {
    /// Times one call.
    pub async fn time<T>(&mut self, call: impl std::future::Future<Output = T>) -> T {
        let start = Instant::now();
        let out = call.await;
        self.latencies.record(start.elapsed());
        out
    }

    /// The `q` quantile (0.0 ..= 1.0).
    pub fn quantile(&self, q: f64) -> Duration {
        self.latencies.quantile(q)
    }

    /// Number of calls timed.
    pub fn count(&self) -> usize {
        self.latencies.len() as usize
    }

    /// Megabytes (10^6 bytes) per second for `bytes_per_call`.
    pub fn mb_per_s(&self, bytes_per_call: usize) -> f64 {
        let secs = self.latencies.total().as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        (bytes_per_call * self.count()) as f64 / secs / 1e6
    }
}

/// Formats a byte count as `64 B`, `4 KiB`, `4 MiB`.
pub fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Formats a duration in microseconds.
pub fn micros(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

/// One row of the table.
#[derive(Debug)]
pub struct Row {
    /// The operation and endpoint.
    pub operation: String,
    /// Payload size in bytes.
    pub size: usize,
    /// Calls made.
    pub calls: usize,
    /// Protocol round trips per call (measured from the client's counters).
    pub round_trips: f64,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Throughput in MB/s with one call in flight.
    pub mb_per_s: f64,
}

/// Prints rows as a plain-text table.
pub fn print_table(rows: &[Row]) {
    println!(
        "{:<24} {:>9} {:>7} {:>12} {:>12} {:>12} {:>10}",
        "operation", "size", "calls", "round trips", "p50", "p99", "MB/s"
    );
    println!("{}", "-".repeat(92));
    for r in rows {
        println!(
            "{:<24} {:>9} {:>7} {:>12.1} {:>12} {:>12} {:>10.1}",
            r.operation,
            size(r.size),
            r.calls,
            r.round_trips,
            micros(r.p50),
            micros(r.p99),
            r.mb_per_s
        );
    }
}
