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

impl Latency {
    /// From samples.
    pub fn of(samples: impl IntoIterator<Item = Duration>) -> Latency {
        Latency::from(&samples.into_iter().collect::<Latencies>())
    }
}

impl From<&Latencies> for Latency {
    fn from(latencies: &Latencies) -> Latency {
        let at = |q: f64| latencies.quantile(q).as_secs_f64() * 1e6;
        Latency {
            p50_us: at(0.5),
            p99_us: at(0.99),
        }
    }
}

/// Latencies as an HDR histogram (the `hdrhistogram` crate): the one percentile
/// implementation of the examples (the bench, the demo's table, the storage initiator) and of
/// `rdma-rpc bench` and `ping`. Durations are kept in nanoseconds to 3 significant digits, so a
/// quantile is within 0.1% of the sample it stands for, from 1 ns to an hour (longer ones count
/// as an hour); a quantile `q` is the smallest latency that `q` of the samples do not exceed.
/// Memory is fixed (some hundred KB), whatever the number of samples.
#[derive(Clone)]
pub struct Latencies {
    histogram: hdrhistogram::Histogram<u64>,
    /// The exact sum, for the mean.
    total: Duration,
}

/// The longest latency told apart from longer ones.
const LONGEST: Duration = Duration::from_secs(3600);

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            histogram: hdrhistogram::Histogram::new_with_bounds(1, LONGEST.as_nanos() as u64, 3)
                .expect("valid bounds and precision"),
            total: Duration::ZERO,
        }
    }
}

impl std::fmt::Debug for Latencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Latencies")
            .field("count", &self.len())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .finish()
    }
}

impl Latencies {
    /// No samples yet.
    pub fn new() -> Latencies {
        Latencies::default()
    }

    /// Adds a sample.
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(nanos.max(1));
        self.total += latency;
    }

    /// Samples recorded.
    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    /// Whether no sample was recorded.
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The `q` quantile (0 to 1); zero when there are no samples.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.is_empty() {
            return Duration::ZERO;
        }
        // The middle of the sample's bucket: the same sample reads the same as min, quantile
        // or max.
        let at = self.histogram.value_at_quantile(q.clamp(0.0, 1.0));
        Duration::from_nanos(self.histogram.median_equivalent(at))
    }

    /// The smallest sample (zero when none).
    pub fn min(&self) -> Duration {
        self.quantile(0.0)
    }

    /// The largest sample (zero when none).
    pub fn max(&self) -> Duration {
        self.quantile(1.0)
    }

    /// The sum of the samples, exact.
    pub fn total(&self) -> Duration {
        self.total
    }

    /// The mean, exact (zero when none).
    pub fn mean(&self) -> Duration {
        match self.len() {
            0 => Duration::ZERO,
            n => self.total.div_f64(n as f64),
        }
    }
}

impl Extend<Duration> for Latencies {
    fn extend<I: IntoIterator<Item = Duration>>(&mut self, samples: I) {
        for latency in samples {
            self.record(latency);
        }
    }
}

impl FromIterator<Duration> for Latencies {
    fn from_iter<I: IntoIterator<Item = Duration>>(samples: I) -> Latencies {
        let mut latencies = Latencies::new();
        latencies.extend(samples);
        latencies
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
    let mut samples = Latencies::new();
    for _ in 0..calls {
        let start = Instant::now();
        f().await?;
        samples.record(start.elapsed());
    }
    Ok(Latency::from(&samples))
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

/// The run of median calls/s among `runs` (none: zero).
pub fn median_throughput(mut runs: Vec<Throughput>) -> Throughput {
    runs.sort_by(|a, b| a.calls_per_s.total_cmp(&b.calls_per_s));
    runs.get(runs.len() / 2).copied().unwrap_or_default()
}

/// Memory the system can give this process now (`MemAvailable`), in bytes (Linux; `None`
/// elsewhere).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_kib(&meminfo, "MemAvailable").map(|kib| kib * 1024)
}

/// The field `key` of a `/proc/meminfo` text, in KiB (as the file gives it).
pub fn meminfo_kib(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == key).then(|| value.split_whitespace().next()?.parse().ok())?
    })
}

/// CPU time this process has used so far, every thread together, in user space and in the
/// kernel (`getrusage`; `None` off Unix). Differences of two readings say what a stretch of
/// work cost in CPU: a steadier figure than its wall time on a machine shared with others.
pub fn process_cpu() -> Option<CpuTime> {
    #[cfg(unix)]
    {
        // SAFETY: `getrusage` fills the `rusage` it is given (all-zero is a valid value of
        // that plain C struct) and reads nothing else.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            (libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0).then_some(usage)
        }?;
        let time = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.clamp(0, 999_999) as u64)
        };
        Some(CpuTime {
            user: time(usage.ru_utime),
            kernel: time(usage.ru_stime),
        })
    }
    #[cfg(not(unix))]
    None
}

/// What this process used since `before` (a reading of [`process_cpu`]), or `None` where
/// either reading is missing.
pub fn process_cpu_since(before: Option<CpuTime>) -> Option<CpuTime> {
    Some(process_cpu()?.since(&before?))
}

/// CPU time, in user space and in the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// In user space.
    pub user: Duration,
    /// In the kernel (system calls, page faults, and over TCP the network stack).
    pub kernel: Duration,
}

impl CpuTime {
    /// What was used between `earlier` and this reading.
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            kernel: self.kernel.saturating_sub(earlier.kernel),
        }
    }

    /// Both together.
    pub fn total(&self) -> Duration {
        self.user + self.kernel
    }

    /// Microseconds per unit of `n` units of work: (total, user, kernel).
    pub fn per_us(&self, n: u64) -> (f64, f64, f64) {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
        (per(self.total()), per(self.user), per(self.kernel))
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_median_run_is_kept_whole() {
        let run = |calls_per_s: f64| super::Throughput {
            calls_per_s,
            gb_per_s: calls_per_s / 1e6,
        };
        let median = super::median_throughput(vec![run(700.0), run(300.0), run(500.0)]);
        assert_eq!((median.calls_per_s, median.gb_per_s), (500.0, 500.0 / 1e6));
        assert_eq!(super::median_throughput(vec![run(9.0)]).calls_per_s, 9.0);
        assert_eq!(super::median_throughput(Vec::new()).calls_per_s, 0.0);
    }

    #[test]
    fn cpu_time_is_split_per_unit_of_work() {
        let ms = std::time::Duration::from_millis;
        let before = CpuTime {
            user: ms(100),
            kernel: ms(40),
        };
        let after = CpuTime {
            user: ms(400),
            kernel: ms(240),
        };
        let spent = after.since(&before);
        assert_eq!(spent.total(), ms(500));
        assert_eq!(spent.per_us(1000), (500.0, 300.0, 200.0));
        // An earlier reading taken as the later one gives nothing, not a wrap.
        assert_eq!(before.since(&after), CpuTime::default());
        assert_eq!(CpuTime::default().per_us(0), (0.0, 0.0, 0.0));
    }

    #[cfg(unix)]
    #[test]
    fn the_process_cpu_time_grows_with_work() {
        let before = process_cpu().expect("getrusage");
        let spent = || process_cpu().expect("getrusage").since(&before).total();
        // Work the optimizer cannot drop, until the clock (10 ms ticks at worst) sees 20 ms
        // of it, or 10 s have passed on the wall clock.
        let started = std::time::Instant::now();
        let mut x = 1u64;
        while spent() < std::time::Duration::from_millis(20)
            && started.elapsed() < std::time::Duration::from_secs(10)
        {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
        assert!(
            spent() >= std::time::Duration::from_millis(20),
            "10 s of spinning showed {:?} of CPU time",
            spent()
        );
        std::hint::black_box(x);
    }

    use super::*;

    /// Within the histogram's precision (3 significant digits).
    fn near(got: Duration, want_us: f64) -> bool {
        (got.as_secs_f64() * 1e6 - want_us).abs() <= want_us * 1e-3
    }

    #[test]
    fn quantiles_of_known_samples() {
        let samples: Latencies = (1..=100).rev().map(Duration::from_micros).collect();
        assert_eq!(samples.len(), 100);
        assert_eq!(samples.min(), Duration::from_micros(1));
        assert!(near(samples.quantile(0.5), 50.0), "{samples:?}");
        assert!(near(samples.quantile(0.99), 99.0), "{samples:?}");
        assert!(near(samples.max(), 100.0), "{samples:?}");
        assert_eq!(samples.mean(), Duration::from_micros(101) / 2, "exact");
        let figures = Latency::of((1..=100).map(Duration::from_micros));
        assert!((figures.p50_us - 50.0).abs() <= 0.05, "{figures:?}");
        assert!((figures.p99_us - 99.0).abs() <= 0.1, "{figures:?}");
    }

    #[test]
    fn no_samples_read_zero_and_long_ones_an_hour() {
        let none = Latencies::new();
        assert!(none.is_empty());
        assert_eq!(
            (none.min(), none.quantile(0.5), none.max(), none.mean()),
            (
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO
            )
        );
        let long: Latencies = [Duration::from_secs(7200)].into_iter().collect();
        assert!(long.max() >= LONGEST && long.max() <= LONGEST.mul_f64(1.001));
    }
}
