//! Busy-poll progress: one thread and one progress engine per transport drive every context
//! of that transport.
//!
//! A thread per context would make a server with 64 clients, or a process with 64 client
//! connections, spin 64 threads; on a DPU's few cores (and on any machine with fewer cores
//! than connections) they take turns through the scheduler and each message waits for its
//! context's turn, milliseconds instead of microseconds. DOCA's model is a progress engine per
//! thread with any number of contexts connected to it (`doca_pe_connect_ctx`): here every
//! context of a busy-polling transport is connected to the engine of the transport's thread,
//! so one `doca_pe_progress` per round serves them all.
//!
//! The thread alone touches its engine: it holds the engine's one [`PeDriver`] (the handle
//! keeps only the engine itself, for the contexts prepared for it), connects and starts the
//! contexts prepared for it (the slow part of setup, allocating and registering memory, is
//! done before, off the engine), progresses, and stops contexts whose handles are all gone.
//! Each round it progresses the engine until nothing happens (at most [`PROGRESS_ROUNDS`]
//! times), then visits every context: the events its callbacks recorded, its deadlines, and,
//! if its doorbell rang, at most [`CMD_BATCH`] of its commands (a flood on one connection
//! cannot starve the others), lending the owner the driver for the commands that progress.
//! Every [`SWEEP_EVERY`]th round it also looks at the queues without a doorbell, which is how
//! it sees that every handle of a context is gone. A context handed over with an engine of its
//! own (event mode without a notification handle) keeps that engine's driver and progresses
//! it when visited.
//!
//! Idle rounds first yield the core, and after a long quiet spell nap between rounds; with no
//! context at all the thread sleeps until one is added, and it ends once its transport and
//! every context are gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::super::sys::{doca_error, Pe, PeDriver};
use super::setup::STATE_CHANGE_LIMIT;
use super::{Cmd, Owner, PROGRESS_ROUNDS};
use crate::error::{Error, Result};

/// Idle rounds after which the thread yields its core between rounds.
const YIELD_AFTER: u32 = 1024;
/// Idle rounds after which it naps between rounds, and for how long.
const NAP_AFTER: u32 = 100_000;
const NAP: Duration = Duration::from_micros(50);
/// Most commands of one context per round.
const CMD_BATCH: usize = 256;
/// How often the queues are looked at without a doorbell.
const SWEEP_EVERY: u32 = 64;

/// A context for the thread: its owner, command queue and the queue's doorbell.
struct Polled {
    owner: Owner,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    doorbell: Arc<AtomicBool>,
}

/// What the thread is handed.
enum Job {
    /// A prepared context on the thread's engine: connect, start, and say when it runs.
    Start(Polled, oneshot::Sender<Result<()>>),
    /// A running context with an engine of its own, whose driver it holds (event mode without
    /// a notification handle).
    Run(Polled),
}

/// The handle of a polling thread: its engine (which contexts are prepared for; the thread
/// alone drives it), and the way to hand it contexts.
pub(in crate::transport::doca) struct Poller {
    jobs: std_mpsc::Sender<Job>,
    pe: Arc<Pe>,
}

impl Poller {
    /// Creates a progress engine and starts its polling thread, with no context yet.
    pub(in crate::transport::doca) fn spawn() -> Result<Poller> {
        let driver = PeDriver::new()?;
        let pe = driver.engine().clone();
        let (jobs, rx) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("doca-progress".into())
            .spawn(move || Thread::new(driver).run(rx))
            .map_err(|e| Error::io("spawning the DOCA progress thread", e))?;
        Ok(Poller { jobs, pe })
    }

    /// The engine that contexts for this thread are prepared for (not a way to drive it).
    pub(super) fn pe(&self) -> &Arc<Pe> {
        &self.pe
    }

    /// Hands a context prepared for [`Poller::pe`] to the thread and waits until it runs.
    pub(super) async fn start(
        &self,
        owner: Owner,
        cmds: mpsc::UnboundedReceiver<Cmd>,
        doorbell: Arc<AtomicBool>,
    ) -> Result<()> {
        let (reply, started) = oneshot::channel();
        let polled = Polled {
            owner,
            cmds,
            doorbell,
        };
        // A thread that is gone dropped the job (and its context, never connected to the
        // engine, with it).
        let _ = self.jobs.send(Job::Start(polled, reply));
        started.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Hands a running context with an engine of its own (and that engine's driver) to the
    /// thread.
    pub(super) fn add(
        &self,
        owner: Owner,
        cmds: mpsc::UnboundedReceiver<Cmd>,
        doorbell: Arc<AtomicBool>,
    ) -> Result<()> {
        let polled = Polled {
            owner,
            cmds,
            doorbell,
        };
        self.jobs.send(Job::Run(polled)).map_err(|e| {
            // The thread is gone (it panicked): stop the context here rather than leak it.
            if let Job::Run(mut polled) = e.0 {
                polled.owner.shutdown_blocking();
            }
            gone()
        })
    }
}

fn gone() -> Error {
    Error::InvalidArgument("the DOCA progress thread has stopped".into())
}

/// What the polling thread holds.
struct Thread {
    /// The driver of the thread's engine, the one every context of the transport shares.
    pe: PeDriver,
    /// Started, not running yet: the deadline and who waits.
    starting: Vec<(Polled, Instant, oneshot::Sender<Result<()>>)>,
    running: Vec<Polled>,
    /// Stopping, until the deadline.
    stopping: Vec<(Owner, Instant)>,
}

impl Thread {
    fn new(pe: PeDriver) -> Thread {
        Thread {
            pe,
            starting: Vec::new(),
            running: Vec::new(),
            stopping: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.starting.is_empty() && self.running.is_empty() && self.stopping.is_empty()
    }

    fn take(&mut self, job: Job) {
        match job {
            Job::Start(mut polled, reply) => match polled.owner.start_context(&mut self.pe) {
                Ok(()) => {
                    let deadline = Instant::now() + STATE_CHANGE_LIMIT;
                    self.starting.push((polled, deadline, reply));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                    // Never started: destroyed as it is.
                    drop(polled);
                }
            },
            // Its owner drives its engine when visited.
            Job::Run(polled) => self.running.push(polled),
        }
    }

    fn stop(&mut self, mut owner: Owner) {
        owner.begin_stop();
        self.stopping
            .push((owner, Instant::now() + STATE_CHANGE_LIMIT));
    }

    fn run(mut self, jobs: std_mpsc::Receiver<Job>) {
        let mut idle = 0u32;
        let mut round = 0u32;
        loop {
            if self.is_empty() {
                // Nothing to poll: sleep until a context arrives or the transport is gone.
                match jobs.recv() {
                    Ok(job) => self.take(job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = jobs.try_recv() {
                self.take(job);
            }
            round = round.wrapping_add(1);
            let busy = self.round(round.is_multiple_of(SWEEP_EVERY));
            idle = if busy { 0 } else { idle.saturating_add(1) };
            if idle > NAP_AFTER {
                std::thread::sleep(NAP);
            } else if idle > YIELD_AFTER {
                std::thread::yield_now();
            }
        }
    }

    /// One round; whether anything happened.
    fn round(&mut self, sweep: bool) -> bool {
        let mut busy = false;
        for _ in 0..PROGRESS_ROUNDS {
            if !self.pe.progress() {
                break;
            }
            busy = true;
        }
        if !self.starting.is_empty() {
            let now = Instant::now();
            let started: Vec<_> = self
                .starting
                .extract_if(.., |(polled, deadline, _)| {
                    // State changes only: nothing to act on before the context runs.
                    drop(polled.owner.sink.take());
                    polled.owner.running() || now > *deadline
                })
                .collect();
            for (polled, _, reply) in started {
                busy = true;
                if polled.owner.running() {
                    let _ = reply.send(Ok(()));
                    self.running.push(polled);
                } else {
                    let timed_out = doca_error("doca_ctx_start", doca_sys::DOCA_ERROR_TIME_OUT);
                    let _ = reply.send(Err(timed_out));
                    self.stop(polled.owner);
                }
            }
        }
        let pe = &mut self.pe;
        let closed: Vec<_> = self
            .running
            .extract_if(.., |ctx| match visit(ctx, sweep, pe) {
                Some(worked) => {
                    busy |= worked;
                    false
                }
                None => true,
            })
            .collect();
        for polled in closed {
            busy = true;
            self.stop(polled.owner);
        }
        if !self.stopping.is_empty() {
            let now = Instant::now();
            let done: Vec<_> = self
                .stopping
                .extract_if(.., |(owner, deadline)| {
                    // Events of the shared engine, or progress of an engine of its own.
                    busy |= owner.progress_up_to(None, PROGRESS_ROUNDS);
                    owner.stopped_idle() || now > *deadline
                })
                .collect();
            for (mut owner, _) in done {
                // Destroys the context here, on the thread of its engine.
                let idle = owner.stopped_idle();
                owner.finish_stop(idle);
            }
        }
        busy
    }
}

/// One visit to a running context, with the driver of the thread's engine (lent to the owner
/// for the commands that progress): whether anything happened, `None` once every handle of it
/// is gone.
fn visit(ctx: &mut Polled, sweep: bool, pe: &mut PeDriver) -> Option<bool> {
    // The events the shared engine's progress recorded, or progress of an engine of its own.
    let mut busy = ctx.owner.progress_up_to(None, PROGRESS_ROUNDS);
    ctx.owner.expire_deadlines();
    // A load first: most contexts have no command most rounds, and a plain load leaves the
    // cache line shared with the threads that ring.
    let rung = ctx.doorbell.load(Ordering::Relaxed) && ctx.doorbell.swap(false, Ordering::Acquire);
    if rung || sweep {
        for taken in 1.. {
            match ctx.cmds.try_recv() {
                Ok(cmd) => {
                    ctx.owner.handle(cmd, Some(&mut *pe));
                    busy = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
            }
            if taken == CMD_BATCH {
                // More may wait: look again next round.
                ctx.doorbell.store(true, Ordering::Relaxed);
                break;
            }
        }
    }
    Some(busy)
}
