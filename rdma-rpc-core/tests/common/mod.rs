//! What the memory tests share: a global allocator that counts live bytes, and a one-endpoint
//! service. Each memory test is a test binary of its own with one test, so no other test's
//! allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use bytes::Bytes;
use rdma_rpc_core::service::{EndpointDef, OpKind, ServerCall, Service};
use rdma_rpc_core::transport::BoxFuture;
use rdma_rpc_core::{ConnectionCount, ServerBuilder, Status};

/// Bytes allocated and not freed, and the highest that figure reached since the last reset.
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
/// Allocations made (reallocations count as one).
static ALLOCATIONS: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are only
// bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: the caller's contract for `layout` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes through
        // this allocator).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(delta: isize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let live = LIVE.fetch_add(delta, Ordering::Relaxed) + delta;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Bytes live now.
#[allow(dead_code)]
pub(crate) fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations made so far.
#[allow(dead_code)]
pub(crate) fn allocations() -> isize {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// The highest live figure since the last [`reset_peak`].
#[allow(dead_code)]
pub(crate) fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a measurement: the peak becomes what is live now.
#[allow(dead_code)]
pub(crate) fn reset_peak() -> isize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

/// Everything a tracing subscriber wrote, kept to read back: install it with
/// [`capture_logs`].
#[allow(dead_code)] // only the tests that read logs use it
#[derive(Clone, Default)]
pub(crate) struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[allow(dead_code)]
impl Captured {
    /// What was written so far, as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// Bytes written so far.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures everything logged at DEBUG and above, for the whole process: install it before
/// anything logs, so every callsite sees it. A test binary that reads logs has one test:
/// tracing keeps process-wide state (one interest per callsite, one maximum level) that
/// captures made by tests running in parallel disturbed (a capture now and then came back
/// empty under load).
#[allow(dead_code)]
pub(crate) fn capture_logs() -> Captured {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .init();
    captured
}

/// An endpoint no service serves.
#[allow(dead_code)] // not every test binary calls it
pub(crate) static UNKNOWN: EndpointDef = EndpointDef {
    path: "/nowhere",
    op: OpKind::Send,
    buffer_size: 64,
    method: "nowhere",
    timeout_ms: None,
    stream: rdma_rpc_core::StreamKind::Unary,
};

pub(crate) static ENDPOINTS: &[EndpointDef] = &[EndpointDef {
    path: "/echo",
    op: OpKind::Send,
    buffer_size: 1 << 20,
    method: "echo",
    timeout_ms: None,
    stream: rdma_rpc_core::StreamKind::Unary,
}];

/// Answers a send with the payload's length.
pub(crate) struct Echo;

impl Service for Echo {
    fn name(&self) -> &'static str {
        "Echo"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        ENDPOINTS
    }

    fn call<'a>(&'a self, _: usize, call: ServerCall<'a>) -> BoxFuture<'a, Result<Bytes, Status>> {
        Box::pin(async move {
            match call {
                ServerCall::Inbound { data, .. } => Ok(Bytes::from(data.len().to_string())),
                _ => Err(Status::unimplemented("only send")),
            }
        })
    }
}

/// Binds `builder` with the [`Echo`] service at `addr` and serves it on a task: its address
/// and its connection count.
#[allow(dead_code)]
pub(crate) async fn serve_echo(builder: ServerBuilder, addr: &str) -> (String, ConnectionCount) {
    let server = builder.add_service(Echo).bind(addr).await.unwrap();
    let bound = (server.local_addr(), server.connection_count());
    tokio::spawn(server.serve());
    bound
}

/// A service whose one endpoint (`/stall`, send) never answers: its handler waits for ever,
/// and counts how often it was stopped (its future dropped).
#[allow(dead_code)]
#[derive(Clone, Default)]
pub(crate) struct Stall {
    /// Handlers stopped so far.
    pub(crate) stopped: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
    /// Handlers started so far.
    pub(crate) started: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
}

#[allow(dead_code)]
pub(crate) static STALL: &[EndpointDef] = &[EndpointDef {
    path: "/stall",
    op: OpKind::Send,
    buffer_size: 1024,
    method: "stall",
    timeout_ms: None,
    stream: rdma_rpc_core::StreamKind::Unary,
}];

struct CountsDrop(std::sync::Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for CountsDrop {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n += 1);
    }
}

impl Service for Stall {
    fn name(&self) -> &'static str {
        "Stall"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        STALL
    }

    fn call<'a>(&'a self, _: usize, _: ServerCall<'a>) -> BoxFuture<'a, Result<Bytes, Status>> {
        Box::pin(async move {
            let _counts = CountsDrop(self.stopped.clone());
            self.started.send_modify(|n| *n += 1);
            std::future::pending().await
        })
    }
}

/// A service whose one endpoint (`/panic`, send) panics in its handler.
#[allow(dead_code)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Panics;

#[allow(dead_code)]
pub(crate) static PANICS: &[EndpointDef] = &[EndpointDef {
    path: "/panic",
    op: OpKind::Send,
    buffer_size: 64,
    method: "panic_send",
    timeout_ms: None,
    stream: rdma_rpc_core::StreamKind::Unary,
}];

impl Service for Panics {
    fn name(&self) -> &'static str {
        "Panics"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        PANICS
    }

    fn call<'a>(&'a self, _: usize, _: ServerCall<'a>) -> BoxFuture<'a, Result<Bytes, Status>> {
        Box::pin(async move { panic!("the handler panics on purpose") })
    }
}

/// A test's failure bound, never what it asserts: panics with `what` if `fut` has not ended
/// after `secs` seconds. At the bound the future is not polled again, so one that lost a
/// wake-up fails here instead of passing late (`tokio::time::timeout` polls its future once
/// more at its deadline).
#[allow(dead_code)] // not every test binary calls it
pub(crate) async fn bounded<T>(
    what: &str,
    secs: u64,
    fut: impl std::future::Future<Output = T>,
) -> T {
    let deadline = std::time::Duration::from_secs(secs);
    tokio::select! {
        biased; // the deadline first
        () = tokio::time::sleep(deadline) => panic!("{what} hung (bound: {secs} s)"),
        out = fut => out,
    }
}
