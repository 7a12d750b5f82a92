//! Tasks: configuration, allocation, submission and the data movement they perform.

use super::memory::contains;
use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a new task carries.
#[derive(Default)]
struct Init {
    conn: Option<H>,
    src: H,
    dst: H,
    result: H,
    imm: u32,
    cmp: u64,
    swap: u64,
    add: u64,
}

fn set_conf(
    rdma: H,
    kind: Kind,
    success: Option<TaskCb>,
    error: Option<TaskCb>,
    num: u32,
) -> doca_error_t {
    if num == 0 || success.is_none() || error.is_none() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    match w.rdmas.get_mut(&rdma) {
        None => DOCA_ERROR_INVALID_VALUE,
        Some(r) if r.state != DOCA_CTX_STATE_IDLE => DOCA_ERROR_BAD_STATE,
        Some(r) => {
            let conf = &mut r.confs[kind.index()];
            conf.success = success;
            conf.error = error;
            conf.num = num;
            DOCA_SUCCESS
        }
    }
}

/// Which buffers a task may leave NULL, as DOCA documents per task type: a receive's
/// destination and a send's source (empty messages); a read's or write's source (no data),
/// and then its destination too. Atomic tasks need both buffers.
fn null_bufs_ok(kind: Kind, src: H, dst: H, result: H) -> bool {
    match kind {
        Kind::Receive | Kind::Send | Kind::SendImm => true,
        Kind::Read | Kind::Write | Kind::WriteImm => dst != 0 || src == 0,
        Kind::CmpSwp | Kind::FetchAdd => dst != 0 && result != 0,
    }
}

/// Checks a task's buffers: the NULL rules, every other buffer live, remote buffers (the
/// source of a read, the destination of writes and atomics) from an mmap created from an
/// export, local buffers from a local mmap. `Err` names the problem.
fn check_bufs(w: &World, kind: Kind, src: H, dst: H, result: H) -> Result<(), &'static str> {
    if !null_bufs_ok(kind, src, dst, result) {
        return Err("a buffer DOCA requires is NULL");
    }
    let is = |buf: H, remote: bool| {
        buf == 0
            || w.live_buf(buf)
                .and_then(|b| w.mmaps.get(&b.mmap))
                .is_some_and(|m| m.remote.is_some() == remote)
    };
    let ok = match kind {
        Kind::Receive => is(dst, false),
        Kind::Send | Kind::SendImm => is(src, false),
        Kind::Read => is(src, true) && is(dst, false),
        Kind::Write | Kind::WriteImm => is(src, false) && is(dst, true),
        Kind::CmpSwp | Kind::FetchAdd => is(dst, true) && is(result, false),
    };
    if ok {
        Ok(())
    } else {
        Err("a buffer is not a live DOCA buffer of the right side (local or remote mmap)")
    }
}

/// # Safety
/// `out` is null or writable.
unsafe fn allocate(
    rdma: H,
    kind: Kind,
    init: Init,
    user_data: doca_data,
    out: *mut H,
) -> doca_error_t {
    if out.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    let conn_ok = match init.conn {
        None => kind == Kind::Receive,
        Some(c) => w.conns.get(&c).is_some_and(|c| c.rdma == rdma),
    };
    if !conn_ok || check_bufs(&w, kind, init.src, init.dst, init.result).is_err() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    match w.rdmas.get(&rdma) {
        None => return DOCA_ERROR_INVALID_VALUE,
        // Only a running context can allocate tasks (doca_ctx_states); the code is the
        // provider's choice.
        Some(r) if r.state != DOCA_CTX_STATE_RUNNING => return DOCA_ERROR_BAD_STATE,
        Some(_) => {}
    }
    if init.conn.is_some_and(|c| !w.conn_ready(c)) {
        // Tasks that name a connection need it established (doca_rdma.h: the entries of
        // accept, connect_to_addr, start_listen_to_port and connect). The code is the
        // provider's choice: the one `doca_task_submit` answers for such a connection.
        return DOCA_ERROR_NOT_CONNECTED;
    }
    let r = w.rdmas.get_mut(&rdma).expect("checked above");
    let conf = &mut r.confs[kind.index()];
    if conf.allocated >= conf.num {
        return DOCA_ERROR_NO_MEMORY;
    }
    conf.allocated += 1;
    let h = new_handle();
    w.tasks.insert(
        h,
        Task {
            kind,
            rdma,
            conn: init.conn,
            src: init.src,
            dst: init.dst,
            result: init.result,
            imm: init.imm,
            cmp: init.cmp,
            swap: init.swap,
            add: init.add,
            user_data: UserData(user_data),
            status: DOCA_SUCCESS,
            phase: Phase::Idle,
            completed: false,
            deadline: None,
            rnr_retries_left: None,
            res_len: 0,
            res_opcode: 0,
            res_imm: 0,
            res_conn: 0,
        },
    );
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *out = h };
    DOCA_SUCCESS
}

/// Updates a field of a task the application owns (the `set_*` accessors). A task DOCA owns
/// (submitted, completion not delivered yet) is left unchanged and the call is recorded.
fn update(function: &str, task: H, f: impl FnOnce(&mut Task)) {
    match world().tasks.get_mut(&task) {
        Some(t) if t.phase == Phase::Idle => f(t),
        Some(_) => violation(format!(
            "{function}(task {task:#x}): the task is submitted (DOCA owns it until its \
             completion callback); left unchanged"
        )),
        None => violation(format!("{function}(task {task:#x}): not an allocated task")),
    }
}

macro_rules! task_type {
    ($kind:expr, $task:ident, $cb:ident, $set_conf:ident, $as_task:ident) => {
        #[no_mangle]
        pub(crate) unsafe extern "C" fn $set_conf(
            rdma: *mut doca_rdma,
            successful_task_completion_cb: $cb,
            error_task_completion_cb: $cb,
            num_tasks: u32,
        ) -> doca_error_t {
            // SAFETY: every task completion callback takes (task pointer, doca_data, doca_data);
            // pointer arguments are ABI-compatible, so the generic signature may call it.
            let (ok, err) = unsafe {
                (
                    std::mem::transmute::<$cb, Option<TaskCb>>(successful_task_completion_cb),
                    std::mem::transmute::<$cb, Option<TaskCb>>(error_task_completion_cb),
                )
            };
            set_conf(rdma as H, $kind, ok, err, num_tasks)
        }

        #[no_mangle]
        pub(crate) unsafe extern "C" fn $as_task(task: *mut $task) -> *mut doca_task {
            task.cast()
        }
    };
}

task_type!(
    Kind::Receive,
    doca_rdma_task_receive,
    doca_rdma_task_receive_completion_cb_t,
    doca_rdma_task_receive_set_conf,
    doca_rdma_task_receive_as_task
);
task_type!(
    Kind::Send,
    doca_rdma_task_send,
    doca_rdma_task_send_completion_cb_t,
    doca_rdma_task_send_set_conf,
    doca_rdma_task_send_as_task
);
task_type!(
    Kind::SendImm,
    doca_rdma_task_send_imm,
    doca_rdma_task_send_imm_completion_cb_t,
    doca_rdma_task_send_imm_set_conf,
    doca_rdma_task_send_imm_as_task
);
task_type!(
    Kind::Read,
    doca_rdma_task_read,
    doca_rdma_task_read_completion_cb_t,
    doca_rdma_task_read_set_conf,
    doca_rdma_task_read_as_task
);
task_type!(
    Kind::Write,
    doca_rdma_task_write,
    doca_rdma_task_write_completion_cb_t,
    doca_rdma_task_write_set_conf,
    doca_rdma_task_write_as_task
);
task_type!(
    Kind::WriteImm,
    doca_rdma_task_write_imm,
    doca_rdma_task_write_imm_completion_cb_t,
    doca_rdma_task_write_imm_set_conf,
    doca_rdma_task_write_imm_as_task
);
task_type!(
    Kind::CmpSwp,
    doca_rdma_task_atomic_cmp_swp,
    doca_rdma_task_atomic_cmp_swp_completion_cb_t,
    doca_rdma_task_atomic_cmp_swp_set_conf,
    doca_rdma_task_atomic_cmp_swp_as_task
);
task_type!(
    Kind::FetchAdd,
    doca_rdma_task_atomic_fetch_add,
    doca_rdma_task_atomic_fetch_add_completion_cb_t,
    doca_rdma_task_atomic_fetch_add_set_conf,
    doca_rdma_task_atomic_fetch_add_as_task
);

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_receive_allocate_init(
    rdma: *mut doca_rdma,
    dst_buf: *mut doca_buf,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_receive,
) -> doca_error_t {
    let init = Init {
        dst: dst_buf as H,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::Receive, init, user_data, task.cast()) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_send_allocate_init(
    rdma: *mut doca_rdma,
    rdma_connection: *mut doca_rdma_connection,
    src_buf: *const doca_buf,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_send,
) -> doca_error_t {
    let init = Init {
        conn: Some(rdma_connection as H),
        src: src_buf as H,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::Send, init, user_data, task.cast()) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_send_imm_allocate_init(
    rdma: *mut doca_rdma,
    rdma_connection: *mut doca_rdma_connection,
    src_buf: *const doca_buf,
    immediate_data: doca_be32_t,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_send_imm,
) -> doca_error_t {
    let init = Init {
        conn: Some(rdma_connection as H),
        src: src_buf as H,
        imm: immediate_data,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::SendImm, init, user_data, task.cast()) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_read_allocate_init(
    rdma: *mut doca_rdma,
    rdma_connection: *mut doca_rdma_connection,
    src_buf: *const doca_buf,
    dst_buf: *mut doca_buf,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_read,
) -> doca_error_t {
    let init = Init {
        conn: Some(rdma_connection as H),
        src: src_buf as H,
        dst: dst_buf as H,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::Read, init, user_data, task.cast()) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_write_allocate_init(
    rdma: *mut doca_rdma,
    rdma_connection: *mut doca_rdma_connection,
    src_buf: *const doca_buf,
    dst_buf: *mut doca_buf,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_write,
) -> doca_error_t {
    let init = Init {
        conn: Some(rdma_connection as H),
        src: src_buf as H,
        dst: dst_buf as H,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::Write, init, user_data, task.cast()) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_write_imm_allocate_init(
    rdma: *mut doca_rdma,
    rdma_connection: *mut doca_rdma_connection,
    src_buf: *const doca_buf,
    dst_buf: *mut doca_buf,
    immediate_data: doca_be32_t,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_write_imm,
) -> doca_error_t {
    let init = Init {
        conn: Some(rdma_connection as H),
        src: src_buf as H,
        dst: dst_buf as H,
        imm: immediate_data,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::WriteImm, init, user_data, task.cast()) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_cmp_swp_allocate_init(
    rdma: *mut doca_rdma,
    rdma_connection: *mut doca_rdma_connection,
    dst_buf: *mut doca_buf,
    result_buf: *mut doca_buf,
    cmp_data: u64,
    swap_data: u64,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_atomic_cmp_swp,
) -> doca_error_t {
    let init = Init {
        conn: Some(rdma_connection as H),
        dst: dst_buf as H,
        result: result_buf as H,
        cmp: cmp_data,
        swap: swap_data,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::CmpSwp, init, user_data, task.cast()) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_fetch_add_allocate_init(
    rdma: *mut doca_rdma,
    rdma_connection: *mut doca_rdma_connection,
    dst_buf: *mut doca_buf,
    result_buf: *mut doca_buf,
    add_data: u64,
    user_data: doca_data,
    task: *mut *mut doca_rdma_task_atomic_fetch_add,
) -> doca_error_t {
    let init = Init {
        conn: Some(rdma_connection as H),
        dst: dst_buf as H,
        result: result_buf as H,
        add: add_data,
        ..Init::default()
    };
    // SAFETY: `task` is writable per the contract.
    unsafe { allocate(rdma as H, Kind::FetchAdd, init, user_data, task.cast()) }
}

// ---- set_* accessors (idle tasks only) ----

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_receive_set_dst_buf(
    task: *mut doca_rdma_task_receive,
    dst_buf: *mut doca_buf,
) {
    update("doca_rdma_task_receive_set_dst_buf", task as H, |t| {
        t.dst = dst_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_send_set_src_buf(
    task: *mut doca_rdma_task_send,
    src_buf: *const doca_buf,
) {
    update("doca_rdma_task_send_set_src_buf", task as H, |t| {
        t.src = src_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_send_imm_set_src_buf(
    task: *mut doca_rdma_task_send_imm,
    src_buf: *const doca_buf,
) {
    update("doca_rdma_task_send_imm_set_src_buf", task as H, |t| {
        t.src = src_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_send_imm_set_immediate_data(
    task: *mut doca_rdma_task_send_imm,
    immediate_data: doca_be32_t,
) {
    update(
        "doca_rdma_task_send_imm_set_immediate_data",
        task as H,
        |t| t.imm = immediate_data,
    );
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_read_set_src_buf(
    task: *mut doca_rdma_task_read,
    src_buf: *const doca_buf,
) {
    update("doca_rdma_task_read_set_src_buf", task as H, |t| {
        t.src = src_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_read_set_dst_buf(
    task: *mut doca_rdma_task_read,
    dst_buf: *mut doca_buf,
) {
    update("doca_rdma_task_read_set_dst_buf", task as H, |t| {
        t.dst = dst_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_write_set_src_buf(
    task: *mut doca_rdma_task_write,
    src_buf: *const doca_buf,
) {
    update("doca_rdma_task_write_set_src_buf", task as H, |t| {
        t.src = src_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_write_set_dst_buf(
    task: *mut doca_rdma_task_write,
    dst_buf: *mut doca_buf,
) {
    update("doca_rdma_task_write_set_dst_buf", task as H, |t| {
        t.dst = dst_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_write_imm_set_src_buf(
    task: *mut doca_rdma_task_write_imm,
    src_buf: *const doca_buf,
) {
    update("doca_rdma_task_write_imm_set_src_buf", task as H, |t| {
        t.src = src_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_write_imm_set_dst_buf(
    task: *mut doca_rdma_task_write_imm,
    dst_buf: *mut doca_buf,
) {
    update("doca_rdma_task_write_imm_set_dst_buf", task as H, |t| {
        t.dst = dst_buf as H
    });
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_write_imm_set_immediate_data(
    task: *mut doca_rdma_task_write_imm,
    immediate_data: doca_be32_t,
) {
    update(
        "doca_rdma_task_write_imm_set_immediate_data",
        task as H,
        |t| t.imm = immediate_data,
    );
}

macro_rules! set_connection {
    ($($name:ident: $task:ident),* $(,)?) => {$(
        #[no_mangle]
        pub(crate) unsafe extern "C" fn $name(
            task: *mut $task,
            rdma_connection: *mut doca_rdma_connection,
        ) {
            update(stringify!($name), task as H, |t| t.conn = Some(rdma_connection as H));
        }
    )*};
}

set_connection!(
    doca_rdma_task_send_set_rdma_connection: doca_rdma_task_send,
    doca_rdma_task_send_imm_set_rdma_connection: doca_rdma_task_send_imm,
    doca_rdma_task_read_set_rdma_connection: doca_rdma_task_read,
    doca_rdma_task_write_set_rdma_connection: doca_rdma_task_write,
    doca_rdma_task_write_imm_set_rdma_connection: doca_rdma_task_write_imm,
    doca_rdma_task_atomic_cmp_swp_set_rdma_connection: doca_rdma_task_atomic_cmp_swp,
    doca_rdma_task_atomic_fetch_add_set_rdma_connection: doca_rdma_task_atomic_fetch_add,
);

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_cmp_swp_set_dst_buf(
    task: *mut doca_rdma_task_atomic_cmp_swp,
    dst_buf: *mut doca_buf,
) {
    update(
        "doca_rdma_task_atomic_cmp_swp_set_dst_buf",
        task as H,
        |t| t.dst = dst_buf as H,
    );
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_cmp_swp_set_result_buf(
    task: *mut doca_rdma_task_atomic_cmp_swp,
    result_buf: *mut doca_buf,
) {
    update(
        "doca_rdma_task_atomic_cmp_swp_set_result_buf",
        task as H,
        |t| t.result = result_buf as H,
    );
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_cmp_swp_set_cmp_data(
    task: *mut doca_rdma_task_atomic_cmp_swp,
    cmp_data: u64,
) {
    update(
        "doca_rdma_task_atomic_cmp_swp_set_cmp_data",
        task as H,
        |t| t.cmp = cmp_data,
    );
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_cmp_swp_set_swap_data(
    task: *mut doca_rdma_task_atomic_cmp_swp,
    swap_data: u64,
) {
    update(
        "doca_rdma_task_atomic_cmp_swp_set_swap_data",
        task as H,
        |t| t.swap = swap_data,
    );
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_fetch_add_set_dst_buf(
    task: *mut doca_rdma_task_atomic_fetch_add,
    dst_buf: *mut doca_buf,
) {
    update(
        "doca_rdma_task_atomic_fetch_add_set_dst_buf",
        task as H,
        |t| t.dst = dst_buf as H,
    );
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_fetch_add_set_result_buf(
    task: *mut doca_rdma_task_atomic_fetch_add,
    result_buf: *mut doca_buf,
) {
    update(
        "doca_rdma_task_atomic_fetch_add_set_result_buf",
        task as H,
        |t| t.result = result_buf as H,
    );
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_atomic_fetch_add_set_add_data(
    task: *mut doca_rdma_task_atomic_fetch_add,
    add_data: u64,
) {
    update(
        "doca_rdma_task_atomic_fetch_add_set_add_data",
        task as H,
        |t| t.add = add_data,
    );
}

// ---- receive results ----

/// What a result getter returns where DOCA leaves the result undefined.
const POISON: u32 = 0xDEAD_BEEF;

/// Reads a field of a task; an unknown task is a recorded violation answering `default`.
fn with_task<T>(function: &str, task: H, default: T, f: impl FnOnce(&Task) -> T) -> T {
    match world().tasks.get(&task) {
        Some(t) => f(t),
        None => {
            violation(format!("{function}(task {task:#x}): not an allocated task"));
            default
        }
    }
}

/// A receive result getter: `valid` says whether DOCA defines the result for this task now;
/// otherwise the call is recorded and answers `poison`.
fn receive_result<T>(
    function: &str,
    task: H,
    poison: T,
    valid: impl FnOnce(&Task) -> Result<(), &'static str>,
    value: impl FnOnce(&Task) -> T,
) -> T {
    let w = world();
    let Some(t) = w.tasks.get(&task).filter(|t| t.kind == Kind::Receive) else {
        violation(format!(
            "{function}(task {task:#x}): not an allocated receive task"
        ));
        return poison;
    };
    let valid = if t.phase != Phase::Idle || !t.completed {
        Err("before the completion of the task")
    } else {
        valid(t)
    };
    match valid {
        Ok(()) => value(t),
        Err(why) => {
            violation(format!(
                "{function}(task {task:#x}): undefined {why}; answered a poison value"
            ));
            poison
        }
    }
}

fn succeeded(t: &Task) -> Result<(), &'static str> {
    if t.status == DOCA_SUCCESS {
        Ok(())
    } else {
        Err("after a failed completion")
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_receive_get_dst_buf(
    task: *const doca_rdma_task_receive,
) -> *mut doca_buf {
    with_task(
        "doca_rdma_task_receive_get_dst_buf",
        task as H,
        std::ptr::null_mut(),
        |t| t.dst as *mut doca_buf,
    )
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_receive_get_result_len(
    task: *const doca_rdma_task_receive,
) -> u32 {
    receive_result(
        "doca_rdma_task_receive_get_result_len",
        task as H,
        POISON,
        succeeded,
        |t| t.res_len,
    )
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_receive_get_result_opcode(
    task: *const doca_rdma_task_receive,
) -> doca_rdma_opcode {
    // Defined after any completion (DOCA: "valid only after completion").
    receive_result(
        "doca_rdma_task_receive_get_result_opcode",
        task as H,
        POISON,
        |_| Ok(()),
        |t| t.res_opcode,
    )
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_receive_get_result_immediate_data(
    task: *const doca_rdma_task_receive,
) -> doca_be32_t {
    receive_result(
        "doca_rdma_task_receive_get_result_immediate_data",
        task as H,
        POISON,
        |t| {
            succeeded(t)?;
            match t.res_opcode {
                DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM | DOCA_RDMA_OPCODE_RECV_WRITE_WITH_IMM => {
                    Ok(())
                }
                _ => Err("for a message without immediate data (opcode RECV_SEND)"),
            }
        },
        |t| t.res_imm,
    )
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_task_receive_get_result_rdma_connection(
    task: *const doca_rdma_task_receive,
) -> *const doca_rdma_connection {
    let h = task as H;
    receive_result(
        "doca_rdma_task_receive_get_result_rdma_connection",
        h,
        POISON as usize as *const doca_rdma_connection,
        |_| {
            if SUCCESS_CB_TASK.with(Cell::get) == h {
                Ok(())
            } else {
                Err("outside the successful completion callback of the task")
            }
        },
        |t| t.res_conn as *const doca_rdma_connection,
    )
}

// ---- generic task calls ----

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_task_free(task: *mut doca_task) {
    let h = task as H;
    let mut w = world();
    let Some(t) = w.tasks.get(&h) else {
        violation(format!(
            "doca_task_free(task {h:#x}): not an allocated task"
        ));
        return;
    };
    if t.phase != Phase::Idle {
        // A submitted task belongs to DOCA: keep it alive rather than dangle.
        violation(format!(
            "doca_task_free(task {h:#x}): the task is submitted (only a task that is not \
             submitted may be freed); not freed"
        ));
        return;
    }
    let t = w.tasks.remove(&h).expect("checked");
    if let Some(r) = w.rdmas.get_mut(&t.rdma) {
        r.confs[t.kind.index()].allocated -= 1;
    }
    free_handle(h);
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_task_get_status(task: *const doca_task) -> doca_error_t {
    with_task(
        "doca_task_get_status",
        task as H,
        DOCA_ERROR_INVALID_VALUE,
        |t| t.status,
    )
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_task_get_user_data(task: *const doca_task) -> doca_data {
    with_task("doca_task_get_user_data", task as H, UserData::NULL, |t| {
        t.user_data
    })
    .0
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_task_set_user_data(
    task: *mut doca_task,
    user_data: doca_data,
) {
    let h = task as H;
    match world().tasks.get_mut(&h) {
        Some(t) => t.user_data = UserData(user_data),
        None => violation(format!(
            "doca_task_set_user_data(task {h:#x}): not an allocated task"
        )),
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_task_submit(task: *mut doca_task) -> doca_error_t {
    // The default submit behaviour is a flush (doca_pe.h: enum doca_task_submit_flag).
    world().submit("doca_task_submit", task as H, true)
}

/// The flags `doca_task_submit_ex` knows.
const SUBMIT_FLAGS: u32 = DOCA_TASK_SUBMIT_FLAG_FLUSH | DOCA_TASK_SUBMIT_FLAG_OPTIMIZE_REPORTS;

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_task_submit_ex(
    task: *mut doca_task,
    flags: u32,
) -> doca_error_t {
    let h = task as H;
    if flags & !SUBMIT_FLAGS != 0 {
        // Stricter choice: DOCA defines only the bits of enum doca_task_submit_flag.
        violation(format!(
            "doca_task_submit_ex(task {h:#x}): unknown flag bits {:#x}; refused",
            flags & !SUBMIT_FLAGS
        ));
        return DOCA_ERROR_INVALID_VALUE;
    }
    // OPTIMIZE_REPORTS only allows DOCA to report completions together: the provider reports
    // each one as usual.
    world().submit(
        "doca_task_submit_ex",
        h,
        flags & DOCA_TASK_SUBMIT_FLAG_FLUSH != 0,
    )
}

/// Bytes of data a (non-NULL) buffer describes.
fn data_len(w: &World, buf: H) -> usize {
    w.live_buf(buf).map_or(0, |b| b.data_len)
}

impl World {
    /// `doca_task_submit` (`flush`) and `doca_task_submit_ex`: validates and accepts the task
    /// (DOCA owns it from here on); with `flush`, starts every unflushed task of its context
    /// and then this one (one doorbell), otherwise leaves it unflushed.
    fn submit(&mut self, function: &str, task: H, flush: bool) -> doca_error_t {
        // `doca_task_submit` does not validate the task: an invalid one is undefined on DOCA.
        // The provider refuses it (INVALID_VALUE) and records the call.
        let invalid = |why: &str| {
            violation(format!("{function}(task {task:#x}): {why}"));
            DOCA_ERROR_INVALID_VALUE
        };
        let Some(t) = self.tasks.get(&task) else {
            return invalid("not an allocated task");
        };
        if t.phase != Phase::Idle {
            violation(format!(
                "{function}(task {task:#x}): the task is already submitted"
            ));
            return DOCA_ERROR_IN_USE;
        }
        let (kind, rdma, conn) = (t.kind, t.rdma, t.conn);
        let (src, dst, result) = (t.src, t.dst, t.result);
        let Some(r) = self.rdmas.get(&rdma) else {
            return invalid("its context is gone");
        };
        if r.state != DOCA_CTX_STATE_RUNNING {
            return DOCA_ERROR_BAD_STATE;
        }
        let connected_once = r.connected_once;
        // A connection set with `*_set_rdma_connection` must be one of the task's context.
        if conn.is_some_and(|c| self.conns.get(&c).is_none_or(|c| c.rdma != rdma)) {
            return invalid("its connection is not a connection of the task's context");
        }
        if let Err(why) = check_bufs(self, kind, src, dst, result) {
            return invalid(why);
        }
        // Stricter choice: "no data" is spelled with a NULL buffer (documented); a non-NULL
        // buffer with an empty data section is refused.
        let empty_source = match kind {
            Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm | Kind::Read => {
                src != 0 && data_len(self, src) == 0
            }
            _ => false,
        };
        // Atomics act on the first 8 bytes of the destination's data.
        let short_target = matches!(kind, Kind::CmpSwp | Kind::FetchAdd) && data_len(self, dst) < 8;
        if empty_source || short_target {
            return DOCA_ERROR_INVALID_VALUE;
        }
        if conn.is_some_and(|c| !self.conn_ready(c)) {
            // Not established as this side knows it (its established callback not delivered,
            // or `doca_rdma_connect` not called), or disconnected.
            return DOCA_ERROR_NOT_CONNECTED;
        }
        if conn.is_none() && !connected_once {
            // A receive before any connection of the context is usable.
            return DOCA_ERROR_NOT_CONNECTED;
        }
        let t = self.tasks.get_mut(&task).expect("checked");
        t.phase = Phase::Submitted;
        t.completed = false;
        t.status = DOCA_SUCCESS;
        (t.res_len, t.res_opcode, t.res_imm, t.res_conn) = (0, 0, 0, 0);
        let r = self.rdmas.get_mut(&rdma).expect("checked");
        r.inflight += 1;
        counters::submitted(r.dev);
        if let Some(conn) = conn {
            // Outstanding from now on: an error or a disconnection of the connection completes
            // it (once), flushed to the hardware or not.
            self.conns
                .get_mut(&conn)
                .expect("checked")
                .outstanding
                .push(task);
        }
        let r = self.rdmas.get_mut(&rdma).expect("checked");
        if !flush {
            r.unflushed.push(task);
            return DOCA_SUCCESS;
        }
        counters::doorbell(r.dev);
        let earlier = std::mem::take(&mut r.unflushed);
        for t in earlier.into_iter().chain([task]) {
            self.start(t);
        }
        DOCA_SUCCESS
    }

    /// `doca_ctx_flush_tasks` of a context that is not idle: starts its unflushed tasks in
    /// submission order, one doorbell for all of them (none when there are none).
    pub(super) fn flush_unflushed(&mut self, rdma: H) {
        let Some(r) = self.rdmas.get_mut(&rdma) else {
            return;
        };
        if r.unflushed.is_empty() {
            return;
        }
        counters::doorbell(r.dev);
        for task in std::mem::take(&mut r.unflushed) {
            self.start(task);
        }
    }

    /// Hands an accepted task to the "hardware": posts a receive, queues a send-like task for
    /// a receive on the peer, or performs a one-sided operation. A task completed meanwhile
    /// (its connection failed or was disconnected while it waited for a flush) is skipped.
    fn start(&mut self, task: H) {
        let Some(t) = self
            .tasks
            .get(&task)
            .filter(|t| t.phase == Phase::Submitted)
        else {
            return;
        };
        let (kind, rdma, conn) = (t.kind, t.rdma, t.conn);
        let Some(conn) = conn else {
            // A receive: post it, then let waiting sends of any connection's peer match it.
            let Some(r) = self.rdmas.get_mut(&rdma) else {
                return;
            };
            r.recvs.push_back(task);
            // Only peers with a send waiting (usually none anywhere: nothing to look at).
            if self.contexts_with_waiting_sends == 0 {
                return;
            }
            let r = self.rdmas.get(&rdma).expect("checked");
            let peers: Vec<H> = r
                .conns
                .iter()
                .filter_map(|c| self.conns.get(c)?.peer)
                .filter(|p| self.conns.get(p).is_some_and(|p| !p.pending.is_empty()))
                .collect();
            for peer in peers {
                self.try_deliver(peer);
            }
            return;
        };
        if self.conn_state(Some(conn)) != Some(ConnState::Established) {
            self.complete(task, ERR_FLUSH);
            return;
        }
        // Out of band, the peer may not have called `doca_rdma_connect` yet: its queue pair is
        // not ready, the packets are dropped and retried until the retry budget runs out, and
        // the task fails. The provider fails it at once.
        let c = self.conns.get(&conn).expect("checked");
        if c.oob && self.conn_state(c.peer) != Some(ConnState::Established) {
            self.complete(task, ERR_TASK);
            self.conn_error(conn);
            return;
        }
        match kind {
            Kind::Send | Kind::SendImm | Kind::WriteImm => {
                let (dev, retries) = self
                    .rdmas
                    .get(&rdma)
                    .map(|r| (r.dev, r.rnr_retry_count))
                    .expect("a submitted task's context exists");
                // One receiver-not-ready timer period per try: the first try, then
                // `retries` more, without end for 7 (InfiniBand's "retry forever").
                let t = self.tasks.get_mut(&task).expect("checked");
                t.deadline = Some(Instant::now() + rnr_timeout());
                t.rnr_retries_left = (retries < super::rdma::RNR_RETRY_FOREVER).then_some(retries);
                self.conns
                    .get_mut(&conn)
                    .expect("checked")
                    .pending
                    .push_back(task);
                self.try_deliver(conn);
                let c = self.conns.get(&conn).expect("checked");
                if !c.pending.is_empty() {
                    // This send (the newest) found no receive on the peer.
                    counters::rnr_wait(dev);
                    self.set_sends_wait(c.rdma, true);
                }
            }
            _ => {
                let status = self.one_sided(task, conn);
                self.complete(task, status);
                if status != DOCA_SUCCESS {
                    self.conn_error(conn);
                }
            }
        }
    }

    /// Moves the waiting sends of `conn` into receives posted on its peer, oldest first.
    pub(super) fn try_deliver(&mut self, conn: H) {
        loop {
            let Some(c) = self.conns.get(&conn) else {
                return;
            };
            let (Some(&task), Some(peer)) = (c.pending.front(), c.peer) else {
                return;
            };
            if c.state != ConnState::Established {
                return;
            }
            let Some(peer_rdma) = self
                .conns
                .get(&peer)
                .filter(|p| p.state == ConnState::Established)
                .map(|p| p.rdma)
            else {
                return;
            };
            let Some(&recv) = self.rdmas.get(&peer_rdma).and_then(|r| r.recvs.front()) else {
                return;
            };
            self.conns
                .get_mut(&conn)
                .expect("checked")
                .pending
                .pop_front();
            self.rdmas
                .get_mut(&peer_rdma)
                .expect("checked")
                .recvs
                .pop_front();
            match self.deliver(task, conn, recv, peer) {
                Ok(()) => {
                    self.complete_dequeued(recv, DOCA_SUCCESS);
                    self.complete_dequeued(task, DOCA_SUCCESS);
                }
                Err(RecvFailure::Sender) => {
                    // Remote access error of a write-with-immediate: the receive stays posted.
                    self.rdmas
                        .get_mut(&peer_rdma)
                        .expect("checked")
                        .recvs
                        .push_front(recv);
                    self.complete_dequeued(task, ERR_TASK);
                    self.conn_error(conn);
                }
                Err(RecvFailure::Both) => {
                    self.complete_dequeued(recv, ERR_TASK);
                    self.complete_dequeued(task, ERR_TASK);
                    self.conn_error(conn);
                    self.conn_error(peer);
                }
            }
        }
    }

    /// Whether `buf` is local memory the context `rdma` may use: from a local mmap that has the
    /// context's device added and, when the operation writes it, local write access.
    fn local_ok(&self, rdma: H, buf: &Buf, write: bool) -> bool {
        let Some(dev) = self.rdmas.get(&rdma).map(|r| r.dev) else {
            return false;
        };
        self.mmaps.get(&buf.mmap).is_some_and(|m| {
            m.remote.is_none()
                && m.started
                && m.has_device(dev)
                && (!write || m.permissions & DOCA_ACCESS_FLAG_LOCAL_READ_WRITE != 0)
        })
    }

    /// Performs one send-like task into one receive.
    fn deliver(&mut self, task: H, conn: H, recv: H, peer: H) -> Result<(), RecvFailure> {
        let t = self.tasks.get(&task).expect("pending task exists");
        let (kind, imm, src, rdma) = (t.kind, t.imm, t.src, t.rdma);
        let r = self.tasks.get(&recv).expect("posted receive exists");
        let (dst, peer_rdma) = (r.dst, r.rdma);
        let (len, opcode) = match kind {
            Kind::WriteImm => {
                if self.one_sided(task, conn) != DOCA_SUCCESS {
                    return Err(RecvFailure::Sender);
                }
                (0, DOCA_RDMA_OPCODE_RECV_WRITE_WITH_IMM)
            }
            _ => {
                let s = if src == 0 {
                    None
                } else {
                    match self.live_buf(src) {
                        Some(s) if self.local_ok(rdma, s, false) => Some(s),
                        _ => return Err(RecvFailure::Both),
                    }
                };
                let len = s.map_or(0, |s| s.data_len);
                if len > 0 {
                    let d = match self.live_buf(dst) {
                        Some(d) if self.local_ok(peer_rdma, d, true) => d,
                        _ => return Err(RecvFailure::Both),
                    };
                    if len > d.tail_room() || len > u32::MAX as usize {
                        return Err(RecvFailure::Both);
                    }
                    let (from, to) = (s.expect("len > 0").data, d.data + d.data_len);
                    // SAFETY: both ranges lie inside registered memory (buffer ranges are
                    // checked against their mmaps); DOCA's contract keeps it valid while
                    // registered.
                    unsafe { std::ptr::copy(from as *const u8, to as *mut u8, len) };
                    self.bufs.get_mut(&dst).expect("checked").data_len += len;
                }
                let op = if kind == Kind::SendImm {
                    DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM
                } else {
                    DOCA_RDMA_OPCODE_RECV_SEND
                };
                (len as u32, op)
            }
        };
        let r = self.tasks.get_mut(&recv).expect("checked");
        r.res_len = len;
        r.res_opcode = opcode;
        r.res_imm = if kind == Kind::Send { 0 } else { imm };
        r.res_conn = peer;
        Ok(())
    }

    /// Checks a remote access of `len` bytes at `addr` through the remote buffer `buf`.
    fn remote_ok(&self, conn: H, buf: &Buf, addr: usize, len: usize, need: u32) -> bool {
        let Some(imported) = self.mmaps.get(&buf.mmap) else {
            return false;
        };
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        // The imported mmap must be usable by the context's device.
        let dev_ok = self
            .rdmas
            .get(&c.rdma)
            .is_some_and(|r| imported.has_device(r.dev));
        let exporter = imported
            .remote
            .and_then(|id| self.mmap_ids.get(&id))
            .and_then(|h| self.mmaps.get(h));
        let peer = c
            .peer
            .and_then(|p| self.conns.get(&p))
            .filter(|p| p.state == ConnState::Established)
            .and_then(|p| self.rdmas.get(&p.rdma));
        let peer_perms = peer.map(|r| r.permissions);
        // The key of an export is valid only on the device it was exported for (verbs: an
        // rkey belongs to its protection domain): the access must reach a peer context on
        // that device.
        let key_ok = peer.is_some_and(|r| {
            // SAFETY: a context's device stays open while the context exists
            // (`doca_dev_close` refuses).
            let peer_dev = unsafe { super::device::device_index(r.dev) };
            peer_dev.is_some() && peer_dev == imported.exported_for
        });
        match (exporter, peer_perms) {
            (Some(m), Some(perms)) => {
                dev_ok
                    && key_ok
                    && m.started
                    && m.permissions & need != 0
                    && perms & need != 0
                    && contains(m.addr, m.len, addr, len)
                    && contains(buf.addr, buf.len, addr, len)
            }
            _ => false,
        }
    }

    /// Performs a read, write (also the write of a write-with-immediate) or atomic.
    fn one_sided(&mut self, task: H, conn: H) -> doca_error_t {
        let t = self.tasks.get(&task).expect("submitted task exists");
        let (kind, rdma, src, dst, result) = (t.kind, t.rdma, t.src, t.dst, t.result);
        let (cmp, swap, add) = (t.cmp, t.swap, t.add);
        match kind {
            Kind::Write | Kind::WriteImm => {
                if src == 0 {
                    // No data: nothing to write, no remote access.
                    return DOCA_SUCCESS;
                }
                let (Some(s), Some(d)) = (self.live_buf(src), self.live_buf(dst)) else {
                    return ERR_TASK;
                };
                let (from, to, len) = (s.data, d.data + d.data_len, s.data_len);
                if !self.local_ok(rdma, s, false)
                    || !self.remote_ok(conn, d, to, len, DOCA_ACCESS_FLAG_RDMA_WRITE)
                {
                    return ERR_TASK;
                }
                // SAFETY: the source is local registered memory and the target lies inside
                // the exporting mmap's registered memory (checked above).
                unsafe { std::ptr::copy(from as *const u8, to as *mut u8, len) };
                self.bufs.get_mut(&dst).expect("checked").data_len += len;
            }
            Kind::Read => {
                if src == 0 {
                    return DOCA_SUCCESS;
                }
                let (Some(s), Some(d)) = (self.live_buf(src), self.live_buf(dst)) else {
                    return ERR_TASK;
                };
                let (from, to, len) = (s.data, d.data + d.data_len, s.data_len);
                if len > d.tail_room()
                    || !self.local_ok(rdma, d, true)
                    || !self.remote_ok(conn, s, from, len, DOCA_ACCESS_FLAG_RDMA_READ)
                {
                    return ERR_TASK;
                }
                // SAFETY: the source lies inside the exporting mmap's registered memory
                // (checked above) and the target inside the local buffer's tail room.
                unsafe { std::ptr::copy(from as *const u8, to as *mut u8, len) };
                self.bufs.get_mut(&dst).expect("checked").data_len += len;
            }
            Kind::CmpSwp | Kind::FetchAdd => {
                let (Some(d), Some(res)) = (self.live_buf(dst), self.live_buf(result)) else {
                    return ERR_TASK;
                };
                let target = d.data;
                if target % 8 != 0
                    || res.tail_room() < 8
                    || !self.local_ok(rdma, res, true)
                    || !self.remote_ok(conn, d, target, 8, DOCA_ACCESS_FLAG_RDMA_ATOMIC)
                {
                    return ERR_TASK;
                }
                // SAFETY: 8 aligned bytes inside the exporting mmap's registered memory
                // (checked above); accessed atomically as the hardware would.
                let cell = unsafe { AtomicU64::from_ptr(target as *mut u64) };
                let old = if kind == Kind::CmpSwp {
                    cell.compare_exchange(cmp, swap, Ordering::SeqCst, Ordering::SeqCst)
                        .unwrap_or_else(|v| v)
                } else {
                    cell.fetch_add(add, Ordering::SeqCst)
                };
                let to = res.data + res.data_len;
                // SAFETY: 8 bytes of tail room in the local result buffer (checked above).
                unsafe { std::ptr::write_unaligned(to as *mut u64, old) };
                self.bufs.get_mut(&result).expect("checked").data_len += 8;
            }
            _ => unreachable!("send-like tasks are delivered by try_deliver"),
        }
        DOCA_SUCCESS
    }
}

/// Which side a failed delivery fails.
enum RecvFailure {
    /// Only the sender (write-with-immediate remote access error).
    Sender,
    /// The receive and the send (length or local access error).
    Both,
}
