//! The objects the provider emulates, one struct per kind of DOCA handle the application
//! holds (progress engine, RDMA context, connection, task, address, mmap, inventory, buffer),
//! and the handles that name them. They live in the `World` (`world.rs`).

use super::*;

/// A handle: the address of a small heap allocation, used as the C pointer and map key.
pub(super) type H = usize;

pub(super) fn new_handle() -> H {
    Box::into_raw(Box::new(0u64)) as H
}

pub(super) fn free_handle(h: H) {
    // SAFETY: `h` came from `new_handle` and is freed once, when its object is removed.
    drop(unsafe { Box::from_raw(h as *mut u64) });
}

/// `union doca_data` stored in the global state.
#[derive(Clone, Copy)]
pub(super) struct UserData(pub(super) doca_data);

// SAFETY: user data is an opaque value the provider only stores and hands back to the
// application's callbacks; DOCA lets the application progress contexts from any thread.
unsafe impl Send for UserData {}

impl UserData {
    pub(super) const NULL: UserData = UserData(doca_data { u64_: 0 });
}

/// Completion callback with the generic task pointer (ABI-compatible with every task type's).
pub(super) type TaskCb = unsafe extern "C" fn(*mut doca_task, doca_data, doca_data);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
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
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Copy, Default)]
pub(super) struct TaskConf {
    pub(super) success: Option<TaskCb>,
    pub(super) error: Option<TaskCb>,
    pub(super) num: u32,
    pub(super) allocated: u32,
}

pub(super) struct Pe {
    pub(super) ctxs: Vec<H>,
    pub(super) queue: VecDeque<Event>,
    pub(super) efd: i32,
    pub(super) armed: bool,
    pub(super) timer: bool,
}

pub(super) enum Event {
    State { ctx: H, prev: u32, next: u32 },
    Request(H),
    Established(H),
    Failure(H),
    Disconnect(H),
    TaskDone(H),
}

pub(super) struct Rdma {
    /// The `struct doca_dev *` it was created on.
    pub(super) dev: H,
    pub(super) pe: Option<H>,
    pub(super) state: doca_ctx_states,
    pub(super) user_data: UserData,
    pub(super) state_cb: doca_ctx_state_changed_callback_t,
    pub(super) permissions: u32,
    pub(super) max_conns: u16,
    pub(super) request_cb: doca_rdma_connection_request_cb_t,
    pub(super) established_cb: doca_rdma_connection_established_cb_t,
    pub(super) failure_cb: doca_rdma_connection_failure_cb_t,
    pub(super) disconnect_cb: doca_rdma_connection_disconnection_cb_t,
    pub(super) confs: [TaskConf; 8],
    /// Tasks submitted whose completion was not delivered yet.
    pub(super) inflight: usize,
    /// Posted receives, oldest first.
    pub(super) recvs: VecDeque<H>,
    pub(super) conns: Vec<H>,
    pub(super) listening: Vec<u16>,
    pub(super) next_conn_id: u32,
    /// A connection became usable since the last start (receives may be posted).
    pub(super) connected_once: bool,
    /// State-change callbacks queued and not delivered yet: the next change waits for them,
    /// so a callback always runs while the context is in the state it announces.
    pub(super) state_events: u32,
    /// Some send of a connection may wait for a receive (set when one is left waiting,
    /// cleared by a progress that finds none): progress looks for expired ones only then.
    pub(super) sends_wait: bool,
    /// `doca_rdma_set_rnr_retry_count`: a send without a receive on the peer fails after
    /// `rnr_retry_count + 1` timer periods; 7 retries forever. 0 until set.
    pub(super) rnr_retry_count: u8,
    /// Tasks accepted by `doca_task_submit_ex` without `DOCA_TASK_SUBMIT_FLAG_FLUSH`, oldest
    /// first: owned by DOCA, not started (no data moves, no completion) until a flush.
    pub(super) unflushed: Vec<H>,
}

impl Rdma {
    pub(super) fn allocated(&self) -> u32 {
        self.confs.iter().map(|c| c.allocated).sum()
    }

    pub(super) fn used_slots(&self, world: &World) -> usize {
        self.conns
            .iter()
            .filter(|c| world.conns.get(c).is_some_and(|c| c.state.holds_slot()))
            .count()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ConnState {
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
    pub(super) fn holds_slot(self) -> bool {
        !matches!(self, ConnState::Disconnected | ConnState::Failed)
    }
}

pub(super) struct Conn {
    pub(super) rdma: H,
    pub(super) id: u32,
    pub(super) state: ConnState,
    pub(super) peer: Option<H>,
    pub(super) user_data: UserData,
    pub(super) oob: bool,
    /// Established as this side knows it: its established callback was delivered (RDMA CM)
    /// or `doca_rdma_connect` was called on it (out of band). Only then may tasks use it.
    pub(super) usable: bool,
    pub(super) blob: Vec<u8>,
    pub(super) addr: Option<H>,
    /// Send-like tasks waiting for a receive on the peer, oldest first.
    pub(super) pending: VecDeque<H>,
    /// Every submitted task of this connection not completed yet.
    pub(super) outstanding: Vec<H>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Submitted,
    Completing,
}

pub(super) struct Task {
    pub(super) kind: Kind,
    pub(super) rdma: H,
    pub(super) conn: Option<H>,
    pub(super) src: H,
    pub(super) dst: H,
    pub(super) result: H,
    pub(super) imm: u32,
    pub(super) cmp: u64,
    pub(super) swap: u64,
    pub(super) add: u64,
    pub(super) user_data: UserData,
    pub(super) status: doca_error_t,
    pub(super) phase: Phase,
    /// A completion was delivered since the last submission (result getters are defined).
    pub(super) completed: bool,
    /// While a send-like task waits for a receive on the peer: when its current receiver-not-
    /// ready timer period ends.
    pub(super) deadline: Option<Instant>,
    /// Receiver-not-ready retries it has left after the current period (`None`: forever).
    pub(super) rnr_retries_left: Option<u8>,
    pub(super) res_len: u32,
    pub(super) res_opcode: u32,
    pub(super) res_imm: u32,
    pub(super) res_conn: H,
}

pub(super) struct Addr {
    pub(super) port: u16,
    pub(super) in_use: usize,
}

pub(super) struct Mmap {
    pub(super) started: bool,
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) permissions: u32,
    pub(super) devs: Vec<usize>,
    /// Global id of the exporting mmap, for mmaps created from an export.
    pub(super) remote: Option<u64>,
    /// For an mmap created from an export: the device (its index in the device list) the
    /// export was made for. Its key is valid only there, as a verbs key in its own protection
    /// domain.
    pub(super) exported_for: Option<usize>,
    /// Global id (set at start).
    pub(super) id: u64,
    /// Export descriptors, one per device it was exported for (non-empty once exported).
    pub(super) exports: Vec<Export>,
    /// Buffers (with a non-zero reference count) pointing into it.
    pub(super) bufs: usize,
}

impl Mmap {
    pub(super) fn exported(&self) -> bool {
        !self.exports.is_empty()
    }

    /// Counts what destroying this mmap undoes: a registration (started local mmap) or an
    /// import.
    pub(super) fn count_teardown(&self) {
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
    pub(super) fn has_device(&self, dev: H) -> bool {
        self.devs.iter().any(|&d| {
            // SAFETY: added devices stay open (`doca_dev_close` refuses while an mmap holds
            // one); callers pass devices the application opened (a context's, or an argument).
            unsafe { device::same_device(d, dev) }
        })
    }
}

/// One `doca_mmap_export_rdma` descriptor: for which device, and its bytes (which stay put
/// while the mmap lives).
pub(super) struct Export {
    /// The device's index in the device list.
    pub(super) dev: usize,
    pub(super) blob: Vec<u8>,
}

pub(super) struct Inventory {
    pub(super) capacity: usize,
    pub(super) used: usize,
    pub(super) started: bool,
    /// Released descriptors (reference count 0), reused by the next `buf_get_by_args`.
    pub(super) free: Vec<H>,
}

pub(super) struct Buf {
    pub(super) inv: H,
    pub(super) mmap: H,
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) data: usize,
    pub(super) data_len: usize,
    /// 0: released to its inventory (the descriptor stays allocated and is reused).
    pub(super) refcount: u16,
}

impl Buf {
    /// Bytes free after the data section.
    pub(super) fn tail_room(&self) -> usize {
        (self.addr + self.len) - (self.data + self.data_len)
    }
}
