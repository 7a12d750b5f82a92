//! The data path of an in-process connection. Every operation is carried out by the thread
//! that posts it, on the peer's memory, with nothing in between: a send copies into the
//! peer's next posted receive and wakes the task waiting in the peer's `recv`; a write, read
//! or atomic copies into or out of a window the peer granted, with key, rights and bounds
//! checked against the peer's window table. Such an operation has completed when it is
//! posted. What must wait for a receive goes to the stall queue (`stall.rs`).

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::{Fault, Link, Rx};
use crate::error::{AccessViolation, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::{Grant, RecvCompletion, RecvOpcode, SendData};

/// An atomic operation.
#[derive(Debug, Clone, Copy)]
pub(in crate::transport::mem) enum Atomic {
    CompareAndSwap { expected: u64, new: u64 },
    FetchAndAdd { add: u64 },
}

/// A one-sided operation on the peer's windows.
pub(in crate::transport::mem) enum Remote {
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
pub(in crate::transport::mem) enum Action {
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
    pub(super) fn needs_receive(&self) -> bool {
        !matches!(self, Action::Remote(_))
    }
}

/// What a completed operation gives back.
pub(in crate::transport::mem) enum Output {
    Unit,
    Buf(RegisteredBuf),
    Word(u64),
}

/// The typed result of an operation, from its [`Output`].
pub(in crate::transport::mem) trait FromOutput:
    Send + Sized + 'static
{
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

/// The result of posting an operation.
pub(in crate::transport::mem) enum Posted {
    /// Carried out already.
    Done(Output),
    /// Waiting behind a send that found no receive.
    Queued(oneshot::Receiver<Result<Output>>),
    /// An unsignaled send, queued.
    Unsignaled,
}

/// Why an operation could not be carried out now.
pub(super) enum Refused {
    /// No receive is posted: it waits (the action comes back to be queued).
    NoReceive(Action),
    Fault(Fault),
}

impl From<Fault> for Refused {
    fn from(f: Fault) -> Self {
        Refused::Fault(f)
    }
}

impl Link {
    /// Posts an operation of end `from`: carries it out now unless it must wait for a
    /// receive, or queue behind one that does.
    pub(in crate::transport::mem) fn post(
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
                self.wake_receiver(st, to);
                Ok(Posted::Done(out))
            }
            Err(Refused::NoReceive(action)) => self.enqueue(st, from, action, signaled),
            Err(Refused::Fault(fault)) => Err(self.fail_with(st, from, fault)),
        }
    }

    /// Posts an unsignaled send of a copy of `frame` from end `from` (see
    /// [`Connection::send_frame`](crate::transport::Connection::send_frame)): copied straight
    /// into the peer's next posted receive; one that must wait (no receive posted, or sends
    /// before it waiting) waits as a copy of its own.
    pub(in crate::transport::mem) fn post_frame(
        self: &Arc<Self>,
        from: usize,
        frame: &[u8],
    ) -> Result<()> {
        let to = 1 - from;
        let mut st = self.state();
        if let Some(errors) = &st.failed {
            return Err(errors[from].duplicate());
        }
        if st.rx[to].stalled.is_empty() {
            match land(&mut st.rx[to], frame.len(), None, |dst| {
                dst.copy_from_slice(frame)
            }) {
                Some(Ok(())) => {
                    self.wake_receiver(st, to);
                    return Ok(());
                }
                Some(Err(fault)) => return Err(self.fail_with(st, from, fault)),
                None => {}
            }
        }
        let data = SendData::Bytes(bytes::Bytes::copy_from_slice(frame));
        self.enqueue(st, from, Action::Send { data, imm: None }, false)
            .map(drop)
    }

    /// Carries out `action` at end `to`, whose receives are `rx` (the link is locked).
    pub(super) fn carry(&self, to: usize, rx: &mut Rx, action: Action) -> Result<Output, Refused> {
        match action {
            Action::Send { data, imm } => {
                match land(rx, data.len(), imm, |dst| data.copy_to(dst)) {
                    Some(landed) => Ok(landed.map(|()| Output::Unit)?),
                    None => Err(Refused::NoReceive(Action::Send { data, imm })),
                }
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

    /// End `end` posts a receive (its rights were checked), and carries out what waited for
    /// it.
    pub(in crate::transport::mem) fn post_recv(
        self: &Arc<Self>,
        end: usize,
        buf: RegisteredBuf,
    ) -> Result<()> {
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
    pub(in crate::transport::mem) fn poll_recv(
        &self,
        end: usize,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvCompletion>> {
        if self.quiet[end].holds(cx.waker()) {
            return Poll::Pending;
        }
        let mut st = self.state();
        let st = &mut *st;
        let rx = &mut st.rx[end];
        if let Some(c) = rx.completed.pop_front() {
            return Poll::Ready(Ok(c));
        }
        if let Some(errors) = &st.failed {
            return Poll::Ready(Err(errors[end].duplicate()));
        }
        rx.waiters.register(cx.waker(), &self.quiet[end]);
        Poll::Pending
    }

    /// End `end` exposes `buf[offset..offset + len]` to the other end (range and rights were
    /// checked).
    pub(in crate::transport::mem) fn grant(
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
}

/// Lands a send of `len` bytes, which `write` puts into the receive's first `len` bytes, in the
/// next receive posted at `rx`: `None` when none is posted (the link is locked).
fn land(
    rx: &mut Rx,
    len: usize,
    imm: Option<u32>,
    write: impl FnOnce(&mut [u8]),
) -> Option<Result<(), Fault>> {
    let capacity = rx.posted.front()?.capacity();
    if len > capacity {
        return Some(Err(Fault::TooSmall {
            len: len as u64,
            capacity: capacity as u64,
        }));
    }
    let mut buf = rx.posted.pop_front().expect("checked above");
    write(&mut buf.as_mut_capacity()[..len]);
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
    Some(Ok(()))
}
