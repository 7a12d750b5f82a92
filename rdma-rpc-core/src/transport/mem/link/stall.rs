//! The stall queue of an in-process connection. Only a send (or write with immediate) that
//! finds no posted receive waits: it goes into the receiving end's queue, and every operation
//! its sender posts afterwards queues behind it, so nothing overtakes it (RC ordering). The
//! receiving end's next `post_recv` carries the queue out; the RNR timer (`rnr.rs`) fails the
//! connection if the receive does not come in time.

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use tokio::sync::oneshot;

use super::super::rnr::{self, Due};
use super::{by_end, Action, Link, LinkState, Output, Posted, Refused};
use crate::error::{Error, Result};

/// An operation waiting in the receiving end's queue.
pub(super) struct Queued {
    pub(super) seq: u64,
    pub(super) action: Action,
    /// `None` for an unsignaled send.
    pub(super) done: Option<oneshot::Sender<Result<Output>>>,
    /// Whether the RNR timer watches it (it was at the head with no receive posted).
    pub(super) timed: bool,
}

/// Reports the result of a queued operation to its poster, if it asked for one.
pub(super) fn complete(done: Option<oneshot::Sender<Result<Output>>>, result: Result<Output>) {
    if let Some(done) = done {
        // A dropped receiver: the caller stopped waiting; the operation still happened.
        let _ = done.send(result);
    }
}

impl Link {
    /// Queues an operation of end `from` behind the one waiting for a receive of the other
    /// end (or as that one).
    pub(super) fn enqueue(
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

    /// End `to` posted a receive: carries out the operations waiting for it, in order, up to
    /// the next one that finds no receive.
    pub(super) fn drain(self: &Arc<Self>, mut st: MutexGuard<'_, LinkState>, to: usize) {
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
        self.wake_receiver(st, to);
    }

    /// The RNR timer of operation `seq` (waiting for a receive of end `end`) expired: fails
    /// the connection if that operation still waits.
    pub(in crate::transport::mem) fn rnr_expired(&self, end: usize, seq: u64) {
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
