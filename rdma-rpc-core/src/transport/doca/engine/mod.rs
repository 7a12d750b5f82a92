//! The progress owner of one DOCA RDMA context.
//!
//! Every DOCA object of a context (the context, its progress engine, buffer inventory, tasks,
//! connections, imported mmaps) is touched by one thread at a time, through its [`Owner`]: in
//! event and spin modes a tokio task waiting on the notification fd of the context's own
//! progress engine; in busy-poll mode the polling thread of its transport, whose engine every
//! context of the transport is connected to (`poller`). An engine is driven only through its
//! one [`PeDriver`], held by the owner of an engine of its own or by the polling thread, which
//! lends it to the owners it visits. Other tasks send the owner [`Cmd`]s through a channel and
//! get results through oneshots; in event and spin modes a task that posts an operation
//! submits it itself when the owner's seat (a lock its task holds while it works, never across
//! an await) is free and no command waits (`shared`). C callbacks only record events; the
//! owner handles them after `doca_pe_progress` returns, so no DOCA call ever runs
//! re-entrantly, and only the owner's task progresses.
//!
//! The owner's concerns, one file each:
//! - `callbacks`: the C callbacks and the events they record;
//! - `shared`: what other tasks hold: the way to the owner ([`EngineShared`], the [`Cmd`]s
//!   they send, the seat through which they post operations themselves), and the staging
//!   receives their connections reserve;
//! - `setup`: context setup (sizes from the device's capabilities) and teardown, off the
//!   async runtime's workers;
//! - `task`: DOCA tasks as owned types, one builder per operation;
//! - `datapath`: operations, their tasks and completions, per-connection backlogs;
//! - `lifecycle`: connections over RDMA CM and out of band;
//! - `receive`: matching the context's receives to connections, with deadlines;
//! - `round`: what both modes do each round (progress, events, commands);
//! - `event_loop`: the event- and spin-mode loop of an owner with an engine of its own;
//! - `poller`: the busy-poll thread and engine a transport's contexts share;
//! - this file: the owner, and how a context and its owner start.

mod callbacks;
mod datapath;
mod event_loop;
mod lifecycle;
mod poller;
mod receive;
mod round;
mod setup;
mod shared;
mod task;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::sys::{Device, Inventory, PeDriver, Rdma};
use super::{DocaConfig, ProgressMode};
use crate::error::{Error, Result};
use crate::ids::IdMap;
use crate::memory::StagingPools;

use callbacks::{Event, Sink};
use datapath::Inflight;
#[cfg(test)]
pub(super) use event_loop::DELIVER_BATCH;
use lifecycle::OwnedConn;
pub(super) use poller::Poller;
pub(super) use receive::ConnShared;
use receive::{Deadlines, Staging};
#[cfg(test)]
pub(super) use round::GATHER;
use setup::Sizes;
use shared::Seat;
pub(super) use shared::{AtomicOp, Cmd, EngineShared, Local, Op, Receives};
use task::SlabBuf;

pub(super) type ConnId = u64;

/// Most `doca_pe_progress` calls in one go where the engine may be shared: per round of the
/// polling thread, and before a connection is closed (its earlier completions first).
const PROGRESS_ROUNDS: usize = 64;

pub(super) struct Owner {
    shared: Weak<EngineShared>,
    config: Arc<DocaConfig>,
    sizes: Sizes,
    // Drop order matters: operations (tasks and buffers) go first, then the idle tasks, the
    // connections, the idle slab buffers, the staging receives, the inventory, the context,
    // the progress engine and last the sink the context's callbacks point to.
    /// Commands sent and not yet handled (`EngineShared::queued`), counted off by
    /// [`Owner::handle`].
    queued: Arc<AtomicUsize>,
    /// Operations in flight, by their task's address (`Task::key`).
    ops: IdMap<u64, Inflight>,
    /// Idle tasks, for any connection (`task::IdleTasks`).
    idle: task::IdleTasks,
    conns: IdMap<ConnId, OwnedConn>,
    by_raw: IdMap<usize, ConnId>,
    /// The shared state of the live connections, by DOCA's connection (what a received
    /// message names): one lookup per message, where `by_raw` then `conns` were two and a
    /// record (`Owner::on_receive`). A connection is here from `make_live` until it is
    /// declared dead (`fail_conn`, `on_failed`) or forgotten.
    live: IdMap<usize, Arc<ConnShared>>,
    accepted: Option<mpsc::UnboundedSender<Arc<ConnShared>>>,
    listening: Vec<u16>,
    deadlines: Deadlines,
    /// Connections whose backlog waits for tasks or buffers of the context.
    waiting: VecDeque<ConnId>,
    /// Idle buffers over whole staging slabs, by the address of the slab's mmap (which each
    /// buffer holds, so the key is never reused while they live); the last one back is used
    /// first, while its memory is still in the cache.
    slab_bufs: IdMap<usize, Vec<SlabBuf>>,
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

// SAFETY: the owner is used by one thread at a time (its tokio task, its polling thread, the
// thread that stops it, or a task that posts an operation while it holds the owner's seat, a
// mutex); every DOCA object it holds may move between threads (see the wrappers), and the
// `Sink`'s cells are only touched by callbacks that run inside a `doca_pe_progress` of the
// owner's engine, called by the owner (or by the polling thread that visits it) on the same
// thread, never by a posting task.
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
    let seat = match config.progress {
        ProgressMode::BusyPoll => None,
        ProgressMode::Event | ProgressMode::Spin => Some(Arc::new(Seat::default())),
    };
    let shared = Arc::new(EngineShared {
        cmds: tx,
        queued: Arc::default(),
        seat: seat.clone(),
        #[cfg(test)]
        direct: AtomicU64::new(0),
        #[cfg(test)]
        gathered: AtomicUsize::new(0),
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
            let seat = seat.expect("event and spin modes have a seat");
            *shared::sit(&seat) = Some(owner);
            runtime.spawn(event_loop::run(seat, rx, spin));
        }
    }
    Ok(shared)
}
