//! Tasks, their C ABI: configuration, allocation, the `set_*` accessors, receive results and
//! the generic task calls. What a submitted task does (the simulated NIC) is in `nic.rs`.
//!
//! Over 600 lines by nature: one small `extern "C"` function per DOCA entry point (about 50),
//! each a few lines of argument checks around a call into the world.

use super::*;

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
pub(super) fn check_bufs(
    w: &World,
    kind: Kind,
    src: H,
    dst: H,
    result: H,
) -> Result<(), &'static str> {
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
