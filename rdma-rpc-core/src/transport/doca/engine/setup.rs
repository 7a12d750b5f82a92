//! Context setup and teardown. Both wait for DOCA state changes by progressing, so both run
//! off the async runtime's workers: setup on a blocking thread, teardown on the polling
//! thread, as an async loop with timer sleeps in event mode, or on a thread of its own when
//! the runtime drops the owner's task.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use doca_sys as sys;

use super::super::sys::{check, doca_error, error_name, Device, Inventory, Pe, PeDriver, Rdma};
use super::super::DocaConfig;
use super::callbacks::*;
use super::receive::{Deadlines, Staging};
use super::{EngineShared, Owner};
use crate::error::{Error, Result};
use crate::ids::IdMap;

/// How long a context may take to start or to stop.
pub(super) const STATE_CHANGE_LIMIT: Duration = Duration::from_secs(10);

/// Most tasks of one kind a context configures (`*_set_conf`), whatever the product of
/// connections and queue depth.
const MAX_TASKS_PER_KIND: u32 = 16 * 1024;

/// Queue and pool sizes of one context, from the configuration bounded by the device.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    /// Operations in flight per connection (`doca_rdma_set_send_queue_size`).
    pub(super) send_queue: u32,
    /// Most staging receives of the context (registered and posted as its connections
    /// reserve them).
    pub(super) recv_count: u32,
    /// Bytes of each staging receive.
    pub(super) recv_slot: usize,
    /// Tasks of each kind the context configures.
    pub(super) tasks_per_kind: u32,
    /// `doca_buf`s of the context's inventory when it starts; it grows on demand
    /// (`doca_buf_inventory_expand`) up to [`MAX_INVENTORY`].
    pub(super) inventory: usize,
}

/// `doca_buf`s an inventory starts with: enough for a few connections' receives and
/// operations; more are added as they are needed.
const INITIAL_INVENTORY: usize = 1024;

/// Most `doca_buf`s of one context's inventory: every staging receive holds one, every
/// operation at most two, and every idle send task one (its buffer over a staging slab).
pub(super) const MAX_INVENTORY: usize = 1 << 22;

/// Smallest staging receive: room for any control frame of the protocol.
const MIN_RECV_SLOT: usize = 64;

impl Sizes {
    pub(super) fn new(config: &DocaConfig, dev: &Device, max_connections: u16) -> Sizes {
        let info = dev.info();
        let send_queue = config
            .send_queue_size
            .clamp(1, info.max_send_queue_size.max(1));
        let recv_count = config
            .recv_queue_size
            .clamp(1, info.max_recv_queue_size.max(1));
        let ops = send_queue.saturating_mul(u32::from(max_connections.max(1)));
        let tasks_per_kind = ops.min(MAX_TASKS_PER_KIND);
        Sizes {
            send_queue,
            recv_count,
            recv_slot: config.max_recv_size.max(MIN_RECV_SLOT),
            tasks_per_kind,
            inventory: INITIAL_INVENTORY,
        }
    }
}

/// Sets the task configuration of every kind.
///
/// # Safety
/// `r` is an idle context.
unsafe fn configure_tasks(r: *mut sys::doca_rdma, sizes: &Sizes) -> Result<()> {
    let n = sizes.tasks_per_kind;
    // SAFETY: per the function's contract; every callback has its C type.
    unsafe {
        check(
            "doca_rdma_task_receive_set_conf",
            sys::doca_rdma_task_receive_set_conf(
                r,
                Some(recv_ok),
                Some(recv_err),
                sizes.recv_count,
            ),
        )?;
        check(
            "doca_rdma_task_send_set_conf",
            sys::doca_rdma_task_send_set_conf(r, Some(send_ok), Some(send_err), n),
        )?;
        check(
            "doca_rdma_task_send_imm_set_conf",
            sys::doca_rdma_task_send_imm_set_conf(r, Some(send_imm_ok), Some(send_imm_err), n),
        )?;
        check(
            "doca_rdma_task_read_set_conf",
            sys::doca_rdma_task_read_set_conf(r, Some(read_ok), Some(read_err), n),
        )?;
        check(
            "doca_rdma_task_write_set_conf",
            sys::doca_rdma_task_write_set_conf(r, Some(write_ok), Some(write_err), n),
        )?;
        check(
            "doca_rdma_task_write_imm_set_conf",
            sys::doca_rdma_task_write_imm_set_conf(r, Some(write_imm_ok), Some(write_imm_err), n),
        )?;
        check(
            "doca_rdma_task_atomic_cmp_swp_set_conf",
            sys::doca_rdma_task_atomic_cmp_swp_set_conf(r, Some(cas_ok), Some(cas_err), n),
        )?;
        check(
            "doca_rdma_task_atomic_fetch_add_set_conf",
            sys::doca_rdma_task_atomic_fetch_add_set_conf(r, Some(faa_ok), Some(faa_err), n),
        )?;
    }
    Ok(())
}

impl Owner {
    /// Creates, configures and starts a context on a progress engine of its own, and waits
    /// until it runs. Blocks: call it off the async runtime's workers.
    pub(super) fn start(
        shared: Weak<EngineShared>,
        dev: &Arc<Device>,
        config: &Arc<DocaConfig>,
        max_connections: u16,
    ) -> Result<Owner> {
        let mut pe = PeDriver::new()?;
        let mut owner = Owner::prepare(shared, dev, config, max_connections, pe.engine().clone())?;
        owner.start_context(&mut pe)?;
        // From here on the owner drives its engine.
        owner.own_pe = Some(pe);
        let deadline = Instant::now() + STATE_CHANGE_LIMIT;
        while !owner.running() {
            if !owner.own_pe.as_mut().is_some_and(PeDriver::progress) {
                if Instant::now() > deadline {
                    owner.shutdown_blocking();
                    return Err(doca_error("doca_ctx_start", sys::DOCA_ERROR_TIME_OUT));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            // State callbacks only: nothing to act on before the context runs.
            drop(owner.sink.take());
        }
        Ok(owner)
    }

    /// Creates a context for `pe` with its settings, inventory and staging receives, without
    /// touching `pe` (which another thread may be progressing meanwhile; a shared `Pe` cannot
    /// drive it): the slow part of setup (allocating and registering memory), done off the
    /// engine's thread. [`Owner::start_context`] connects, configures and starts it.
    pub(super) fn prepare(
        shared: Weak<EngineShared>,
        dev: &Arc<Device>,
        config: &Arc<DocaConfig>,
        max_connections: u16,
        pe: Arc<Pe>,
    ) -> Result<Owner> {
        let sizes = Sizes::new(config, dev, max_connections);
        let rdma = Rdma::new(dev, &pe)?;
        let r = rdma.raw();
        let sink = Box::new(Sink::new());
        // SAFETY: `r` is a new, idle context. No receive queue size is set: DOCA
        // documents `doca_rdma_set_recv_queue_size` as GPU/DPA data path only (NOT_SUPPORTED
        // on the CPU data path).
        unsafe {
            check(
                "doca_rdma_set_permissions",
                sys::doca_rdma_set_permissions(r, remote_access()),
            )?;
            check(
                "doca_rdma_set_max_num_connections",
                sys::doca_rdma_set_max_num_connections(r, max_connections.max(1)),
            )?;
            check(
                "doca_rdma_set_send_queue_size",
                sys::doca_rdma_set_send_queue_size(r, sizes.send_queue),
            )?;
            check(
                "doca_rdma_set_transport_type",
                sys::doca_rdma_set_transport_type(r, sys::DOCA_RDMA_TRANSPORT_TYPE_RC),
            )?;
            // Receives cannot run out by design (see `Receives`): a peer that finds none
            // broke its credits or stalled, and its connection fails after these retries
            // instead of stalling the queue pair for good (7 would retry forever).
            check(
                "doca_rdma_set_rnr_retry_count",
                sys::doca_rdma_set_rnr_retry_count(r, config.rnr_retry_count.min(7)),
            )?;
            if let Some(gid) = config.gid_index {
                check(
                    "doca_rdma_set_gid_index",
                    sys::doca_rdma_set_gid_index(r, gid),
                )?;
            }
        }
        let inv = Inventory::new(sizes.inventory, MAX_INVENTORY)?;
        let staging = Staging::new(sizes.recv_slot, sizes.recv_count as usize);
        let queued = shared
            .upgrade()
            .map(|s| s.queued.clone())
            .unwrap_or_default();
        Ok(Owner {
            shared,
            queued,
            config: config.clone(),
            sizes,
            ops: IdMap::default(),
            idle: Default::default(),
            conns: IdMap::default(),
            by_raw: IdMap::default(),
            live: IdMap::default(),
            accepted: None,
            listening: Vec::new(),
            deadlines: Deadlines::default(),
            waiting: VecDeque::new(),
            slab_bufs: IdMap::default(),
            staging,
            inv,
            rdma,
            own_pe: None,
            sink,
            events: Vec::new(),
            max_message: u64::from(dev.info().max_message_size),
            batching: false,
            unflushed: false,
            freed: Vec::new(),
            stop_begun: false,
            stopped: false,
        })
    }

    /// Connects a prepared context to its progress engine through the engine's driver, `pe`
    /// (held by the caller: the engine's progress owner), and starts it; it runs once a
    /// progress of the engine reports it (see [`Owner::running`]).
    pub(super) fn start_context(&mut self, pe: &mut PeDriver) -> Result<()> {
        let r = self.rdma.raw();
        // The order is the samples': connect to the engine, configure the tasks, set the user
        // data and callbacks, start.
        pe.connect(&self.rdma)?;
        // SAFETY: an idle context, connected to its engine; the sink outlives the context (both
        // owned by the owner, the context destroyed first).
        unsafe {
            configure_tasks(r, &self.sizes)?;
            check(
                "doca_ctx_set_user_data",
                sys::doca_ctx_set_user_data(self.rdma.ctx(), self.sink.user_data()),
            )?;
            check(
                "doca_rdma_set_connection_state_callbacks",
                sys::doca_rdma_set_connection_state_callbacks(
                    r,
                    Some(on_request),
                    Some(on_established),
                    Some(on_failure),
                    Some(on_disconnect),
                ),
            )?;
        }
        // SAFETY: a configured, idle context connected to a progress engine. DOCA may finish
        // starting asynchronously (IN_PROGRESS): the state is then reached through progress.
        let code = unsafe { sys::doca_ctx_start(self.rdma.ctx()) };
        if code != sys::DOCA_SUCCESS && code != sys::DOCA_ERROR_IN_PROGRESS {
            return Err(doca_error("doca_ctx_start", code));
        }
        self.rdma.destroyable = false;
        Ok(())
    }

    /// Whether the context runs.
    pub(super) fn running(&self) -> bool {
        self.rdma.state() == sys::DOCA_CTX_STATE_RUNNING
    }

    /// Starts stopping (once): disconnects every connection and stops the context, which
    /// flushes every outstanding task.
    pub(super) fn begin_stop(&mut self) {
        if std::mem::replace(&mut self.stop_begun, true) {
            return;
        }
        self.sink.accepting.set(false);
        let ids: Vec<_> = self.conns.keys().copied().collect();
        for id in ids {
            self.fail_conn(
                id,
                Error::ConnectionClosed {
                    peer: String::new(),
                    reason: "the DOCA context is shutting down".into(),
                },
            );
        }
        // Every task must be freed before its context stops (doca_pe.h: doca_task_free): the
        // idle ones go now, those in flight when their flushed completions come back (no
        // connection is live from here on, so none goes back to `idle`).
        self.idle = Default::default();
        // SAFETY: a started context.
        let code = unsafe { sys::doca_ctx_stop(self.rdma.ctx()) };
        if code != sys::DOCA_SUCCESS && code != sys::DOCA_ERROR_IN_PROGRESS {
            tracing::warn!(error = %error_name(code), "doca_ctx_stop failed");
        }
    }

    /// Progresses a stopping context (its own engine; on a shared one, the polling thread
    /// progresses and this only handles events); true once it is idle with every task back.
    fn stop_progress(&mut self) -> bool {
        self.progress_all();
        self.stopped_idle()
    }

    /// Whether a stopping context is idle with every task back.
    pub(super) fn stopped_idle(&self) -> bool {
        self.ops.is_empty()
            && self.staging.outstanding() == 0
            && self.rdma.state() == sys::DOCA_CTX_STATE_IDLE
    }

    pub(super) fn finish_stop(&mut self, idle: bool) {
        if idle {
            self.rdma.destroyable = true;
        } else {
            tracing::warn!("DOCA context did not stop within {STATE_CHANGE_LIMIT:?}; leaking it");
            self.abandon_ops();
        }
        self.conns.clear();
        self.by_raw.clear();
        self.live.clear();
        self.stopped = true;
    }

    /// Stops the context, waiting with thread sleeps (off the async runtime).
    pub(super) fn shutdown_blocking(&mut self) {
        if self.stopped {
            return;
        }
        self.begin_stop();
        let deadline = Instant::now() + STATE_CHANGE_LIMIT;
        loop {
            if self.stop_progress() {
                return self.finish_stop(true);
            }
            if Instant::now() > deadline {
                return self.finish_stop(false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Stops the context, waiting with timer sleeps (on the owner's async task).
    pub(super) async fn shutdown_async(&mut self) {
        if self.stopped {
            return;
        }
        self.begin_stop();
        let deadline = Instant::now() + STATE_CHANGE_LIMIT;
        loop {
            if self.stop_progress() {
                return self.finish_stop(true);
            }
            if Instant::now() > deadline {
                return self.finish_stop(false);
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
}

/// The remote rights every context grants its connections (mmaps limit each window).
fn remote_access() -> u32 {
    sys::DOCA_ACCESS_FLAG_LOCAL_READ_WRITE
        | sys::DOCA_ACCESS_FLAG_RDMA_READ
        | sys::DOCA_ACCESS_FLAG_RDMA_WRITE
        | sys::DOCA_ACCESS_FLAG_RDMA_ATOMIC
}
