//! The C callbacks DOCA calls from `doca_pe_progress`, and the events they record.
//!
//! Callbacks never call DOCA back except where NVIDIA's samples do (accepting or rejecting a
//! connection request): they record an [`Event`] in the context's [`Sink`] and the owner
//! handles it after `doca_pe_progress` returned, so no DOCA call runs re-entrantly.

use std::cell::{Cell, RefCell};
use std::ptr;

use doca_sys as sys;

use super::task::Kind;
use super::ConnId;

/// What a successful receive reports.
pub(super) struct RecvResult {
    pub(super) len: u32,
    pub(super) opcode: sys::doca_rdma_opcode,
    /// Only for the `*_WITH_IMM` opcodes: DOCA leaves it undefined for the others.
    pub(super) imm: Option<u32>,
    /// The connection the message came on, as a map key.
    pub(super) conn: usize,
}

pub(super) enum Event {
    Task {
        kind: Kind,
        /// A receive's user data; for other kinds, the task's address (`Task::key`).
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
pub(super) struct Sink {
    events: RefCell<Vec<Event>>,
    /// Whether connection requests are accepted (a listener is open).
    pub(super) accepting: Cell<bool>,
    next_id: Cell<ConnId>,
}

impl Sink {
    pub(super) fn new() -> Sink {
        Sink {
            events: RefCell::new(Vec::new()),
            accepting: Cell::new(false),
            next_id: Cell::new(1),
        }
    }

    fn push(&self, e: Event) {
        match self.events.try_borrow_mut() {
            Ok(mut events) => events.push(e),
            // Cannot happen (the owner never holds the borrow while progressing); never
            // unwind into C.
            Err(_) => tracing::error!("DOCA callback re-entered: event lost"),
        }
    }

    /// The events recorded since the last call.
    pub(super) fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.borrow_mut())
    }

    /// Whether events were recorded since the last call.
    pub(super) fn has_events(&self) -> bool {
        self.events.try_borrow().is_ok_and(|e| !e.is_empty())
    }

    /// Swaps the events recorded since the last call into `out` (empty), whose capacity the
    /// next events reuse: no allocation per batch.
    pub(super) fn swap_into(&self, out: &mut Vec<Event>) {
        debug_assert!(out.is_empty());
        std::mem::swap(&mut *self.events.borrow_mut(), out);
    }

    pub(super) fn new_id(&self) -> ConnId {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// The context user data that makes callbacks find this sink.
    pub(super) fn user_data(&self) -> sys::doca_data {
        sys::doca_data {
            ptr: (self as *const Sink).cast_mut().cast(),
        }
    }
}

/// # Safety
/// `ctx` is the context user data set from [`Sink::user_data`]: the sink outlives the
/// context; called from `doca_pe_progress` on the owner's thread.
unsafe fn sink<'a>(ctx: sys::doca_data) -> &'a Sink {
    // SAFETY: per the function's contract.
    unsafe { &*(ctx.ptr as *const Sink) }
}

/// # Safety
/// Called by DOCA from `doca_pe_progress` with a live task of type `kind`, whose generic task
/// is `task`; see [`sink`].
unsafe fn on_task(
    kind: Kind,
    task: *mut sys::doca_task,
    receive: *const sys::doca_rdma_task_receive,
    user: sys::doca_data,
    ctx: sys::doca_data,
    ok: bool,
) {
    // SAFETY: per the function's contract.
    let sink = unsafe { sink(ctx) };
    // A receive is known by the integer in its user data, any other task by its address
    // (the key of its operation, see `Task::key`).
    let user = if receive.is_null() {
        task as usize as u64
    } else {
        // SAFETY: every receive of this transport carries an integer in its user data.
        unsafe { user.u64_ }
    };
    let status = if ok {
        sys::DOCA_SUCCESS
    } else {
        // SAFETY: a live task, in its completion callback.
        unsafe { sys::doca_task_get_status(task) }
    };
    let recv = (ok && !receive.is_null()).then(|| {
        // SAFETY: a successful receive in its completion callback: its results are valid.
        let opcode = unsafe { sys::doca_rdma_task_receive_get_result_opcode(receive) };
        let with_imm = opcode == sys::DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM
            || opcode == sys::DOCA_RDMA_OPCODE_RECV_WRITE_WITH_IMM;
        // SAFETY: as above; the immediate is read only for the opcodes that carry one.
        unsafe {
            RecvResult {
                len: sys::doca_rdma_task_receive_get_result_len(receive),
                opcode,
                imm: with_imm.then(|| {
                    u32::from_be(sys::doca_rdma_task_receive_get_result_immediate_data(
                        receive,
                    ))
                }),
                conn: sys::doca_rdma_task_receive_get_result_rdma_connection(receive) as usize,
            }
        }
    });
    sink.push(Event::Task {
        kind,
        user,
        status,
        recv,
    });
}

macro_rules! task_callbacks {
    ($ok:ident, $err:ident, $ty:ty, $as_task:path, $kind:expr, $receive:expr) => {
        pub(super) unsafe extern "C" fn $ok(
            task: *mut $ty,
            user: sys::doca_data,
            ctx: sys::doca_data,
        ) {
            // SAFETY: DOCA calls this from progress with a live task of this type.
            unsafe { on_task($kind, $as_task(task), $receive(task), user, ctx, true) }
        }
        pub(super) unsafe extern "C" fn $err(
            task: *mut $ty,
            user: sys::doca_data,
            ctx: sys::doca_data,
        ) {
            // SAFETY: as above.
            unsafe { on_task($kind, $as_task(task), $receive(task), user, ctx, false) }
        }
    };
}

fn not_receive<T>(_: *mut T) -> *const sys::doca_rdma_task_receive {
    ptr::null()
}

fn is_receive(t: *mut sys::doca_rdma_task_receive) -> *const sys::doca_rdma_task_receive {
    t
}

task_callbacks!(
    recv_ok,
    recv_err,
    sys::doca_rdma_task_receive,
    sys::doca_rdma_task_receive_as_task,
    Kind::Receive,
    is_receive
);
task_callbacks!(
    send_ok,
    send_err,
    sys::doca_rdma_task_send,
    sys::doca_rdma_task_send_as_task,
    Kind::Send,
    not_receive
);
task_callbacks!(
    send_imm_ok,
    send_imm_err,
    sys::doca_rdma_task_send_imm,
    sys::doca_rdma_task_send_imm_as_task,
    Kind::SendImm,
    not_receive
);
task_callbacks!(
    read_ok,
    read_err,
    sys::doca_rdma_task_read,
    sys::doca_rdma_task_read_as_task,
    Kind::Read,
    not_receive
);
task_callbacks!(
    write_ok,
    write_err,
    sys::doca_rdma_task_write,
    sys::doca_rdma_task_write_as_task,
    Kind::Write,
    not_receive
);
task_callbacks!(
    write_imm_ok,
    write_imm_err,
    sys::doca_rdma_task_write_imm,
    sys::doca_rdma_task_write_imm_as_task,
    Kind::WriteImm,
    not_receive
);
task_callbacks!(
    cas_ok,
    cas_err,
    sys::doca_rdma_task_atomic_cmp_swp,
    sys::doca_rdma_task_atomic_cmp_swp_as_task,
    Kind::CmpSwp,
    not_receive
);
task_callbacks!(
    faa_ok,
    faa_err,
    sys::doca_rdma_task_atomic_fetch_add,
    sys::doca_rdma_task_atomic_fetch_add_as_task,
    Kind::FetchAdd,
    not_receive
);

pub(super) unsafe extern "C" fn on_request(
    conn: *mut sys::doca_rdma_connection,
    ctx: sys::doca_data,
) {
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

pub(super) unsafe extern "C" fn on_established(
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
        pub(super) unsafe extern "C" fn $name(
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
