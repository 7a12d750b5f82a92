//! The storage service: between the initiator and the three targets.
//!
//! Memory is registered and offered once, as in NVIDIA's storage application: the initiator
//! offers its whole I/O memory on each of its connections at `init_storage`, and the service
//! offers each lane's whole staging memory (the halves of that lane's transactions) to the
//! lane's connection to each target at its `init`; every I/O message then carries a block
//! index and offsets, and no I/O offers, revokes, registers or imports memory.
//!
//! A write fetches the block from the initiator's memory with one RDMA read into a private
//! staging area, encodes it ([`super::codec::Codec`]) into its three halves in the shared
//! staging memory, and has each target fetch its half with one RDMA read: 4 calls, and 4
//! network round trips one after the other (the call, the read, the three target calls in
//! parallel and their reads). A read has the two data targets write their halves into the
//! staging memory, decodes, and writes the block into the initiator's memory with one RDMA
//! write: 3 calls. Each write is posted ahead of its call's response
//! ([`rdma_rpc_core::RemoteMemory::write_posted`]), which tells the caller the bytes landed:
//! 2 round trips one after the other over the software transports, 4 over DOCA, whose writes
//! complete before their responses are sent. Every Nth read, or when a data half is
//! missing, unreachable or corrupt, the read goes through the parity target instead (a
//! recovery read).
//!
//! A data path per core: the service keeps `cores` connections to each target (lanes). With
//! [`ServiceConfig::threads`], lane `k` is dialed on core `k`'s thread, and a handler running
//! on core `k` (the service listens once per core there) calls over lane `k`: an I/O stays on
//! one thread ([`super::cores`]), with staging memory of that lane's own. Without, I/Os take
//! the lanes in turn, so that the calls of different transactions run on different
//! connections.

// This file holds the service, its configuration and its connections to the targets;
// `staging` the staging memory, `io` the pieces of the I/O path, `endpoints` what the
// initiator calls.

mod endpoints;
mod io;
mod staging;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_rpc_core::server::ServerBuilder;
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server, Status};
use tokio::sync::watch;

use super::auth::Secret;
use super::codec::{Codec, CpuCodec, Slot};
use super::cores::{CoreThreads, Padded, PerCore};
use super::handles::ConnectionHandles;
use crate::generated::storage_service::StorageServiceServer;
use crate::generated::storage_target::{
    Command, StorageTargetClient, TargetControl, TargetGeometry,
};

pub use staging::shards_used;
use staging::{Staging, StagingSet};

/// A server of `service` as every storage process runs it: the receives the storage
/// connections post ([`super::RECEIVES`]), and calls taken only from the initiator that
/// presents `secret`.
pub fn server(service: &Arc<Service>, secret: &Secret) -> ServerBuilder {
    Server::builder()
        .initial_receives(super::RECEIVES)
        .recv_credits(super::RECEIVES)
        .interceptor(secret.require("its initiator"))
        .add_service(StorageServiceServer::new(service.clone()))
}

/// How the service behaves.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Every Nth read goes through the parity target (0: only when needed).
    pub recovery_every: u64,
    /// Longest wait for a target's answer to a control command.
    pub control_timeout: Duration,
    /// Connections to each target (lanes): one per core that runs I/O.
    pub cores: usize,
    /// The codec; `None`: the CPU one ([`CpuCodec`]) for the targets' block size.
    pub codec: Option<Arc<dyn Codec>>,
    /// What the service presents to the targets (they take calls from their service only).
    pub target_secret: Secret,
    /// A thread per core: lane `k` to each target is dialed on core `k`, and handlers on core
    /// `k` use it. `None`: lanes are dialed on the caller's runtime and I/Os take them in turn.
    pub threads: Option<Arc<CoreThreads>>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            recovery_every: 0,
            control_timeout: Duration::from_secs(5),
            cores: 1,
            codec: None,
            target_secret: Secret::random(),
            threads: None,
        }
    }
}

/// Most initiator connections whose I/O memory handles the service keeps.
const MAX_INITIATOR_CONNECTIONS: usize = 256;

/// One connection to a target: a lane of the data path.
struct Lane {
    client: Client,
    stub: StorageTargetClient,
}

/// One target as the service sees it.
struct Link {
    slot: Slot,
    lanes: Vec<Lane>,
    /// A write missed this target and that was logged; cleared when one reaches it again.
    down: std::sync::atomic::AtomicBool,
}

impl Link {
    /// Logs a target that misses writes once, not once per block.
    fn went_down(&self, status: &Status) {
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target_slot = %self.slot,
                reason = %describe(status),
                "writes are degraded: the {} target misses them (reads recover from parity)",
                self.slot
            );
        }
    }

    fn came_back(&self) {
        // Read first: a swap on every write would take the line from the other cores.
        if self.down.load(Ordering::Relaxed) && self.down.swap(false, Ordering::Relaxed) {
            tracing::warn!(target_slot = %self.slot, "the {} target takes writes again", self.slot);
        }
    }
}

#[derive(Clone)]
enum State {
    /// Waiting for `init_storage`.
    Created,
    /// Initialized; I/O once started.
    Ready(Arc<StagingSet>),
    Running(Arc<StagingSet>),
    ShutDown,
}

/// One lane's staging while storage runs, on cache lines of its own.
type LaneRunning = Padded<Mutex<Option<Arc<Staging>>>>;

/// The service.
pub struct Service {
    config: ServiceConfig,
    codec: Arc<dyn Codec>,
    links: [Link; 3],
    block_size: usize,
    half_size: usize,
    block_count: u64,
    state: Mutex<State>,
    /// Per lane, the lane's staging while storage runs: what an I/O reads instead of
    /// `state`, whose lock and `Arc` every core's I/Os would take from each other.
    running: Box<[LaneRunning]>,
    /// The lane of the next I/O that runs on no core's thread.
    next_lane: AtomicUsize,
    /// The I/O memory each initiator connection offered at `init_storage`.
    initiators: ConnectionHandles,
    reads: AtomicU64,
    /// I/Os started on each core thread ([`ServiceConfig::threads`]), and elsewhere.
    by_core: PerCore,
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .finish_non_exhaustive()
    }
}

fn describe(status: &Status) -> String {
    format!("{}: {}", status.code(), status.message())
}

impl Service {
    /// Connects to the data 1, data 2 and parity targets (`config.cores` connections to
    /// each) and checks that they agree. Each target is given by one or more addresses: lane
    /// `k` dials address `k` (modulo their number), on core `k` with [`ServiceConfig::threads`].
    pub async fn connect(
        transport: Arc<dyn Transport>,
        targets: [&[String]; 3],
        mut config: ServiceConfig,
    ) -> Result<Service, Status> {
        // Used to dial here only: the service's connections and listeners live on the threads,
        // which must not be kept alive by the service they run.
        let threads = config.threads.take();
        // Every target needs an address: checked before anything is dialed.
        for (addrs, slot) in targets.iter().zip([Slot::Data1, Slot::Data2, Slot::Parity]) {
            if addrs.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "no address for the {slot} target"
                )));
            }
        }
        let mut links = Vec::new();
        let mut geometry: Option<TargetGeometry> = None;
        for (addrs, slot) in targets
            .into_iter()
            .zip([Slot::Data1, Slot::Data2, Slot::Parity])
        {
            let mut lanes = Vec::new();
            for lane in 0..config.cores.max(1) {
                let addr = addrs[lane % addrs.len()].clone();
                let builder = Client::builder()
                    .transport(transport.clone())
                    .initial_receives(super::RECEIVES)
                    .recv_credits(super::RECEIVES)
                    .interceptor(config.target_secret.present());
                let dial = {
                    let (addr, limit) = (addr.clone(), config.control_timeout);
                    async move { tokio::time::timeout(limit, builder.connect(&addr)).await }
                };
                let dialed = match &threads {
                    Some(threads) => threads.run(lane, dial).await,
                    None => dial.await,
                };
                let client = dialed
                    .map_err(|_| {
                        Status::unavailable(format!("{slot} target at {addr}: no answer"))
                    })?
                    .map_err(|e| Status::unavailable(format!("{slot} target at {addr}: {e}")))?;
                let stub = StorageTargetClient::new(client.clone());
                lanes.push(Lane { client, stub });
            }
            let addr = &addrs[0];
            let g = lanes[0].stub.query(()).await?;
            if g.slot != slot.to_string() {
                return Err(Status::invalid_argument(format!(
                    "the target at {addr} keeps {} halves, not {slot}",
                    g.slot
                )));
            }
            match &geometry {
                None => geometry = Some(g),
                Some(first)
                    if (first.block_size, first.half_size, first.half_count)
                        != (g.block_size, g.half_size, g.half_count) =>
                {
                    return Err(Status::failed_precondition(format!(
                        "the targets disagree: {slot} stores {} halves of {} bytes for {}-byte \
                         blocks, data 1 stores {} of {} for {}",
                        g.half_count,
                        g.half_size,
                        g.block_size,
                        first.half_count,
                        first.half_size,
                        first.block_size
                    )))
                }
                Some(_) => {}
            }
            links.push(Link {
                slot,
                lanes,
                down: Default::default(),
            });
        }
        let g = geometry.expect("three targets");
        let codec = match &config.codec {
            Some(codec) => codec.clone(),
            None => Arc::new(
                CpuCodec::new(g.block_size as usize)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            ) as Arc<dyn Codec>,
        };
        if codec.block_size() != g.block_size as usize || codec.half_size() != g.half_size as usize
        {
            return Err(Status::failed_precondition(format!(
                "the targets store halves of {} bytes for {}-byte blocks; the codec makes {} for {}",
                g.half_size,
                g.block_size,
                codec.half_size(),
                codec.block_size()
            )));
        }
        let links: [Link; 3] = super::cluster::three(links);
        let by_core = PerCore::new(config.cores.max(1));
        let lanes = links[0].lanes.len();
        Ok(Service {
            config,
            codec,
            links,
            block_size: g.block_size as usize,
            half_size: g.half_size as usize,
            block_count: g.half_count,
            state: Mutex::new(State::Created),
            running: (0..lanes).map(|_| Padded::default()).collect(),
            next_lane: AtomicUsize::new(0),
            initiators: ConnectionHandles::new(MAX_INITIATOR_CONNECTIONS, lanes),
            reads: AtomicU64::new(0),
            by_core,
            shutdown: watch::channel(false).0,
        })
    }

    /// How many I/Os (writes and reads) each core thread started, by core, and how many started
    /// on no core thread (all of them without [`ServiceConfig::threads`]).
    pub fn ios_by_core(&self) -> (Vec<u64>, u64) {
        self.by_core.get()
    }

    /// Per lane, the staging slots its I/Os took, by the core thread they ran on, and
    /// elsewhere: with a thread per core, lane `k`'s staging is used on core `k` only. Empty
    /// before `init_storage`.
    pub fn staging_by_lane(&self) -> Vec<(Vec<u64>, u64)> {
        match &*self.state.lock().unwrap() {
            State::Ready(set) | State::Running(set) => {
                set.lanes.iter().map(|s| s.taken_on.get()).collect()
            }
            State::Created | State::ShutDown => Vec::new(),
        }
    }

    /// [`Service::ios_by_core`] as the binaries print it.
    pub fn ios_by_core_line(&self) -> String {
        self.by_core.line("I/Os the service started")
    }

    /// Resolves once the initiator asked the service to shut down.
    pub fn shut_down(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.shutdown.subscribe();
        async move {
            let _ = rx.wait_for(|down| *down).await;
        }
    }

    /// The staging of the lane an I/O uses, while storage runs: on a core's thread that
    /// core's lane (its connections live there), elsewhere the lanes in turn.
    fn running(&self) -> Result<Arc<Staging>, Status> {
        let lanes = self.running.len();
        let lane = match super::cores::current() {
            Some(core) => core % lanes,
            None => self.next_lane.fetch_add(1, Ordering::Relaxed) % lanes,
        };
        if let Some(staging) = &*self.running[lane].0.lock().unwrap() {
            return Ok(staging.clone());
        }
        match &*self.state.lock().unwrap() {
            State::Running(set) => Ok(set.lanes[lane].clone()),
            State::Created => Err(Status::failed_precondition(
                "storage is not initialized: call init_storage, then start",
            )),
            State::Ready(_) => Err(Status::failed_precondition(
                "storage is initialized but not started: call start",
            )),
            State::ShutDown => Err(Status::failed_precondition("storage was shut down")),
        }
    }

    /// Sets the state, and what each lane's I/O reads of it.
    fn set_state(&self, state: State) {
        let mut current = self.state.lock().unwrap();
        for (lane, running) in self.running.iter().enumerate() {
            *running.0.lock().unwrap() = match &state {
                State::Running(set) => Some(set.lanes[lane].clone()),
                _ => None,
            };
        }
        *current = state;
    }

    async fn control_targets(&self, command: Command) -> Vec<(Slot, Status)> {
        let mut failed = Vec::new();
        for link in &self.links {
            let mut request = TargetControl::default();
            request.set_command(command);
            let stub = &link.lanes[0].stub;
            let sent = tokio::time::timeout(self.config.control_timeout, stub.control(request))
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer (control_timeout)")));
            if let Err(status) = sent {
                failed.push((link.slot, status));
            }
        }
        failed
    }
}
