//! A data path per core: one thread per core, each running a single-threaded tokio runtime
//! with its own connections and transactions, as NVIDIA's storage application runs one
//! data-path thread per `--cpu`, each with its own RDMA contexts.
//!
//! What runs on core `k` stays there: its targets' and the service's listeners (so the
//! connections they accept are served on that thread), the service's connections to the
//! targets that lane `k` uses, the initiator's connection `k` and the transactions that use
//! it. An I/O then goes from the initiator through the service to the targets and back
//! without waking another thread, and no work is stolen between threads. On a 2-core VM that
//! made `storage-demo` over TCP 1.25 to 1.38 times as fast as the same parts on one two-worker
//! runtime (`--one-runtime`), where any frame may wake a task on the other core
//! (docs/bench/storage.txt).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdma_rpc_core::server::ServerBuilder;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

thread_local! {
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The core the calling thread serves, when it is one of a [`CoreThreads`]' threads.
pub fn current() -> Option<usize> {
    CURRENT.with(std::cell::Cell::get)
}

/// One thread per core, each running a single-threaded tokio runtime until this is dropped.
/// Dropping it stops the runtimes without waiting: each thread drops its tasks and ends on its
/// own (a drop in async code must not block on them).
pub struct CoreThreads {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
}

impl std::fmt::Debug for CoreThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreThreads")
            .field("cores", &self.handles.len())
            .finish()
    }
}

impl CoreThreads {
    /// Starts `cores` threads (at least one), `storage-core-0` and on, wherever the OS
    /// schedules them.
    pub fn start(cores: usize) -> std::io::Result<Arc<CoreThreads>> {
        CoreThreads::start_with(cores.max(1), None)
    }

    /// Starts one thread per CPU of `cpus` (at least one), thread `k` pinned to CPU
    /// `cpus[k]`, as NVIDIA's application pins a data-path thread to each `--cpu`. Fails when a
    /// CPU is not one this process may run on, or where threads cannot be pinned (only
    /// Linux can).
    pub fn start_pinned(cpus: &[usize]) -> std::io::Result<Arc<CoreThreads>> {
        if cpus.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no CPU to run on",
            ));
        }
        CoreThreads::start_with(cpus.len(), Some(cpus))
    }

    fn start_with(cores: usize, cpus: Option<&[usize]>) -> std::io::Result<Arc<CoreThreads>> {
        let mut threads = CoreThreads {
            handles: Vec::new(),
            stops: Vec::new(),
        };
        for core in 0..cores {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            let cpu = cpus.map(|cpus| cpus[core]);
            let (pinned, pinning) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("storage-core-{core}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        let outcome = pin::to(cpu);
                        let failed = outcome.is_err();
                        let _ = pinned.send(outcome);
                        if failed {
                            return;
                        }
                    }
                    drop(pinned);
                    CURRENT.with(|c| c.set(Some(core)));
                    // Tasks spawned on this runtime run while it waits for the stop.
                    runtime.block_on(async move {
                        let _ = stopped.await;
                    });
                })?;
            // Unpinned threads hang up at once; a pinned one says how pinning went.
            if let Ok(Err(e)) = pinning.recv() {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!(
                        "pinning core {core}'s thread to CPU {}: {e}",
                        cpu.unwrap_or(0)
                    ),
                ));
            }
            threads.handles.push(handle);
            threads.stops.push(stop);
        }
        Ok(Arc::new(threads))
    }

    /// How many cores.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Never: there is at least one core.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The runtime of core `core` (modulo the number of cores).
    pub fn handle(&self, core: usize) -> &Handle {
        &self.handles[core % self.handles.len()]
    }

    /// Runs `future` on core `core` (modulo the number of cores) and waits for its output, from
    /// any runtime. A panic in `future` is raised again here.
    pub async fn run<F>(&self, core: usize, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handle(core).spawn(future).await {
            Ok(output) => output,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: only when the runtime stops, which dropping `self` does, and `self`
            // is borrowed here.
            Err(e) => panic!("core {core} stopped while running a task: {e}"),
        }
    }
}

impl Drop for CoreThreads {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

/// Pinning the calling thread to one CPU.
mod pin {
    /// Pins the calling thread to CPU `cpu`.
    #[cfg(target_os = "linux")]
    pub(super) fn to(cpu: usize) -> std::io::Result<()> {
        // The bit set holds CPUs 0..CPU_SETSIZE.
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "CPU {cpu} is beyond the {} a CPU set holds",
                    libc::CPU_SETSIZE
                ),
            ));
        }
        // SAFETY: `cpu_set_t` is plain bits, and all zeros is the empty set. `CPU_SET` sets
        // bit `cpu`, below `CPU_SETSIZE` (checked above), inside the set it is given.
        // `sched_setaffinity` reads `size_of::<cpu_set_t>()` bytes from the set, which is
        // that large, and changes only the calling thread (pid 0).
        let status = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if status != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: the set holds no CPU this process may use.
            return Err(match e.raw_os_error() {
                Some(libc::EINVAL) => std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("CPU {cpu} is not one this process may run on"),
                ),
                _ => e,
            });
        }
        Ok(())
    }

    /// Pinning threads is implemented for Linux only.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn to(cpu: usize) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("cannot pin a thread to CPU {cpu}: --cpu is supported on Linux only"),
        ))
    }

    /// The CPUs the calling thread may run on (for tests).
    #[cfg(all(test, target_os = "linux"))]
    pub(super) fn allowed() -> Vec<usize> {
        // SAFETY: as in `to`: a zeroed set is empty, `sched_getaffinity` writes at most
        // `size_of::<cpu_set_t>()` bytes into it, and `CPU_ISSET` reads bits below
        // `CPU_SETSIZE` of it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
                .collect()
        }
    }
}

/// How many of something (I/Os, halves moved, claims held) ran on each core's thread, and
/// elsewhere: what shows that a data path stayed on its core, counted without a line both
/// cores write.
#[derive(Debug, Default)]
pub struct PerCore {
    by_core: Vec<Padded<AtomicU64>>,
    elsewhere: Padded<AtomicU64>,
}

/// A value on a cache line (pair) of its own, so that cores using their own values side by
/// side do not take the line from each other.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// The index of the calling thread's own entry among `cores` per-core entries and one more
/// for threads that are no core's (or a core beyond them).
pub fn own_index(cores: usize) -> usize {
    current().filter(|&core| core < cores).unwrap_or(cores)
}

impl PerCore {
    /// Counters for cores `0..cores`.
    pub fn new(cores: usize) -> PerCore {
        PerCore {
            by_core: (0..cores).map(|_| Padded::default()).collect(),
            elsewhere: Padded::default(),
        }
    }

    /// The calling thread's counter: its core's, or the one for elsewhere on a thread that is
    /// no core's (or a core beyond those counted).
    pub fn counter(&self) -> &AtomicU64 {
        match self.by_core.get(own_index(self.by_core.len())) {
            Some(counter) => &counter.0,
            None => &self.elsewhere.0,
        }
    }

    /// Counts one for the calling thread's core ([`PerCore::counter`]).
    pub fn count(&self) {
        self.counter().fetch_add(1, Ordering::Relaxed);
    }

    /// All counters together, each read with `order`.
    pub fn sum(&self, order: Ordering) -> u64 {
        self.by_core
            .iter()
            .chain(std::iter::once(&self.elsewhere))
            .map(|n| n.0.load(order))
            .sum()
    }

    /// The counts, by core, and elsewhere.
    pub fn get(&self) -> (Vec<u64>, u64) {
        let by_core = self
            .by_core
            .iter()
            .map(|n| n.0.load(Ordering::Relaxed))
            .collect();
        (by_core, self.elsewhere.0.load(Ordering::Relaxed))
    }

    /// `{what} on each core's thread: 310, 290 (elsewhere: 0)`.
    pub fn line(&self, what: &str) -> String {
        let (by_core, elsewhere) = self.get();
        let by_core: Vec<String> = by_core.iter().map(u64::to_string).collect();
        format!(
            "{what} on each core's thread: {} (elsewhere: {elsewhere})",
            by_core.join(", ")
        )
    }
}

/// Binds `builder` on `bind` and serves until `shutdown`: on core `core`'s thread when there
/// are threads per core (the listener and the connections it accepts then live there), else
/// on the caller's runtime. Returns the bound address and the serving task, which can be
/// awaited from any runtime.
pub async fn serve_on(
    threads: Option<&CoreThreads>,
    core: usize,
    builder: ServerBuilder,
    bind: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> rdma_rpc_core::Result<(String, JoinHandle<rdma_rpc_core::Result<()>>)> {
    let bind = bind.to_owned();
    let start = async move {
        let server = builder.bind(&bind).await?;
        let addr = server.local_addr();
        Ok((addr, tokio::spawn(server.serve_with_shutdown(shutdown))))
    };
    match threads {
        Some(threads) => threads.run(core, start).await,
        None => start.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_core_runs_its_own_tasks_and_knows_its_index() {
        let threads = CoreThreads::start(2).unwrap();
        assert_eq!(threads.len(), 2);
        assert_eq!(current(), None, "the test's own thread is no core");
        for (core, expected) in [(0, 0), (1, 1), (2, 0), (3, 1)] {
            let (seen, name) = threads
                .run(core, async {
                    (current(), std::thread::current().name().map(str::to_owned))
                })
                .await;
            assert_eq!(seen, Some(expected), "core {core}");
            assert_eq!(name.as_deref(), Some(&*format!("storage-core-{expected}")));
        }
    }

    #[tokio::test]
    async fn dropping_the_threads_drops_their_tasks() {
        let threads = CoreThreads::start(1).unwrap();
        let (held, dropped) = oneshot::channel::<()>();
        let (started, running) = oneshot::channel::<()>();
        threads.handle(0).spawn(async move {
            let _held = held;
            let _ = started.send(());
            std::future::pending::<()>().await;
        });
        running.await.unwrap();
        drop(threads);
        // The task never ends on its own: its sender goes only when its runtime drops it.
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(30), dropped).await;
        assert!(matches!(outcome, Ok(Err(_))), "{outcome:?}");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn pinned_threads_run_on_their_cpu_only() {
        let allowed = pin::allowed();
        let cpus: Vec<usize> = allowed.iter().rev().copied().collect();
        let threads = CoreThreads::start_pinned(&cpus).unwrap();
        assert_eq!(threads.len(), cpus.len());
        for (core, &cpu) in cpus.iter().enumerate() {
            let seen = threads.run(core, async { pin::allowed() }).await;
            assert_eq!(seen, [cpu], "core {core}");
        }
        // A CPU this process may not use, one past the set's end, and none at all are errors
        // that say so.
        let outside = (0..1024).find(|c| !allowed.contains(c)).unwrap();
        let e = CoreThreads::start_pinned(&[allowed[0], outside]).unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "core 1's thread to CPU {outside}: CPU {outside} is not"
            )),
            "{e}"
        );
        let e = CoreThreads::start_pinned(&[usize::MAX]).unwrap_err();
        assert!(e.to_string().contains("beyond"), "{e}");
        assert!(CoreThreads::start_pinned(&[]).is_err());
    }

    #[tokio::test]
    async fn counts_go_to_the_core_that_ran_them() {
        let threads = CoreThreads::start(3).unwrap();
        let counts = Arc::new(PerCore::new(2));
        counts.count();
        for core in [0, 1, 1, 2] {
            let counts = counts.clone();
            threads.run(core, async move { counts.count() }).await;
        }
        // Core 2 is beyond the two counted: elsewhere, with the test's own thread.
        assert_eq!(counts.get(), (vec![1, 2], 2));
        assert_eq!(
            counts.line("calls"),
            "calls on each core's thread: 1, 2 (elsewhere: 2)"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "boom")]
    async fn a_panic_on_a_core_is_raised_to_the_caller() {
        let threads = CoreThreads::start(1).unwrap();
        threads.run(0, async { panic!("boom") }).await
    }
}
