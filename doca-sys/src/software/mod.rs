//! The in-process software provider: every function of `include/doca_rpc_sw.h`, implemented
//! in Rust as `#[no_mangle] extern "C"` symbols, so the crate's `extern "C"` declarations
//! resolve to it at link time. Built only with `cfg(doca_sys_software)`.
//!
//! It is a stand-in for tests, faithful to DOCA's documented semantics, not a mock: data
//! really moves between registered memories of the same process.
//!
//! # Devices
//! Two devices, `mlx5_0` (`0000:03:00.0`) and `mlx5_1` (`0000:03:00.1`); every RDMA task type
//! is supported; the maximum message size is 1 GiB.
//!
//! # Contexts
//! - `doca_ctx_start` needs a progress engine (`NOT_CONNECTED`) and an idle context
//!   (`BAD_STATE`); the context is `STARTING` at once and becomes `RUNNING` during the next
//!   `doca_pe_progress`. State callbacks (`IDLE -> STARTING -> RUNNING`) run from progress.
//! - Configuration calls (`doca_rdma_set_*`, `*_set_conf`, `doca_ctx_set_state_changed_cb`,
//!   `doca_pe_connect_ctx`) need an idle context: `BAD_STATE` otherwise. Task allocation,
//!   submission, listening, connecting and export need `RUNNING`: `BAD_STATE` otherwise.
//! - `doca_ctx_stop` disconnects every connection (peers get their disconnection callback),
//!   stops listening, flushes posted receives and outstanding tasks (error completions), and
//!   returns `IN_PROGRESS` (state `STOPPING`) while tasks are in flight **or still allocated**.
//!   The context reaches `IDLE` in a later `doca_pe_progress` once every completion was
//!   delivered and every task freed. With nothing allocated it stops at once (`SUCCESS`).
//! - `doca_rdma_set_max_num_connections` defaults to 1, as a reminder to set it.
//!
//! # Connections
//! - RDMA CM is emulated by port number: `doca_rdma_start_listen_to_port(port)` registers the
//!   context process-wide (`IN_USE` if another context listens there); `doca_rdma_connect_to_addr`
//!   with any address and that port reaches it. Nobody listening, or the server full: the
//!   client gets its failure callback. Otherwise the server's request callback runs from the
//!   server's progress; `accept` queues the established callback on both sides; `reject`
//!   queues the client's failure callback. Without a request callback requests are rejected.
//! - `doca_rdma_connection_disconnect` flushes the connection's outstanding tasks, and the peer
//!   gets its disconnection callback (CM connections only; the side that disconnects gets no
//!   callback). The peer's outstanding tasks are flushed too, and it must call
//!   `doca_rdma_connection_disconnect` to finish. Disconnecting twice is `BAD_STATE`.
//! - Out of band: `doca_rdma_export` creates a connection and a blob (`FULL` when all slots
//!   are used); `doca_rdma_connect(blob)` on each side pairs them. No connection callbacks are
//!   called in this mode; a side is usable once it called `doca_rdma_connect`.
//!
//! # Tasks
//! - `*_set_conf` sets the pool size: allocating more than `num_tasks` tasks of that type
//!   gives `NO_MEMORY`. Completions are delivered only from `doca_pe_progress` of the
//!   submitting context's progress engine; a task is reusable after its callback.
//! - A send (also send-with-immediate and write-with-immediate) is matched with the oldest
//!   receive posted on the peer context (receives match any connection). If none is posted,
//!   the send waits up to `DOCA_SYS_SW_RNR_TIMEOUT_MS` milliseconds (default 20, checked in
//!   the sender's progress) for one, then fails with `DOCA_ERROR_IO_FAILED` (receiver not
//!   ready) and its connection goes to error.
//! - A receive appends after its buffer's data section and grows the data length. A message
//!   larger than the free space fails the receive and the send (`IO_FAILED`) and puts both
//!   connections in error. Write-with-immediate consumes a receive with result length 0 and
//!   leaves its buffer untouched.
//! - Write appends the source's data section after the remote buffer's data section (and grows
//!   the local descriptor's data length); read copies the remote buffer's data section after
//!   the local buffer's data section; atomics act on the 8 aligned bytes at the remote buffer's
//!   data address and append the previous value (native endian) to the result buffer.
//!   They need no peer task. The remote buffer must come from an mmap created from an export
//!   (`INVALID_VALUE` at submit otherwise). Access is checked against the exporting mmap (it
//!   must still exist and be started, cover the range and grant `RDMA_WRITE` / `RDMA_READ` /
//!   `RDMA_ATOMIC`) and the peer context's `doca_rdma_set_permissions`.
//! - A failed task completes with `DOCA_ERROR_IO_FAILED` and puts its connection in error:
//!   every other outstanding task of that connection completes (once) with
//!   `DOCA_ERROR_CONNECTION_ABORTED`, tasks submitted later on it too, and it must be
//!   disconnected. Other connections of the context keep working.
//! - Submitting on a connection that is not established gives `NOT_CONNECTED`.
//!
//! # Memory
//! mmaps check ranges and states (`BAD_STATE` after start); `doca_mmap_export_rdma` needs a
//! started mmap with an RDMA permission (`NOT_PERMITTED`) and the device added
//! (`INVALID_VALUE`). A buffer inventory gives `NO_MEMORY` when all its buffers are out.
//!
//! # Progress engine
//! `doca_pe_get_notification_handle` returns an eventfd. After `doca_pe_request_notification`
//! it becomes readable as soon as something is pending (at once if something already is,
//! including a receiver-not-ready deadline that expires later); `doca_pe_clear_notification`
//! drains it.
//!
//! # Threads
//! All state is process-global behind one mutex; contexts may be progressed from different
//! threads. Callbacks run without the lock held, so they may call any function except
//! `doca_pe_progress`.

mod device;
mod errors;
mod memory;
mod pe;
mod rdma;
mod tasks;

use crate::ffi::*;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Status of the task that failed (remote access, receiver not ready, length).
const ERR_TASK: doca_error_t = DOCA_ERROR_IO_FAILED;
/// Status of the tasks flushed from a connection in error, disconnected, or stopping.
const ERR_FLUSH: doca_error_t = DOCA_ERROR_CONNECTION_ABORTED;

/// A handle: the address of a small heap allocation, used as the C pointer and map key.
type H = usize;

fn new_handle() -> H {
    Box::into_raw(Box::new(0u64)) as H
}

fn free_handle(h: H) {
    // SAFETY: `h` came from `new_handle` and is freed once, when its object is removed.
    drop(unsafe { Box::from_raw(h as *mut u64) });
}

/// `union doca_data` stored in the global state.
#[derive(Clone, Copy)]
struct UserData(doca_data);

// SAFETY: user data is an opaque value the provider only stores and hands back to the
// application's callbacks; DOCA lets the application progress contexts from any thread.
unsafe impl Send for UserData {}

impl UserData {
    const NULL: UserData = UserData(doca_data { u64_: 0 });
}

/// Completion callback with the generic task pointer (ABI-compatible with every task type's).
type TaskCb = unsafe extern "C" fn(*mut doca_task, doca_data, doca_data);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Receive,
    Send,
    SendImm,
    Read,
    Write,
    WriteImm,
    CmpSwp,
    FetchAdd,
}

impl Kind {
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Copy, Default)]
struct TaskConf {
    success: Option<TaskCb>,
    error: Option<TaskCb>,
    num: u32,
    allocated: u32,
}

struct Pe {
    ctxs: Vec<H>,
    queue: VecDeque<Event>,
    efd: i32,
    armed: bool,
    timer: bool,
}

enum Event {
    State { ctx: H, prev: u32, next: u32 },
    Request(H),
    Established(H),
    Failure(H),
    Disconnect(H),
    TaskDone(H),
}

struct Rdma {
    pe: Option<H>,
    state: doca_ctx_states,
    user_data: UserData,
    state_cb: doca_ctx_state_changed_callback_t,
    permissions: u32,
    max_conns: u16,
    request_cb: doca_rdma_connection_request_cb_t,
    established_cb: doca_rdma_connection_established_cb_t,
    failure_cb: doca_rdma_connection_failure_cb_t,
    disconnect_cb: doca_rdma_connection_disconnection_cb_t,
    confs: [TaskConf; 8],
    /// Tasks submitted whose completion was not delivered yet.
    inflight: usize,
    /// Posted receives, oldest first.
    recvs: VecDeque<H>,
    conns: Vec<H>,
    listening: Vec<u16>,
    next_conn_id: u32,
}

impl Rdma {
    fn allocated(&self) -> u32 {
        self.confs.iter().map(|c| c.allocated).sum()
    }

    fn used_slots(&self, world: &World) -> usize {
        self.conns
            .iter()
            .filter(|c| world.conns.get(c).is_some_and(|c| c.state.holds_slot()))
            .count()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    /// Server side, waiting for accept / reject.
    Requested,
    /// Client side, waiting for the server.
    Connecting,
    /// Out of band: exported, `doca_rdma_connect` not called yet.
    Exported,
    Established,
    /// A task failed: outstanding tasks are flushed; must be disconnected.
    Error,
    /// The peer disconnected: must be disconnected.
    PeerGone,
    Disconnected,
    Failed,
}

impl ConnState {
    fn holds_slot(self) -> bool {
        !matches!(self, ConnState::Disconnected | ConnState::Failed)
    }
}

struct Conn {
    rdma: H,
    id: u32,
    state: ConnState,
    peer: Option<H>,
    user_data: UserData,
    oob: bool,
    blob: Vec<u8>,
    addr: Option<H>,
    /// Send-like tasks waiting for a receive on the peer, oldest first.
    pending: VecDeque<H>,
    /// Every submitted task of this connection not completed yet.
    outstanding: Vec<H>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Submitted,
    Completing,
}

struct Task {
    kind: Kind,
    rdma: H,
    conn: Option<H>,
    src: H,
    dst: H,
    result: H,
    imm: u32,
    cmp: u64,
    swap: u64,
    add: u64,
    user_data: UserData,
    status: doca_error_t,
    phase: Phase,
    deadline: Option<Instant>,
    res_len: u32,
    res_opcode: u32,
    res_imm: u32,
    res_conn: H,
}

struct Addr {
    port: u16,
    in_use: usize,
}

struct Mmap {
    started: bool,
    addr: usize,
    len: usize,
    permissions: u32,
    devs: Vec<usize>,
    /// Global id of the exporting mmap, for mmaps created from an export.
    remote: Option<u64>,
    /// Global id (set at start).
    id: u64,
    blob: Vec<u8>,
    bufs: usize,
}

struct Inventory {
    capacity: usize,
    used: usize,
    started: bool,
}

struct Buf {
    inv: H,
    mmap: H,
    addr: usize,
    len: usize,
    data: usize,
    data_len: usize,
    refcount: u16,
}

impl Buf {
    /// Bytes free after the data section.
    fn tail_room(&self) -> usize {
        (self.addr + self.len) - (self.data + self.data_len)
    }
}

#[derive(Default)]
struct World {
    pes: HashMap<H, Pe>,
    rdmas: HashMap<H, Rdma>,
    conns: HashMap<H, Conn>,
    addrs: HashMap<H, Addr>,
    mmaps: HashMap<H, Mmap>,
    mmap_ids: HashMap<u64, H>,
    next_mmap_id: u64,
    invs: HashMap<H, Inventory>,
    bufs: HashMap<H, Buf>,
    tasks: HashMap<H, Task>,
    listeners: HashMap<u16, H>,
}

static WORLD: LazyLock<Mutex<World>> = LazyLock::new(Mutex::default);

fn world() -> MutexGuard<'static, World> {
    // A panic cannot unwind out of an `extern "C"` function (it aborts), so poisoning only
    // happens in a dying process; keep going.
    WORLD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a send waits for a receive on the peer.
fn rnr_timeout() -> Duration {
    static TIMEOUT: LazyLock<Duration> = LazyLock::new(|| {
        let ms = std::env::var("DOCA_SYS_SW_RNR_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        Duration::from_millis(ms)
    });
    *TIMEOUT
}

fn signal_fd(efd: i32) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live local to the eventfd owned by a live progress engine.
    let _ = unsafe { libc::write(efd, (&one as *const u64).cast::<c_void>(), 8) };
}

impl World {
    /// Queues a callback on a progress engine and wakes it if armed.
    fn enqueue(&mut self, pe: H, event: Event) {
        if let Some(pe) = self.pes.get_mut(&pe) {
            pe.queue.push_back(event);
            if pe.armed {
                pe.armed = false;
                signal_fd(pe.efd);
            }
        }
    }

    fn enqueue_ctx(&mut self, rdma: H, event: Event) {
        if let Some(pe) = self.rdmas.get(&rdma).and_then(|r| r.pe) {
            self.enqueue(pe, event);
        }
    }

    fn enqueue_conn(&mut self, conn: H, event: Event) {
        if let Some(rdma) = self.conns.get(&conn).map(|c| c.rdma) {
            self.enqueue_ctx(rdma, event);
        }
    }

    /// Completes a submitted task: its callback is delivered by the next progress.
    fn complete(&mut self, task: H, status: doca_error_t) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        if t.phase != Phase::Submitted {
            return;
        }
        t.phase = Phase::Completing;
        t.status = status;
        t.deadline = None;
        let (rdma, conn) = (t.rdma, t.conn);
        if let Some(c) = conn.and_then(|c| self.conns.get_mut(&c)) {
            c.outstanding.retain(|&x| x != task);
            c.pending.retain(|&x| x != task);
        }
        if let Some(r) = self.rdmas.get_mut(&rdma) {
            r.recvs.retain(|&x| x != task);
        }
        self.enqueue_ctx(rdma, Event::TaskDone(task));
    }

    /// Completes every outstanding task of a connection with the flush status.
    fn flush_conn(&mut self, conn: H) {
        let tasks = match self.conns.get(&conn) {
            Some(c) => c.outstanding.clone(),
            None => return,
        };
        for t in tasks {
            self.complete(t, ERR_FLUSH);
        }
    }

    /// Moves an established connection to error and flushes its tasks.
    fn conn_error(&mut self, conn: H) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if c.state == ConnState::Established {
                c.state = ConnState::Error;
            }
        }
        self.flush_conn(conn);
    }

    fn conn_state(&self, conn: Option<H>) -> Option<ConnState> {
        conn.and_then(|c| self.conns.get(&c)).map(|c| c.state)
    }

    /// Disconnects a connection (application call, or context stop).
    fn disconnect(&mut self, conn: H) -> doca_error_t {
        let Some(c) = self.conns.get(&conn) else {
            return DOCA_ERROR_INVALID_VALUE;
        };
        let (state, peer, oob, addr) = (c.state, c.peer, c.oob, c.addr);
        match state {
            ConnState::Established | ConnState::Error | ConnState::PeerGone => {
                self.flush_conn(conn);
                self.set_conn_state(conn, ConnState::Disconnected);
                let peer_state = self.conn_state(peer);
                if let (Some(p), Some(ConnState::Established | ConnState::Error)) =
                    (peer, peer_state)
                {
                    self.flush_conn(p);
                    if oob {
                        self.set_conn_state(p, ConnState::Error);
                    } else {
                        self.set_conn_state(p, ConnState::PeerGone);
                        self.enqueue_conn(p, Event::Disconnect(p));
                    }
                }
            }
            ConnState::Requested => {
                self.set_conn_state(conn, ConnState::Disconnected);
                if let Some(p) = peer {
                    self.fail_client(p);
                }
            }
            ConnState::Connecting => {
                self.set_conn_state(conn, ConnState::Disconnected);
                self.release_addr(addr);
                if let Some(p) = peer {
                    self.set_conn_state(p, ConnState::Disconnected);
                }
            }
            ConnState::Exported => self.set_conn_state(conn, ConnState::Disconnected),
            ConnState::Disconnected | ConnState::Failed => return DOCA_ERROR_BAD_STATE,
        }
        DOCA_SUCCESS
    }

    fn set_conn_state(&mut self, conn: H, state: ConnState) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = state;
        }
    }

    fn release_addr(&mut self, addr: Option<H>) {
        if let Some(a) = addr.and_then(|a| self.addrs.get_mut(&a)) {
            a.in_use = a.in_use.saturating_sub(1);
        }
    }

    /// A client's connection attempt failed: failure callback on the client.
    fn fail_client(&mut self, client: H) {
        let Some(c) = self.conns.get_mut(&client) else {
            return;
        };
        if c.state != ConnState::Connecting {
            return;
        }
        c.state = ConnState::Failed;
        let addr = c.addr;
        self.release_addr(addr);
        self.enqueue_conn(client, Event::Failure(client));
    }

    /// Whether a progress engine has work for `doca_pe_progress`.
    fn pe_has_work(&self, pe: H, now: Instant) -> bool {
        let Some(p) = self.pes.get(&pe) else {
            return false;
        };
        if !p.queue.is_empty() {
            return true;
        }
        p.ctxs.iter().filter_map(|c| self.rdmas.get(c)).any(|r| {
            r.state == DOCA_CTX_STATE_STARTING
                || (r.state == DOCA_CTX_STATE_STOPPING && r.inflight == 0 && r.allocated() == 0)
        }) || self.earliest_deadline(pe).is_some_and(|d| d <= now)
    }

    fn earliest_deadline(&self, pe: H) -> Option<Instant> {
        let p = self.pes.get(&pe)?;
        p.ctxs
            .iter()
            .filter_map(|r| self.rdmas.get(r))
            .flat_map(|r| r.conns.iter())
            .filter_map(|c| self.conns.get(c)?.pending.front())
            .filter_map(|t| self.tasks.get(t)?.deadline)
            .min()
    }
}

#[cfg(test)]
mod signatures {
    use super::{device::*, errors::*, memory::*, pe::*, rdma::*, tasks::*};

    /// Each software function must have exactly the type of its generated declaration: the
    /// `if` only compiles when both function items coerce to one function pointer type.
    macro_rules! same_signature {
        ($($f:ident),* $(,)?) => {
            {$( let _ = if true { crate::ffi::$f } else { $f }; )*}
        };
    }

    #[test]
    fn software_functions_match_the_header() {
        include!("signature_list.rs");
    }
}
