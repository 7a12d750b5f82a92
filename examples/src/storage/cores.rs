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
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The core the calling thread serves, when it is one of a [`CoreThreads`]' threads.
pub fn current() -> Option<usize> {
    CURRENT.with(std::cell::Cell::get)
}

/// One thread per core, each running a single-threaded tokio runtime until this is dropped
/// (which stops the runtimes, dropping their tasks, and joins the threads).
pub struct CoreThreads {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for CoreThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreThreads")
            .field("cores", &self.handles.len())
            .finish()
    }
}

impl CoreThreads {
    /// Starts `cores` threads (at least one), `storage-core-0` and on.
    pub fn start(cores: usize) -> std::io::Result<Arc<CoreThreads>> {
        let mut threads = CoreThreads {
            handles: Vec::new(),
            stops: Vec::new(),
            threads: Vec::new(),
        };
        for core in 0..cores.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            threads.handles.push(runtime.handle().clone());
            threads.stops.push(stop);
            let thread = std::thread::Builder::new()
                .name(format!("storage-core-{core}"))
                .spawn(move || {
                    CURRENT.with(|c| c.set(Some(core)));
                    // Tasks spawned on this runtime run while it waits for the stop.
                    runtime.block_on(async move {
                        let _ = stopped.await;
                    });
                })?;
            threads.threads.push(thread);
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
        let me = std::thread::current().id();
        for thread in self.threads.drain(..) {
            // Dropped by a task on one of the cores: that thread ends once this returns.
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}
