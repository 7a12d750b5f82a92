//! DOCA RDMA tasks, owned by the engine: one builder per operation over a typed task.
//!
//! Ownership is in the types. A [`Task`] is idle (allocated, or completed): the engine owns
//! it, may change its buffers and operands with DOCA's setters, and frees it on drop. Submitting
//! moves it into a [`Submitted`], which DOCA owns until the task's completion callback ran;
//! the submitted task keeps the `doca_buf`s it uses, so they cannot be released early, and
//! dropping a submitted task leaks it instead of freeing memory DOCA still uses.
//!
//! Every task type is reusable: DOCA 3.x has setters for the buffers, operands and connection
//! of every type, atomics included. So a context's idle tasks serve all its connections
//! ([`IdleTasks`]): a task that completes is the next one of its kind submitted, on whichever
//! connection posts next, while its memory (ours and DOCA's) is still in the cache.

use std::ptr::{self, NonNull};
use std::sync::Arc;

use doca_sys as sys;

use super::super::sys::{check, doca_error, Buf, Rdma};
use crate::error::Result;
use crate::memory::Region;

/// The task types this transport uses.
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

/// Number of kinds kept in [`IdleTasks`] (every kind but receive).
const POOLS: usize = 7;

impl Kind {
    /// Index of the pool of idle tasks of this kind (receives are reposted as they are, never
    /// pooled).
    pub(super) fn pool(self) -> Option<usize> {
        match self {
            Kind::Receive => None,
            Kind::Send => Some(0),
            Kind::SendImm => Some(1),
            Kind::Read => Some(2),
            Kind::Write => Some(3),
            Kind::WriteImm => Some(4),
            Kind::CmpSwp => Some(5),
            Kind::FetchAdd => Some(6),
        }
    }
}

/// A context's idle tasks of every kind but receive, for any of its connections: the last one
/// back is the first one out (its memory is the most likely to be in the cache). A task
/// taken from here still names the connection it last ran on; the builders name the new one
/// (`*_set_rdma_connection`) before anything else, so a task is never submitted on a
/// connection it was not built for, even one that has ended since.
#[derive(Default)]
pub(super) struct IdleTasks {
    pools: [Vec<Task>; POOLS],
    /// Takes that found no idle task (so a new one was allocated).
    #[cfg(test)]
    pub(super) empty: u64,
}

impl IdleTasks {
    /// The last idle task of `kind` put back, if any.
    pub(super) fn take(&mut self, kind: Kind) -> Option<Task> {
        let task = self.pools[kind.pool()?].pop();
        #[cfg(test)]
        if task.is_none() {
            self.empty += 1;
        }
        task
    }

    /// Keeps an idle task for reuse (receives are not kept: they are dropped, so freed).
    pub(super) fn put(&mut self, task: Task) {
        if let Some(i) = task.kind().pool() {
            self.pools[i].push(task);
        }
    }

    /// Idle tasks kept, of every kind.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.pools.iter().map(Vec::len).sum()
    }
}

/// A connection of a context, as tasks name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct ConnPtr(NonNull<sys::doca_rdma_connection>);

impl ConnPtr {
    /// # Safety
    /// `raw` is a connection of the context the tasks built on it are allocated from, and
    /// stays valid while any task submitted on it is in flight (the owner forgets a
    /// connection only once none of its operations is). An idle task may still name a
    /// connection that has gone; it is never submitted before it names a live one again.
    pub(super) unsafe fn new(raw: *mut sys::doca_rdma_connection) -> Option<ConnPtr> {
        NonNull::new(raw).map(ConnPtr)
    }

    pub(super) fn raw(self) -> *mut sys::doca_rdma_connection {
        self.0.as_ptr()
    }

    /// The address, as a map key (never turned back into a pointer).
    pub(super) fn key(self) -> usize {
        self.0.as_ptr() as usize
    }
}

/// The typed pointer of a task.
#[derive(Clone, Copy)]
enum Raw {
    Receive(NonNull<sys::doca_rdma_task_receive>),
    Send(NonNull<sys::doca_rdma_task_send>),
    SendImm(NonNull<sys::doca_rdma_task_send_imm>),
    Read(NonNull<sys::doca_rdma_task_read>),
    Write(NonNull<sys::doca_rdma_task_write>),
    WriteImm(NonNull<sys::doca_rdma_task_write_imm>),
    CmpSwp(NonNull<sys::doca_rdma_task_atomic_cmp_swp>),
    FetchAdd(NonNull<sys::doca_rdma_task_atomic_fetch_add>),
}

impl Raw {
    fn kind(self) -> Kind {
        match self {
            Raw::Receive(_) => Kind::Receive,
            Raw::Send(_) => Kind::Send,
            Raw::SendImm(_) => Kind::SendImm,
            Raw::Read(_) => Kind::Read,
            Raw::Write(_) => Kind::Write,
            Raw::WriteImm(_) => Kind::WriteImm,
            Raw::CmpSwp(_) => Kind::CmpSwp,
            Raw::FetchAdd(_) => Kind::FetchAdd,
        }
    }

    fn as_task(self) -> *mut sys::doca_task {
        // SAFETY: every variant holds a live task of its type; the `as_task` functions only
        // convert the pointer.
        unsafe {
            match self {
                Raw::Receive(t) => sys::doca_rdma_task_receive_as_task(t.as_ptr()),
                Raw::Send(t) => sys::doca_rdma_task_send_as_task(t.as_ptr()),
                Raw::SendImm(t) => sys::doca_rdma_task_send_imm_as_task(t.as_ptr()),
                Raw::Read(t) => sys::doca_rdma_task_read_as_task(t.as_ptr()),
                Raw::Write(t) => sys::doca_rdma_task_write_as_task(t.as_ptr()),
                Raw::WriteImm(t) => sys::doca_rdma_task_write_imm_as_task(t.as_ptr()),
                Raw::CmpSwp(t) => sys::doca_rdma_task_atomic_cmp_swp_as_task(t.as_ptr()),
                Raw::FetchAdd(t) => sys::doca_rdma_task_atomic_fetch_add_as_task(t.as_ptr()),
            }
        }
    }
}

/// An idle task owned by the engine; freed on drop.
pub(super) struct Task {
    raw: Raw,
}

// SAFETY: a task is only touched by the progress owner of its context (one thread at a time);
// DOCA tasks have no thread affinity.
unsafe impl Send for Task {}

/// A null `doca_buf` for an operand that is absent (an empty message).
fn buf_ptr(buf: Option<&Buf>) -> *mut sys::doca_buf {
    buf.map_or(ptr::null_mut(), Buf::raw)
}

/// Allocates one task: `alloc` gets the out-pointer and returns DOCA's status.
fn allocate<T>(
    call: &'static str,
    wrap: fn(NonNull<T>) -> Raw,
    alloc: impl FnOnce(&mut *mut T) -> sys::doca_error_t,
) -> Result<Task> {
    let mut out = ptr::null_mut();
    check(call, alloc(&mut out))?;
    let raw = NonNull::new(out).ok_or_else(|| doca_error(call, sys::DOCA_ERROR_UNEXPECTED))?;
    Ok(Task { raw: wrap(raw) })
}

const NO_USER: sys::doca_data = sys::doca_data { u64_: 0 };

impl Task {
    pub(super) fn kind(&self) -> Kind {
        self.raw.kind()
    }

    /// Takes the pointer out without freeing the task (a builder sets it up again).
    fn into_raw(self) -> Raw {
        let raw = self.raw;
        std::mem::forget(self);
        raw
    }

    /// A receive of the context into `dst` (receives match any connection).
    pub(super) fn receive(rdma: &Rdma, dst: &Buf) -> Result<Task> {
        allocate(
            "doca_rdma_task_receive_allocate_init",
            Raw::Receive,
            |out| {
                // SAFETY: a running context and a live buffer; `out` is a valid out-pointer.
                unsafe {
                    sys::doca_rdma_task_receive_allocate_init(rdma.raw(), dst.raw(), NO_USER, out)
                }
            },
        )
    }

    /// A send of `src` (`None`: an empty message), with an immediate when `imm` is set.
    /// Reuses `idle` (an idle task of the same kind of this context, last run on any of its
    /// connections) when given.
    pub(super) fn send(
        rdma: &Rdma,
        conn: ConnPtr,
        idle: Option<Task>,
        src: Option<&Buf>,
        imm: Option<u32>,
    ) -> Result<Task> {
        let src = buf_ptr(src);
        match (idle.map(Task::into_raw), imm) {
            (Some(Raw::Send(t)), None) => {
                // SAFETY: an idle send task of this context, one of its live connections; the
                // buffer (or null for an empty message) is live.
                unsafe {
                    sys::doca_rdma_task_send_set_rdma_connection(t.as_ptr(), conn.raw());
                    sys::doca_rdma_task_send_set_src_buf(t.as_ptr(), src);
                }
                Ok(Task { raw: Raw::Send(t) })
            }
            (Some(Raw::SendImm(t)), Some(imm)) => {
                // SAFETY: as above.
                unsafe {
                    sys::doca_rdma_task_send_imm_set_rdma_connection(t.as_ptr(), conn.raw());
                    sys::doca_rdma_task_send_imm_set_src_buf(t.as_ptr(), src);
                    sys::doca_rdma_task_send_imm_set_immediate_data(t.as_ptr(), imm.to_be());
                }
                Ok(Task {
                    raw: Raw::SendImm(t),
                })
            }
            (Some(other), _) => Err(mismatch(other)),
            (None, None) => allocate("doca_rdma_task_send_allocate_init", Raw::Send, |out| {
                // SAFETY: running context, live connection and buffer, valid out-pointer.
                unsafe {
                    sys::doca_rdma_task_send_allocate_init(
                        rdma.raw(),
                        conn.raw(),
                        src,
                        NO_USER,
                        out,
                    )
                }
            }),
            (None, Some(imm)) => allocate(
                "doca_rdma_task_send_imm_allocate_init",
                Raw::SendImm,
                |out| {
                    // SAFETY: as above.
                    unsafe {
                        sys::doca_rdma_task_send_imm_allocate_init(
                            rdma.raw(),
                            conn.raw(),
                            src,
                            imm.to_be(),
                            NO_USER,
                            out,
                        )
                    }
                },
            ),
        }
    }

    /// A write of the local `src` into the peer's `dst`, with an immediate when `imm` is set
    /// (both `None`: no data, as DOCA spells it).
    pub(super) fn write(
        rdma: &Rdma,
        conn: ConnPtr,
        idle: Option<Task>,
        src: Option<&Buf>,
        dst: Option<&Buf>,
        imm: Option<u32>,
    ) -> Result<Task> {
        let (src, dst) = (buf_ptr(src), buf_ptr(dst));
        match (idle.map(Task::into_raw), imm) {
            (Some(Raw::Write(t)), None) => {
                // SAFETY: an idle write task of this context, one of its live connections;
                // both buffers are live.
                unsafe {
                    sys::doca_rdma_task_write_set_rdma_connection(t.as_ptr(), conn.raw());
                    sys::doca_rdma_task_write_set_src_buf(t.as_ptr(), src);
                    sys::doca_rdma_task_write_set_dst_buf(t.as_ptr(), dst);
                }
                Ok(Task { raw: Raw::Write(t) })
            }
            (Some(Raw::WriteImm(t)), Some(imm)) => {
                // SAFETY: as above.
                unsafe {
                    sys::doca_rdma_task_write_imm_set_rdma_connection(t.as_ptr(), conn.raw());
                    sys::doca_rdma_task_write_imm_set_src_buf(t.as_ptr(), src);
                    sys::doca_rdma_task_write_imm_set_dst_buf(t.as_ptr(), dst);
                    sys::doca_rdma_task_write_imm_set_immediate_data(t.as_ptr(), imm.to_be());
                }
                Ok(Task {
                    raw: Raw::WriteImm(t),
                })
            }
            (Some(other), _) => Err(mismatch(other)),
            (None, None) => allocate("doca_rdma_task_write_allocate_init", Raw::Write, |out| {
                // SAFETY: running context, live connection and buffers, valid out-pointer.
                unsafe {
                    sys::doca_rdma_task_write_allocate_init(
                        rdma.raw(),
                        conn.raw(),
                        src,
                        dst,
                        NO_USER,
                        out,
                    )
                }
            }),
            (None, Some(imm)) => allocate(
                "doca_rdma_task_write_imm_allocate_init",
                Raw::WriteImm,
                |out| {
                    // SAFETY: as above.
                    unsafe {
                        sys::doca_rdma_task_write_imm_allocate_init(
                            rdma.raw(),
                            conn.raw(),
                            src,
                            dst,
                            imm.to_be(),
                            NO_USER,
                            out,
                        )
                    }
                },
            ),
        }
    }

    /// A read of the peer's `src` into the local `dst` (both `None`: no data).
    pub(super) fn read(
        rdma: &Rdma,
        conn: ConnPtr,
        idle: Option<Task>,
        src: Option<&Buf>,
        dst: Option<&Buf>,
    ) -> Result<Task> {
        let (src, dst) = (buf_ptr(src), buf_ptr(dst));
        match idle.map(Task::into_raw) {
            Some(Raw::Read(t)) => {
                // SAFETY: an idle read task of this context, one of its live connections;
                // both buffers are live.
                unsafe {
                    sys::doca_rdma_task_read_set_rdma_connection(t.as_ptr(), conn.raw());
                    sys::doca_rdma_task_read_set_src_buf(t.as_ptr(), src);
                    sys::doca_rdma_task_read_set_dst_buf(t.as_ptr(), dst);
                }
                Ok(Task { raw: Raw::Read(t) })
            }
            Some(other) => Err(mismatch(other)),
            None => allocate("doca_rdma_task_read_allocate_init", Raw::Read, |out| {
                // SAFETY: running context, live connection and buffers, valid out-pointer.
                unsafe {
                    sys::doca_rdma_task_read_allocate_init(
                        rdma.raw(),
                        conn.raw(),
                        src,
                        dst,
                        NO_USER,
                        out,
                    )
                }
            }),
        }
    }

    /// A compare-and-swap on the peer's 8 bytes at `dst`; the previous value lands in `result`.
    pub(super) fn compare_and_swap(
        rdma: &Rdma,
        conn: ConnPtr,
        idle: Option<Task>,
        dst: &Buf,
        result: &Buf,
        expected: u64,
        new: u64,
    ) -> Result<Task> {
        match idle.map(Task::into_raw) {
            Some(Raw::CmpSwp(t)) => {
                // SAFETY: an idle compare-and-swap task of this context, one of its live
                // connections; both buffers are live.
                unsafe {
                    sys::doca_rdma_task_atomic_cmp_swp_set_rdma_connection(t.as_ptr(), conn.raw());
                    sys::doca_rdma_task_atomic_cmp_swp_set_dst_buf(t.as_ptr(), dst.raw());
                    sys::doca_rdma_task_atomic_cmp_swp_set_result_buf(t.as_ptr(), result.raw());
                    sys::doca_rdma_task_atomic_cmp_swp_set_cmp_data(t.as_ptr(), expected);
                    sys::doca_rdma_task_atomic_cmp_swp_set_swap_data(t.as_ptr(), new);
                }
                Ok(Task {
                    raw: Raw::CmpSwp(t),
                })
            }
            Some(other) => Err(mismatch(other)),
            None => allocate(
                "doca_rdma_task_atomic_cmp_swp_allocate_init",
                Raw::CmpSwp,
                |out| {
                    // SAFETY: running context, live connection and buffers, valid out-pointer.
                    unsafe {
                        sys::doca_rdma_task_atomic_cmp_swp_allocate_init(
                            rdma.raw(),
                            conn.raw(),
                            dst.raw(),
                            result.raw(),
                            expected,
                            new,
                            NO_USER,
                            out,
                        )
                    }
                },
            ),
        }
    }

    /// A fetch-and-add on the peer's 8 bytes at `dst`; the previous value lands in `result`.
    pub(super) fn fetch_and_add(
        rdma: &Rdma,
        conn: ConnPtr,
        idle: Option<Task>,
        dst: &Buf,
        result: &Buf,
        add: u64,
    ) -> Result<Task> {
        match idle.map(Task::into_raw) {
            Some(Raw::FetchAdd(t)) => {
                // SAFETY: an idle fetch-and-add task of this context, one of its live
                // connections; both buffers are live.
                unsafe {
                    sys::doca_rdma_task_atomic_fetch_add_set_rdma_connection(
                        t.as_ptr(),
                        conn.raw(),
                    );
                    sys::doca_rdma_task_atomic_fetch_add_set_dst_buf(t.as_ptr(), dst.raw());
                    sys::doca_rdma_task_atomic_fetch_add_set_result_buf(t.as_ptr(), result.raw());
                    sys::doca_rdma_task_atomic_fetch_add_set_add_data(t.as_ptr(), add);
                }
                Ok(Task {
                    raw: Raw::FetchAdd(t),
                })
            }
            Some(other) => Err(mismatch(other)),
            None => allocate(
                "doca_rdma_task_atomic_fetch_add_allocate_init",
                Raw::FetchAdd,
                |out| {
                    // SAFETY: running context, live connection and buffers, valid out-pointer.
                    unsafe {
                        sys::doca_rdma_task_atomic_fetch_add_allocate_init(
                            rdma.raw(),
                            conn.raw(),
                            dst.raw(),
                            result.raw(),
                            add,
                            NO_USER,
                            out,
                        )
                    }
                },
            ),
        }
    }

    /// The task's address: while it is submitted, no other task has it, so it keys the
    /// operation the task carries (its completion callback gets the same pointer), and the
    /// task needs no user data (`doca_task_set_user_data`) per submission.
    pub(super) fn key(&self) -> u64 {
        self.raw.as_task() as usize as u64
    }

    /// Submits the task, with `user` as its user data if given (otherwise the task keeps
    /// what it has). The submitted task keeps `bufs` (the buffers it uses) until it
    /// completes. On failure the task is idle again. Without `flush` DOCA may hold the task
    /// until the context's next flush (see [`Doorbell`]).
    #[allow(clippy::result_large_err)]
    pub(super) fn submit_with(
        self,
        user: Option<u64>,
        bufs: TaskBufs,
        flush: bool,
    ) -> std::result::Result<Submitted, (Task, sys::doca_error_t)> {
        let task = self.raw.as_task();
        let flags = if flush {
            sys::DOCA_TASK_SUBMIT_FLAG_FLUSH
        } else {
            sys::DOCA_TASK_SUBMIT_FLAG_NONE
        };
        // SAFETY: an idle task of this engine; its buffers are kept by the `Submitted`.
        let code = unsafe {
            if let Some(user) = user {
                sys::doca_task_set_user_data(task, sys::doca_data { u64_: user });
            }
            sys::doca_task_submit_ex(task, flags)
        };
        if code != sys::DOCA_SUCCESS {
            return Err((self, code));
        }
        let raw = self.raw;
        std::mem::forget(self);
        Ok(Submitted {
            raw: Some(raw),
            bufs,
        })
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        // SAFETY: an idle task (never submitted, or its completion callback ran), freed once.
        unsafe { sys::doca_task_free(self.raw.as_task()) }
    }
}

fn mismatch(raw: Raw) -> crate::error::Error {
    // An idle task of another kind was handed to a builder: a bug of the pools, not of DOCA.
    // Leak the task rather than guess its state.
    tracing::error!(kind = ?raw.kind(), "DOCA task of the wrong kind reused; leaked");
    doca_error("task reuse", sys::DOCA_ERROR_UNEXPECTED)
}

/// The buffers of one task: none, one or two (a source, a destination), kept inline: a task
/// is built for every operation, and a `Vec` would be an allocation for each. A source over a
/// staging slab is a [`SlabBuf`], which goes back to the owner when the task completes.
#[derive(Default)]
pub(super) struct TaskBufs {
    source: Option<Source>,
    other: Option<Buf>,
}

impl TaskBufs {
    pub(super) fn of(source: Option<Source>, other: Option<Buf>) -> TaskBufs {
        TaskBufs { source, other }
    }

    fn iter(&self) -> impl Iterator<Item = &Buf> {
        self.source.iter().map(Source::buf).chain(self.other.iter())
    }
}

/// An operation's first buffer (the source of a send or write, the remote side of a read or
/// atomic): one of its own, or one over a staging slab.
pub(super) enum Source {
    Own(Buf),
    Slab(SlabBuf),
}

impl Source {
    pub(super) fn buf(&self) -> &Buf {
        match self {
            Source::Own(b) => b,
            Source::Slab(s) => &s.buf,
        }
    }
}

/// A `doca_buf` over a whole staging slab, kept by the owner between uses: a send or write
/// from the slab moves its data section (`doca_buf_set_data`) instead of taking a buffer
/// from the inventory and giving it back. Holds the slab, so its memory lives while the
/// buffer does.
pub(super) struct SlabBuf {
    pub(super) buf: Buf,
    _slab: Arc<Region>,
}

impl SlabBuf {
    pub(super) fn new(buf: Buf, slab: Arc<Region>) -> SlabBuf {
        SlabBuf { buf, _slab: slab }
    }
}

/// A task DOCA owns until its completion callback ran, with the buffers it uses.
pub(super) struct Submitted {
    raw: Option<Raw>,
    // Released after the task is idle again: dropped with (or after) `raw` is taken.
    bufs: TaskBufs,
}

// SAFETY: see `Task`; the buffers are used by the same single owner.
unsafe impl Send for Submitted {}

impl Submitted {
    /// The task is idle again: its completion callback ran. Releases its buffers, but for a
    /// slab buffer, which it returns.
    ///
    /// # Safety
    /// DOCA delivered this task's completion (success or error).
    pub(super) unsafe fn completed(mut self) -> (Task, Option<SlabBuf>) {
        let raw = self.raw.take().expect("a submitted task is completed once");
        let slab = match self.bufs.source.take() {
            Some(Source::Slab(s)) => Some(s),
            _ => None,
        };
        (Task { raw }, slab)
    }

    /// Empties the data sections of its buffers (a completed receive about to be reposted).
    pub(super) fn reset_bufs(&self) {
        for buf in self.bufs.iter() {
            buf.reset();
        }
    }

    /// The task is idle again and its buffers stay with it (a receive reposted as it is).
    /// Its user data stays what it was submitted with: a task keeps it until it is set again
    /// (doca_pe.h: doca_task_set_user_data, doca_task_get_user_data).
    ///
    /// # Safety
    /// As [`completed`](Self::completed).
    pub(super) unsafe fn resubmit(&mut self) -> sys::doca_error_t {
        let Some(raw) = self.raw else {
            return sys::DOCA_ERROR_BAD_STATE;
        };
        // SAFETY: per the caller, the task completed, so it is idle; its buffers are held here.
        unsafe { sys::doca_task_submit(raw.as_task()) }
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        if let Some(raw) = self.raw {
            // DOCA may still write through this task and its buffers: never free them.
            tracing::warn!(kind = ?raw.kind(), "leaking a DOCA task that did not complete");
            std::mem::forget(std::mem::take(&mut self.bufs));
        }
    }
}

/// Tasks submitted together, with one doorbell for all of them: each is submitted without
/// `DOCA_TASK_SUBMIT_FLAG_FLUSH` and [`Doorbell::ring`] flushes the context once
/// (`doca_ctx_flush_tasks`). Used where a batch is known to follow (a backlog draining, a
/// chunk of receives); a single operation is submitted with the flag.
pub(super) struct Doorbell<'a> {
    rdma: &'a Rdma,
    pending: bool,
}

impl<'a> Doorbell<'a> {
    pub(super) fn new(rdma: &'a Rdma) -> Doorbell<'a> {
        Doorbell {
            rdma,
            pending: false,
        }
    }

    /// Submits `task` without ringing.
    #[allow(clippy::result_large_err)]
    pub(super) fn submit(
        &mut self,
        task: Task,
        user: u64,
        bufs: TaskBufs,
    ) -> std::result::Result<Submitted, (Task, sys::doca_error_t)> {
        let submitted = task.submit_with(Some(user), bufs, false)?;
        self.pending = true;
        Ok(submitted)
    }

    /// Rings once for every task submitted since the last ring.
    pub(super) fn ring(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.rdma.flush_tasks();
        }
    }
}

impl Drop for Doorbell<'_> {
    fn drop(&mut self) {
        // Never leave submitted tasks unflushed.
        self.ring();
    }
}
