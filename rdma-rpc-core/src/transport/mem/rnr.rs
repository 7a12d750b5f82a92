//! Receiver-not-ready deadlines. A send that finds no posted receive waits in the receiving
//! end's queue; one thread for the whole process sleeps until the earliest such deadline and
//! fails the connection if that send still waits. A thread rather than a task: the two ends
//! may run on different runtimes (or none), and the deadline must fire whichever is alive.
//! Only stalled sends get here; the data path never does.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

use super::link::{lock, Link};
use crate::error::{Error, Result};

/// A send waiting for a receive, from the timer's point of view.
pub(super) struct Due {
    pub(super) at: Instant,
    pub(super) link: Weak<Link>,
    /// The end whose receive the send waits for.
    pub(super) end: usize,
    /// The waiting operation (see `Link::rnr_expired`).
    pub(super) seq: u64,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    /// Earliest first in the (max-)heap.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

struct Timer {
    due: Mutex<BinaryHeap<Due>>,
    changed: Condvar,
}

static TIMER: Timer = Timer {
    due: Mutex::new(BinaryHeap::new()),
    changed: Condvar::new(),
};

/// Whether the timer thread runs (`false`: it could not be started).
static STARTED: OnceLock<bool> = OnceLock::new();

/// Fails the send `due` names at `due.at` if it still waits then.
pub(super) fn schedule(due: Due) -> Result<()> {
    let started = *STARTED.get_or_init(|| {
        std::thread::Builder::new()
            .name("rdma-rpc-mem-rnr".into())
            .spawn(run)
            .map_err(|e| tracing::error!(error = %e, "cannot start the mem:// RNR timer"))
            .is_ok()
    });
    if !started {
        return Err(Error::io(
            "starting the mem:// receiver-not-ready timer thread",
            std::io::Error::other("the thread could not be spawned"),
        ));
    }
    lock(&TIMER.due).push(due);
    TIMER.changed.notify_one();
    Ok(())
}

fn run() {
    let mut due = lock(&TIMER.due);
    loop {
        let now = Instant::now();
        let next = due.peek().map(|d| d.at);
        match next {
            None => due = TIMER.changed.wait(due).unwrap_or_else(|e| e.into_inner()),
            Some(at) if at > now => {
                due = TIMER
                    .changed
                    .wait_timeout(due, at - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            Some(_) => {
                let Some(expired) = due.pop() else { continue };
                drop(due);
                if let Some(link) = expired.link.upgrade() {
                    link.rnr_expired(expired.end, expired.seq);
                }
                due = lock(&TIMER.due);
            }
        }
    }
}
