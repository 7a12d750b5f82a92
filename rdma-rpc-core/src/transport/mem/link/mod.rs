//! What the two ends of an in-process connection share: each end's peer, settings and
//! granted windows, and, behind one lock, both ends' receives and the operations stalled
//! behind a send that found none; and how the connection fails (once, for both ends, with
//! every waiter woken). The data path is in `datapath.rs`, the stall queue and its RNR timer
//! in `stall.rs`.

mod datapath;
mod stall;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::window::WindowTable;
use super::MemConfig;
use crate::error::{AccessViolation, Error};
use crate::memory::RegisteredBuf;
use crate::transport::common::{Quiet, Waiters};
use crate::transport::RecvCompletion;

use datapath::Refused;
pub(super) use datapath::{Action, Atomic, FromOutput, Output, Posted, Remote};
use stall::{complete, Queued};

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
    /// `quiet[i]`: lets end `i`'s polls that find no receive skip the lock.
    quiet: [Quiet; 2],
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
            quiet: Default::default(),
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
            woken.push(rx.waiters.take(&self.quiet[end]));
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

    /// Unlocks the link and wakes whoever waits for end `to`'s receives (something landed
    /// there).
    #[inline]
    fn wake_receiver(&self, mut st: MutexGuard<'_, LinkState>, to: usize) {
        let woken = st.rx[to].waiters.take(&self.quiet[to]);
        drop(st);
        woken.wake();
    }

    /// Fails the connection with the fault of an operation of end `from`; returns the error
    /// that operation completes with.
    fn fail_with(&self, st: MutexGuard<'_, LinkState>, from: usize, fault: Fault) -> Error {
        let errors = self.fault_errors(from, fault);
        let mine = errors[from].duplicate();
        self.fail(st, errors);
        mine
    }

    /// The other end's address, as end `end` reports it.
    pub(super) fn peer(&self, end: usize) -> &str {
        &self.ends[end].peer
    }

    /// The settings of end `end`.
    pub(super) fn config(&self, end: usize) -> &MemConfig {
        &self.ends[end].config
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
}

/// `[errors of end 0, errors of end 1]` from the errors of `from` and of the other end.
fn by_end(from: usize, mine: Error, theirs: Error) -> [Error; 2] {
    if from == 0 {
        [mine, theirs]
    } else {
        [theirs, mine]
    }
}
