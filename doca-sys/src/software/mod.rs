//! The in-process software provider: every function of `include/doca_rpc_sw.h`, implemented
//! in Rust as `#[no_mangle] extern "C"` symbols, so the crate's `extern "C"` declarations
//! resolve to it at link time. Built only with `cfg(doca_sys_software)`.
//!
//! It is a stand-in for tests that follows DOCA's documentation and NVIDIA's samples, not our
//! transport: data really moves between registered memories of the same process, and where
//! DOCA is silent the provider takes the stricter choice. `CONTRACT.md` (next to the crate's
//! README) lists, per function, the documented conditions, what the provider does, and the
//! test that proves it. The main rules:
//!
//! # Contract violations
//! Calls whose result DOCA documents as undefined, and documented misuses the provider can
//! detect but not report through a return value, are recorded: [`violations`] /
//! [`take_violations`] (also printed to stderr). Examples: a receive result getter outside its
//! validity (answers the poison value `0xDEADBEEF`), `doca_task_free` or a `set_*` accessor
//! on a submitted task, `doca_pe_progress` from a callback, an invalid task given to
//! `doca_task_submit` (which DOCA does not validate; the provider refuses it with
//! `INVALID_VALUE`), a released buffer. A correct caller leaves the list empty.
//!
//! # Devices
//! `mlx5_0` (`0000:03:00.0`) and `mlx5_1` (`0000:03:00.1`) support every RDMA task type
//! (maximum message 1 GiB, send and receive queues 32768). `mlx5_2` (`0000:03:00.2`) has no
//! RDMA: its `doca_rdma_cap_task_*_is_supported` answer `NOT_SUPPORTED`, its numeric
//! capability queries `DRIVER`, an RDMA context on it does not start (`NOT_SUPPORTED`).
//! `doca_dev_close` is `IN_USE` while a context or an mmap uses the device.
//!
//! # Contexts
//! - `doca_ctx_start` needs a progress engine (`NOT_CONNECTED`) and an idle context
//!   (`BAD_STATE`); it returns `DOCA_ERROR_IN_PROGRESS`: the context is `STARTING` and becomes
//!   `RUNNING` in a later `doca_pe_progress`. State callbacks run from progress, each while the
//!   context is in the state it announces: a state change waits until the callback of the
//!   previous one was delivered (so the `STARTING` callback cannot allocate tasks).
//! - Configuration calls (`doca_rdma_set_*`, `*_set_conf`, `doca_ctx_set_state_changed_cb`,
//!   `doca_rdma_set_connection_state_callbacks`) need an idle context: `BAD_STATE`
//!   otherwise. `doca_rdma_set_recv_queue_size` is always `NOT_SUPPORTED` (CPU data path);
//!   `doca_rdma_set_send_queue_size` above the device maximum is `NOT_SUPPORTED`. Permissions
//!   of a context are RDMA flags only (`INVALID_VALUE` otherwise).
//! - Task allocation, submission, listening, connecting, accepting, rejecting and
//!   disconnecting need `RUNNING` (`BAD_STATE`); `doca_rdma_export` / `doca_rdma_connect` need a
//!   started context (`STARTING`, as their documentation says, or `RUNNING`, as the samples do).
//! - `doca_ctx_stop` disconnects every connection (peers get their disconnection callback),
//!   stops listening, flushes posted receives and outstanding tasks (error completions), and
//!   returns `IN_PROGRESS` (state `STOPPING`) while tasks are in flight **or still allocated**.
//!   The context reaches `IDLE` in a later `doca_pe_progress` once every completion was
//!   delivered and every task freed. With nothing allocated it stops at once (`SUCCESS`).
//! - `doca_rdma_set_max_num_connections` defaults to 1, as a reminder to set it.
//!
//! # Connections
//! - RDMA CM is emulated by port number: `doca_rdma_start_listen_to_port(port)` registers the
//!   context process-wide (`CONNECTION_ABORTED` if the port is taken); `doca_rdma_connect_to_addr`
//!   with any address and that port reaches it. Nobody listening, or the server full: the
//!   client gets its failure callback. Otherwise the server's request callback runs from the
//!   server's progress; `accept` queues the established callback on both sides; `reject`
//!   queues the client's failure callback. Without a request callback requests are rejected.
//! - `doca_rdma_connection_disconnect` flushes the connection's outstanding tasks, and the peer
//!   gets its disconnection callback (CM connections only; the side that disconnects gets no
//!   callback). The peer's outstanding tasks are flushed too, and it must call
//!   `doca_rdma_connection_disconnect` to finish. Disconnecting twice is `INVALID_VALUE`.
//! - Out of band: `doca_rdma_export` creates a connection and a blob (`FULL` when all slots
//!   are used); `doca_rdma_connect(blob)` on each side pairs them (`CONNECTION_ABORTED` for a
//!   corrupted blob). No connection callbacks are called in this mode. A side may submit once
//!   it called `doca_rdma_connect`, but a task that reaches a peer which has not called it yet
//!   fails (its queue pair is not ready): nothing is queued until the peer connects.
//! - A connection takes tasks (allocation and submission; `NOT_CONNECTED` otherwise) once it
//!   is established as its side knows it: its established callback was delivered (RDMA CM; a
//!   server's connection is not established at accept) or `doca_rdma_connect` was called on it
//!   (out of band); and until it is disconnected.
//!
//! # Tasks
//! - `*_set_conf` sets the pool size (and both callbacks, non-NULL): allocating more than
//!   `num_tasks` tasks of that type gives `NO_MEMORY`. Completions are delivered only from
//!   `doca_pe_progress` of the submitting context's progress engine; a task is reusable after
//!   its callback, with the `set_*` accessors (also `*_set_rdma_connection`).
//! - A receive can be submitted once a connection of its context was established in the sense
//!   above: `NOT_CONNECTED` before.
//! - A send (also send-with-immediate and write-with-immediate) is matched with the oldest
//!   receive posted on the peer context (receives match any connection). If none is posted,
//!   it is receiver-not-ready: it tries again once per timer period of
//!   `DOCA_SYS_SW_RNR_TIMEOUT_MS` milliseconds (default 20, checked in the sender's progress),
//!   and fails when `rnr_retry_count + 1` periods ended without a receive
//!   (`doca_rdma_set_rnr_retry_count` of the sending context, 0 until set: one period; 7:
//!   it waits until a receive comes or the connection ends, as verbs' `rnr_retry = 7`).
//!   Values above 7 are `INVALID_VALUE`.
//! - `doca_task_submit_ex` without `DOCA_TASK_SUBMIT_FLAG_FLUSH` accepts a task (same checks
//!   and codes as `doca_task_submit`; DOCA owns it) but does not start it: no data moves, no
//!   receive is posted, nothing completes, until a later submit with `FLUSH` on the same
//!   context (earlier tasks start first, in submission order) or `doca_ctx_flush_tasks`.
//!   `doca_task_submit` is a submit with `FLUSH`. A disconnection, an error of the task's
//!   connection or `doca_ctx_stop` completes unflushed tasks like any other (once).
//!   `OPTIMIZE_REPORTS` is accepted and changes nothing; unknown flag bits are
//!   `INVALID_VALUE` (and a violation). `doca_ctx_flush_tasks` on an idle or unknown context
//!   is a violation.
//! - "No data" is a NULL buffer (DOCA documents it for send, send-with-immediate, receive,
//!   read and write); a non-NULL source with an empty data section is refused at submit
//!   (`INVALID_VALUE`). Atomics act on the first 8 bytes of the destination's data (fewer:
//!   `INVALID_VALUE` at submit).
//! - A receive appends after its buffer's data section and grows the data length. A message
//!   larger than the free space fails the receive and the send and puts both connections in
//!   error. Write-with-immediate consumes a receive with result length 0 and leaves its buffer
//!   untouched.
//! - Write appends the source's data section after the remote buffer's data section (and grows
//!   the local descriptor's data length); read copies the remote buffer's data section after
//!   the local buffer's data section; atomics act on the 8 aligned bytes at the remote buffer's
//!   data address and append the previous value (native endian) to the result buffer.
//!   They need no peer task. The remote buffer must come from an mmap created from an export
//!   with the context's device, and the export must be for the device of the peer context the
//!   connection reaches (a key is valid only on its device); local buffers from an mmap with
//!   the context's device (local write access where the task writes them). Remote access is checked against the exporting
//!   mmap (it must still exist, cover the range and grant `RDMA_WRITE` / `RDMA_READ` /
//!   `RDMA_ATOMIC`) and the peer context's `doca_rdma_set_permissions`.
//! - A failed task completes with `DOCA_ERROR_IO_FAILED` and puts its connection in error:
//!   every other outstanding task of that connection completes (once) with
//!   `DOCA_ERROR_CONNECTION_ABORTED`, tasks submitted later on it too, and it must be
//!   disconnected. Other connections of the context keep working.
//! - Submitting on a connection that is not established gives `NOT_CONNECTED`.
//!
//! # Memory
//! mmaps check ranges and states as `doca_mmap.h` documents: `NOT_PERMITTED` to destroy or
//! stop one with buffers out, to stop an exported or imported one, to set its range twice;
//! `doca_mmap_set_permissions` refuses undefined flags and remote write or atomic access
//! without local write access. `doca_mmap_export_rdma` needs a started mmap with an RDMA
//! permission (`NOT_PERMITTED`) and the device added (`NOT_FOUND`); its descriptor is for that
//! device and names it (one per device). A buffer inventory gives
//! `NO_MEMORY` when all its buffers are out; it can be stopped with buffers out (no more can
//! be taken). `doca_buf_inventory_expand` grows a started inventory (`BAD_STATE` otherwise;
//! 0 elements or a total above `u32::MAX` is `INVALID_VALUE`), buffers out or not. `doca_buf_dec_refcount` reports the count before the call; released descriptors
//! are reused.
//!
//! # Progress engine
//! Any number of contexts may be connected to one engine; its `doca_pe_progress` serves all of
//! them, one callback per call (in queue order): progress until it returns 0.
//! `doca_pe_get_notification_handle` returns an eventfd. After `doca_pe_request_notification`
//! it becomes readable as soon as a **task completion** is pending (at once if one already
//! is, including a receiver-not-ready timer period that ends later: each retry of a waiting
//! send wakes it once); `doca_pe_clear_notification`
//! drains it. Connection events and state changes never signal it: `doca_pe_progress`
//! delivers them when called.
//!
//! # Threads
//! All state is process-global behind one mutex; contexts may be progressed from different
//! threads. Callbacks run without the lock held, so they may call any function except
//! `doca_pe_progress`.

mod cm;
mod connection;
mod counters;
mod device;
mod errors;
mod memory;
mod nic;
mod oob;
mod pe;
mod rdma;
mod tasks;

use crate::ffi::*;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write as _;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub use counters::counters;
pub use violations::{take_violations, violations};

/// Status of the task that failed (remote access, receiver not ready, length).
const ERR_TASK: doca_error_t = DOCA_ERROR_IO_FAILED;
/// Status of the tasks flushed from a connection in error, disconnected, or stopping.
const ERR_FLUSH: doca_error_t = DOCA_ERROR_CONNECTION_ABORTED;

/// Calls whose result DOCA documents as undefined, and documented misuses the provider can
/// detect but not report through a return value.
mod violations {
    use super::*;

    static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn list() -> MutexGuard<'static, Vec<String>> {
        VIOLATIONS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a contract violation (and prints it to stderr, so a test log shows it).
    pub(super) fn record(message: String) {
        let _ = writeln!(
            std::io::stderr(),
            "doca-sys software provider: contract violation: {message}"
        );
        list().push(message);
    }

    /// Every contract violation recorded so far in this process, oldest first.
    ///
    /// A violation is a call whose result DOCA documents as undefined (for example
    /// `doca_rdma_task_receive_get_result_immediate_data` on a receive that carried no
    /// immediate), or a documented misuse the provider detects but cannot report through a
    /// return value (for example `doca_task_free` on a submitted task, or `doca_pe_progress`
    /// called from a callback). Each entry names the function and the object handle
    /// (`0x...`). A correct caller leaves this list empty; see `CONTRACT.md`.
    ///
    /// The list is process-wide: tests running in parallel share it.
    pub fn violations() -> Vec<String> {
        list().clone()
    }

    /// Like [`violations`], and empties the list.
    pub fn take_violations() -> Vec<String> {
        std::mem::take(&mut *list())
    }
}

use violations::record as violation;

thread_local! {
    /// Set while this thread runs callbacks inside `doca_pe_progress`.
    static IN_PROGRESS: Cell<bool> = const { Cell::new(false) };
    /// The receive task whose successful completion callback this thread is running (0: none).
    static SUCCESS_CB_TASK: Cell<H> = const { Cell::new(0) };
}

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
    /// The `struct doca_dev *` it was created on.
    dev: H,
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
    /// A connection became usable since the last start (receives may be posted).
    connected_once: bool,
    /// State-change callbacks queued and not delivered yet: the next change waits for them,
    /// so a callback always runs while the context is in the state it announces.
    state_events: u32,
    /// Some send of a connection may wait for a receive (set when one is left waiting,
    /// cleared by a progress that finds none): progress looks for expired ones only then.
    sends_wait: bool,
    /// `doca_rdma_set_rnr_retry_count`: a send without a receive on the peer fails after
    /// `rnr_retry_count + 1` timer periods; 7 retries forever. 0 until set.
    rnr_retry_count: u8,
    /// Tasks accepted by `doca_task_submit_ex` without `DOCA_TASK_SUBMIT_FLAG_FLUSH`, oldest
    /// first: owned by DOCA, not started (no data moves, no completion) until a flush.
    unflushed: Vec<H>,
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
    /// Established as this side knows it: its established callback was delivered (RDMA CM)
    /// or `doca_rdma_connect` was called on it (out of band). Only then may tasks use it.
    usable: bool,
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
    /// A completion was delivered since the last submission (result getters are defined).
    completed: bool,
    /// While a send-like task waits for a receive on the peer: when its current receiver-not-
    /// ready timer period ends.
    deadline: Option<Instant>,
    /// Receiver-not-ready retries it has left after the current period (`None`: forever).
    rnr_retries_left: Option<u8>,
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
    /// For an mmap created from an export: the device (its index in the device list) the
    /// export was made for. Its key is valid only there, as a verbs key in its own protection
    /// domain.
    exported_for: Option<usize>,
    /// Global id (set at start).
    id: u64,
    /// Export descriptors, one per device it was exported for (non-empty once exported).
    exports: Vec<Export>,
    /// Buffers (with a non-zero reference count) pointing into it.
    bufs: usize,
}

impl Mmap {
    fn exported(&self) -> bool {
        !self.exports.is_empty()
    }

    /// Counts what destroying this mmap undoes: a registration (started local mmap) or an
    /// import.
    fn count_teardown(&self) {
        match self.remote {
            Some(_) => self
                .devs
                .iter()
                .for_each(|&d| counters::import_destroyed(d)),
            None if self.started => self
                .devs
                .iter()
                .for_each(|&d| counters::deregistered(d, self.len)),
            None => {}
        }
    }

    /// Whether the device `dev` (an open device handle) was added, by any of its handles.
    fn has_device(&self, dev: H) -> bool {
        self.devs.iter().any(|&d| {
            // SAFETY: added devices stay open (`doca_dev_close` refuses while an mmap holds
            // one); callers pass devices the application opened (a context's, or an argument).
            unsafe { device::same_device(d, dev) }
        })
    }
}

/// One `doca_mmap_export_rdma` descriptor: for which device, and its bytes (which stay put
/// while the mmap lives).
struct Export {
    /// The device's index in the device list.
    dev: usize,
    blob: Vec<u8>,
}

struct Inventory {
    capacity: usize,
    used: usize,
    started: bool,
    /// Released descriptors (reference count 0), reused by the next `buf_get_by_args`.
    free: Vec<H>,
}

struct Buf {
    inv: H,
    mmap: H,
    addr: usize,
    len: usize,
    data: usize,
    data_len: usize,
    /// 0: released to its inventory (the descriptor stays allocated and is reused).
    refcount: u16,
}

impl Buf {
    /// Bytes free after the data section.
    fn tail_room(&self) -> usize {
        (self.addr + self.len) - (self.data + self.data_len)
    }
}

/// Hashes the provider's own keys (handles, ids, ports): values it chose, never a peer, so a
/// multiply-shift is enough. SipHash cost more than the rest of an idle `doca_pe_progress`,
/// which a busy-polling application calls millions of times a second.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the high bits (which the table's control bytes use) depend on
        // every bit of the key.
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type Map<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

#[derive(Default)]
struct World {
    pes: Map<H, Pe>,
    rdmas: Map<H, Rdma>,
    conns: Map<H, Conn>,
    addrs: Map<H, Addr>,
    mmaps: Map<H, Mmap>,
    mmap_ids: Map<u64, H>,
    next_mmap_id: u64,
    invs: Map<H, Inventory>,
    bufs: Map<H, Buf>,
    tasks: Map<H, Task>,
    listeners: Map<u16, H>,
    /// Contexts whose `sends_wait` is set: while none is, a posted receive has no waiting
    /// send to look for.
    contexts_with_waiting_sends: usize,
    /// Contexts `STARTING` or `STOPPING`: with none, and no send waiting, a progress has no
    /// time-driven state to advance.
    contexts_changing_state: usize,
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
    /// Queues a callback on a progress engine. Only task completions wake an armed engine:
    /// nothing documents that connection events or context state changes signal the
    /// notification handle.
    fn enqueue(&mut self, pe: H, event: Event) {
        if let Some(pe) = self.pes.get_mut(&pe) {
            let completion = matches!(event, Event::TaskDone(_));
            pe.queue.push_back(event);
            if completion && pe.armed {
                pe.armed = false;
                signal_fd(pe.efd);
            }
        }
    }

    /// A live buffer (reference count above 0).
    fn live_buf(&self, buf: H) -> Option<&Buf> {
        self.bufs.get(&buf).filter(|b| b.refcount > 0)
    }

    /// Queues a context's state-change callback (`prev` to `next`).
    fn enqueue_state(&mut self, ctx: H, prev: u32, next: u32) {
        if let Some(r) = self.rdmas.get_mut(&ctx) {
            r.state_events += 1;
        }
        self.enqueue_ctx(ctx, Event::State { ctx, prev, next });
    }

    /// Whether tasks may use `conn` now: established as its side knows it (see `Conn::usable`)
    /// and not disconnected. A connection in error, or whose peer left, still takes tasks,
    /// which complete with the flush status (verbs: work posted to a queue pair in error).
    fn conn_ready(&self, conn: H) -> bool {
        self.conns.get(&conn).is_some_and(|c| {
            c.usable
                && matches!(
                    c.state,
                    ConnState::Established | ConnState::Error | ConnState::PeerGone
                )
        })
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

    /// Moves a context to `next`, keeping the world's count of contexts changing state.
    fn set_state(&mut self, rdma: H, next: doca_ctx_states) {
        let changing = |s| s == DOCA_CTX_STATE_STARTING || s == DOCA_CTX_STATE_STOPPING;
        if let Some(r) = self.rdmas.get_mut(&rdma) {
            let was = changing(r.state);
            r.state = next;
            match (was, changing(next)) {
                (false, true) => self.contexts_changing_state += 1,
                (true, false) => self.contexts_changing_state -= 1,
                _ => {}
            }
        }
    }

    /// Sets or clears a context's `sends_wait`, keeping the world's count.
    fn set_sends_wait(&mut self, rdma: H, wait: bool) {
        if let Some(r) = self.rdmas.get_mut(&rdma) {
            if r.sends_wait != wait {
                r.sends_wait = wait;
                if wait {
                    self.contexts_with_waiting_sends += 1;
                } else {
                    self.contexts_with_waiting_sends -= 1;
                }
            }
        }
    }

    /// Completes a submitted task: its callback is delivered by the next progress.
    fn complete(&mut self, task: H, status: doca_error_t) {
        self.finish(task, status, true);
    }

    /// Completes a task the caller already took off its queue (a receive off its context's
    /// posted receives, a send off its connection's waiting sends): no queue to search.
    fn complete_dequeued(&mut self, task: H, status: doca_error_t) {
        self.finish(task, status, false);
    }

    fn finish(&mut self, task: H, status: doca_error_t, queued: bool) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        if t.phase != Phase::Submitted {
            return;
        }
        t.phase = Phase::Completing;
        t.status = status;
        t.deadline = None;
        let (rdma, conn, receive) = (t.rdma, t.conn, t.kind == Kind::Receive);
        if let Some(c) = conn.and_then(|c| self.conns.get_mut(&c)) {
            c.outstanding.retain(|&x| x != task);
            if queued {
                c.pending.retain(|&x| x != task);
            }
        }
        if let (true, Some(r)) = (queued, self.rdmas.get_mut(&rdma)) {
            if receive {
                r.recvs.retain(|&x| x != task);
            }
            // A task completed before a flush started it (an error, a disconnection, a stop).
            r.unflushed.retain(|&x| x != task);
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
                // The server's pending request stays: accepting it fails (the client left).
                self.set_conn_state(conn, ConnState::Disconnected);
                self.release_addr(addr);
            }
            ConnState::Exported => self.set_conn_state(conn, ConnState::Disconnected),
            // Not a live connection any more: an invalid parameter (the documented code).
            ConnState::Disconnected | ConnState::Failed => return DOCA_ERROR_INVALID_VALUE,
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

    /// Whether a task completion is pending on a progress engine (what arms the handle).
    fn pe_has_completion(&self, pe: H, now: Instant) -> bool {
        let Some(p) = self.pes.get(&pe) else {
            return false;
        };
        p.queue.iter().any(|e| matches!(e, Event::TaskDone(_)))
            || self.earliest_deadline(pe).is_some_and(|d| d <= now)
    }

    fn earliest_deadline(&self, pe: H) -> Option<Instant> {
        let p = self.pes.get(&pe)?;
        // Only contexts that may have a waiting send (`sends_wait`) have deadlines: the others'
        // connections are not looked at, so arming an engine costs nothing per connection.
        p.ctxs
            .iter()
            .filter_map(|r| self.rdmas.get(r))
            .filter(|r| r.sends_wait)
            .flat_map(|r| r.conns.iter())
            .filter_map(|c| self.conns.get(c)?.pending.front())
            .filter_map(|t| self.tasks.get(t)?.deadline)
            .min()
    }
}

#[cfg(test)]
mod signatures {
    use super::{
        cm::*, connection::*, device::*, errors::*, memory::*, oob::*, pe::*, rdma::*, tasks::*,
    };

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
