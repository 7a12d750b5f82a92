//! Busy-poll progress: one thread per transport drives every context of that transport.
//!
//! A thread per context would make a server with 64 clients, or a process with 64 client
//! connections, spin 64 threads; on a DPU's few cores (and on any machine with fewer cores
//! than connections) they take turns through the scheduler and each message waits for its
//! context's turn, milliseconds instead of microseconds. DOCA's own model is a progress
//! engine per thread serving many contexts; here each context keeps its own engine and one
//! thread progresses them all in turn, so a round costs one `doca_pe_progress` per context.
//!
//! Each round visits every context: progress until nothing happens, expire deadlines, then,
//! if its doorbell rang, at most [`CMD_BATCH`] of its commands (so a flood on one connection
//! cannot starve the others). A context quiet for [`COLD_AFTER`] rounds is progressed only every
//! [`COLD_EVERY`]th round (its commands are still taken every round, and any activity makes
//! it hot again): with many idle connections a round stays short, and so does the wait of
//! the busy ones. Every [`COLD_EVERY`]th round also looks at the queue without a doorbell,
//! which is how it sees that every handle is gone. A context whose handles are all gone is handed to a thread of its own to stop
//! (stopping waits for DOCA state changes and must not stall the others). Idle rounds first
//! yield the core, and after a long quiet spell nap between rounds; with no context at all
//! the thread sleeps until one is added, and it ends when its transport and every context
//! are gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{stop_elsewhere, Cmd, Owner};
use crate::error::{Error, Result};

/// Idle rounds after which the thread yields its core between rounds.
const YIELD_AFTER: u32 = 1024;
/// Idle rounds after which it naps between rounds, and for how long.
const NAP_AFTER: u32 = 100_000;
const NAP: Duration = Duration::from_micros(50);
/// Most commands of one context handled per round.
const CMD_BATCH: usize = 256;
/// Rounds without activity after which a context is cold, and how often a cold one is
/// progressed.
const COLD_AFTER: u32 = 4096;
const COLD_EVERY: u32 = 16;

type Entry = (Owner, mpsc::UnboundedReceiver<Cmd>, Arc<AtomicBool>);

/// A context on the thread, with how many rounds it has been quiet.
struct Polled {
    owner: Owner,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    /// Set by senders after each command.
    doorbell: Arc<AtomicBool>,
    quiet: u32,
}

/// The handle of a polling thread: adds contexts to it.
pub(in crate::transport::doca) struct Poller {
    adds: std_mpsc::Sender<Entry>,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Poller")
    }
}

impl Poller {
    /// Starts a polling thread with no context yet.
    pub(in crate::transport::doca) fn spawn() -> Result<Poller> {
        let (adds, rx) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("doca-progress".into())
            .spawn(move || run(rx))
            .map_err(|e| Error::io("spawning the DOCA progress thread", e))?;
        Ok(Poller { adds })
    }

    /// Hands a started context, its command queue and the queue's doorbell to the thread.
    pub(super) fn add(
        &self,
        owner: Owner,
        cmds: mpsc::UnboundedReceiver<Cmd>,
        doorbell: Arc<AtomicBool>,
    ) -> Result<()> {
        self.adds.send((owner, cmds, doorbell)).map_err(|e| {
            // The thread is gone (it panicked): stop the context here rather than leak it.
            let (mut owner, ..) = e.0;
            owner.shutdown_blocking();
            Error::InvalidArgument("the DOCA progress thread has stopped".into())
        })
    }
}

/// What one visit to a context found.
#[derive(Debug, PartialEq, Eq)]
enum Visit {
    Busy,
    Idle,
    /// Every handle of the context is gone.
    Closed,
}

fn visit(ctx: &mut Polled, round: u32) -> Visit {
    let mut busy = false;
    let sweep = round.is_multiple_of(COLD_EVERY);
    if ctx.quiet < COLD_AFTER || sweep {
        busy = ctx.owner.progress_all();
        ctx.owner.expire_deadlines();
    }
    if ctx.doorbell.swap(false, Ordering::Acquire) || sweep {
        for taken in 1.. {
            match ctx.cmds.try_recv() {
                Ok(cmd) => {
                    ctx.owner.handle(cmd);
                    busy = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return Visit::Closed,
            }
            if taken == CMD_BATCH {
                // More may wait: look again next round.
                ctx.doorbell.store(true, Ordering::Relaxed);
                break;
            }
        }
    }
    ctx.quiet = if busy { 0 } else { ctx.quiet.saturating_add(1) };
    if busy {
        Visit::Busy
    } else {
        Visit::Idle
    }
}

fn run(adds: std_mpsc::Receiver<Entry>) {
    let mut ctxs: Vec<Polled> = Vec::new();
    let add = |ctxs: &mut Vec<Polled>, (owner, cmds, doorbell): Entry| {
        ctxs.push(Polled {
            owner,
            cmds,
            doorbell,
            quiet: 0,
        })
    };
    let mut idle = 0u32;
    let mut round = 0u32;
    loop {
        if ctxs.is_empty() {
            // Nothing to poll: sleep until a context arrives or the transport is gone.
            match adds.recv() {
                Ok(entry) => add(&mut ctxs, entry),
                Err(_) => return,
            }
        }
        while let Ok(entry) = adds.try_recv() {
            add(&mut ctxs, entry);
        }
        round = round.wrapping_add(1);
        let mut busy = false;
        let mut i = 0;
        while i < ctxs.len() {
            match visit(&mut ctxs[i], round) {
                Visit::Busy => busy = true,
                Visit::Idle => {}
                Visit::Closed => {
                    stop_elsewhere(ctxs.swap_remove(i).owner);
                    busy = true;
                    continue;
                }
            }
            i += 1;
        }
        idle = if busy { 0 } else { idle.saturating_add(1) };
        if idle > NAP_AFTER {
            std::thread::sleep(NAP);
        } else if idle > YIELD_AFTER {
            std::thread::yield_now();
        }
    }
}
