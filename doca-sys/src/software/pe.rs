//! Progress engine, context state machine, and callback delivery.

use super::*;

/// A callback resolved under the lock and invoked after releasing it.
enum Call {
    State(doca_ctx_state_changed_callback_t, UserData, H, u32, u32),
    Request(doca_rdma_connection_request_cb_t, H, UserData),
    Conn(doca_rdma_connection_established_cb_t, H, UserData, UserData),
    /// Callback, task, task user data, context user data, successful receive.
    Task(Option<TaskCb>, H, UserData, UserData, bool),
}

impl Call {
    /// # Safety
    /// The callbacks were registered by the application for exactly these arguments.
    unsafe fn invoke(self) {
        // The successful completion callback of a receive is the only place where
        // `doca_rdma_task_receive_get_result_rdma_connection` is defined.
        let success_task = match self {
            Call::Task(Some(_), task, _, _, true) => task,
            _ => 0,
        };
        SUCCESS_CB_TASK.with(|t| t.set(success_task));
        // SAFETY: (all arms) DOCA calls registered callbacks with the object pointers and user
        // data they were registered for; the handles are live objects of this provider.
        unsafe {
            match self {
                Call::State(Some(cb), ud, ctx, prev, next) => {
                    cb(ud.0, ctx as *mut doca_ctx, prev, next)
                }
                Call::Request(Some(cb), conn, ud) => cb(conn as *mut doca_rdma_connection, ud.0),
                Call::Conn(Some(cb), conn, cud, ud) => {
                    cb(conn as *mut doca_rdma_connection, cud.0, ud.0)
                }
                Call::Task(Some(cb), task, tud, ud, _) => cb(task as *mut doca_task, tud.0, ud.0),
                _ => {}
            }
        }
        SUCCESS_CB_TASK.with(|t| t.set(0));
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_pe_create(pe: *mut *mut doca_pe) -> doca_error_t {
    if pe.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: plain eventfd creation.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return DOCA_ERROR_OPERATING_SYSTEM;
    }
    let h = new_handle();
    world().pes.insert(
        h,
        Pe {
            ctxs: Vec::new(),
            queue: VecDeque::new(),
            efd,
            armed: false,
            timer: false,
        },
    );
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *pe = h as *mut doca_pe };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_pe_destroy(pe: *mut doca_pe) -> doca_error_t {
    let mut w = world();
    match w.pes.get(&(pe as H)) {
        None => return DOCA_ERROR_INVALID_VALUE,
        Some(p) if !p.ctxs.is_empty() => return DOCA_ERROR_IN_USE,
        Some(_) => {}
    }
    let p = w.pes.remove(&(pe as H)).expect("checked above");
    // SAFETY: the eventfd belongs to this progress engine and is closed once.
    unsafe { libc::close(p.efd) };
    free_handle(pe as H);
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_pe_connect_ctx(
    pe: *mut doca_pe,
    ctx: *mut doca_ctx,
) -> doca_error_t {
    let (pe, ctx) = (pe as H, ctx as H);
    let mut w = world();
    if !w.pes.contains_key(&pe) {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let Some(r) = w.rdmas.get_mut(&ctx) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if r.state != DOCA_CTX_STATE_IDLE {
        return DOCA_ERROR_BAD_STATE;
    }
    if r.pe.is_some() {
        // Documented: the context is already connected to a progress engine (this one too).
        return DOCA_ERROR_NOT_PERMITTED;
    }
    r.pe = Some(pe);
    w.pes.get_mut(&pe).expect("checked above").ctxs.push(ctx);
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_pe_progress(pe: *mut doca_pe) -> u8 {
    if IN_PROGRESS.with(Cell::get) {
        violation(format!(
            "doca_pe_progress(pe {:#x}): called from a callback running inside doca_pe_progress \
             (the callback documentation forbids it); nothing was progressed",
            pe as H
        ));
        return 0;
    }
    // One callback per call: doca_pe.h describes a call as serving the next context with a
    // completed task, running that task's callback (stricter reading: never a batch).
    let Some(call) = world().prepare_progress(pe as H) else {
        return 0;
    };
    IN_PROGRESS.with(|p| p.set(true));
    // SAFETY: a callback registered by the application; called without the lock.
    unsafe { call.invoke() };
    IN_PROGRESS.with(|p| p.set(false));
    1
}

impl World {
    /// Advances time-driven state of a progress engine and takes its next queued callback.
    fn prepare_progress(&mut self, pe: H) -> Option<Call> {
        if !self.pes.contains_key(&pe) {
            return None;
        }
        // The clock is read once, and only if some send waits for a receive.
        let mut now = None;
        // By index, not over a copy: this runs on every poll, usually with nothing to do (no
        // context anywhere changing state or with a send waiting: no context to look at).
        let mut i = 0;
        let anything = self.contexts_changing_state > 0 || self.contexts_with_waiting_sends > 0;
        while let Some(ctx) = anything
            .then(|| self.pes.get(&pe).and_then(|p| p.ctxs.get(i)).copied())
            .flatten()
        {
            self.advance_ctx(ctx, &mut now);
            i += 1;
        }
        // Events that no longer call anything (a request withdrawn meanwhile) are skipped.
        loop {
            let event = self.pes.get_mut(&pe)?.queue.pop_front()?;
            if let Some(call) = self.resolve(event) {
                return Some(call);
            }
        }
    }

    fn advance_ctx(&mut self, ctx: H, now: &mut Option<Instant>) {
        let Some(r) = self.rdmas.get_mut(&ctx) else {
            return;
        };
        // A state change waits until the callback of the previous one was delivered: the
        // callback runs while the context is in the state it announces (doca_ctx.h).
        let settled = r.state_events == 0;
        if r.state == DOCA_CTX_STATE_STARTING {
            if settled {
                self.set_state(ctx, DOCA_CTX_STATE_RUNNING);
                self.enqueue_state(ctx, DOCA_CTX_STATE_STARTING, DOCA_CTX_STATE_RUNNING);
            }
            return;
        }
        // Receiver not ready: the oldest waiting send of each connection whose timer period
        // ended retries (a new period) or, with no retry left, fails.
        let mut i = 0;
        let mut waiting = false;
        while let Some(conn) = self
            .rdmas
            .get(&ctx)
            .filter(|r| r.sends_wait)
            .and_then(|r| r.conns.get(i))
            .copied()
        {
            i += 1;
            let front = self.conns.get(&conn).and_then(|c| c.pending.front());
            waiting |= front.is_some();
            let expired = front
                .filter(|t| {
                    self.tasks
                        .get(t)
                        .and_then(|t| t.deadline)
                        .is_some_and(|d| d <= *now.get_or_insert_with(Instant::now))
                })
                .copied();
            let Some(task) = expired else {
                continue;
            };
            let dev = self.rdmas.get(&ctx).expect("checked above").dev;
            let t = self.tasks.get_mut(&task).expect("a waiting send exists");
            match t.rnr_retries_left {
                Some(0) => {
                    counters::rnr_failure(dev);
                    self.complete(task, ERR_TASK);
                    self.conn_error(conn);
                }
                left => {
                    t.rnr_retries_left = left.map(|n| n - 1);
                    t.deadline = now.map(|n| n + rnr_timeout());
                    counters::rnr_retry(dev);
                }
            }
        }
        if !waiting {
            self.set_sends_wait(ctx, false);
        }
        let r = self.rdmas.get_mut(&ctx).expect("checked above");
        if settled && r.state == DOCA_CTX_STATE_STOPPING && r.inflight == 0 && r.allocated() == 0 {
            self.set_state(ctx, DOCA_CTX_STATE_IDLE);
            self.enqueue_state(ctx, DOCA_CTX_STATE_STOPPING, DOCA_CTX_STATE_IDLE);
        }
    }

    /// Turns a queued event into the callback to run, updating state for delivery.
    fn resolve(&mut self, event: Event) -> Option<Call> {
        match event {
            Event::State { ctx, prev, next } => {
                let r = self.rdmas.get_mut(&ctx)?;
                r.state_events = r.state_events.saturating_sub(1);
                Some(Call::State(r.state_cb, r.user_data, ctx, prev, next))
            }
            Event::Request(conn) => {
                let c = self.conns.get(&conn)?;
                if c.state != ConnState::Requested {
                    return None;
                }
                let r = self.rdmas.get(&c.rdma)?;
                if r.request_cb.is_none() {
                    self.reject(conn);
                    return None;
                }
                Some(Call::Request(r.request_cb, conn, r.user_data))
            }
            Event::Established(conn) | Event::Failure(conn) | Event::Disconnect(conn) => {
                if let Event::Established(_) = event {
                    // The application learns of the connection now: from here on tasks may
                    // use it (and the context may post receives).
                    let c = self.conns.get_mut(&conn)?;
                    c.usable = true;
                    let rdma = c.rdma;
                    self.rdmas.get_mut(&rdma)?.connected_once = true;
                }
                let c = self.conns.get(&conn)?;
                let r = self.rdmas.get(&c.rdma)?;
                let cb = match event {
                    Event::Established(_) => r.established_cb,
                    Event::Failure(_) => r.failure_cb,
                    _ if c.state == ConnState::PeerGone => r.disconnect_cb,
                    _ => return None,
                };
                Some(Call::Conn(cb, conn, c.user_data, r.user_data))
            }
            Event::TaskDone(task) => {
                let t = self.tasks.get_mut(&task)?;
                if t.phase != Phase::Completing {
                    return None;
                }
                t.phase = Phase::Idle;
                t.completed = true;
                let (rdma, kind, status, tud) = (t.rdma, t.kind, t.status, t.user_data);
                let r = self.rdmas.get_mut(&rdma)?;
                r.inflight -= 1;
                let conf = r.confs[kind.index()];
                let cb = if status == DOCA_SUCCESS {
                    conf.success
                } else {
                    conf.error
                };
                let receive_ok = kind == Kind::Receive && status == DOCA_SUCCESS;
                Some(Call::Task(cb, task, tud, r.user_data, receive_ok))
            }
        }
    }

    /// Server side reject: the client gets its failure callback.
    pub(super) fn reject(&mut self, conn: H) {
        let peer = self.conns.get(&conn).and_then(|c| c.peer);
        self.set_conn_state(conn, ConnState::Disconnected);
        if let Some(p) = peer {
            self.fail_client(p);
        }
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_pe_get_notification_handle(
    pe: *const doca_pe,
    handle: *mut doca_notification_handle_t,
) -> doca_error_t {
    let w = world();
    let Some(p) = w.pes.get(&(pe as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if handle.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *handle = p.efd };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_pe_request_notification(pe: *mut doca_pe) -> doca_error_t {
    let pe = pe as H;
    let mut w = world();
    let now = Instant::now();
    let has_completion = w.pe_has_completion(pe, now);
    let deadline = w.earliest_deadline(pe);
    let Some(p) = w.pes.get_mut(&pe) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if has_completion {
        p.armed = false;
        signal_fd(p.efd);
        return DOCA_SUCCESS;
    }
    p.armed = true;
    if let Some(deadline) = deadline {
        if !p.timer {
            // Wake the engine when a receiver-not-ready deadline expires.
            p.timer = true;
            std::thread::spawn(move || {
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                let mut w = world();
                if let Some(p) = w.pes.get_mut(&pe) {
                    p.timer = false;
                    if p.armed {
                        p.armed = false;
                        signal_fd(p.efd);
                    }
                }
            });
        }
    }
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_pe_clear_notification(
    pe: *mut doca_pe,
    handle: doca_notification_handle_t,
) -> doca_error_t {
    let w = world();
    let Some(p) = w.pes.get(&(pe as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if p.efd != handle {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live local from the engine's non-blocking eventfd.
    let _ = unsafe { libc::read(p.efd, (&mut value as *mut u64).cast::<c_void>(), 8) };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_ctx_start(ctx: *mut doca_ctx) -> doca_error_t {
    let ctx = ctx as H;
    let mut w = world();
    let Some(r) = w.rdmas.get_mut(&ctx) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if r.pe.is_none() {
        return DOCA_ERROR_NOT_CONNECTED;
    }
    if r.state != DOCA_CTX_STATE_IDLE {
        return DOCA_ERROR_BAD_STATE;
    }
    // SAFETY: the device outlives the context (`doca_dev_close` refuses while it is in use).
    if !unsafe { super::device::rdma_supported(r.dev) } {
        return DOCA_ERROR_NOT_SUPPORTED;
    }
    // An RDMA context starts asynchronously: STARTING now, RUNNING from progress.
    r.connected_once = false;
    w.set_state(ctx, DOCA_CTX_STATE_STARTING);
    w.enqueue_state(ctx, DOCA_CTX_STATE_IDLE, DOCA_CTX_STATE_STARTING);
    DOCA_ERROR_IN_PROGRESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_ctx_stop(ctx: *mut doca_ctx) -> doca_error_t {
    let ctx = ctx as H;
    let mut w = world();
    let Some(r) = w.rdmas.get_mut(&ctx) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if r.pe.is_none() {
        return DOCA_ERROR_NOT_CONNECTED;
    }
    let prev = r.state;
    match prev {
        // Stricter choice: stopping an idle context is refused.
        DOCA_CTX_STATE_IDLE => return DOCA_ERROR_BAD_STATE,
        DOCA_CTX_STATE_STOPPING => return DOCA_ERROR_IN_PROGRESS,
        _ => {}
    }
    let listening = std::mem::take(&mut r.listening);
    let conns = r.conns.clone();
    // Taken off their queue here, so completing each searches no queue (a context with
    // thousands of posted receives stops in linear time).
    let recvs = std::mem::take(&mut r.recvs);
    // Tasks accepted without a flush complete too (those of a connection already did, with
    // its disconnection): once each, as every outstanding task.
    let unflushed = r.unflushed.clone();
    for port in listening {
        w.listeners.remove(&port);
    }
    for conn in conns {
        let _ = w.disconnect(conn);
    }
    for task in recvs {
        w.complete_dequeued(task, ERR_FLUSH);
    }
    for task in unflushed {
        w.complete(task, ERR_FLUSH);
    }
    let r = w.rdmas.get_mut(&ctx).expect("checked above");
    let done = r.inflight == 0 && r.allocated() == 0;
    let next = if done {
        DOCA_CTX_STATE_IDLE
    } else {
        DOCA_CTX_STATE_STOPPING
    };
    w.set_state(ctx, next);
    w.enqueue_state(ctx, prev, next);
    if done {
        DOCA_SUCCESS
    } else {
        DOCA_ERROR_IN_PROGRESS
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_ctx_flush_tasks(ctx: *mut doca_ctx) {
    let h = ctx as H;
    let mut w = world();
    match w.rdmas.get(&h).map(|r| r.state) {
        // No return value: misuse is recorded.
        None => violation(format!(
            "doca_ctx_flush_tasks(ctx {h:#x}): not a context; nothing flushed"
        )),
        Some(DOCA_CTX_STATE_IDLE) => violation(format!(
            "doca_ctx_flush_tasks(ctx {h:#x}): the context is idle (it must not be); nothing \
             flushed"
        )),
        Some(_) => w.flush_unflushed(h),
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_ctx_get_state(
    ctx: *const doca_ctx,
    state: *mut doca_ctx_states,
) -> doca_error_t {
    let w = world();
    let Some(r) = w.rdmas.get(&(ctx as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if state.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *state = r.state };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_ctx_set_state_changed_cb(
    ctx: *mut doca_ctx,
    cb: doca_ctx_state_changed_callback_t,
) -> doca_error_t {
    let mut w = world();
    let Some(r) = w.rdmas.get_mut(&(ctx as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if r.state != DOCA_CTX_STATE_IDLE {
        return DOCA_ERROR_BAD_STATE;
    }
    r.state_cb = cb;
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_ctx_set_user_data(
    ctx: *mut doca_ctx,
    user_data: doca_data,
) -> doca_error_t {
    let mut w = world();
    let Some(r) = w.rdmas.get_mut(&(ctx as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    r.user_data = UserData(user_data);
    DOCA_SUCCESS
}
