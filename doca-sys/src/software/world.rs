//! The process-global `World`: every object's state behind one mutex, and the bookkeeping
//! every call shares: queueing callbacks on progress engines (and waking an armed one),
//! the counts of contexts changing state or with waiting sends, and task completion.

use super::*;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes the provider's own keys (handles, ids, ports): values it chose, never a peer, so a
/// multiply-shift is enough. SipHash cost more than the rest of an idle `doca_pe_progress`,
/// which a busy-polling application calls millions of times a second.
#[derive(Default, Clone, Copy)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the high bits (which the table's control bytes use) depend on
        // every bit of the key.
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

pub(super) type Map<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

#[derive(Default)]
pub(super) struct World {
    pub(super) pes: Map<H, Pe>,
    pub(super) rdmas: Map<H, Rdma>,
    pub(super) conns: Map<H, Conn>,
    pub(super) addrs: Map<H, Addr>,
    pub(super) mmaps: Map<H, Mmap>,
    pub(super) mmap_ids: Map<u64, H>,
    pub(super) next_mmap_id: u64,
    pub(super) invs: Map<H, Inventory>,
    pub(super) bufs: Map<H, Buf>,
    pub(super) tasks: Map<H, Task>,
    pub(super) listeners: Map<u16, H>,
    /// Contexts whose `sends_wait` is set: while none is, a posted receive has no waiting
    /// send to look for.
    pub(super) contexts_with_waiting_sends: usize,
    /// Contexts `STARTING` or `STOPPING`: with none, and no send waiting, a progress has no
    /// time-driven state to advance.
    pub(super) contexts_changing_state: usize,
}

static WORLD: LazyLock<Mutex<World>> = LazyLock::new(Mutex::default);

pub(super) fn world() -> MutexGuard<'static, World> {
    // A panic cannot unwind out of an `extern "C"` function (it aborts), so poisoning only
    // happens in a dying process; keep going.
    WORLD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a send waits for a receive on the peer.
pub(super) fn rnr_timeout() -> Duration {
    static TIMEOUT: LazyLock<Duration> = LazyLock::new(|| {
        let ms = std::env::var("DOCA_SYS_SW_RNR_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        Duration::from_millis(ms)
    });
    *TIMEOUT
}

pub(super) fn signal_fd(efd: i32) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live local to the eventfd owned by a live progress engine.
    let _ = unsafe { libc::write(efd, (&one as *const u64).cast::<c_void>(), 8) };
}

impl World {
    /// Queues a callback on a progress engine. Only task completions wake an armed engine:
    /// nothing documents that connection events or context state changes signal the
    /// notification handle.
    pub(super) fn enqueue(&mut self, pe: H, event: Event) {
        if let Some(pe) = self.pes.get_mut(&pe) {
            let completion = matches!(event, Event::TaskDone(_));
            pe.queue.push_back(event);
            if completion && pe.armed {
                pe.armed = false;
                signal_fd(pe.efd);
            }
        }
    }

    /// A live buffer (reference count above 0).
    pub(super) fn live_buf(&self, buf: H) -> Option<&Buf> {
        self.bufs.get(&buf).filter(|b| b.refcount > 0)
    }

    /// Queues a context's state-change callback (`prev` to `next`).
    pub(super) fn enqueue_state(&mut self, ctx: H, prev: u32, next: u32) {
        if let Some(r) = self.rdmas.get_mut(&ctx) {
            r.state_events += 1;
        }
        self.enqueue_ctx(ctx, Event::State { ctx, prev, next });
    }

    pub(super) fn enqueue_ctx(&mut self, rdma: H, event: Event) {
        if let Some(pe) = self.rdmas.get(&rdma).and_then(|r| r.pe) {
            self.enqueue(pe, event);
        }
    }

    pub(super) fn enqueue_conn(&mut self, conn: H, event: Event) {
        if let Some(rdma) = self.conns.get(&conn).map(|c| c.rdma) {
            self.enqueue_ctx(rdma, event);
        }
    }

    /// Moves a context to `next`, keeping the world's count of contexts changing state.
    pub(super) fn set_state(&mut self, rdma: H, next: doca_ctx_states) {
        let changing = |s| s == DOCA_CTX_STATE_STARTING || s == DOCA_CTX_STATE_STOPPING;
        if let Some(r) = self.rdmas.get_mut(&rdma) {
            let was = changing(r.state);
            r.state = next;
            match (was, changing(next)) {
                (false, true) => self.contexts_changing_state += 1,
                (true, false) => self.contexts_changing_state -= 1,
                _ => {}
            }
        }
    }

    /// Sets or clears a context's `sends_wait`, keeping the world's count.
    pub(super) fn set_sends_wait(&mut self, rdma: H, wait: bool) {
        if let Some(r) = self.rdmas.get_mut(&rdma) {
            if r.sends_wait != wait {
                r.sends_wait = wait;
                if wait {
                    self.contexts_with_waiting_sends += 1;
                } else {
                    self.contexts_with_waiting_sends -= 1;
                }
            }
        }
    }

    /// Completes a submitted task: its callback is delivered by the next progress.
    pub(super) fn complete(&mut self, task: H, status: doca_error_t) {
        self.finish(task, status, true);
    }

    /// Completes a task the caller already took off its queue (a receive off its context's
    /// posted receives, a send off its connection's waiting sends): no queue to search.
    pub(super) fn complete_dequeued(&mut self, task: H, status: doca_error_t) {
        self.finish(task, status, false);
    }

    fn finish(&mut self, task: H, status: doca_error_t, queued: bool) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        if t.phase != Phase::Submitted {
            return;
        }
        t.phase = Phase::Completing;
        t.status = status;
        t.deadline = None;
        let (rdma, conn, receive) = (t.rdma, t.conn, t.kind == Kind::Receive);
        if let Some(c) = conn.and_then(|c| self.conns.get_mut(&c)) {
            c.outstanding.retain(|&x| x != task);
            if queued {
                c.pending.retain(|&x| x != task);
            }
        }
        if let (true, Some(r)) = (queued, self.rdmas.get_mut(&rdma)) {
            if receive {
                r.recvs.retain(|&x| x != task);
            }
            // A task completed before a flush started it (an error, a disconnection, a stop).
            r.unflushed.retain(|&x| x != task);
        }
        self.enqueue_ctx(rdma, Event::TaskDone(task));
    }

    /// Whether a task completion is pending on a progress engine (what arms the handle).
    pub(super) fn pe_has_completion(&self, pe: H, now: Instant) -> bool {
        let Some(p) = self.pes.get(&pe) else {
            return false;
        };
        p.queue.iter().any(|e| matches!(e, Event::TaskDone(_)))
            || self.earliest_deadline(pe).is_some_and(|d| d <= now)
    }

    pub(super) fn earliest_deadline(&self, pe: H) -> Option<Instant> {
        let p = self.pes.get(&pe)?;
        // Only contexts that may have a waiting send (`sends_wait`) have deadlines: the others'
        // connections are not looked at, so arming an engine costs nothing per connection.
        p.ctxs
            .iter()
            .filter_map(|r| self.rdmas.get(r))
            .filter(|r| r.sends_wait)
            .flat_map(|r| r.conns.iter())
            .filter_map(|c| self.conns.get(c)?.pending.front())
            .filter_map(|t| self.tasks.get(t)?.deadline)
            .min()
    }
}
