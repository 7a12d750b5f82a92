//! What the context's handles hold: [`EngineShared`], the way to the context's owner (the
//! commands they send it, [`Cmd`] and [`Op`], the seat through which they post operations
//! themselves, and the connection claims of a shared client context), and [`Receives`], the
//! staging receives their connections reserve.
//!
//! # Operations posted by the caller's task
//! An owner with a progress engine of its own (event and spin modes) sits in a [`Seat`], a
//! lock its task holds while it progresses and handles commands, never across an await. A
//! handle that posts an operation takes the seat if it is free and submits the operation
//! itself ([`EngineShared::post`]), instead of queueing a command that the owner's task takes
//! later: no command, no queue node, no wake of the owner's task (about 500 fewer
//! instructions per 64 B call with 64 connections, 1,900 with 1,000, whose commands made the
//! owner's queue long; docs/doca.md has the figures). DOCA gives a progress
//! engine and its contexts no thread safety of their own: the seat makes sure one thread at
//! a time uses them, as the owner's task alone did before. Only the owner progresses, so
//! callbacks still run on its task. The seat taken (the owner progresses on another worker)
//! or a command still queued sends the operation as a command instead: operations of a
//! connection are submitted in the order they were posted, behind any command sent before
//! them. Busy-poll contexts share the polling thread's engine with other contexts and keep
//! the command queue only.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use tokio::sync::{mpsc, oneshot};

use super::super::sys::{Device, Mmap};
use super::{ConnId, ConnShared, Owner};
use crate::error::{Error, Result};
use crate::memory::{RegisteredBuf, StagingPools};
use crate::transport::Descriptor;
use std::net::IpAddr;

/// Registered local memory for one operation, with the mmap that covers it.
pub(in crate::transport::doca) struct Local {
    pub(in crate::transport::doca) buf: RegisteredBuf,
    pub(in crate::transport::doca) mmap: Arc<Mmap>,
    /// Whether the bytes were copied into the transport's pooled staging: then `buf`'s region
    /// is a staging slab, and a send or write from it uses a `doca_buf` the context keeps
    /// over the whole slab.
    pub(in crate::transport::doca) staged: bool,
}

pub(in crate::transport::doca) enum AtomicOp {
    CompareAndSwap { expected: u64, new: u64 },
    FetchAndAdd { add: u64 },
}

/// An operation posted on a connection.
pub(in crate::transport::doca) enum Op {
    /// `done` is `None` for an unsignaled send: nobody waits for it, and a failure fails the
    /// connection as any failed operation does.
    Send {
        src: Local,
        imm: Option<u32>,
        done: Option<oneshot::Sender<Result<()>>>,
    },
    Write {
        src: Local,
        dst: Descriptor,
        imm: Option<u32>,
        done: Option<oneshot::Sender<Result<()>>>,
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

/// What other tasks ask the owner to do.
pub(in crate::transport::doca) enum Cmd {
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
    /// A connection reserved more staging receives (see [`Receives`]): register and post
    /// them before the operations queued behind this command.
    Grow,
}

/// The staging receives of one context, as its connections reserve them: a connection
/// reserves one for each receive it posts beyond its earlier peak (the credits its peer may
/// hold), so the owner can keep at least that many posted. Shared by the connections'
/// application handles, which reserve without waiting for the owner.
pub(in crate::transport::doca) struct Receives {
    /// Bytes of one staging receive (`DocaConfig::max_recv_size`).
    pub(in crate::transport::doca) slot_size: usize,
    /// Most staging receives of the context (`DocaConfig::recv_queue_size`, bounded by the
    /// device).
    pub(in crate::transport::doca) max: usize,
    reserved: std::sync::atomic::AtomicUsize,
}

impl Receives {
    pub(super) fn new(slot_size: usize, max: usize) -> Receives {
        Receives {
            slot_size,
            max,
            reserved: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Reserves `n` more staging receives, if the context has room for them.
    pub(in crate::transport::doca) fn reserve(&self, n: usize) -> bool {
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(n).filter(|t| *t <= self.max)
            })
            .is_ok()
    }

    /// Gives back `n` reserved staging receives (a connection ended).
    pub(in crate::transport::doca) fn release(&self, n: usize) {
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(n))
            });
    }

    /// Staging receives reserved by the context's connections.
    pub(in crate::transport::doca) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }
}

/// Where an owner with a progress engine of its own sits while its event-mode task runs (see
/// the module's documentation). Empty before the context runs and once it stops, or when the
/// owner moved to a polling thread.
pub(super) type Seat = Mutex<Option<Owner>>;

/// Takes the seat, waiting for it. A panic while it was held (a bug) does not end the
/// context: the owner goes on serving its other connections, as it did when a panic in a
/// posting task could not reach it.
pub(super) fn sit(seat: &Seat) -> std::sync::MutexGuard<'_, Option<Owner>> {
    seat.lock().unwrap_or_else(|e| e.into_inner())
}

/// What every handle of one context shares: the way to its owner.
pub(in crate::transport::doca) struct EngineShared {
    pub(super) cmds: mpsc::UnboundedSender<Cmd>,
    /// Commands sent and not yet handled: while any is, operations go behind them as commands.
    pub(super) queued: Arc<AtomicUsize>,
    /// The owner's seat (event and spin modes); `None` in busy-poll mode.
    pub(super) seat: Option<Arc<Seat>>,
    /// Operations submitted by the posting task itself, through the seat (for tests).
    #[cfg(test)]
    pub(super) direct: AtomicU64,
    /// The most events the owner handled together (for tests).
    #[cfg(test)]
    pub(super) gathered: AtomicUsize,
    /// Set after each command: a busy-poll thread looks at the queue only when it is set,
    /// one load instead of a channel receive per context and round.
    pub(super) doorbell: Arc<AtomicBool>,
    pub(in crate::transport::doca) dev: Arc<Device>,
    pub(in crate::transport::doca) staging: Arc<StagingPools>,
    /// The context's staging receives, as reserved by its connections.
    pub(in crate::transport::doca) receives: Receives,
    /// Connections of a shared client context claimed by connects (the transport picks a
    /// context with room; the owner gives the claim back when the connection is gone).
    pub(super) claimed: std::sync::atomic::AtomicUsize,
    /// Most connections of the context.
    pub(in crate::transport::doca) capacity: usize,
    /// Wake-ups of event-mode owners, counted per transport.
    pub(super) wakeups: Arc<AtomicU64>,
}

impl EngineShared {
    /// Sends a command; if the owner is gone the command (and its oneshot) is dropped, which
    /// its waiter sees as an error.
    pub(in crate::transport::doca) fn send(&self, cmd: Cmd) {
        // Counted before it is queued: the owner, which counts it off once handled, must
        // never see it first.
        self.queued.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(_)) = self.cmds.send(cmd) {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        self.doorbell.store(true, Ordering::Release);
    }

    /// Posts an operation on connection `id`: submitted by this task if the owner's seat is
    /// free and no command waits (see the module's documentation), else sent as a command.
    pub(in crate::transport::doca) fn post(&self, id: ConnId, op: Op) {
        let Some(seat) = &self.seat else {
            return self.send(Cmd::Op { id, op });
        };
        let mut held = match seat.try_lock() {
            Ok(held) => held,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return self.send(Cmd::Op { id, op }),
        };
        // Read with the seat held: the owner counts a command off only while it holds it.
        match held.as_mut() {
            Some(owner) if self.queued.load(Ordering::Acquire) == 0 => {
                owner.post(id, op);
                #[cfg(test)]
                self.direct.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                drop(held);
                self.send(Cmd::Op { id, op });
            }
        }
    }

    /// Takes the owner's seat, as its task does while it progresses (`None` without one).
    #[cfg(test)]
    pub(in crate::transport::doca) fn hold_seat(&self) -> Option<impl Drop + '_> {
        self.seat.as_deref().map(sit)
    }

    /// The owner's idle tasks kept, and how often it found none to reuse and allocated one
    /// (`None` while the owner is elsewhere: busy poll, or a stopped context).
    #[cfg(test)]
    pub(in crate::transport::doca) fn idle_tasks(&self) -> Option<(usize, u64)> {
        let seat = sit(self.seat.as_deref()?);
        seat.as_ref().map(|o| (o.idle.len(), o.idle.empty))
    }

    /// Takes the owner out of its seat and stops its context on this thread, as a dropped
    /// owner task has it done: whether the context stopped (every task back and freed)
    /// within the stop's limit, or was leaked (`None` without a seated owner).
    #[cfg(test)]
    pub(in crate::transport::doca) fn stop_owner_here(&self) -> Option<bool> {
        let mut owner = sit(self.seat.as_deref()?).take()?;
        owner.shutdown_blocking();
        Some(owner.rdma.destroyable)
    }

    /// Operations submitted by their posting task, not sent to the owner as commands.
    #[cfg(test)]
    pub(in crate::transport::doca) fn direct_posts(&self) -> u64 {
        self.direct.load(Ordering::Relaxed)
    }

    /// The most events the owner handled in one batch so far.
    #[cfg(test)]
    pub(in crate::transport::doca) fn largest_batch(&self) -> usize {
        self.gathered.load(Ordering::Relaxed)
    }

    /// Claims room for one more connection, if the context has it (shared client contexts).
    pub(in crate::transport::doca) fn claim(&self) -> bool {
        self.claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < self.capacity).then_some(c + 1)
            })
            .is_ok()
    }

    /// Whether the context's owner still takes commands: not once its progress ended (its
    /// runtime shut down, or the context failed).
    pub(in crate::transport::doca) fn is_running(&self) -> bool {
        !self.cmds.is_closed()
    }

    /// Gives back a connection's claim (it is gone, or never came to be).
    pub(in crate::transport::doca) fn unclaim(&self) {
        let _ = self
            .claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(1))
            });
    }

    /// Sends a command and waits for the owner's reply.
    pub(in crate::transport::doca) async fn ask<T>(
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
