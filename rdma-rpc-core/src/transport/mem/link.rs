//! What the two ends of an in-process connection share, and its data path. Every operation
//! is carried out by the thread that posts it, on the peer's memory, with nothing in between:
//! a send copies into the peer's next posted receive and wakes the task waiting in the peer's
//! `recv`; a write, read or atomic copies into or out of a window the peer granted, with key,
//! rights and bounds checked against the peer's window table. Such an operation has completed
//! when it is posted.
//!
//! Only a send (or write with immediate) that finds no posted receive waits: it goes into the
//! receiving end's queue, and every operation its sender posts afterwards queues behind it, so
//! nothing overtakes it (RC ordering). The receiving end's next `post_recv` carries the queue
//! out; the RNR timer (`rnr.rs`) fails the connection if the receive does not come in time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::{oneshot, Notify};

use super::rnr::{self, Due};
use super::window::WindowTable;
use super::MemConfig;
use crate::error::{AccessViolation, Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::common::Waiters;
use crate::transport::{Grant, RecvCompletion, RecvOpcode, SendData};

/// Locks `m`; a panic elsewhere while it was held leaves plain data, still usable.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one end is: its peer's address and settings, and the windows it granted.
pub(super) struct End {
    /// The other end's address, as this end's [`Connection::peer`] reports it.
    peer: String,
    config: Arc<MemConfig>,
    /// Windows this end granted; the other end's one-sided operations look keys up here.
    windows: Arc<WindowTable>,
}

impl End {
    pub(super) fn new(peer: String, config: Arc<MemConfig>) -> End {
        End {
            peer,
            config,
            windows: WindowTable::new(),
        }
    }
}

/// What both ends of one connection share.
pub(super) struct Link {
    ends: [End; 2],
    state: Mutex<LinkState>,
    /// Woken once, when the link fails (the ends' `closed`).
    failed: Notify,
}

struct LinkState {
    /// `rx[i]`: the receives of end `i`, and the other end's operations waiting for one.
    rx: [Rx; 2],
    /// Once the connection is in error: why, as each end reports it.
    failed: Option<[Error; 2]>,
    /// Numbers queued operations, for the RNR timer.
    next_seq: u64,
}

/// The receiving side of one end.
#[derive(Default)]
struct Rx {
    posted: VecDeque<RegisteredBuf>,
    completed: VecDeque<RecvCompletion>,
    waiters: Waiters,
    /// The other end's operations, in posting order, behind one that found no posted receive
    /// (the head is always a send or a write with immediate).
    stalled: VecDeque<Queued>,
}

/// An atomic operation.
#[derive(Debug, Clone, Copy)]
pub(super) enum Atomic {
    CompareAndSwap { expected: u64, new: u64 },
    FetchAndAdd { add: u64 },
}

/// A one-sided operation on the peer's windows.
pub(super) enum Remote {
    Write {
        src: SendData,
        rkey: u32,
        addr: u64,
    },
    Read {
        rkey: u32,
        addr: u64,
        len: u64,
        dst: RegisteredBuf,
    },
    Atomic {
        rkey: u32,
        addr: u64,
        op: Atomic,
    },
}

/// What an operation does at the peer.
pub(super) enum Action {
    /// Into the next posted receive.
    Send { data: SendData, imm: Option<u32> },
    /// A write whose immediate completes the next posted receive.
    WriteImm {
        src: SendData,
        rkey: u32,
        addr: u64,
        imm: u32,
    },
    /// On the peer's windows only.
    Remote(Remote),
}

impl Action {
    fn needs_receive(&self) -> bool {
        !matches!(self, Action::Remote(_))
    }
}

/// What a completed operation gives back.
pub(super) enum Output {
    Unit,
    Buf(RegisteredBuf),
    Word(u64),
}

/// The typed result of an operation, from its [`Output`].
pub(super) trait FromOutput: Send + Sized + 'static {
    fn from_output(out: Output) -> Self;
}

impl FromOutput for () {
    fn from_output(_: Output) {}
}

impl FromOutput for RegisteredBuf {
    fn from_output(out: Output) -> Self {
        match out {
            Output::Buf(buf) => buf,
            _ => unreachable!("a read completes with its buffer"),
        }
    }
}

impl FromOutput for u64 {
    fn from_output(out: Output) -> Self {
        match out {
            Output::Word(w) => w,
            _ => unreachable!("an atomic completes with the previous value"),
        }
    }
}

/// An operation waiting in the receiving end's queue.
struct Queued {
    seq: u64,
    action: Action,
    /// `None` for an unsignaled send.
    done: Option<oneshot::Sender<Result<Output>>>,
    /// Whether the RNR timer watches it (it was at the head with no receive posted).
    timed: bool,
}

/// Reports the result of a queued operation to its poster, if it asked for one.
fn complete(done: Option<oneshot::Sender<Result<Output>>>, result: Result<Output>) {
    if let Some(done) = done {
        // A dropped receiver: the caller stopped waiting; the operation still happened.
        let _ = done.send(result);
    }
}

/// Why the peer refused an operation; the connection goes to error with it.
enum Fault {
    TooSmall {
        len: u64,
        capacity: u64,
    },
    Access {
        what: &'static str,
        rkey: u32,
        addr: u64,
        len: u64,
        violation: AccessViolation,
    },
}

/// Why an operation could not be carried out now.
enum Refused {
    /// No receive is posted: it waits (the action comes back to be queued).
    NoReceive(Action),
    Fault(Fault),
}

impl From<Fault> for Refused {
    fn from(f: Fault) -> Self {
        Refused::Fault(f)
    }
}

/// The result of posting an operation.
pub(super) enum Posted {
    /// Carried out already.
    Done(Output),
    /// Waiting behind a send that found no receive.
    Queued(oneshot::Receiver<Result<Output>>),
    /// An unsignaled send, queued.
    Unsignaled,
}

impl Link {
    /// A connection between end 0 (the one that connected) and end 1 (the accepted one).
    pub(super) fn new(ends: [End; 2]) -> Arc<Link> {
        Arc::new(Link {
            ends,
            state: Mutex::new(LinkState {
                rx: [Rx::default(), Rx::default()],
                failed: None,
                next_seq: 0,
            }),
            failed: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, LinkState> {
        lock(&self.state)
    }

    /// The error end `end` reports, once the connection is in error.
    pub(super) fn error(&self, end: usize) -> Option<Error> {
        self.state().failed.as_ref().map(|e| e[end].duplicate())
    }

    /// The errors a fault of an operation of end `from` puts the connection in, by end.
    fn fault_errors(&self, from: usize, fault: Fault) -> [Error; 2] {
        let (mine, theirs) = match fault {
            Fault::TooSmall { len, capacity } => (
                Error::ReceiveTooSmall { len, capacity },
                Error::ReceiveTooSmall { len, capacity },
            ),
            Fault::Access {
                what,
                rkey,
                addr,
                len,
                violation,
            } => (
                Error::RemoteAccess {
                    rkey,
                    addr,
                    len,
                    violation,
                },
                Error::Protocol {
                    peer: self.ends[1 - from].peer.clone(),
                    reason: format!(
                        "its {what} of {len} bytes at {addr:#x} with key {rkey:#x} was \
                         refused: {violation}"
                    ),
                },
            ),
        };
        by_end(from, mine, theirs)
    }

    /// Puts the connection in error (once): both ends report `errors[end]`, every queued
    /// operation fails, posted receives are flushed, windows are forgotten, and every waiter
    /// wakes. Completed receives stay to be taken.
    fn fail(&self, mut st: MutexGuard<'_, LinkState>, errors: [Error; 2]) {
        if st.failed.is_some() {
            return;
        }
        tracing::debug!(peer = %self.ends[0].peer, error = %errors[0], "in-process connection in error");
        let copies = [errors[0].duplicate(), errors[1].duplicate()];
        st.failed = Some(errors);
        let mut flushed = Vec::new();
        let mut woken = Vec::new();
        for (end, rx) in st.rx.iter_mut().enumerate() {
            flushed.push((1 - end, std::mem::take(&mut rx.stalled)));
            drop(std::mem::take(&mut rx.posted));
            woken.push(rx.waiters.take());
        }
        drop(st);
        for (from, stalled) in flushed {
            for op in stalled {
                complete(op.done, Err(copies[from].duplicate()));
            }
        }
        for w in woken {
            w.wake();
        }
        self.failed.notify_waiters();
        for end in &self.ends {
            end.windows.clear();
        }
    }

    /// Fails the connection with the fault of an operation of end `from`; returns the error
    /// that operation completes with.
    fn fail_with(&self, st: MutexGuard<'_, LinkState>, from: usize, fault: Fault) -> Error {
        let errors = self.fault_errors(from, fault);
        let mine = errors[from].duplicate();
        self.fail(st, errors);
        mine
    }

    /// Posts an operation of end `from`: carries it out now unless it must wait for a
    /// receive, or queue behind one that does.
    pub(super) fn post(
        self: &Arc<Self>,
        from: usize,
        action: Action,
        signaled: bool,
    ) -> Result<Posted> {
        let to = 1 - from;
        let mut st = self.state();
        if let Some(errors) = &st.failed {
            return Err(errors[from].duplicate());
        }
        if !st.rx[to].stalled.is_empty() {
            return self.enqueue(st, from, action, signaled);
        }
        let action = match action {
            Action::Remote(op) => {
                // The peer's windows have their own locks: copy without holding the link.
                drop(st);
                return match self.remote(to, op) {
                    Ok(out) => Ok(Posted::Done(out)),
                    Err(fault) => Err(self.fail_with(self.state(), from, fault)),
                };
            }
            action => action,
        };
        match self.carry(to, &mut st.rx[to], action) {
            Ok(out) => {
                let woken = st.rx[to].waiters.take();
                drop(st);
                woken.wake();
                Ok(Posted::Done(out))
            }
            Err(Refused::NoReceive(action)) => self.enqueue(st, from, action, signaled),
            Err(Refused::Fault(fault)) => Err(self.fail_with(st, from, fault)),
        }
    }

    /// Queues an operation of end `from` behind the one waiting for a receive of the other
    /// end (or as that one).
    fn enqueue(
        self: &Arc<Self>,
        mut st: MutexGuard<'_, LinkState>,
        from: usize,
        action: Action,
        signaled: bool,
    ) -> Result<Posted> {
        let to = 1 - from;
        let max = self.ends[from].config.max_outstanding;
        let waiting = st.rx[to].stalled.len();
        if waiting >= max {
            let err = Error::LimitExceeded {
                limit: "max_outstanding",
                max: max as u64,
                actual: waiting as u64 + 1,
            };
            if !signaled {
                // Nothing would report a dropped unsignaled send: end the connection instead.
                let reason = format!(
                    "{waiting} operations wait for a receive the peer does not post \
                     (max_outstanding = {max}); connection closed"
                );
                let errors = by_end(
                    from,
                    Error::ConnectionClosed {
                        peer: self.ends[from].peer.clone(),
                        reason: reason.clone(),
                    },
                    Error::ConnectionClosed {
                        peer: self.ends[to].peer.clone(),
                        reason,
                    },
                );
                self.fail(st, errors);
            }
            return Err(err);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let rx = &mut st.rx[to];
        // Onto an empty queue only an operation that found no receive: the RNR timer starts.
        let timed = rx.stalled.is_empty();
        if timed {
            self.watch(to, seq)?;
        }
        let (done, posted) = if signaled {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Posted::Queued(rx))
        } else {
            (None, Posted::Unsignaled)
        };
        rx.stalled.push_back(Queued {
            seq,
            action,
            done,
            timed,
        });
        Ok(posted)
    }

    /// Starts the RNR timer for operation `seq`, waiting for a receive of end `to`.
    fn watch(self: &Arc<Self>, to: usize, seq: u64) -> Result<()> {
        rnr::schedule(Due {
            at: Instant::now() + self.ends[to].config.rnr_timeout,
            link: Arc::downgrade(self),
            end: to,
            seq,
        })
    }

    /// Carries out `action` at end `to`, whose receives are `rx` (the link is locked).
    fn carry(&self, to: usize, rx: &mut Rx, action: Action) -> Result<Output, Refused> {
        match action {
            Action::Send { data, imm } => {
                let Some(buf) = rx.posted.front() else {
                    return Err(Refused::NoReceive(Action::Send { data, imm }));
                };
                let (len, capacity) = (data.len(), buf.capacity());
                if len > capacity {
                    return Err(Fault::TooSmall {
                        len: len as u64,
                        capacity: capacity as u64,
                    }
                    .into());
                }
                let mut buf = rx.posted.pop_front().expect("checked above");
                data.copy_to(&mut buf.as_mut_capacity()[..len]);
                buf.set_len(len);
                rx.completed.push_back(RecvCompletion {
                    buf,
                    opcode: if imm.is_some() {
                        RecvOpcode::SendWithImm
                    } else {
                        RecvOpcode::Send
                    },
                    imm,
                    write_len: 0,
                });
                Ok(Output::Unit)
            }
            Action::WriteImm {
                src,
                rkey,
                addr,
                imm,
            } => {
                if rx.posted.is_empty() {
                    return Err(Refused::NoReceive(Action::WriteImm {
                        src,
                        rkey,
                        addr,
                        imm,
                    }));
                }
                let write_len = src.len() as u64;
                self.remote(to, Remote::Write { src, rkey, addr })?;
                let mut buf = rx.posted.pop_front().expect("checked above");
                buf.set_len(0);
                rx.completed.push_back(RecvCompletion {
                    buf,
                    opcode: RecvOpcode::WriteWithImm,
                    imm: Some(imm),
                    write_len,
                });
                Ok(Output::Unit)
            }
            Action::Remote(op) => Ok(self.remote(to, op)?),
        }
    }

    /// A one-sided operation on the windows end `to` granted.
    fn remote(&self, to: usize, op: Remote) -> Result<Output, Fault> {
        let windows = &self.ends[to].windows;
        match op {
            Remote::Write { src, rkey, addr } => {
                let len = src.len() as u64;
                windows
                    .access(rkey, addr, len, Access::REMOTE_WRITE, |buf, range| {
                        src.copy_to(&mut buf.as_mut_capacity()[range])
                    })
                    .map_err(|violation| Fault::Access {
                        what: "write",
                        rkey,
                        addr,
                        len,
                        violation,
                    })?;
                Ok(Output::Unit)
            }
            Remote::Read {
                rkey,
                addr,
                len,
                mut dst,
            } => {
                let n = len as usize;
                let target = &mut dst.as_mut_capacity()[..n];
                windows
                    // A raw copy: the window may be a read-only view of frozen bytes.
                    .access(rkey, addr, len, Access::REMOTE_READ, |buf, range| {
                        buf.copy_out(range.start, target)
                    })
                    .map_err(|violation| Fault::Access {
                        what: "read",
                        rkey,
                        addr,
                        len,
                        violation,
                    })?;
                dst.set_len(n);
                Ok(Output::Buf(dst))
            }
            Remote::Atomic { rkey, addr, op } => {
                let refused = |violation| Fault::Access {
                    what: "atomic",
                    rkey,
                    addr,
                    len: 8,
                    violation,
                };
                if !addr.is_multiple_of(8) {
                    return Err(refused(AccessViolation::Misaligned));
                }
                let old = windows
                    .access(rkey, addr, 8, Access::REMOTE_ATOMIC, |buf, range| {
                        let bytes = &mut buf.as_mut_capacity()[range];
                        let word: &mut [u8; 8] = bytes.try_into().expect("an 8-byte range");
                        let old = u64::from_ne_bytes(*word);
                        let new = match op {
                            Atomic::CompareAndSwap { expected, new } if old == expected => new,
                            Atomic::CompareAndSwap { .. } => old,
                            Atomic::FetchAndAdd { add } => old.wrapping_add(add),
                        };
                        *word = new.to_ne_bytes();
                        old
                    })
                    .map_err(refused)?;
                Ok(Output::Word(old))
            }
        }
    }

    /// End `to` posted a receive: carries out the operations waiting for it, in order, up to
    /// the next one that finds no receive.
    fn drain(self: &Arc<Self>, mut st: MutexGuard<'_, LinkState>, to: usize) {
        let from = 1 - to;
        loop {
            let rx = &mut st.rx[to];
            let Some(head) = rx.stalled.front_mut() else {
                break;
            };
            if head.action.needs_receive() && rx.posted.is_empty() {
                if !head.timed {
                    head.timed = true;
                    let seq = head.seq;
                    if let Err(e) = self.watch(to, seq) {
                        let errors = by_end(from, e.duplicate(), e);
                        return self.fail(st, errors);
                    }
                }
                break;
            }
            let Queued {
                seq,
                action,
                done,
                timed,
            } = rx.stalled.pop_front().expect("checked above");
            match self.carry(to, rx, action) {
                Ok(out) => complete(done, Ok(out)),
                Err(Refused::NoReceive(action)) => {
                    // Not reached (a receive is posted), but harmless: it waits on.
                    rx.stalled.push_front(Queued {
                        seq,
                        action,
                        done,
                        timed,
                    });
                    break;
                }
                Err(Refused::Fault(fault)) => {
                    let errors = self.fault_errors(from, fault);
                    complete(done, Err(errors[from].duplicate()));
                    return self.fail(st, errors);
                }
            }
        }
        let woken = st.rx[to].waiters.take();
        drop(st);
        woken.wake();
    }

    /// The other end's address, as end `end` reports it.
    pub(super) fn peer(&self, end: usize) -> &str {
        &self.ends[end].peer
    }

    /// The settings of end `end`.
    pub(super) fn config(&self, end: usize) -> &MemConfig {
        &self.ends[end].config
    }

    /// End `end` posts a receive (its rights were checked), and carries out what waited for
    /// it.
    pub(super) fn post_recv(self: &Arc<Self>, end: usize, buf: RegisteredBuf) -> Result<()> {
        let mut st = self.state();
        if let Some(errors) = &st.failed {
            return Err(errors[end].duplicate());
        }
        let rx = &mut st.rx[end];
        rx.posted.push_back(buf);
        if !rx.stalled.is_empty() {
            self.drain(st, end);
        }
        Ok(())
    }

    /// The next completed receive of end `end`; once none is left and the connection is in
    /// error, the error. A completion is taken only when it is returned.
    pub(super) fn poll_recv(
        &self,
        end: usize,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvCompletion>> {
        let mut st = self.state();
        let st = &mut *st;
        let rx = &mut st.rx[end];
        if let Some(c) = rx.completed.pop_front() {
            return Poll::Ready(Ok(c));
        }
        if let Some(errors) = &st.failed {
            return Poll::Ready(Err(errors[end].duplicate()));
        }
        rx.waiters.register(cx.waker());
        Poll::Pending
    }

    /// End `end` exposes `buf[offset..offset + len]` to the other end (range and rights were
    /// checked).
    pub(super) fn grant(
        &self,
        end: usize,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant> {
        if let Some(e) = self.error(end) {
            return Err(e);
        }
        Ok(self.ends[end].windows.grant(buf, offset, len, access))
    }

    /// End `end` closes the connection.
    pub(super) fn close(&self, end: usize) {
        let st = self.state();
        if st.failed.is_some() {
            return;
        }
        let errors = by_end(
            end,
            Error::ConnectionClosed {
                peer: self.ends[end].peer.clone(),
                reason: "closed locally".into(),
            },
            Error::ConnectionClosed {
                peer: self.ends[1 - end].peer.clone(),
                reason: "closed by the peer".into(),
            },
        );
        self.fail(st, errors);
    }

    /// Resolves once the connection is in error, with the error end `end` reports.
    pub(super) async fn closed(&self, end: usize) -> Error {
        loop {
            let notified = self.failed.notified();
            tokio::pin!(notified);
            // Registered before the check: a failure in between still wakes it.
            notified.as_mut().enable();
            if let Some(e) = self.error(end) {
                return e;
            }
            notified.await;
        }
    }

    /// The RNR timer of operation `seq` (waiting for a receive of end `end`) expired: fails
    /// the connection if that operation still waits.
    pub(super) fn rnr_expired(&self, end: usize, seq: u64) {
        let st = self.state();
        let waiting = st.failed.is_none()
            && st.rx[end]
                .stalled
                .front()
                .is_some_and(|head| head.seq == seq);
        if !waiting {
            return;
        }
        let retry_ms = self.ends[end].config.rnr_timeout.as_millis() as u64;
        let errors = [
            Error::ReceiverNotReady { retry_ms },
            Error::ReceiverNotReady { retry_ms },
        ];
        self.fail(st, errors);
    }
}

/// `[errors of end 0, errors of end 1]` from the errors of `from` and of the other end.
fn by_end(from: usize, mine: Error, theirs: Error) -> [Error; 2] {
    if from == 0 {
        [mine, theirs]
    } else {
        [theirs, mine]
    }
}
