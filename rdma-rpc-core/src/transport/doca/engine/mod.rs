//! The progress owner of one DOCA RDMA context.
//!
//! Every DOCA object of a context (the context, its progress engine, buffer inventory, tasks,
//! connections, imported mmaps) is touched only by its owner's thread: in event and spin modes
//! a tokio task waiting on the notification fd of the context's own progress engine; in busy-poll
//! mode the polling thread of its transport, whose engine every context of the transport is
//! connected to (`poller`). An engine is driven only through its one [`PeDriver`], held by the
//! owner of an engine of its own or by the polling thread, which lends it to the owners it
//! visits. Other tasks send the owner [`Cmd`]s through a channel and get results through
//! oneshots. C callbacks only record events; the owner handles them after `doca_pe_progress`
//! returns, so no DOCA call ever runs re-entrantly.
//!
//! The owner's concerns, one file each:
//! - `callbacks`: the C callbacks and the events they record;
//! - `setup`: context setup (sizes from the device's capabilities) and teardown, off the
//!   async runtime's workers;
//! - `task`: DOCA tasks as owned types, one builder per operation;
//! - `datapath`: operations, their tasks and completions, per-connection backlogs;
//! - `lifecycle`: connections over RDMA CM and out of band;
//! - `receive`: matching the context's receives to connections, with deadlines;
//! - `poller`: the busy-poll thread and engine a transport's contexts share;
//! - this file: the event-mode loop, and what both modes do each round.
//!
//! # Progress in event mode
//! The notification fd reports task completions. Nothing in DOCA's documentation says that
//! RDMA CM events (connection request, established, disconnection) signal it, so while the
//! context listens or has RDMA CM connections the owner also progresses periodically: every
//! 2 ms while a request or an establishment may arrive, every 50 ms while only a
//! disconnection may (see `Owner::cm_poll`); early-message deadlines wake it too.
//!
//! # Progress in spin mode
//! The same loop, but while the context did something (progress found work, or a command
//! came) less than `DocaConfig::spin` ago, the owner takes the queued commands and yields to
//! its runtime's other tasks, then progresses again, instead of arming and waiting. A message
//! for an active context is so found by the thread that runs the context's tasks, which wakes
//! them without a system call: the round trip of a call carries no thread wake-up, where
//! event mode has two (the notification fd) and busy-poll mode two (from the polling thread
//! to the runtimes). Once the window passes without activity the owner arms and sleeps as in
//! event mode.

mod callbacks;
mod datapath;
mod lifecycle;
mod poller;
mod receive;
mod setup;
mod task;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, oneshot};

use super::sys::{Device, Inventory, Mmap, PeDriver, Rdma};
use super::{DocaConfig, ProgressMode};
use crate::error::{Error, Result};
use crate::memory::{RegisteredBuf, StagingPools};
use crate::transport::{Descriptor, RecvOpcode};

use callbacks::{Event, Sink};
use datapath::Inflight;
use lifecycle::OwnedConn;
pub(super) use poller::Poller;
pub(super) use receive::ConnShared;
use receive::{Deadlines, Staging};
use setup::Sizes;
use task::Kind;

pub(super) type ConnId = u64;

/// Most `doca_pe_progress` calls in one go where the engine may be shared: per round of the
/// polling thread, and before a connection is closed (its earlier completions first).
const PROGRESS_ROUNDS: usize = 64;

/// How stale the event loop's answer to `Owner::cm_poll` may be.
const CM_POLL_REFRESH: Duration = Duration::from_millis(1);

/// How long an event-mode owner with nothing scheduled sleeps between checks.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// Registered local memory for one operation, with the mmap that covers it.
pub(super) struct Local {
    pub(super) buf: RegisteredBuf,
    pub(super) mmap: Arc<Mmap>,
}

pub(super) enum AtomicOp {
    CompareAndSwap { expected: u64, new: u64 },
    FetchAndAdd { add: u64 },
}

/// An operation posted on a connection.
pub(super) enum Op {
    Send {
        src: Local,
        imm: Option<u32>,
        done: oneshot::Sender<Result<()>>,
    },
    Write {
        src: Local,
        dst: Descriptor,
        imm: Option<u32>,
        done: oneshot::Sender<Result<()>>,
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
pub(super) enum Cmd {
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
pub(super) struct Receives {
    /// Bytes of one staging receive (`DocaConfig::max_recv_size`).
    pub(super) slot_size: usize,
    /// Most staging receives of the context (`DocaConfig::recv_queue_size`, bounded by the
    /// device).
    pub(super) max: usize,
    reserved: std::sync::atomic::AtomicUsize,
}

impl Receives {
    fn new(slot_size: usize, max: usize) -> Receives {
        Receives {
            slot_size,
            max,
            reserved: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Reserves `n` more staging receives, if the context has room for them.
    pub(super) fn reserve(&self, n: usize) -> bool {
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(n).filter(|t| *t <= self.max)
            })
            .is_ok()
    }

    /// Gives back `n` reserved staging receives (a connection ended).
    pub(super) fn release(&self, n: usize) {
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(n))
            });
    }

    /// Staging receives reserved by the context's connections.
    pub(super) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }
}

/// What every handle of one context shares: the way to its owner.
pub(super) struct EngineShared {
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Set after each command: a busy-poll thread looks at the queue only when it is set,
    /// one load instead of a channel receive per context and round.
    doorbell: Arc<AtomicBool>,
    pub(super) dev: Arc<Device>,
    pub(super) staging: Arc<StagingPools>,
    /// The context's staging receives, as reserved by its connections.
    pub(super) receives: Receives,
    /// Connections of a shared client context claimed by connects (the transport picks a
    /// context with room; the owner gives the claim back when the connection is gone).
    claimed: std::sync::atomic::AtomicUsize,
    /// Most connections of the context.
    pub(super) capacity: usize,
    /// Wake-ups of event-mode owners, counted per transport.
    wakeups: Arc<AtomicU64>,
}

impl EngineShared {
    /// Sends a command; if the owner is gone the command (and its oneshot) is dropped, which
    /// its waiter sees as an error.
    pub(super) fn send(&self, cmd: Cmd) {
        let _ = self.cmds.send(cmd);
        self.doorbell.store(true, Ordering::Release);
    }

    /// Claims room for one more connection, if the context has it (shared client contexts).
    pub(super) fn claim(&self) -> bool {
        self.claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < self.capacity).then_some(c + 1)
            })
            .is_ok()
    }

    /// Gives back a connection's claim (it is gone, or never came to be).
    pub(super) fn unclaim(&self) {
        let _ = self
            .claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(1))
            });
    }

    /// Sends a command and waits for the owner's reply.
    pub(super) async fn ask<T>(
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

pub(super) struct Owner {
    shared: Weak<EngineShared>,
    config: Arc<DocaConfig>,
    sizes: Sizes,
    // Drop order matters: operations (tasks and buffers) go first, then connections (their
    // idle tasks), the staging receives, the inventory, the context, the progress engine and
    // last the sink the context's callbacks point to.
    ops: HashMap<u64, Inflight>,
    conns: HashMap<ConnId, OwnedConn>,
    by_raw: HashMap<usize, ConnId>,
    accepted: Option<mpsc::UnboundedSender<Arc<ConnShared>>>,
    listening: Vec<u16>,
    next_op: u64,
    deadlines: Deadlines,
    /// Connections whose backlog waits for tasks or buffers of the context.
    waiting: VecDeque<ConnId>,
    staging: Staging,
    inv: Inventory,
    rdma: Rdma,
    /// The driver of the context's own progress engine (event and spin modes); `None` on a
    /// polling thread's engine, which the thread drives (the context holds the engine).
    own_pe: Option<PeDriver>,
    /// Boxed: its address is the context's user data.
    sink: Box<Sink>,
    /// The sink's previous batch of events, emptied: its capacity takes the next batch.
    events: Vec<Event>,
    max_message: u64,
    /// A backlog is draining: tasks are submitted without a doorbell ([`Owner::ring`]).
    batching: bool,
    /// Tasks were submitted without a doorbell since the last one.
    unflushed: bool,
    /// Connections whose operations completed in this round of progress, in order: their
    /// backlogs drain once the round is over.
    freed: Vec<ConnId>,
    stop_begun: bool,
    stopped: bool,
}

// SAFETY: the owner is used by one thread at a time (its tokio task, its polling thread, or
// the thread that stops it); every DOCA object it holds may move between threads (see the
// wrappers), and the `Sink`'s cells are only touched by callbacks that run inside a
// `doca_pe_progress` of the owner's engine, called by the owner (or by the polling thread
// that visits it) on the same thread.
unsafe impl Send for Owner {}

/// Starts a context and its owner; returns the handle other tasks use. In busy-poll mode the
/// owner joins `poller`, the transport's polling thread.
pub(super) async fn start(
    dev: &Arc<Device>,
    config: &Arc<DocaConfig>,
    staging: &Arc<StagingPools>,
    max_connections: u16,
    poller: Option<&Poller>,
    wakeups: &Arc<AtomicU64>,
) -> Result<Arc<EngineShared>> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        Error::InvalidArgument("the DOCA transport must be used inside a tokio runtime".into())
    })?;
    let (tx, rx) = mpsc::unbounded_channel();
    let doorbell = Arc::new(AtomicBool::new(false));
    let sizes = Sizes::new(config, dev, max_connections);
    let shared = Arc::new(EngineShared {
        cmds: tx,
        doorbell: doorbell.clone(),
        dev: dev.clone(),
        staging: staging.clone(),
        receives: Receives::new(sizes.recv_slot, sizes.recv_count as usize),
        claimed: std::sync::atomic::AtomicUsize::new(0),
        capacity: usize::from(max_connections.max(1)),
        wakeups: wakeups.clone(),
    });
    let (weak, dev, cfg) = (Arc::downgrade(&shared), dev.clone(), config.clone());
    match config.progress {
        ProgressMode::BusyPoll => {
            // Prepared off the runtime's workers, started by the polling thread, which alone
            // touches its progress engine.
            let spawned;
            let poller = match poller {
                Some(poller) => poller,
                None => {
                    spawned = Poller::spawn()?;
                    &spawned
                }
            };
            let pe = poller.pe().clone();
            let owner = runtime
                .spawn_blocking(move || Owner::prepare(weak, &dev, &cfg, max_connections, pe))
                .await
                .map_err(|e| Error::InvalidArgument(format!("DOCA context setup failed: {e}")))??;
            poller.start(owner, rx, doorbell).await?;
        }
        ProgressMode::Event | ProgressMode::Spin => {
            let spin = match config.progress {
                ProgressMode::Spin => config.spin,
                _ => Duration::ZERO,
            };
            // Setup waits for the context to run: off the runtime's workers.
            let owner = runtime
                .spawn_blocking(move || Owner::start(weak, &dev, &cfg, max_connections))
                .await
                .map_err(|e| Error::InvalidArgument(format!("DOCA context setup failed: {e}")))??;
            runtime.spawn(owner.run_event(rx, spin));
        }
    }
    Ok(shared)
}

/// Stops a context on a thread of its own (stopping waits for DOCA state changes, which must
/// not block a runtime worker or a polling thread that serves other contexts).
fn stop_elsewhere(mut owner: Owner) {
    let spawned = std::thread::Builder::new()
        .name("doca-stop".into())
        .spawn(move || owner.shutdown_blocking());
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread to stop a DOCA context; leaking it");
    }
}

/// The notification fd, for `AsyncFd` (owned by the progress engine, not closed here).
struct NotifyFd(RawFd);

impl AsRawFd for NotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Holds the owner inside its event-mode task. If the task is dropped before it stopped the
/// context (its runtime shut down), the context is stopped on a thread of its own, never on a
/// runtime worker.
struct StopOnDrop(Option<Owner>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(owner) = self.0.take().filter(|o| !o.stopped) {
            stop_elsewhere(owner);
        }
    }
}

impl Owner {
    /// Takes every command already queued (an owner with an engine of its own); whether there
    /// was any, `None` once every sender is gone.
    fn take_commands(&mut self, cmds: &mut mpsc::UnboundedReceiver<Cmd>) -> Option<bool> {
        let mut any = false;
        loop {
            match cmds.try_recv() {
                Ok(cmd) => {
                    self.handle(cmd, None);
                    any = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => return Some(any),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
            }
        }
    }

    /// The event-mode loop; with a non-zero `spin` (spin mode), an owner whose context did
    /// something less than `spin` ago polls again after yielding to the runtime's other tasks
    /// instead of waiting on the notification fd.
    async fn run_event(self, mut cmds: mpsc::UnboundedReceiver<Cmd>, spin: Duration) {
        let mut guard = StopOnDrop(Some(self));
        let owner = guard.0.as_mut().expect("just set");
        let fd = match owner.own_pe.as_ref().map(PeDriver::notification_fd) {
            Some(Ok(fd)) => fd,
            failed => {
                let e = failed.and_then(Result::err).unwrap_or_else(|| {
                    Error::InvalidArgument("no progress engine of its own".into())
                });
                tracing::error!(error = %e, "DOCA event mode unavailable; polling instead");
                let owner = guard.0.take().expect("just set");
                let doorbell = match owner.shared.upgrade() {
                    Some(shared) => shared.doorbell.clone(),
                    // Every handle is gone already: the thread sees the queue closed.
                    None => Arc::new(AtomicBool::new(true)),
                };
                if let Err(e) = Poller::spawn().and_then(|p| p.add(owner, cmds, doorbell)) {
                    tracing::error!(error = %e, "the DOCA context has no progress owner");
                }
                return;
            }
        };
        // SAFETY: the fd is the progress engine's notification handle; the engine (its driver
        // held by the owner) outlives `afd`, which is dropped before the context stops.
        let afd = match unsafe { AsyncFd::register_with_interest(NotifyFd(fd), Interest::READABLE) }
        {
            Ok(afd) => afd,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch the DOCA notification fd");
                owner.shutdown_async().await;
                return;
            }
        };
        // One timer, moved only when the next wake-up changes (not re-armed per event).
        let timer = tokio::time::sleep(IDLE_WAKE);
        tokio::pin!(timer);
        let mut timer_at = Instant::now() + IDLE_WAKE;
        let mut next_poll: Option<Instant> = None;
        // `cm_poll`'s answer, when it was asked, and the connection count then.
        let mut cm_every: (Option<Duration>, Instant, usize) = (None, Instant::now(), usize::MAX);
        // Spin mode: when the context last did something.
        let mut active_at = Instant::now();
        'run: loop {
            let worked = owner.progress_all();
            owner.expire_deadlines();
            if !spin.is_zero() {
                let now = Instant::now();
                if worked {
                    active_at = now;
                }
                if now.duration_since(active_at) < spin {
                    // Active within the window: take the commands that came and progress
                    // again once the runtime ran its other tasks, without arming or sleeping.
                    match owner.take_commands(&mut cmds) {
                        Some(true) => active_at = now,
                        Some(false) => {}
                        None => break 'run,
                    }
                    tokio::task::yield_now().await;
                    continue;
                }
            }
            if let Some(Err(e)) = owner.own_pe.as_mut().map(PeDriver::arm) {
                tracing::warn!(error = %e, "arming DOCA notifications");
            }
            let now = Instant::now();
            // Which RDMA CM events may come looks at every connection: with a thousand of
            // them, once per millisecond (or when their number changed) is enough.
            let count = owner.conns.len();
            if cm_every.1 + CM_POLL_REFRESH <= now || cm_every.2 != count {
                cm_every = (owner.cm_poll(), now, count);
            }
            next_poll = match (cm_every.0, next_poll) {
                (None, _) => None,
                (Some(every), Some(at)) if at > now && at <= now + every => Some(at),
                (Some(every), _) => Some(now + every),
            };
            let wake = [next_poll, owner.deadlines.next()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now + IDLE_WAKE);
            if wake != timer_at {
                timer_at = wake;
                timer.as_mut().reset(wake.into());
            }
            tokio::select! {
                ready = afd.readable() => {
                    if let Ok(mut guard) = ready {
                        if let Some(pe) = owner.own_pe.as_mut() {
                            let _ = pe.clear(fd);
                        }
                        guard.clear_ready();
                    }
                }
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => {
                        owner.handle(cmd, None);
                        // And the ones queued behind it; senders gone is seen by the next
                        // `recv`, after one more round of progress.
                        let _ = owner.take_commands(&mut cmds);
                    }
                    None => break 'run,
                },
                () = &mut timer => {
                    // Fired: wait for the next deadline computed above.
                    timer_at = now;
                }
            }
            if let Some(shared) = owner.shared.upgrade() {
                shared.wakeups.fetch_add(1, Ordering::Relaxed);
            }
            active_at = Instant::now();
        }
        drop(afd);
        owner.shutdown_async().await;
    }

    /// Progresses the owner's own engine until nothing happens; returns whether anything
    /// did. The event loop arms the engine's notification only after this (DOCA's loop:
    /// progress until it returns 0, then arm).
    fn progress_all(&mut self) -> bool {
        self.progress_up_to(None, usize::MAX)
    }

    /// Progresses the context's engine at most `rounds` times, handling the events after each
    /// call; whether anything happened. The engine is the owner's own, or else `shared`, the
    /// polling thread's (lent by the thread, which drives it); with neither, only the events
    /// already recorded are handled. On an engine shared with other contexts, their events
    /// wait in their own sinks for their owners, and a busy neighbour is why `rounds` bounds
    /// the loop.
    pub(super) fn progress_up_to(&mut self, shared: Option<&mut PeDriver>, rounds: usize) -> bool {
        let any = if let Some(mut own) = self.own_pe.take() {
            let any = self.drive(&mut own, rounds);
            self.own_pe = Some(own);
            any
        } else {
            match shared {
                Some(pe) => self.drive(pe, rounds),
                None => self.handle_events(),
            }
        };
        // What the completions of this round freed goes out together, with one doorbell.
        self.drain_freed();
        any
    }

    fn drive(&mut self, pe: &mut PeDriver, rounds: usize) -> bool {
        let mut any = false;
        for round in 1..=rounds {
            let progressed = pe.progress();
            if !self.handle_events() && !progressed {
                return any;
            }
            any = true;
            if round % PROGRESS_ROUNDS == 0 {
                // A context that never runs dry still submits what its completions freed.
                self.drain_freed();
            }
        }
        any
    }

    /// Acts on the events the callbacks recorded; whether there were any.
    fn handle_events(&mut self) -> bool {
        if !self.sink.has_events() {
            return false;
        }
        let mut events = std::mem::take(&mut self.events);
        self.sink.swap_into(&mut events);
        for e in events.drain(..) {
            self.on_event(e);
        }
        self.events = events;
        true
    }

    fn expire_deadlines(&mut self) {
        if self.deadlines.next().is_some() {
            self.deadlines
                .expire(Instant::now(), self.config.rnr_timeout);
        }
    }

    fn on_event(&mut self, e: Event) {
        match e {
            Event::Task {
                kind: Kind::Receive,
                user,
                status,
                recv,
            } => self.on_receive(user, status, recv),
            Event::Task {
                kind, user, status, ..
            } => self.on_completion(kind, user, status),
            Event::Requested { conn, id, accepted } => self.on_requested(conn, id, accepted),
            Event::Established { conn, id } => self.on_established(conn, id),
            Event::Failed { id } => self.on_failed(id),
            Event::Disconnected { id } => self.on_disconnected(id),
        }
    }

    /// Handles a command. `shared` is the polling thread's engine driver when the owner is
    /// visited by the thread (busy-poll mode), `None` for an owner with an engine of its own.
    fn handle(&mut self, cmd: Cmd, shared: Option<&mut PeDriver>) {
        match cmd {
            Cmd::Listen {
                port,
                accepted,
                reply,
            } => {
                let _ = reply.send(self.listen(port, accepted));
            }
            Cmd::StopListen { port } => self.stop_listen(port),
            Cmd::Connect {
                ip,
                port,
                peer,
                reply,
            } => self.connect(ip, port, peer, reply),
            Cmd::Export { reply } => {
                let _ = reply.send(self.export());
            }
            Cmd::ConnectOob {
                id,
                blob,
                peer,
                reply,
            } => {
                let _ = reply.send(self.connect_oob(id, &blob, peer));
            }
            Cmd::Op { id, op } => self.post(id, op),
            Cmd::Grow => self.grow_receives(),
            Cmd::Close { id, err } => {
                // Completions already in DOCA's queues come first: what the peer sent before
                // the connection ended is delivered, not dropped.
                self.progress_up_to(shared, PROGRESS_ROUNDS);
                self.fail_conn(id, err);
            }
        }
    }

    /// Registers and posts the staging receives the context's connections reserved.
    fn grow_receives(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let wanted = shared.receives.reserved();
        if let Err(e) = self.staging.ensure(wanted, &self.rdma, &self.inv) {
            // The reservations stand, so a peer may find no receive: say so loudly once.
            tracing::error!(
                error = %e,
                wanted,
                posted = self.staging.slots(),
                "could not register more DOCA staging receives"
            );
        }
    }

    /// A staging receive completed: hand its message to its connection, then repost it.
    fn on_receive(
        &mut self,
        user: u64,
        status: doca_sys::doca_error_t,
        recv: Option<callbacks::RecvResult>,
    ) {
        if let (true, Some(r)) = (status == doca_sys::DOCA_SUCCESS, recv) {
            let shared = self
                .by_raw
                .get(&r.conn)
                .and_then(|id| self.conns.get(id))
                .filter(|c| c.phase == lifecycle::Phase::Live)
                .and_then(|c| c.shared.clone());
            let (opcode, len) = match r.opcode {
                doca_sys::DOCA_RDMA_OPCODE_RECV_SEND => (RecvOpcode::Send, r.len as usize),
                doca_sys::DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM => {
                    (RecvOpcode::SendWithImm, r.len as usize)
                }
                _ => (RecvOpcode::WriteWithImm, 0),
            };
            match (shared, self.staging.message(user, len)) {
                (Some(shared), Some(data)) => receive::deliver(
                    &shared,
                    data,
                    opcode,
                    r.imm,
                    &mut self.deadlines,
                    self.config.rnr_timeout,
                ),
                _ => tracing::debug!("DOCA receive for an unknown or closed connection dropped"),
            }
        } else if status != doca_sys::DOCA_ERROR_CONNECTION_ABORTED {
            tracing::debug!(
                error = %super::sys::error_name(status),
                "a DOCA receive failed (a message larger than max_recv_size?)"
            );
        }
        let running = self.rdma.state() == doca_sys::DOCA_CTX_STATE_RUNNING && !self.stop_begun;
        self.staging.recycle(user, running);
    }
}
