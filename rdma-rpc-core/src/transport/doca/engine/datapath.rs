//! The data path: operations posted on connections, their DOCA tasks, and their completions.
//!
//! An operation is checked locally first (lengths, rights and alignment a well-behaved NIC
//! would refuse anyway), then gets its `doca_buf`s and a task (reused from the connection's
//! pool of that kind, or allocated), and is submitted. Each connection has at most
//! `send_queue` operations in flight; beyond that, and when the context runs out of tasks or
//! buffers, operations wait in the connection's backlog, in order, and are submitted as
//! earlier ones complete. Nothing fails for being busy.

use std::sync::Arc;

use doca_sys as sys;
use tokio::sync::oneshot;

use super::super::sys::{doca_error, error_name, Buf, Inventory, Mmap};
use super::lifecycle::Phase;
use super::task::{ConnPtr, Kind, SlabBuf, Source, Submitted, Task, TaskBufs};
use super::{AtomicOp, ConnId, Local, Op, Owner};
use crate::error::{AccessViolation, Error, Result};
use crate::ids::IdMap;
use crate::memory::{Access, RegisteredBuf};
use crate::transport::Descriptor;

/// What to do with the result of a completed operation.
pub(super) enum Done {
    /// A send or a write; `None` when nobody waits for it (an unsignaled send).
    Unit(Option<oneshot::Sender<Result<()>>>),
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

/// An operation DOCA is working on.
pub(super) struct Inflight {
    conn: ConnId,
    len: u64,
    // The task goes back to DOCA's idle state (and its buffers are released) before the
    // registered memory below may be reused: declared first.
    task: Submitted,
    /// Source memory kept alive until the operation completed.
    _keep: Option<RegisteredBuf>,
    done: Done,
}

/// Why an operation was not submitted.
pub(super) enum NotSubmitted {
    /// Out of tasks, buffers or send queue room: try again after a completion.
    Busy(Op),
    /// Failed: complete the operation with the error, and fail the connection if `fatal`.
    Failed(Op, Error, bool),
}

/// Whether a DOCA status means "out of resources for now".
fn busy(code: sys::doca_error_t) -> bool {
    code == sys::DOCA_ERROR_NO_MEMORY
        || code == sys::DOCA_ERROR_FULL
        || code == sys::DOCA_ERROR_AGAIN
}

fn is_busy(e: &Error) -> bool {
    matches!(e, Error::Doca { code, .. } if busy(*code as sys::doca_error_t))
}

impl Op {
    pub(super) fn fail(self, err: Error) {
        let _ = match self {
            Op::Send { done, .. } | Op::Write { done, .. } => {
                done.map_or(Ok(()), |done| done.send(Err(err)).map_err(drop))
            }
            Op::Read { done, .. } => done.send(Err(err)).map_err(drop),
            Op::Atomic { done, .. } => done.send(Err(err)).map_err(drop),
        };
    }
}

impl Owner {
    /// Starts an operation on a connection, or queues it behind the connection's backlog.
    pub(super) fn post(&mut self, id: ConnId, op: Op) {
        let send_queue = self.sizes.send_queue as usize;
        let conn_err = match self.conns.get(&id) {
            None => Some(Error::ConnectionClosed {
                peer: String::new(),
                reason: "connection already closed".into(),
            }),
            Some(c) if c.phase != Phase::Live => Some(c.error("not connected")),
            Some(c) => c.shared.as_ref().and_then(|s| s.current_error()),
        };
        if let Some(err) = conn_err {
            op.fail(err);
            return;
        }
        let c = self.conns.get_mut(&id).expect("checked");
        if !c.backlog.is_empty() || c.inflight >= send_queue {
            c.backlog.push_back(op);
            return;
        }
        self.try_submit(id, op);
    }

    /// Submits `op` or puts it at the front of its connection's backlog. Returns whether it
    /// left the backlog for good (submitted or failed).
    fn try_submit(&mut self, id: ConnId, op: Op) -> bool {
        match self.submit(id, op) {
            Ok(()) => true,
            Err(NotSubmitted::Busy(op)) => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.backlog.push_front(op);
                    if !self.waiting.contains(&id) {
                        self.waiting.push_back(id);
                    }
                } else {
                    op.fail(Error::ConnectionClosed {
                        peer: String::new(),
                        reason: "connection already closed".into(),
                    });
                }
                false
            }
            Err(NotSubmitted::Failed(op, err, fatal)) => {
                op.fail(err.duplicate());
                if fatal {
                    self.fail_conn(id, err);
                }
                true
            }
        }
    }

    /// Submits what a connection's backlog holds, as far as room allows.
    fn drain(&mut self, id: ConnId) {
        let send_queue = self.sizes.send_queue as usize;
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            if c.phase != Phase::Live || c.inflight >= send_queue {
                return;
            }
            let Some(op) = c.backlog.pop_front() else {
                return;
            };
            if !self.try_submit(id, op) {
                return;
            }
        }
    }

    /// A completion freed room on connection `id`: its backlog drains after this round of
    /// progress ([`Owner::drain_freed`]).
    fn completed_on(&mut self, id: ConnId) {
        if !self.freed.contains(&id) {
            self.freed.push(id);
        }
    }

    /// After a round of progress whose completions freed room: the connections that
    /// completed operations first, in completion order, then those that waited for tasks or
    /// buffers of the context. What the backlogs release is submitted without flushing, and
    /// one doorbell rings for all of it.
    pub(super) fn drain_freed(&mut self) {
        if self.freed.is_empty() {
            return;
        }
        self.batching = true;
        let mut freed = std::mem::take(&mut self.freed);
        for id in freed.drain(..) {
            self.drain(id);
        }
        // Its capacity takes the next round's.
        self.freed = freed;
        for other in std::mem::take(&mut self.waiting) {
            self.drain(other);
        }
        self.batching = false;
        self.ring();
    }

    /// Flushes the tasks submitted without a doorbell (`doca_ctx_flush_tasks`).
    pub(super) fn ring(&mut self) {
        if std::mem::take(&mut self.unflushed) {
            self.rdma.flush_tasks();
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

    /// Checks a remote operand locally and imports its mmap.
    #[allow(clippy::result_large_err)]
    fn remote(
        &mut self,
        id: ConnId,
        d: &Descriptor,
        need: Access,
        len: u64,
        atomic: bool,
    ) -> std::result::Result<Arc<Mmap>, Error> {
        let violation = |v| Error::RemoteAccess {
            rkey: d.rkey,
            addr: d.addr,
            len,
            violation: v,
        };
        if atomic && !d.addr.is_multiple_of(8) {
            return Err(violation(AccessViolation::Misaligned));
        }
        if !d.access.contains(need) {
            return Err(violation(AccessViolation::NotPermitted));
        }
        if d.blob.is_empty() {
            return Err(violation(AccessViolation::UnknownKey));
        }
        self.remote_mmap(id, d).map_err(|e| {
            tracing::debug!(error = %e, "importing a peer mmap");
            violation(AccessViolation::UnknownKey)
        })
    }

    #[allow(clippy::result_large_err)]
    fn submit(&mut self, id: ConnId, op: Op) -> std::result::Result<(), NotSubmitted> {
        let len = match &op {
            Op::Send { src, .. } | Op::Write { src, .. } => src.buf.len() as u64,
            Op::Read { src, .. } => src.len,
            Op::Atomic { .. } => 8,
        };
        if len > self.max_message {
            let err = Error::LimitExceeded {
                limit: "max_message_size",
                max: self.max_message,
                actual: len,
            };
            return Err(NotSubmitted::Failed(op, err, false));
        }
        // Remote operands: checked here as the peer's NAK would, failing the connection.
        let remote = match &op {
            Op::Send { .. } => None,
            Op::Write { dst, .. } => Some((dst, Access::REMOTE_WRITE, false)),
            Op::Read { src, .. } => Some((src, Access::REMOTE_READ, false)),
            Op::Atomic { dst, .. } => Some((dst, Access::REMOTE_ATOMIC, true)),
        };
        let remote = match remote {
            Some((d, need, atomic)) => match self.remote(id, d, need, len, atomic) {
                Ok(m) => Some(m),
                Err(e) => return Err(NotSubmitted::Failed(op, e, true)),
            },
            None => None,
        };
        match self.build(id, &op, remote.as_ref(), len) {
            Ok((task, bufs)) => self.launch(id, op, task, bufs, len),
            Err(e) if is_busy(&e) => Err(NotSubmitted::Busy(op)),
            Err(e) => {
                // A remote range the peer's mmap does not cover is the peer's fault.
                let fatal = remote.is_some() && matches!(e, Error::RemoteAccess { .. });
                Err(NotSubmitted::Failed(op, e, fatal))
            }
        }
    }

    /// The buffers and the (reused or new) task of an operation.
    fn build(
        &mut self,
        id: ConnId,
        op: &Op,
        remote: Option<&Arc<Mmap>>,
        len: u64,
    ) -> Result<(Task, TaskBufs)> {
        let c = self.conns.get(&id).expect("live connection");
        let conn: ConnPtr = c.raw.expect("a live connection has its DOCA connection");
        let idle = &mut self.idle;
        let inv = &self.inv;
        let rdma = &self.rdma;
        let remote_buf = |d: &Descriptor, data_len: usize| -> Result<Buf> {
            let m = remote.expect("remote operand imported");
            // SAFETY: remote memory, never touched locally; DOCA checks the range against the
            // peer's mmap.
            unsafe { inv.buf(m, d.addr, len as usize, data_len) }.map_err(|e| {
                if is_busy(&e) {
                    return e;
                }
                tracing::debug!(error = %e, "remote range refused");
                Error::RemoteAccess {
                    rkey: d.rkey,
                    addr: d.addr,
                    len,
                    violation: AccessViolation::OutOfBounds,
                }
            })
        };
        match op {
            Op::Send { src, imm, .. } => {
                let kind = if imm.is_some() {
                    Kind::SendImm
                } else {
                    Kind::Send
                };
                let n = src.buf.len();
                // An empty message carries no buffer.
                let b = match n {
                    0 => None,
                    _ => Some(source_buf(inv, &mut self.slab_bufs, src)?),
                };
                let task = Task::send(
                    rdma,
                    conn,
                    idle.take(kind),
                    b.as_ref().map(Source::buf),
                    *imm,
                )?;
                Ok((task, TaskBufs::of(b, None)))
            }
            Op::Write { src, dst, imm, .. } => {
                let kind = if imm.is_some() {
                    Kind::WriteImm
                } else {
                    Kind::Write
                };
                let n = src.buf.len();
                // No data: no buffers, as DOCA spells it.
                let (s, d) = match n {
                    0 => (None, None),
                    _ => (
                        Some(source_buf(inv, &mut self.slab_bufs, src)?),
                        Some(remote_buf(dst, 0)?),
                    ),
                };
                let s_buf = s.as_ref().map(Source::buf);
                let task = Task::write(rdma, conn, idle.take(kind), s_buf, d.as_ref(), *imm)?;
                Ok((task, TaskBufs::of(s, d)))
            }
            Op::Read { src, dst, .. } => {
                let (s, d) = match len {
                    0 => (None, None),
                    _ => (
                        Some(remote_buf(src, len as usize)?),
                        // SAFETY: the destination is owned by this operation until it completes.
                        Some(unsafe {
                            inv.buf(&dst.mmap, dst.buf.addr(), dst.buf.capacity().max(1), 0)
                        }?),
                    ),
                };
                let task = Task::read(rdma, conn, idle.take(Kind::Read), s.as_ref(), d.as_ref())?;
                Ok((task, TaskBufs::of(s.map(Source::Own), d)))
            }
            Op::Atomic {
                dst,
                op: aop,
                result,
                ..
            } => {
                let d = remote_buf(dst, 8)?;
                // SAFETY: the result buffer is owned by this operation until it completes.
                let r =
                    unsafe { inv.buf(&result.mmap, result.buf.addr(), result.buf.capacity(), 0) }?;
                let task = match *aop {
                    AtomicOp::CompareAndSwap { expected, new } => Task::compare_and_swap(
                        rdma,
                        conn,
                        idle.take(Kind::CmpSwp),
                        &d,
                        &r,
                        expected,
                        new,
                    )?,
                    AtomicOp::FetchAndAdd { add } => {
                        Task::fetch_and_add(rdma, conn, idle.take(Kind::FetchAdd), &d, &r, add)?
                    }
                };
                Ok((task, TaskBufs::of(Some(Source::Own(d)), Some(r))))
            }
        }
    }

    /// Submits a built task and records the operation.
    #[allow(clippy::result_large_err)]
    fn launch(
        &mut self,
        id: ConnId,
        op: Op,
        task: Task,
        bufs: TaskBufs,
        len: u64,
    ) -> std::result::Result<(), NotSubmitted> {
        let op_id = task.key();
        let c = self.conns.get_mut(&id).expect("live connection");
        let flush = !self.batching;
        let task = match task.submit_with(None, bufs, flush) {
            Ok(task) => {
                self.unflushed |= !flush;
                task
            }
            Err((task, code)) => {
                self.idle.put(task);
                if busy(code) {
                    return Err(NotSubmitted::Busy(op));
                }
                let err = Error::ConnectionClosed {
                    peer: c.peer.clone(),
                    reason: doca_error("doca_task_submit", code).to_string(),
                };
                return Err(NotSubmitted::Failed(op, err, true));
            }
        };
        let (done, keep) = match op {
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
        c.inflight += 1;
        self.ops.insert(
            op_id,
            Inflight {
                conn: id,
                len,
                task,
                _keep: keep,
                done,
            },
        );
        Ok(())
    }

    /// A completion of an operation (not a staging receive).
    pub(super) fn on_completion(&mut self, kind: Kind, user: u64, status: sys::doca_error_t) {
        let Some(op) = self.ops.remove(&user) else {
            // Cannot happen: every submitted operation is in `ops` until its completion.
            tracing::error!(?kind, user, "completion of an unknown DOCA task");
            return;
        };
        let Inflight {
            conn: id,
            len,
            task,
            _keep,
            done,
        } = op;
        // The operation's memory goes back before anyone hears it completed: a caller that
        // then leases the same bytes again finds them free.
        drop(_keep);
        // SAFETY: this is the task's completion.
        let (task, slab_buf) = unsafe { task.completed() };
        if let Some(b) = slab_buf {
            self.slab_bufs
                .entry(slab_key(b.buf.mmap()))
                .or_default()
                .push(b);
        }
        let c = self.conns.get_mut(&id);
        let live = c.as_ref().is_some_and(|c| c.phase == Phase::Live);
        if let Some(c) = c {
            c.inflight -= 1;
            if live {
                self.idle.put(task);
            }
        }
        if status == sys::DOCA_SUCCESS {
            complete(done, Ok(()));
            if live {
                self.completed_on(id);
            } else {
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
                    retry_ms: super::super::provider_rnr_ms(),
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
                reason: format!("DOCA task failed: {}", error_name(code)),
            },
        };
        complete(done, Err(err.duplicate()));
        self.fail_conn(id, err);
        self.maybe_remove(id);
        self.completed_on(id);
    }

    /// Fails every operation still in flight (the context could not stop): their tasks are
    /// leaked, never freed while DOCA may use them.
    pub(super) fn abandon_ops(&mut self) {
        let err = || Error::ConnectionClosed {
            peer: String::new(),
            reason: "the DOCA context did not stop".into(),
        };
        for (_, op) in self.ops.drain() {
            // DOCA may still use the memory of these operations: leak it with the task.
            let _ = match op.done {
                Done::Unit(tx) => tx.map_or(Ok(()), |tx| tx.send(Err(err())).map_err(drop)),
                Done::Read { dst, done, .. } => {
                    std::mem::forget(dst);
                    done.send(Err(err())).map_err(drop)
                }
                Done::Atomic { result, done } => {
                    std::mem::forget(result);
                    done.send(Err(err())).map_err(drop)
                }
            };
            std::mem::forget(op._keep);
            drop(op.task);
        }
    }
}

fn complete(done: Done, result: Result<()>) {
    let _ = match (done, result) {
        (Done::Unit(tx), r) => tx.map_or(Ok(()), |tx| tx.send(r).map_err(drop)),
        (Done::Read { mut dst, len, done }, Ok(())) => {
            dst.set_len(len);
            done.send(Ok(dst)).map_err(drop)
        }
        (Done::Read { done, .. }, Err(e)) => done.send(Err(e)).map_err(drop),
        (Done::Atomic { result, done }, Ok(())) => {
            let mut bytes = [0u8; 8];
            // SAFETY: the atomic completed, so DOCA wrote the previous value (native endian)
            // into the first 8 bytes of the result buffer, which this operation owns.
            unsafe { std::ptr::copy_nonoverlapping(result.ptr_at(0), bytes.as_mut_ptr(), 8) };
            done.send(Ok(u64::from_ne_bytes(bytes))).map_err(drop)
        }
        (Done::Atomic { done, .. }, Err(e)) => done.send(Err(e)).map_err(drop),
    };
}

/// The key of an mmap in the owner's idle slab buffers: its address (each buffer holds its
/// mmap, so the address is not reused while one is kept).
fn slab_key(mmap: &Arc<Mmap>) -> usize {
    Arc::as_ptr(mmap) as usize
}

/// The source buffer of an operation from `src`: for bytes copied into a staging slab, an idle
/// buffer over that slab (or a new one) with its data section moved to them; for any other
/// memory, a buffer of its own.
fn source_buf(
    inv: &Inventory,
    idle: &mut IdMap<usize, Vec<SlabBuf>>,
    src: &Local,
) -> Result<Source> {
    let (addr, n) = (src.buf.addr(), src.buf.len());
    if !src.staged {
        // SAFETY: the source memory is owned by this operation until it completes.
        return Ok(Source::Own(unsafe { inv.buf(&src.mmap, addr, n, n) }?));
    }
    let b = match idle.get_mut(&slab_key(&src.mmap)).and_then(Vec::pop) {
        Some(b) => {
            // SAFETY: an idle buffer (no task uses it); the bytes are this operation's until
            // it completes.
            unsafe { b.buf.set_data(addr, n) }?;
            b
        }
        None => {
            let slab = src.buf.region();
            // SAFETY: the `SlabBuf` keeps the slab's memory; the bytes are this operation's
            // until it completes.
            let b = unsafe { inv.buf_over(&src.mmap, (slab.addr(), slab.capacity()), addr, n) }?;
            SlabBuf::new(b, slab.clone())
        }
    };
    Ok(Source::Slab(b))
}
