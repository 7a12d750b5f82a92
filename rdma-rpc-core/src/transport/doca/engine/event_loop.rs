//! The loop of an owner with a progress engine of its own (event and spin modes).
//!
//! # Progress in event mode
//! The notification fd reports task completions. Nothing in DOCA's documentation says that
//! RDMA CM events (connection request, established, disconnection) signal it, so while the
//! context listens or has RDMA CM connections the owner also progresses periodically: every
//! 2 ms while a request or an establishment may arrive, every 50 ms while only a
//! disconnection may (see `Owner::cm_poll`); early-message deadlines wake it too.
//!
//! # Batches
//! In either mode a turn makes at most [`DELIVER_BATCH`] `doca_pe_progress` calls; if the
//! engine still has work, the owner takes its commands and yields to the runtime's other
//! tasks before the next turn instead of arming. The tasks its batch woke read their
//! messages while those are still in the cache: unbounded, a turn among 1,000 busy
//! connections delivered every waiting message before any task ran, and the first ones were
//! out of the cache again by then.
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

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;

use super::super::sys::PeDriver;
use super::shared::sit;
use super::{Cmd, Owner, Poller, Seat};
use crate::error::{Error, Result};

/// How stale the event loop's answer to `Owner::cm_poll` may be.
const CM_POLL_REFRESH: Duration = Duration::from_millis(1);

/// The event loop's cached answer to `Owner::cm_poll` (how often RDMA CM events must be
/// polled for), asked again once it is `CM_POLL_REFRESH` old or when the owner's shape changed:
/// its connection count or the ports it listens on. A cached "no CM events to poll for" kept
/// after a `listen` would let the loop sleep `IDLE_WAKE` before it saw the first connection
/// request (DOCA does not document that CM events signal the notification fd, and the
/// software provider takes the stricter reading), so every change of shape asks again at once.
/// Never asked yet (`asked_at` empty), it asks whatever the shape.
#[derive(Debug, Default)]
struct CmPollCache {
    every: Option<Duration>,
    asked_at: Option<Instant>,
    shape: (usize, usize),
}

impl CmPollCache {
    /// How often to poll for CM events, asking `ask` only when the cached answer is stale.
    /// `shape` is (connections, listening ports).
    fn get(
        &mut self,
        now: Instant,
        shape: (usize, usize),
        ask: impl FnOnce() -> Option<Duration>,
    ) -> Option<Duration> {
        let fresh = self
            .asked_at
            .is_some_and(|at| now < at + CM_POLL_REFRESH && self.shape == shape);
        if !fresh {
            *self = CmPollCache {
                every: ask(),
                asked_at: Some(now),
                shape,
            };
        }
        self.every
    }
}

/// Most `doca_pe_progress` calls (each one completion or event) before the owner lets the
/// runtime's other tasks run. Unbounded, a round among 1,000 busy connections delivered every
/// waiting message before any task read one, and by then the first ones were out of the
/// cache again; a batch leaves its messages warm for the tasks they woke.
pub(in crate::transport::doca) const DELIVER_BATCH: usize = 32;

/// How long an event-mode owner with nothing scheduled sleeps between checks.
const IDLE_WAKE: Duration = Duration::from_secs(1);

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

/// An owner its event-mode task holds. If the task is dropped before it stopped the context
/// (its runtime shut down), the context is stopped on a thread of its own, never on a runtime
/// worker.
struct StopOnDrop(Option<Owner>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(owner) = self.0.take().filter(|o| !o.stopped) {
            stop_elsewhere(owner);
        }
    }
}

/// The owner's seat inside its event-mode task: dropped with the owner still in it, the owner
/// leaves the seat and stops as [`StopOnDrop`] says.
struct LeaveOnDrop(Arc<Seat>);

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        drop(StopOnDrop(sit(&self.0).take()));
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
}

/// What one turn of the loop decided, the seat held.
enum Turn {
    /// The batch ran out with work left, or spin mode is active: yield to the runtime and
    /// progress again, without arming.
    Again,
    /// Armed: wait for the notification fd, a command or the timer.
    Wait,
    /// Every sender is gone: stop.
    End,
}

/// The event-mode loop of the owner in `seat`; with a non-zero `spin` (spin mode), an owner
/// whose context did something less than `spin` ago polls again after yielding to the
/// runtime's other tasks instead of waiting on the notification fd. The seat is held for each
/// step and never across an await, so the context's handles post operations in between
/// (`EngineShared::post`).
pub(super) fn run(
    seat: Arc<Seat>,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    spin: Duration,
) -> impl std::future::Future<Output = ()> + Send {
    // Made before the task first runs: a task dropped unpolled (its runtime shutting down)
    // still takes the owner out of the seat and stops its context, and no handle submits to
    // a context nobody progresses.
    serve(LeaveOnDrop(seat), cmds, spin)
}

async fn serve(guard: LeaveOnDrop, mut cmds: mpsc::UnboundedReceiver<Cmd>, spin: Duration) {
    let seat = &guard.0;
    let fd = sit(seat)
        .as_ref()
        .and_then(|o| o.own_pe.as_ref())
        .map(PeDriver::notification_fd);
    let fd = match fd {
        Some(Ok(fd)) => fd,
        failed => {
            let e = failed
                .and_then(Result::err)
                .unwrap_or_else(|| Error::InvalidArgument("no progress engine of its own".into()));
            tracing::error!(error = %e, "DOCA event mode unavailable; polling instead");
            // Out of the seat: from now on every operation goes to the polling thread as a
            // command.
            let Some(owner) = sit(seat).take() else {
                return;
            };
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
    let afd = match unsafe { AsyncFd::register_with_interest(NotifyFd(fd), Interest::READABLE) } {
        Ok(afd) => afd,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch the DOCA notification fd");
            return shutdown(seat).await;
        }
    };
    // One timer, moved only when the next wake-up changes (not re-armed per event).
    let timer = tokio::time::sleep(IDLE_WAKE);
    tokio::pin!(timer);
    let mut timer_at = Instant::now() + IDLE_WAKE;
    let mut next_poll: Option<Instant> = None;
    let mut cm_cache = CmPollCache::default();
    // Spin mode: when the context last did something.
    let mut active_at = Instant::now();
    'run: loop {
        let turn = {
            let mut held = sit(seat);
            let Some(owner) = held.as_mut() else {
                return;
            };
            let progressed = owner.progress_bounded(None, DELIVER_BATCH);
            owner.expire_deadlines();
            let now = Instant::now();
            if progressed.any {
                active_at = now;
            }
            if progressed.more || (!spin.is_zero() && now.duration_since(active_at) < spin) {
                // More completions wait (their tasks run first, while what this batch
                // delivered is still in the cache), or active within the spin window: take
                // the commands that came and progress again once the runtime ran its other
                // tasks, without arming or sleeping.
                match owner.take_commands(&mut cmds) {
                    Some(true) => {
                        active_at = now;
                        Turn::Again
                    }
                    Some(false) => Turn::Again,
                    None => Turn::End,
                }
            } else {
                // Armed with the seat held: an operation posted after this is submitted
                // behind the arming, so its completion signals the fd.
                if let Some(Err(e)) = owner.own_pe.as_mut().map(PeDriver::arm) {
                    tracing::warn!(error = %e, "arming DOCA notifications");
                }
                // Which RDMA CM events may come looks at every connection: with a thousand
                // of them, once per millisecond (or when the owner's shape changed) is
                // enough.
                let shape = (owner.conns.len(), owner.listening.len());
                let cm_every = cm_cache.get(now, shape, || owner.cm_poll());
                next_poll = match (cm_every, next_poll) {
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
                Turn::Wait
            }
        };
        match turn {
            Turn::Again => {
                tokio::task::yield_now().await;
                continue;
            }
            Turn::End => break 'run,
            Turn::Wait => {}
        }
        let mut readable = false;
        let cmd = tokio::select! {
            ready = afd.readable() => {
                if let Ok(mut ready) = ready {
                    ready.clear_ready();
                    readable = true;
                }
                None
            }
            cmd = cmds.recv() => match cmd {
                Some(cmd) => Some(cmd),
                None => break 'run,
            },
            () = &mut timer => {
                // Fired: wait for the next deadline computed above.
                timer_at = Instant::now();
                None
            }
        };
        {
            let mut held = sit(seat);
            let Some(owner) = held.as_mut() else {
                return;
            };
            if readable {
                if let Some(pe) = owner.own_pe.as_mut() {
                    let _ = pe.clear(fd);
                }
            }
            if let Some(cmd) = cmd {
                owner.handle(cmd, None);
                // And the ones queued behind it; senders gone is seen by the next `recv`,
                // after one more round of progress.
                let _ = owner.take_commands(&mut cmds);
            }
            if let Some(shared) = owner.shared.upgrade() {
                shared.wakeups.fetch_add(1, Ordering::Relaxed);
            }
        }
        active_at = Instant::now();
    }
    drop(afd);
    shutdown(seat).await;
}

/// Stops the context of the owner in `seat`, taken out of it first: every operation posted
/// from now on goes to the closed command queue and fails.
async fn shutdown(seat: &Seat) {
    let mut owner = StopOnDrop(sit(seat).take());
    if let Some(owner) = owner.0.as_mut() {
        owner.shutdown_async().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL: Option<Duration> = Some(Duration::from_millis(2));

    #[test]
    fn a_new_listener_is_polled_for_at_once_not_after_the_idle_wake() {
        let mut cache = CmPollCache::default();
        let t0 = Instant::now();
        // Nothing to poll for: no connection, no listener.
        assert_eq!(cache.get(t0, (0, 0), || None), None);
        // Within the refresh interval, a `listen` changes the shape only: asked again.
        assert_eq!(cache.get(t0, (0, 1), || POLL), POLL);
        // A connection request accepted: the count changed, asked again.
        let established = Some(Duration::from_millis(50));
        assert_eq!(cache.get(t0, (1, 1), || established), established);
    }

    #[test]
    fn an_unchanged_shape_is_asked_again_only_once_the_answer_is_stale() {
        let mut cache = CmPollCache::default();
        let t0 = Instant::now();
        assert_eq!(cache.get(t0, (3, 1), || POLL), POLL);
        let within = t0 + CM_POLL_REFRESH / 2;
        assert_eq!(
            cache.get(within, (3, 1), || panic!("asked while fresh")),
            POLL
        );
        assert_eq!(cache.get(t0 + CM_POLL_REFRESH, (3, 1), || None), None);
    }

    #[test]
    fn a_cache_never_asked_asks_whatever_the_shape() {
        let mut cache = CmPollCache::default();
        assert_eq!(cache.get(Instant::now(), (0, 0), || POLL), POLL);
    }
}
