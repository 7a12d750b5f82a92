//! The progress owner of one DOCA RDMA context.
//!
//! Every DOCA object of a context (the context, its progress engine, buffer inventory, tasks,
//! connections, imported mmaps) is touched only by its owner: a tokio task waiting on the
//! progress engine's notification fd (event mode) or a dedicated busy-polling thread. Other
//! tasks send it [`Cmd`]s through a channel and get results through oneshots. C callbacks
//! only record [`Event`]s in the context's [`Sink`]; the owner handles them after
//! `doca_pe_progress` returns, so no DOCA call ever runs re-entrantly.

use crate::transport::common::RecvQueue;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use doca_sys as sys;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, oneshot, watch};

use super::sys::{check, doca_error, Buf, Device, Inventory, Mmap, Pe, Rdma, RdmaAddr};
use super::{DocaConfig, ProgressMode};
use crate::error::{AccessViolation, Error, Result};
use crate::memory::{Access, RegisteredBuf, StagingPools};
use crate::transport::{Descriptor, RecvCompletion, RecvOpcode};

pub(super) type ConnId = u64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registered local memory for one operation, with the mmap that covers it.
pub(super) struct Local {
    pub(super) buf: RegisteredBuf,
    pub(super) mmap: Arc<Mmap>,
}

pub(super) enum AtomicOp {
    CompareAndSwap { expected: u64, new: u64 },
    FetchAndAdd { add: u64 },
}

/// An operation posted on a connection.
pub(super) enum Op {
    Send {
        src: Local,
        imm: Option<u32>,
        done: oneshot::Sender<Result<()>>,
    },
    Write {
        src: Local,
        dst: Descriptor,
        imm: Option<u32>,
        done: oneshot::Sender<Result<()>>,
    },
    Read {
        src: Descriptor,
        dst: Local,
        done: oneshot::Sender<Result<RegisteredBuf>>,
    },
    Atomic {
        dst: Descriptor,
        op: AtomicOp,
        result: Local,
        done: oneshot::Sender<Result<u64>>,
    },
}

impl Op {
    fn fail(self, err: Error) {
        let _ = match self {
            Op::Send { done, .. } | Op::Write { done, .. } => done.send(Err(err)).map_err(drop),
            Op::Read { done, .. } => done.send(Err(err)).map_err(drop),
            Op::Atomic { done, .. } => done.send(Err(err)).map_err(drop),
        };
    }
}

/// What other tasks ask the owner to do.
pub(super) enum Cmd {
    Listen {
        port: u16,
        accepted: mpsc::UnboundedSender<Arc<ConnShared>>,
        reply: oneshot::Sender<Result<()>>,
    },
    StopListen {
        port: u16,
    },
    Connect {
        ip: IpAddr,
        port: u16,
        peer: String,
        reply: oneshot::Sender<Result<Arc<ConnShared>>>,
    },
    Export {
        reply: oneshot::Sender<Result<(Vec<u8>, ConnId)>>,
    },
    ConnectOob {
        id: ConnId,
        blob: Vec<u8>,
        peer: String,
        reply: oneshot::Sender<Result<Arc<ConnShared>>>,
    },
    Op {
        id: ConnId,
        op: Op,
    },
    Close {
        id: ConnId,
        err: Error,
    },
}

/// What every handle of one context shares: the way to its owner.
pub(super) struct EngineShared {
    cmds: mpsc::UnboundedSender<Cmd>,
    pub(super) dev: Arc<Device>,
    pub(super) config: Arc<DocaConfig>,
    pub(super) staging: Arc<StagingPools>,
    runtime: tokio::runtime::Handle,
}

impl EngineShared {
    /// Sends a command; if the owner is gone the command (and its oneshot) is dropped, which
    /// its waiter sees as an error.
    pub(super) fn send(&self, cmd: Cmd) {
        let _ = self.cmds.send(cmd);
    }

    /// Sends a command and waits for the owner's reply.
    pub(super) async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx));
        rx.await.unwrap_or_else(|_| {
            Err(Error::ConnectionClosed {
                peer: "DOCA context".into(),
                reason: "the context's progress owner stopped".into(),
            })
        })
    }
}

impl std::fmt::Debug for EngineShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineShared")
            .field("device", &self.dev.info().name)
            .finish()
    }
}

/// A message that arrived for a connection with no posted receive yet.
struct Arrival {
    seq: u64,
    data: Vec<u8>,
    opcode: RecvOpcode,
    imm: Option<u32>,
}

struct ConnState {
    error: Option<Error>,
    posted: VecDeque<RegisteredBuf>,
    arrived: VecDeque<Arrival>,
    next_seq: u64,
}

/// The state of one connection shared by its application handle and the owner.
pub(super) struct ConnShared {
    pub(super) id: ConnId,
    pub(super) peer: String,
    pub(super) engine: Arc<EngineShared>,
    state: Mutex<ConnState>,
    pub(super) completions: RecvQueue,
    pub(super) closed: watch::Sender<bool>,
}

impl ConnShared {
    fn new(id: ConnId, peer: String, engine: Arc<EngineShared>) -> Arc<ConnShared> {
        Arc::new(ConnShared {
            id,
            peer,
            engine,
            state: Mutex::new(ConnState {
                error: None,
                posted: VecDeque::new(),
                arrived: VecDeque::new(),
                next_seq: 0,
            }),
            completions: RecvQueue::new(),
            closed: watch::channel(false).0,
        })
    }

    /// The error the connection ended with (or a generic one while it is alive).
    pub(super) fn error(&self) -> Error {
        match &lock(&self.state).error {
            Some(e) => e.duplicate(),
            None => Error::ConnectionClosed {
                peer: self.peer.clone(),
                reason: "the operation was dropped".into(),
            },
        }
    }

    pub(super) fn current_error(&self) -> Option<Error> {
        lock(&self.state).error.as_ref().map(Error::duplicate)
    }

    /// Records the first error: posted receives are dropped and `closed` resolves. Returns
    /// whether this was the first error.
    pub(super) fn fail(&self, err: Error) -> bool {
        let (posted, arrived) = {
            let mut st = lock(&self.state);
            if st.error.is_some() {
                return false;
            }
            tracing::debug!(peer = %self.peer, error = %err, "DOCA connection in error");
            st.error = Some(err);
            (
                std::mem::take(&mut st.posted),
                std::mem::take(&mut st.arrived),
            )
        };
        drop((posted, arrived));
        self.closed.send_replace(true);
        true
    }

    /// Fails the connection and tells the owner to disconnect it.
    pub(super) fn fail_and_close(&self, err: Error) {
        if self.fail(err.duplicate()) {
            self.engine.send(Cmd::Close { id: self.id, err });
        }
    }

    /// A posted receive buffer from the application.
    pub(super) fn post_recv(self: &Arc<Self>, buf: RegisteredBuf) -> Result<()> {
        let mut st = lock(&self.state);
        if let Some(e) = &st.error {
            return Err(e.duplicate());
        }
        match st.arrived.pop_front() {
            Some(a) => {
                let result = self.fill(buf, &a.data, a.opcode, a.imm);
                drop(st);
                if let Err(e) = result {
                    self.fail_and_close(e);
                }
            }
            None => st.posted.push_back(buf),
        }
        Ok(())
    }

    fn fill(
        &self,
        mut buf: RegisteredBuf,
        data: &[u8],
        opcode: RecvOpcode,
        imm: Option<u32>,
    ) -> Result<()> {
        if data.len() > buf.capacity() {
            return Err(Error::ReceiveTooSmall {
                len: data.len() as u64,
                capacity: buf.capacity() as u64,
            });
        }
        buf.fill_from(data)?;
        self.completions.push(RecvCompletion {
            buf,
            opcode,
            imm,
            write_len: 0,
        });
        Ok(())
    }

    /// A message the context received for this connection (called by the owner with the
    /// bytes still in the staging receive). Copies it into the next posted receive, or keeps
    /// it for at most the RNR timeout until one is posted.
    fn on_message(self: &Arc<Self>, data: &[u8], opcode: RecvOpcode, imm: Option<u32>) {
        let mut st = lock(&self.state);
        if st.error.is_some() {
            return;
        }
        if let Some(buf) = st.posted.pop_front() {
            let result = self.fill(buf, data, opcode, imm);
            drop(st);
            if let Err(e) = result {
                self.fail_and_close(e);
            }
            return;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.arrived.push_back(Arrival {
            seq,
            data: data.to_vec(),
            opcode,
            imm,
        });
        drop(st);
        // Receiver not ready: the message waits for a posted receive, within the RNR budget.
        let weak = Arc::downgrade(self);
        let rnr = self.engine.config.rnr_timeout;
        self.engine.runtime.spawn(async move {
            tokio::time::sleep(rnr).await;
            let Some(conn) = weak.upgrade() else { return };
            let expired = lock(&conn.state)
                .arrived
                .front()
                .is_some_and(|a| a.seq <= seq);
            if expired {
                conn.fail_and_close(Error::ReceiverNotReady {
                    retry_ms: rnr.as_millis() as u64,
                });
            }
        });
    }
}

// ---- callbacks ----

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

/// The kinds kept in per-connection pools, by pool index.
const POOLED: [Kind; 5] = [
    Kind::Send,
    Kind::SendImm,
    Kind::Read,
    Kind::Write,
    Kind::WriteImm,
];

impl Kind {
    /// Index of the per-connection pool of reusable tasks (atomics have no setters for their
    /// operands, so they are allocated per operation).
    fn pool(self) -> Option<usize> {
        match self {
            Kind::Send => Some(0),
            Kind::SendImm => Some(1),
            Kind::Read => Some(2),
            Kind::Write => Some(3),
            Kind::WriteImm => Some(4),
            _ => None,
        }
    }
}

/// The generic task of a typed task pointer.
fn as_task(kind: Kind, task: usize) -> *mut sys::doca_task {
    // SAFETY: `task` is a live task of type `kind`; the `as_task` functions only convert.
    unsafe {
        match kind {
            Kind::Receive => sys::doca_rdma_task_receive_as_task(task as *mut _),
            Kind::Send => sys::doca_rdma_task_send_as_task(task as *mut _),
            Kind::SendImm => sys::doca_rdma_task_send_imm_as_task(task as *mut _),
            Kind::Read => sys::doca_rdma_task_read_as_task(task as *mut _),
            Kind::Write => sys::doca_rdma_task_write_as_task(task as *mut _),
            Kind::WriteImm => sys::doca_rdma_task_write_imm_as_task(task as *mut _),
            Kind::CmpSwp => sys::doca_rdma_task_atomic_cmp_swp_as_task(task as *mut _),
            Kind::FetchAdd => sys::doca_rdma_task_atomic_fetch_add_as_task(task as *mut _),
        }
    }
}

struct RecvResult {
    len: u32,
    opcode: sys::doca_rdma_opcode,
    imm: u32,
    conn: usize,
}

enum Event {
    Task {
        kind: Kind,
        task: usize,
        user: u64,
        status: sys::doca_error_t,
        recv: Option<RecvResult>,
    },
    Requested {
        conn: usize,
        id: ConnId,
        accepted: bool,
    },
    Established {
        conn: usize,
        id: ConnId,
    },
    Failed {
        id: ConnId,
    },
    Disconnected {
        id: ConnId,
    },
}

/// Where callbacks record what happened; the context's user data points here.
struct Sink {
    events: RefCell<Vec<Event>>,
    accepting: Cell<bool>,
    next_id: Cell<ConnId>,
}

impl Sink {
    fn push(&self, e: Event) {
        match self.events.try_borrow_mut() {
            Ok(mut events) => events.push(e),
            // Cannot happen (the owner never holds the borrow while progressing); never
            // unwind into C.
            Err(_) => tracing::error!("DOCA callback re-entered: event lost"),
        }
    }

    fn new_id(&self) -> ConnId {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }
}

/// # Safety
/// `ctx` is the context user data set by [`Owner::start`]: a pointer to the owner's `Sink`,
/// which outlives the context; called from `doca_pe_progress` on the owner's thread.
unsafe fn sink<'a>(ctx: sys::doca_data) -> &'a Sink {
    // SAFETY: per the function's contract.
    unsafe { &*(ctx.ptr as *const Sink) }
}

/// # Safety
/// Called by DOCA from `doca_pe_progress` with a live task of type `kind`; see [`sink`].
unsafe fn on_task(kind: Kind, task: usize, user: sys::doca_data, ctx: sys::doca_data, ok: bool) {
    // SAFETY: per the function's contract.
    let sink = unsafe { sink(ctx) };
    // SAFETY: every task of this transport carries an integer in its user data.
    let user = unsafe { user.u64_ };
    let status = if ok {
        sys::DOCA_SUCCESS
    } else {
        // SAFETY: a live task, in its completion callback.
        unsafe { sys::doca_task_get_status(as_task(kind, task)) }
    };
    let recv = (kind == Kind::Receive && ok).then(|| {
        let t = task as *const sys::doca_rdma_task_receive;
        // SAFETY: a successful receive in its completion callback: the results are valid.
        unsafe {
            RecvResult {
                len: sys::doca_rdma_task_receive_get_result_len(t),
                opcode: sys::doca_rdma_task_receive_get_result_opcode(t),
                imm: sys::doca_rdma_task_receive_get_result_immediate_data(t),
                conn: sys::doca_rdma_task_receive_get_result_rdma_connection(t) as usize,
            }
        }
    });
    sink.push(Event::Task {
        kind,
        task,
        user,
        status,
        recv,
    });
}

macro_rules! task_callbacks {
    ($ok:ident, $err:ident, $ty:ty, $kind:expr) => {
        unsafe extern "C" fn $ok(task: *mut $ty, user: sys::doca_data, ctx: sys::doca_data) {
            // SAFETY: DOCA calls this from progress with a live task of this type.
            unsafe { on_task($kind, task as usize, user, ctx, true) }
        }
        unsafe extern "C" fn $err(task: *mut $ty, user: sys::doca_data, ctx: sys::doca_data) {
            // SAFETY: as above.
            unsafe { on_task($kind, task as usize, user, ctx, false) }
        }
    };
}

task_callbacks!(
    recv_ok,
    recv_err,
    sys::doca_rdma_task_receive,
    Kind::Receive
);
task_callbacks!(send_ok, send_err, sys::doca_rdma_task_send, Kind::Send);
task_callbacks!(
    send_imm_ok,
    send_imm_err,
    sys::doca_rdma_task_send_imm,
    Kind::SendImm
);
task_callbacks!(read_ok, read_err, sys::doca_rdma_task_read, Kind::Read);
task_callbacks!(write_ok, write_err, sys::doca_rdma_task_write, Kind::Write);
task_callbacks!(
    write_imm_ok,
    write_imm_err,
    sys::doca_rdma_task_write_imm,
    Kind::WriteImm
);
task_callbacks!(
    cas_ok,
    cas_err,
    sys::doca_rdma_task_atomic_cmp_swp,
    Kind::CmpSwp
);
task_callbacks!(
    faa_ok,
    faa_err,
    sys::doca_rdma_task_atomic_fetch_add,
    Kind::FetchAdd
);

unsafe extern "C" fn on_request(conn: *mut sys::doca_rdma_connection, ctx: sys::doca_data) {
    // SAFETY: DOCA calls this from progress; see `sink`.
    let sink = unsafe { sink(ctx) };
    if !sink.accepting.get() {
        // SAFETY: a connection request being delivered.
        let _ = unsafe { sys::doca_rdma_connection_reject(conn) };
        return;
    }
    let id = sink.new_id();
    // SAFETY: a connection request being delivered; accepting it here, as NVIDIA's samples
    // do, with no private data.
    let accepted = unsafe {
        sys::doca_rdma_connection_set_user_data(conn, sys::doca_data { u64_: id })
            == sys::DOCA_SUCCESS
            && sys::doca_rdma_connection_accept(conn, ptr::null_mut(), 0) == sys::DOCA_SUCCESS
    };
    sink.push(Event::Requested {
        conn: conn as usize,
        id,
        accepted,
    });
}

unsafe extern "C" fn on_established(
    conn: *mut sys::doca_rdma_connection,
    user: sys::doca_data,
    ctx: sys::doca_data,
) {
    // SAFETY: DOCA calls this from progress; see `sink`. Connection user data is the integer
    // id this transport set.
    let (sink, id) = unsafe { (sink(ctx), user.u64_) };
    sink.push(Event::Established {
        conn: conn as usize,
        id,
    });
}

macro_rules! conn_callback {
    ($name:ident, $event:ident) => {
        unsafe extern "C" fn $name(
            _conn: *mut sys::doca_rdma_connection,
            user: sys::doca_data,
            ctx: sys::doca_data,
        ) {
            // SAFETY: DOCA calls this from progress; see `sink`. Connection user data is the
            // integer id this transport set.
            let (sink, id) = unsafe { (sink(ctx), user.u64_) };
            sink.push(Event::$event { id });
        }
    };
}

conn_callback!(on_failure, Failed);
conn_callback!(on_disconnect, Disconnected);

// ---- the owner ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// CM connect or out-of-band export in progress.
    Connecting,
    Live,
    Dead,
}

struct OwnedConn {
    raw: usize,
    phase: Phase,
    disconnected: bool,
    peer: String,
    shared: Option<Arc<ConnShared>>,
    /// Idle tasks bound to this connection, per pooled kind.
    pools: [Vec<usize>; 5],
    inflight: usize,
    /// Peer mmaps imported from descriptor blobs, once per blob.
    remote: HashMap<Bytes, Arc<Mmap>>,
    connect_reply: Option<oneshot::Sender<Result<Arc<ConnShared>>>>,
    _addr: Option<RdmaAddr>,
}

enum Done {
    Unit(oneshot::Sender<Result<()>>),
    Read {
        dst: RegisteredBuf,
        len: usize,
        done: oneshot::Sender<Result<RegisteredBuf>>,
    },
    Atomic {
        result: RegisteredBuf,
        done: oneshot::Sender<Result<u64>>,
    },
}

struct Inflight {
    conn: ConnId,
    kind: Kind,
    task: usize,
    len: u64,
    // Released (refcount dropped) before the registered memory below: declared first.
    _bufs: Vec<Buf>,
    /// Source memory kept alive until the operation completed.
    _keep: Option<RegisteredBuf>,
    done: Done,
}

struct RecvSlot {
    /// 0 once freed (after its completion during a stop).
    task: usize,
    buf: Buf,
    offset: usize,
}

/// The user data of staging receives has this bit set; operations use plain counters.
const RECV_TAG: u64 = 1 << 63;

pub(super) struct Owner {
    shared: Weak<EngineShared>,
    config: Arc<DocaConfig>,
    // Drop order matters: tasks are freed in `shutdown`; buffers (in `ops`, `recvs` and the
    // connections) go before the inventory, the context before the progress engine.
    ops: HashMap<u64, Inflight>,
    recvs: Vec<RecvSlot>,
    conns: HashMap<ConnId, OwnedConn>,
    by_raw: HashMap<usize, ConnId>,
    accepted: Option<mpsc::UnboundedSender<Arc<ConnShared>>>,
    listening: Vec<u16>,
    next_op: u64,
    inv: Inventory,
    staging_mmap: Arc<Mmap>,
    staging: RegisteredBuf,
    rdma: Rdma,
    pe: Arc<Pe>,
    /// Boxed: its address is the context's user data.
    sink: Box<Sink>,
    max_message: u64,
    /// `shutdown` ran.
    stopped: bool,
}

// SAFETY: the owner is used by one thread at a time (its tokio task or its polling thread);
// every DOCA object it holds may move between threads (see the wrappers), and the `Sink`'s
// cells are only touched by callbacks that run inside the owner's own `doca_pe_progress`.
unsafe impl Send for Owner {}

fn all_remote() -> u32 {
    sys::DOCA_ACCESS_FLAG_LOCAL_READ_WRITE
        | sys::DOCA_ACCESS_FLAG_RDMA_READ
        | sys::DOCA_ACCESS_FLAG_RDMA_WRITE
        | sys::DOCA_ACCESS_FLAG_RDMA_ATOMIC
}

/// Starts a context and its owner; returns the handle other tasks use.
pub(super) fn start(
    dev: &Arc<Device>,
    config: &Arc<DocaConfig>,
    staging: &Arc<StagingPools>,
    max_connections: u16,
) -> Result<Arc<EngineShared>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(EngineShared {
        cmds: tx,
        dev: dev.clone(),
        config: config.clone(),
        staging: staging.clone(),
        runtime: tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument("the DOCA transport must be used inside a tokio runtime".into())
        })?,
    });
    let owner = Owner::start(&shared, max_connections)?;
    match config.progress {
        ProgressMode::Event => {
            shared.runtime.spawn(owner.run_event(rx));
        }
        ProgressMode::BusyPoll => {
            std::thread::Builder::new()
                .name("doca-progress".into())
                .spawn(move || owner.run_busy(rx))
                .map_err(|e| Error::io("spawning the DOCA progress thread", e))?;
        }
    }
    Ok(shared)
}

/// The notification fd, for `AsyncFd` (owned by the progress engine, not closed here).
struct NotifyFd(RawFd);

impl AsRawFd for NotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl Owner {
    fn start(shared: &Arc<EngineShared>, max_connections: u16) -> Result<Owner> {
        let config = shared.config.clone();
        let dev = &shared.dev;
        let pe = Arc::new(Pe::new()?);
        let mut rdma = Rdma::new(dev, &pe)?;
        let r = rdma.raw();
        let send_queue = config.send_queue_size.max(1);
        let recv_count = config.recv_queue_size.max(1);
        let per_kind = send_queue.saturating_mul(u32::from(max_connections.max(1)));
        let sink = Box::new(Sink {
            events: RefCell::new(Vec::new()),
            accepting: Cell::new(false),
            next_id: Cell::new(1),
        });
        // SAFETY: `r` is a new, idle context; every callback matches its C type; the sink
        // outlives the context (both owned by the owner, the context destroyed first).
        unsafe {
            check(
                "doca_rdma_set_permissions",
                sys::doca_rdma_set_permissions(r, all_remote()),
            )?;
            check(
                "doca_rdma_set_max_num_connections",
                sys::doca_rdma_set_max_num_connections(r, max_connections.max(1)),
            )?;
            check(
                "doca_rdma_set_send_queue_size",
                sys::doca_rdma_set_send_queue_size(r, send_queue),
            )?;
            check(
                "doca_rdma_set_recv_queue_size",
                sys::doca_rdma_set_recv_queue_size(r, recv_count),
            )?;
            check(
                "doca_rdma_set_transport_type",
                sys::doca_rdma_set_transport_type(r, sys::DOCA_RDMA_TRANSPORT_TYPE_RC),
            )?;
            if let Some(gid) = config.gid_index {
                check(
                    "doca_rdma_set_gid_index",
                    sys::doca_rdma_set_gid_index(r, gid),
                )?;
            }
            check(
                "doca_pe_connect_ctx",
                sys::doca_pe_connect_ctx(pe.raw(), rdma.ctx()),
            )?;
            check(
                "doca_rdma_task_receive_set_conf",
                sys::doca_rdma_task_receive_set_conf(r, Some(recv_ok), Some(recv_err), recv_count),
            )?;
            check(
                "doca_rdma_task_send_set_conf",
                sys::doca_rdma_task_send_set_conf(r, Some(send_ok), Some(send_err), per_kind),
            )?;
            check(
                "doca_rdma_task_send_imm_set_conf",
                sys::doca_rdma_task_send_imm_set_conf(
                    r,
                    Some(send_imm_ok),
                    Some(send_imm_err),
                    per_kind,
                ),
            )?;
            check(
                "doca_rdma_task_read_set_conf",
                sys::doca_rdma_task_read_set_conf(r, Some(read_ok), Some(read_err), per_kind),
            )?;
            check(
                "doca_rdma_task_write_set_conf",
                sys::doca_rdma_task_write_set_conf(r, Some(write_ok), Some(write_err), per_kind),
            )?;
            check(
                "doca_rdma_task_write_imm_set_conf",
                sys::doca_rdma_task_write_imm_set_conf(
                    r,
                    Some(write_imm_ok),
                    Some(write_imm_err),
                    per_kind,
                ),
            )?;
            check(
                "doca_rdma_task_atomic_cmp_swp_set_conf",
                sys::doca_rdma_task_atomic_cmp_swp_set_conf(
                    r,
                    Some(cas_ok),
                    Some(cas_err),
                    per_kind,
                ),
            )?;
            check(
                "doca_rdma_task_atomic_fetch_add_set_conf",
                sys::doca_rdma_task_atomic_fetch_add_set_conf(
                    r,
                    Some(faa_ok),
                    Some(faa_err),
                    per_kind,
                ),
            )?;
            let user = sys::doca_data {
                ptr: (&*sink as *const Sink).cast_mut().cast(),
            };
            check(
                "doca_ctx_set_user_data",
                sys::doca_ctx_set_user_data(rdma.ctx(), user),
            )?;
            check(
                "doca_rdma_set_connection_state_callbacks",
                sys::doca_rdma_set_connection_state_callbacks(
                    r,
                    Some(on_request),
                    Some(on_established),
                    Some(on_failure),
                    Some(on_disconnect),
                ),
            )?;
        }
        let inv_count = (recv_count as usize)
            .saturating_add((per_kind as usize).saturating_mul(3))
            .min(1 << 22);
        let inv = Inventory::new(inv_count)?;
        let slot = config.max_recv_size.max(64);
        let staging = RegisteredBuf::new(slot * recv_count as usize, Access::LOCAL_WRITE)?;
        // SAFETY: the staging buffer is owned by the owner and outlives the mmap (the owner
        // drops the mmap's users first, then the mmap, then the buffer).
        let staging_mmap = Arc::new(unsafe {
            Mmap::local(
                dev,
                staging.region().ptr_at(0),
                staging.capacity(),
                sys::DOCA_ACCESS_FLAG_LOCAL_READ_WRITE,
            )
        }?);
        // SAFETY: a configured, idle context connected to a progress engine.
        check("doca_ctx_start", unsafe { sys::doca_ctx_start(rdma.ctx()) })?;
        rdma.destroyable = false;
        let mut owner = Owner {
            shared: Arc::downgrade(shared),
            config: config.clone(),
            ops: HashMap::new(),
            recvs: Vec::new(),
            conns: HashMap::new(),
            by_raw: HashMap::new(),
            accepted: None,
            listening: Vec::new(),
            next_op: 1,
            inv,
            staging_mmap,
            staging,
            rdma,
            pe,
            sink,
            max_message: u64::from(dev.info().max_message_size),
            stopped: false,
        };
        if let Err(e) = owner
            .wait_running()
            .and_then(|()| owner.post_receives(recv_count, slot))
        {
            owner.shutdown();
            return Err(e);
        }
        Ok(owner)
    }

    fn wait_running(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.rdma.state() != sys::DOCA_CTX_STATE_RUNNING {
            if !self.pe.progress() {
                if Instant::now() > deadline {
                    return Err(doca_error("doca_ctx_start", sys::DOCA_ERROR_TIME_OUT));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            self.sink.events.borrow_mut().clear();
        }
        Ok(())
    }

    fn post_receives(&mut self, count: u32, slot: usize) -> Result<()> {
        let base = self.staging.region().addr();
        for i in 0..count as usize {
            let offset = i * slot;
            // SAFETY: the slot lies inside the staging buffer, which only receives write into.
            let buf = unsafe {
                self.inv
                    .buf(&self.staging_mmap, base + offset as u64, slot, 0)
            }?;
            let mut task = ptr::null_mut();
            // SAFETY: running context, live buffer, valid out-pointer.
            check("doca_rdma_task_receive_allocate_init", unsafe {
                sys::doca_rdma_task_receive_allocate_init(
                    self.rdma.raw(),
                    buf.raw(),
                    sys::doca_data {
                        u64_: RECV_TAG | i as u64,
                    },
                    &mut task,
                )
            })?;
            // SAFETY: a new idle task.
            let code = unsafe { sys::doca_task_submit(as_task(Kind::Receive, task as usize)) };
            if code != sys::DOCA_SUCCESS {
                free_task(Kind::Receive, task as usize);
                return Err(doca_error("doca_task_submit", code));
            }
            self.recvs.push(RecvSlot {
                task: task as usize,
                buf,
                offset,
            });
        }
        Ok(())
    }

    async fn run_event(mut self, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
        let fd = match self.pe.notification_fd() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::error!(error = %e, "DOCA event mode unavailable; polling instead");
                return tokio::task::block_in_place(move || self.run_busy(cmds));
            }
        };
        // SAFETY: the fd is the progress engine's notification handle; the engine (held by
        // `self`) outlives `afd`, which is dropped before `shutdown` destroys the engine.
        let afd = match unsafe { AsyncFd::register_with_interest(NotifyFd(fd), Interest::READABLE) }
        {
            Ok(afd) => afd,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch the DOCA notification fd");
                self.shutdown();
                return;
            }
        };
        loop {
            self.progress_all();
            if let Err(e) = self.pe.arm() {
                tracing::warn!(error = %e, "arming DOCA notifications");
            }
            tokio::select! {
                ready = afd.readable() => {
                    if let Ok(mut guard) = ready {
                        let _ = self.pe.clear(fd);
                        guard.clear_ready();
                    }
                }
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => {
                        self.handle(cmd);
                        while let Ok(cmd) = cmds.try_recv() {
                            self.handle(cmd);
                        }
                    }
                    None => break,
                },
            }
        }
        drop(afd);
        self.shutdown();
    }

    fn run_busy(mut self, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
        let mut idle = 0u32;
        loop {
            let mut busy = self.progress_all();
            loop {
                match cmds.try_recv() {
                    Ok(cmd) => {
                        self.handle(cmd);
                        busy = true;
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        self.shutdown();
                        return;
                    }
                }
            }
            idle = if busy { 0 } else { idle.saturating_add(1) };
            if idle > 1024 {
                std::thread::yield_now();
            }
        }
    }

    /// Progresses until nothing happens; returns whether anything did.
    fn progress_all(&mut self) -> bool {
        let mut any = false;
        loop {
            let progressed = self.pe.progress();
            let events = std::mem::take(&mut *self.sink.events.borrow_mut());
            if !progressed && events.is_empty() {
                return any;
            }
            any = true;
            for e in events {
                self.on_event(e);
            }
        }
    }

    fn on_event(&mut self, e: Event) {
        match e {
            Event::Task {
                kind: Kind::Receive,
                task: _,
                user,
                status,
                recv,
            } => self.on_receive(user, status, recv),
            Event::Task {
                kind,
                task,
                user,
                status,
                recv: _,
            } => self.on_completion(kind, task, user, status),
            Event::Requested { conn, id, accepted } => {
                if accepted {
                    let peer = format!("doca://conn-{id}@{}", self.listening_name());
                    self.insert_conn(id, conn, peer, None, None);
                }
            }
            Event::Established { conn, id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    if c.raw == 0 {
                        c.raw = conn;
                        self.by_raw.insert(conn, id);
                    }
                }
                self.on_established(id)
            }
            Event::Failed { id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.phase = Phase::Dead;
                    c.disconnected = true;
                    let err = Error::ConnectionClosed {
                        peer: c.peer.clone(),
                        reason:
                            "RDMA CM connection failed (nobody listening, or the server is full)"
                                .into(),
                    };
                    if let Some(reply) = c.connect_reply.take() {
                        let _ = reply.send(Err(err));
                    }
                }
                self.maybe_remove(id);
            }
            Event::Disconnected { id } => {
                let peer = self
                    .conns
                    .get(&id)
                    .map(|c| c.peer.clone())
                    .unwrap_or_default();
                self.fail_conn(
                    id,
                    Error::ConnectionClosed {
                        peer,
                        reason: "closed by the peer".into(),
                    },
                );
            }
        }
    }

    fn listening_name(&self) -> String {
        self.listening
            .first()
            .map_or_else(|| "out-of-band".to_owned(), |p| format!("port {p}"))
    }

    fn insert_conn(
        &mut self,
        id: ConnId,
        raw: usize,
        peer: String,
        reply: Option<oneshot::Sender<Result<Arc<ConnShared>>>>,
        addr: Option<RdmaAddr>,
    ) {
        self.by_raw.insert(raw, id);
        self.conns.insert(
            id,
            OwnedConn {
                raw,
                phase: Phase::Connecting,
                disconnected: false,
                peer,
                shared: None,
                pools: Default::default(),
                inflight: 0,
                remote: HashMap::new(),
                connect_reply: reply,
                _addr: addr,
            },
        );
    }

    /// Makes the application-side state of an established connection.
    fn make_live(&mut self, id: ConnId) -> Option<Arc<ConnShared>> {
        let engine = self.shared.upgrade();
        let c = self.conns.get_mut(&id)?;
        let Some(engine) = engine else {
            // Nobody can use it any more.
            self.fail_conn(
                id,
                Error::ConnectionClosed {
                    peer: String::new(),
                    reason: "the transport was dropped".into(),
                },
            );
            return None;
        };
        c.phase = Phase::Live;
        let shared = ConnShared::new(id, c.peer.clone(), engine);
        c.shared = Some(shared.clone());
        Some(shared)
    }

    fn on_established(&mut self, id: ConnId) {
        let Some(shared) = self.make_live(id) else {
            return;
        };
        let reply = self.conns.get_mut(&id).and_then(|c| c.connect_reply.take());
        let delivered = match reply {
            Some(reply) => reply.send(Ok(shared)).is_ok(),
            None => self
                .accepted
                .as_ref()
                .is_some_and(|tx| tx.send(shared).is_ok()),
        };
        if !delivered {
            self.fail_conn(
                id,
                Error::ConnectionClosed {
                    peer: String::new(),
                    reason: "nobody took the connection".into(),
                },
            );
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Listen {
                port,
                accepted,
                reply,
            } => {
                // SAFETY: a running context.
                let r = check("doca_rdma_start_listen_to_port", unsafe {
                    sys::doca_rdma_start_listen_to_port(self.rdma.raw(), port)
                });
                if r.is_ok() {
                    self.listening.push(port);
                    self.accepted = Some(accepted);
                    self.sink.accepting.set(true);
                }
                let _ = reply.send(r);
            }
            Cmd::StopListen { port } => {
                self.sink.accepting.set(false);
                self.accepted = None;
                if self.listening.contains(&port) {
                    self.listening.retain(|p| *p != port);
                    // SAFETY: a running context listening on `port`.
                    let _ = unsafe { sys::doca_rdma_stop_listen_to_port(self.rdma.raw(), port) };
                }
            }
            Cmd::Connect {
                ip,
                port,
                peer,
                reply,
            } => {
                let addr = match RdmaAddr::new(ip, port) {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                let id = self.sink.new_id();
                // The connection object appears in the callbacks; its id travels as user data.
                // SAFETY: running context, live address.
                let r = check("doca_rdma_connect_to_addr", unsafe {
                    sys::doca_rdma_connect_to_addr(
                        self.rdma.raw(),
                        addr.raw(),
                        sys::doca_data { u64_: id },
                    )
                });
                match r {
                    // The raw connection is not known until a callback: 0 until then.
                    Ok(()) => self.insert_conn(id, 0, peer, Some(reply), Some(addr)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Cmd::Export { reply } => {
                let mut blob = ptr::null();
                let mut len = 0usize;
                let mut conn = ptr::null_mut();
                // SAFETY: running context; valid out-pointers.
                let r = check("doca_rdma_export", unsafe {
                    sys::doca_rdma_export(self.rdma.raw(), &mut blob, &mut len, &mut conn)
                });
                let result = r.map(|()| {
                    // SAFETY: DOCA returned `len` readable bytes, valid while the connection
                    // exists; copied at once.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(blob.cast::<u8>(), len) }.to_vec();
                    let id = self.sink.new_id();
                    self.insert_conn(id, conn as usize, String::new(), None, None);
                    (bytes, id)
                });
                let _ = reply.send(result);
            }
            Cmd::ConnectOob {
                id,
                blob,
                peer,
                reply,
            } => {
                let Some(c) = self.conns.get_mut(&id) else {
                    let _ = reply.send(Err(Error::InvalidArgument("unknown export".into())));
                    return;
                };
                c.peer = peer;
                // SAFETY: running context; the connection came from its export; the blob is
                // readable for its length.
                let r = check("doca_rdma_connect", unsafe {
                    sys::doca_rdma_connect(
                        self.rdma.raw(),
                        blob.as_ptr().cast(),
                        blob.len(),
                        c.raw as *mut sys::doca_rdma_connection,
                    )
                });
                match r.map(|()| self.make_live(id)) {
                    Ok(Some(shared)) => {
                        let _ = reply.send(Ok(shared));
                    }
                    Ok(None) => {
                        let _ = reply.send(Err(Error::ConnectionClosed {
                            peer: String::new(),
                            reason: "the transport was dropped".into(),
                        }));
                    }
                    Err(e) => {
                        self.fail_conn(id, e.duplicate());
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Cmd::Op { id, op } => self.post(id, op),
            Cmd::Close { id, err } => self.fail_conn(id, err),
        }
    }

    /// Puts a connection in error: the application side learns it, DOCA disconnects it
    /// (its outstanding tasks complete with errors, the peer gets its disconnection
    /// callback), its idle tasks are freed. Other connections are not touched.
    fn fail_conn(&mut self, id: ConnId, err: Error) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(shared) = &c.shared {
            shared.fail(err.duplicate());
        }
        if let Some(reply) = c.connect_reply.take() {
            let _ = reply.send(Err(err));
        }
        c.phase = Phase::Dead;
        if !c.disconnected && c.raw != 0 {
            c.disconnected = true;
            // SAFETY: a connection of this running context, disconnected once.
            let code = unsafe {
                sys::doca_rdma_connection_disconnect(c.raw as *mut sys::doca_rdma_connection)
            };
            if code != sys::DOCA_SUCCESS && code != sys::DOCA_ERROR_BAD_STATE {
                tracing::debug!(code, "disconnecting a DOCA connection");
            }
        }
        for (pool, kind) in c.pools.iter_mut().zip(POOLED) {
            for task in pool.drain(..) {
                free_task(kind, task);
            }
        }
        self.maybe_remove(id);
    }

    fn maybe_remove(&mut self, id: ConnId) {
        let remove = self
            .conns
            .get(&id)
            .is_some_and(|c| c.phase == Phase::Dead && c.inflight == 0);
        if remove {
            if let Some(c) = self.conns.remove(&id) {
                self.by_raw.remove(&c.raw);
            }
        }
    }

    fn on_receive(&mut self, user: u64, status: sys::doca_error_t, recv: Option<RecvResult>) {
        let index = (user & !RECV_TAG) as usize;
        if index >= self.recvs.len() {
            return;
        }
        if let (true, Some(r)) = (status == sys::DOCA_SUCCESS, recv) {
            let id = self.by_raw.get(&r.conn).copied();
            let shared = id
                .and_then(|id| self.conns.get(&id))
                .filter(|c| c.phase == Phase::Live)
                .and_then(|c| c.shared.clone());
            if let Some(shared) = shared {
                let slot = &self.recvs[index];
                let (opcode, imm, len) = match r.opcode {
                    sys::DOCA_RDMA_OPCODE_RECV_SEND => (RecvOpcode::Send, None, r.len as usize),
                    sys::DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM => (
                        RecvOpcode::SendWithImm,
                        Some(u32::from_be(r.imm)),
                        r.len as usize,
                    ),
                    _ => (RecvOpcode::WriteWithImm, Some(u32::from_be(r.imm)), 0),
                };
                // SAFETY: the receive completed, so DOCA is done writing its slot, which lies
                // inside the staging buffer; the slot is not reposted before this copy.
                let data = unsafe {
                    std::slice::from_raw_parts(self.staging.region().ptr_at(slot.offset), len)
                };
                shared.on_message(data, opcode, imm);
            } else {
                tracing::debug!("DOCA receive for an unknown or closed connection dropped");
            }
        } else if status != sys::DOCA_ERROR_CONNECTION_ABORTED {
            tracing::debug!(
                error = %super::sys::error_name(status),
                "a DOCA receive failed (a message larger than max_recv_size?)"
            );
        }
        if self.rdma.state() != sys::DOCA_CTX_STATE_RUNNING {
            // Flushed by the stop: the task is idle now and is freed (never reposted).
            let slot = &mut self.recvs[index];
            if slot.task != 0 {
                free_task(Kind::Receive, slot.task);
                slot.task = 0;
            }
            return;
        }
        let slot = &self.recvs[index];
        slot.buf.reset();
        // SAFETY: the task completed, so it is idle and may be submitted again.
        let code = unsafe { sys::doca_task_submit(as_task(Kind::Receive, slot.task)) };
        if code != sys::DOCA_SUCCESS {
            tracing::warn!(error = %super::sys::error_name(code), "could not repost a DOCA receive");
        }
    }

    fn fail_op(&mut self, id: ConnId, op: Op, err: Error, fatal: bool) {
        op.fail(err.duplicate());
        if fatal {
            self.fail_conn(id, err);
        }
    }

    /// Starts an operation on a connection.
    fn post(&mut self, id: ConnId, op: Op) {
        let conn_err = match self.conns.get(&id) {
            None => Some(Error::ConnectionClosed {
                peer: String::new(),
                reason: "connection already closed".into(),
            }),
            Some(c) if c.phase != Phase::Live => {
                Some(c.shared.as_ref().map(|s| s.error()).unwrap_or_else(|| {
                    Error::ConnectionClosed {
                        peer: c.peer.clone(),
                        reason: "not connected".into(),
                    }
                }))
            }
            Some(c) => c.shared.as_ref().and_then(|s| s.current_error()),
        };
        if let Some(err) = conn_err {
            op.fail(err);
            return;
        }
        let c = self.conns.get(&id).expect("checked");
        if c.inflight >= self.config.send_queue_size as usize {
            op.fail(Error::LimitExceeded {
                limit: "send_queue_size",
                max: u64::from(self.config.send_queue_size),
                actual: c.inflight as u64 + 1,
            });
            return;
        }
        match self.submit(id, op) {
            Ok(()) => {}
            Err((op, err, fatal)) => self.fail_op(id, op, err, fatal),
        }
    }

    fn remote_mmap(&mut self, id: ConnId, d: &Descriptor) -> Result<Arc<Mmap>> {
        let dev = self.rdma.device().clone();
        let c = self.conns.get_mut(&id).expect("live connection");
        if let Some(m) = c.remote.get(&d.blob) {
            return Ok(m.clone());
        }
        let m = Arc::new(Mmap::import(&dev, &d.blob)?);
        if c.remote.len() >= 4096 {
            // Bound the cache: drop imports no operation uses (their `Arc` is unique).
            c.remote.retain(|_, m| Arc::strong_count(m) > 1);
        }
        c.remote.insert(d.blob.clone(), m.clone());
        Ok(m)
    }

    #[allow(clippy::result_large_err)]
    fn submit(&mut self, id: ConnId, op: Op) -> std::result::Result<(), (Op, Error, bool)> {
        let access_err = |d: &Descriptor, len: u64, v| Error::RemoteAccess {
            rkey: d.rkey,
            addr: d.addr,
            len,
            violation: v,
        };
        // Checks the local side can make before DOCA does: they fail the connection as the
        // peer's NAK would.
        let (need, remote, len) = match &op {
            Op::Send { src, .. } => (None, None, src.buf.len() as u64),
            Op::Write { src, dst, .. } => {
                (Some(Access::REMOTE_WRITE), Some(dst), src.buf.len() as u64)
            }
            Op::Read { src, .. } => (Some(Access::REMOTE_READ), Some(src), src.len),
            Op::Atomic { dst, .. } => (Some(Access::REMOTE_ATOMIC), Some(dst), 8),
        };
        if len > self.max_message {
            let err = Error::LimitExceeded {
                limit: "max_message_size",
                max: self.max_message,
                actual: len,
            };
            return Err((op, err, false));
        }
        let remote_mmap = match (need, remote) {
            (Some(need), Some(d)) => {
                if matches!(op, Op::Atomic { .. }) && !d.addr.is_multiple_of(8) {
                    let err = access_err(d, 8, AccessViolation::Misaligned);
                    return Err((op, err, true));
                }
                if !d.access.contains(need) {
                    let err = access_err(d, len, AccessViolation::NotPermitted);
                    return Err((op, err, true));
                }
                if d.blob.is_empty() {
                    let err = access_err(d, len, AccessViolation::UnknownKey);
                    return Err((op, err, true));
                }
                match self.remote_mmap(id, d) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::debug!(error = %e, "importing a peer mmap");
                        let err = access_err(d, len, AccessViolation::UnknownKey);
                        return Err((op, err, true));
                    }
                }
            }
            _ => None,
        };
        // Buffers: local first, then remote (a range outside the peer's mmap is refused here).
        let op_id = self.next_op;
        self.next_op += 1;
        let c = self.conns.get_mut(&id).expect("live connection");
        let conn = c.raw as *mut sys::doca_rdma_connection;
        let inv = &self.inv;
        let r = self.rdma.raw();
        let user = sys::doca_data { u64_: op_id };
        macro_rules! try_buf {
            ($e:expr, $d:expr, $len:expr) => {
                match $e {
                    Ok(b) => b,
                    Err(e) => {
                        let err = match $d {
                            Some(d) => {
                                tracing::debug!(error = %e, "remote range refused");
                                access_err(d, $len, AccessViolation::OutOfBounds)
                            }
                            None => e,
                        };
                        let fatal = $d.is_some();
                        return Err((op, err, fatal));
                    }
                }
            };
        }
        let none: Option<&Descriptor> = None;
        let (kind, bufs, task) = match &op {
            Op::Send { src, imm, .. } => {
                let addr = src.buf.region().addr();
                let n = src.buf.len();
                // SAFETY: the source buffer is owned by this operation until it completes.
                let b = try_buf!(unsafe { inv.buf(&src.mmap, addr, n.max(1), n) }, none, 0);
                let kind = if imm.is_some() {
                    Kind::SendImm
                } else {
                    Kind::Send
                };
                let imm_be = imm.unwrap_or(0).to_be();
                let pooled = c.pools[kind.pool().expect("pooled")].pop();
                let task = match (pooled, kind) {
                    (Some(t), Kind::Send) => {
                        // SAFETY: an idle task of this connection.
                        unsafe { sys::doca_rdma_task_send_set_src_buf(t as *mut _, b.raw()) };
                        Ok(t)
                    }
                    (Some(t), _) => {
                        // SAFETY: an idle task of this connection.
                        unsafe {
                            sys::doca_rdma_task_send_imm_set_src_buf(t as *mut _, b.raw());
                            sys::doca_rdma_task_send_imm_set_immediate_data(t as *mut _, imm_be);
                        }
                        Ok(t)
                    }
                    (None, Kind::Send) => {
                        let mut t = ptr::null_mut();
                        // SAFETY: running context, live connection and buffer.
                        check("doca_rdma_task_send_allocate_init", unsafe {
                            sys::doca_rdma_task_send_allocate_init(r, conn, b.raw(), user, &mut t)
                        })
                        .map(|()| t as usize)
                    }
                    (None, _) => {
                        let mut t = ptr::null_mut();
                        // SAFETY: as above.
                        check("doca_rdma_task_send_imm_allocate_init", unsafe {
                            sys::doca_rdma_task_send_imm_allocate_init(
                                r,
                                conn,
                                b.raw(),
                                imm_be,
                                user,
                                &mut t,
                            )
                        })
                        .map(|()| t as usize)
                    }
                };
                (kind, vec![b], task)
            }
            Op::Write { src, dst, imm, .. } => {
                let n = src.buf.len();
                // SAFETY: the source buffer is owned by this operation until it completes.
                let s = try_buf!(
                    unsafe { inv.buf(&src.mmap, src.buf.region().addr(), n.max(1), n) },
                    none,
                    0
                );
                let rm = remote_mmap.as_ref().expect("remote");
                // SAFETY: remote memory; DOCA checks the range against the peer's mmap.
                let d = try_buf!(unsafe { inv.buf(rm, dst.addr, n, 0) }, Some(dst), n as u64);
                let kind = if imm.is_some() {
                    Kind::WriteImm
                } else {
                    Kind::Write
                };
                let imm_be = imm.unwrap_or(0).to_be();
                let pooled = c.pools[kind.pool().expect("pooled")].pop();
                let task = match (pooled, kind) {
                    (Some(t), Kind::Write) => {
                        // SAFETY: an idle task of this connection.
                        unsafe {
                            sys::doca_rdma_task_write_set_src_buf(t as *mut _, s.raw());
                            sys::doca_rdma_task_write_set_dst_buf(t as *mut _, d.raw());
                        }
                        Ok(t)
                    }
                    (Some(t), _) => {
                        // SAFETY: an idle task of this connection.
                        unsafe {
                            sys::doca_rdma_task_write_imm_set_src_buf(t as *mut _, s.raw());
                            sys::doca_rdma_task_write_imm_set_dst_buf(t as *mut _, d.raw());
                            sys::doca_rdma_task_write_imm_set_immediate_data(t as *mut _, imm_be);
                        }
                        Ok(t)
                    }
                    (None, Kind::Write) => {
                        let mut t = ptr::null_mut();
                        // SAFETY: running context, live connection and buffers.
                        check("doca_rdma_task_write_allocate_init", unsafe {
                            sys::doca_rdma_task_write_allocate_init(
                                r,
                                conn,
                                s.raw(),
                                d.raw(),
                                user,
                                &mut t,
                            )
                        })
                        .map(|()| t as usize)
                    }
                    (None, _) => {
                        let mut t = ptr::null_mut();
                        // SAFETY: as above.
                        check("doca_rdma_task_write_imm_allocate_init", unsafe {
                            sys::doca_rdma_task_write_imm_allocate_init(
                                r,
                                conn,
                                s.raw(),
                                d.raw(),
                                imm_be,
                                user,
                                &mut t,
                            )
                        })
                        .map(|()| t as usize)
                    }
                };
                (kind, vec![s, d], task)
            }
            Op::Read { src, dst, .. } => {
                let rm = remote_mmap.as_ref().expect("remote");
                let n = src.len as usize;
                // SAFETY: remote memory; DOCA checks the range against the peer's mmap.
                let s = try_buf!(unsafe { inv.buf(rm, src.addr, n, n) }, Some(src), src.len);
                // SAFETY: the destination is owned by this operation until it completes.
                let d = try_buf!(
                    unsafe {
                        inv.buf(
                            &dst.mmap,
                            dst.buf.region().addr(),
                            dst.buf.capacity().max(1),
                            0,
                        )
                    },
                    none,
                    0
                );
                let pooled = c.pools[Kind::Read.pool().expect("pooled")].pop();
                let task = match pooled {
                    Some(t) => {
                        // SAFETY: an idle task of this connection.
                        unsafe {
                            sys::doca_rdma_task_read_set_src_buf(t as *mut _, s.raw());
                            sys::doca_rdma_task_read_set_dst_buf(t as *mut _, d.raw());
                        }
                        Ok(t)
                    }
                    None => {
                        let mut t = ptr::null_mut();
                        // SAFETY: running context, live connection and buffers.
                        check("doca_rdma_task_read_allocate_init", unsafe {
                            sys::doca_rdma_task_read_allocate_init(
                                r,
                                conn,
                                s.raw(),
                                d.raw(),
                                user,
                                &mut t,
                            )
                        })
                        .map(|()| t as usize)
                    }
                };
                (Kind::Read, vec![s, d], task)
            }
            Op::Atomic {
                dst,
                op: aop,
                result,
                ..
            } => {
                let rm = remote_mmap.as_ref().expect("remote");
                // SAFETY: remote memory; DOCA checks the range against the peer's mmap.
                let d = try_buf!(unsafe { inv.buf(rm, dst.addr, 8, 8) }, Some(dst), 8);
                // SAFETY: the result buffer is owned by this operation until it completes.
                let res = try_buf!(
                    unsafe {
                        inv.buf(
                            &result.mmap,
                            result.buf.region().addr(),
                            result.buf.capacity(),
                            0,
                        )
                    },
                    none,
                    0
                );
                let mut cas: *mut sys::doca_rdma_task_atomic_cmp_swp = ptr::null_mut();
                let mut faa: *mut sys::doca_rdma_task_atomic_fetch_add = ptr::null_mut();
                let (kind, code) = match aop {
                    AtomicOp::CompareAndSwap { expected, new } => (
                        Kind::CmpSwp,
                        // SAFETY: running context, live connection and buffers.
                        unsafe {
                            sys::doca_rdma_task_atomic_cmp_swp_allocate_init(
                                r,
                                conn,
                                d.raw(),
                                res.raw(),
                                *expected,
                                *new,
                                user,
                                &mut cas,
                            )
                        },
                    ),
                    AtomicOp::FetchAndAdd { add } => (
                        Kind::FetchAdd,
                        // SAFETY: as above.
                        unsafe {
                            sys::doca_rdma_task_atomic_fetch_add_allocate_init(
                                r,
                                conn,
                                d.raw(),
                                res.raw(),
                                *add,
                                user,
                                &mut faa,
                            )
                        },
                    ),
                };
                let t = if kind == Kind::CmpSwp {
                    cas as usize
                } else {
                    faa as usize
                };
                let task = check("doca_rdma_task_atomic_allocate_init", code).map(|()| t);
                (kind, vec![d, res], task)
            }
        };
        let task = match task {
            Ok(t) => t,
            Err(e) => {
                // Out of tasks: the configured queue sizes are exceeded.
                let err = match &e {
                    Error::Doca { code, .. } if *code == sys::DOCA_ERROR_NO_MEMORY as i32 => {
                        Error::LimitExceeded {
                            limit: "send_queue_size",
                            max: u64::from(self.config.send_queue_size),
                            actual: u64::from(self.config.send_queue_size) + 1,
                        }
                    }
                    _ => e,
                };
                drop(bufs);
                return Err((op, err, false));
            }
        };
        // SAFETY: an idle task (new or reused); the user data names this operation.
        unsafe { sys::doca_task_set_user_data(as_task(kind, task), user) };
        let (inflight_done, keep_buf) = match op {
            Op::Send { src, done, .. } | Op::Write { src, done, .. } => {
                (Done::Unit(done), Some(src.buf))
            }
            Op::Read { src, dst, done } => (
                Done::Read {
                    dst: dst.buf,
                    len: src.len as usize,
                    done,
                },
                None,
            ),
            Op::Atomic { result, done, .. } => (
                Done::Atomic {
                    result: result.buf,
                    done,
                },
                None,
            ),
        };
        // SAFETY: an idle task whose buffers are held in `ops` until its completion.
        let code = unsafe { sys::doca_task_submit(as_task(kind, task)) };
        if code != sys::DOCA_SUCCESS {
            free_or_pool(c, kind, task, true);
            let err = doca_error("doca_task_submit", code);
            let err = Error::ConnectionClosed {
                peer: c.peer.clone(),
                reason: err.to_string(),
            };
            drop(bufs);
            complete(inflight_done, Err(err.duplicate()));
            self.fail_conn(id, err);
            return Ok(());
        }
        c.inflight += 1;
        self.ops.insert(
            op_id,
            Inflight {
                conn: id,
                kind,
                task,
                len,
                _bufs: bufs,
                _keep: keep_buf,
                done: inflight_done,
            },
        );
        Ok(())
    }

    fn on_completion(&mut self, kind: Kind, task: usize, user: u64, status: sys::doca_error_t) {
        let Some(op) = self.ops.remove(&user) else {
            // Not ours (cannot happen): never leak a task.
            tracing::warn!(?kind, "completion of an unknown DOCA task");
            free_task(kind, task);
            return;
        };
        let Inflight {
            conn: id,
            kind,
            task,
            len,
            _bufs,
            _keep,
            done,
        } = op;
        drop(_bufs);
        let c = self.conns.get_mut(&id);
        let live = c.as_ref().is_some_and(|c| c.phase == Phase::Live);
        if let Some(c) = c {
            c.inflight -= 1;
            free_or_pool(c, kind, task, !live);
        } else {
            free_task(kind, task);
        }
        if status == sys::DOCA_SUCCESS {
            complete(done, Ok(()));
            if !live {
                self.maybe_remove(id);
            }
            return;
        }
        let conn_error = self
            .conns
            .get(&id)
            .and_then(|c| c.shared.as_ref())
            .and_then(|s| s.current_error());
        let peer = self
            .conns
            .get(&id)
            .map(|c| c.peer.clone())
            .unwrap_or_default();
        let err = match (status, conn_error) {
            (_, Some(e)) => e,
            (sys::DOCA_ERROR_IO_FAILED, None) => match kind {
                Kind::Send | Kind::SendImm if len > self.config.max_recv_size as u64 => {
                    Error::ReceiveTooSmall {
                        len,
                        capacity: self.config.max_recv_size as u64,
                    }
                }
                Kind::Send | Kind::SendImm => Error::ReceiverNotReady {
                    retry_ms: super::provider_rnr_ms(),
                },
                _ => Error::RemoteAccess {
                    rkey: 0,
                    addr: 0,
                    len,
                    violation: AccessViolation::NotPermitted,
                },
            },
            (code, None) => Error::ConnectionClosed {
                peer,
                reason: format!("DOCA task failed: {}", super::sys::error_name(code)),
            },
        };
        complete(done, Err(err.duplicate()));
        self.fail_conn(id, err);
        self.maybe_remove(id);
    }

    /// Stops the context: disconnects everything, waits (bounded) for every task to
    /// complete, frees the tasks and destroys the objects.
    fn shutdown(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.sink.accepting.set(false);
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            self.fail_conn(
                id,
                Error::ConnectionClosed {
                    peer: String::new(),
                    reason: "the DOCA context is shutting down".into(),
                },
            );
        }
        // SAFETY: a started context; stopping flushes every outstanding task.
        let code = unsafe { sys::doca_ctx_stop(self.rdma.ctx()) };
        if code != sys::DOCA_SUCCESS && code != sys::DOCA_ERROR_IN_PROGRESS {
            if self.rdma.state() == sys::DOCA_CTX_STATE_IDLE {
                self.rdma.destroyable = true;
            } else {
                tracing::warn!(error = %super::sys::error_name(code), "doca_ctx_stop failed");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.progress_all();
            // Receives are freed in `on_receive` as their flushed completions arrive.
            if self.ops.is_empty() && self.rdma.state() == sys::DOCA_CTX_STATE_IDLE {
                self.rdma.destroyable = true;
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!("DOCA context did not stop within 10 s; leaking it");
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.conns.clear();
        self.by_raw.clear();
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // The owner's task was dropped without finishing (its runtime shut down): stop the
        // context here so it is still destroyed rather than leaked.
        if !self.stopped {
            self.shutdown();
        }
    }
}

fn complete(done: Done, result: Result<()>) {
    let _ = match (done, result) {
        (Done::Unit(tx), r) => tx.send(r).map_err(drop),
        (Done::Read { mut dst, len, done }, Ok(())) => {
            dst.set_len(len);
            done.send(Ok(dst)).map_err(drop)
        }
        (Done::Read { done, .. }, Err(e)) => done.send(Err(e)).map_err(drop),
        (Done::Atomic { result, done }, Ok(())) => {
            let mut bytes = [0u8; 8];
            // SAFETY: the atomic completed, so DOCA wrote the previous value (native endian)
            // into the first 8 bytes of the result buffer, which this operation owns.
            unsafe {
                std::ptr::copy_nonoverlapping(result.region().ptr_at(0), bytes.as_mut_ptr(), 8)
            };
            done.send(Ok(u64::from_ne_bytes(bytes))).map_err(drop)
        }
        (Done::Atomic { done, .. }, Err(e)) => done.send(Err(e)).map_err(drop),
    };
}

fn free_or_pool(c: &mut OwnedConn, kind: Kind, task: usize, free: bool) {
    match kind.pool() {
        Some(i) if !free => c.pools[i].push(task),
        _ => free_task(kind, task),
    }
}

fn free_task(kind: Kind, task: usize) {
    // SAFETY: an idle task (completed, or never submitted) freed once.
    unsafe { sys::doca_task_free(as_task(kind, task)) }
}
