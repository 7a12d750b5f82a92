//! Measuring: latency with one call in flight, throughput with several in flight, peak RSS,
//! and a progress line on stderr.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An error while measuring, with what was being measured.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// p50 and p99 of latencies.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Latency {
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
}

/// The `q` quantile (0 to 1, nearest rank) of `sorted` samples; zero when there are none.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    match sorted.len() {
        0 => Duration::ZERO,
        n => sorted[((n - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize],
    }
}

impl Latency {
    /// From samples.
    pub fn of(mut samples: Vec<Duration>) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let at = |q: f64| quantile(&samples, q).as_secs_f64() * 1e6;
        Latency {
            p50_us: at(0.5),
            p99_us: at(0.99),
        }
    }
}

/// Calls per second and bytes per second.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Throughput {
    /// Calls completed per second.
    pub calls_per_s: f64,
    /// Payload bytes per second, in GB/s (10^9).
    pub gb_per_s: f64,
}

/// Times `calls` sequential calls of `f`.
pub async fn latency<F, Fut>(calls: usize, mut f: F) -> Result<Latency, BenchError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), BenchError>>,
{
    // A few calls first, to warm pools and caches.
    for _ in 0..calls.min(5) {
        f().await?;
    }
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        f().await?;
        samples.push(start.elapsed());
    }
    Ok(Latency::of(samples))
}

/// Runs `calls` calls of `payload` bytes spread over `workers` concurrent workers;
/// `make(worker)` gives each worker its call function (its own connection or a shared one).
/// Each worker makes one untimed call first (warming its connection's buffers); the clock
/// runs from the moment the first worker is released after all of them are warm to the moment
/// the last one finishes. Both ends are taken inside the workers: the task awaiting them may
/// be polled only after a scheduler has run many other tasks (a current-thread runtime polls
/// its `block_on` future between batches), which would leave calls outside the clock.
pub async fn throughput<F, Fut>(
    calls: usize,
    payload: usize,
    workers: usize,
    make: impl Fn(usize) -> F,
) -> Result<Throughput, BenchError>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), BenchError>> + Send,
{
    let left = Arc::new(AtomicUsize::new(calls));
    let warm = Arc::new(tokio::sync::Barrier::new(workers));
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let mut f = make(w);
        let left = left.clone();
        let warm = warm.clone();
        tasks.push(tokio::spawn(async move {
            let warmed = f().await;
            warm.wait().await;
            let released = Instant::now();
            warmed?;
            while left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                f().await?;
            }
            Ok::<_, BenchError>((released, Instant::now()))
        }));
    }
    let (mut start, mut end) = (None::<Instant>, None::<Instant>);
    for t in tasks {
        let (released, finished) = t.await??;
        start = Some(start.map_or(released, |s| s.min(released)));
        end = Some(end.map_or(finished, |e| e.max(finished)));
    }
    let secs = match (start, end) {
        (Some(s), Some(e)) => (e - s).as_secs_f64(),
        _ => 0.0,
    }
    .max(1e-9);
    Ok(Throughput {
        calls_per_s: calls as f64 / secs,
        gb_per_s: (calls * payload) as f64 / secs / 1e9,
    })
}

/// Peak resident set size of this process so far, in MiB (Linux; 0 elsewhere).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The benchmark's progress line on stderr (indicatif, as the storage binaries; hidden when
/// stderr is not a terminal), then one summary line.
#[derive(Debug)]
pub struct Progress {
    bar: indicatif::ProgressBar,
    started: Instant,
}

impl Progress {
    /// A progress line for `total` steps.
    pub fn new(total: usize) -> Progress {
        let bar = indicatif::ProgressBar::new(total as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("[{pos:>3}/{len}] {elapsed:>4}  {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    /// Announces the next step.
    pub fn step(&mut self, what: &str) {
        self.bar.inc(1);
        self.bar.set_message(what.to_owned());
    }

    /// Ends the line.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
        eprintln!(
            "done: {} measurements in {:.1}s",
            self.bar.position(),
            self.started.elapsed().as_secs_f64()
        );
    }
}
