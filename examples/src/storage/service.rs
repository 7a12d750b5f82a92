//! The storage service: between the initiator and the three targets.
//!
//! Memory is registered and offered once, as in NVIDIA's storage application: the initiator
//! offers its whole I/O memory on each of its connections at `init_storage`, and the service
//! offers its whole staging memory (the halves of every transaction) to each target
//! connection at its `init`; every I/O message then carries a block index and offsets, and no
//! I/O offers, revokes, registers or imports memory.
//!
//! A write fetches the block from the initiator's memory with one RDMA read into a private
//! staging area, encodes it ([`super::codec::Codec`]) into its three halves in the shared
//! staging memory, and has each target fetch its half with one RDMA read: 4 calls, and 4
//! network round trips one after the other (the call, the read, the three target calls in
//! parallel and their reads). A read has the two data targets write their halves into the
//! staging memory, decodes, and writes the block into the initiator's memory with one RDMA
//! write: 3 calls, 4 round trips one after the other. Every Nth read, or when a data half is
//! missing, unreachable or corrupt, the read goes through the parity target instead (a
//! recovery read).
//!
//! A data path per core: the service keeps `cores` connections to each target (lanes), and a
//! transaction's staging slot picks its lane, so that the calls of different cores run on
//! different connections (each served by a task of its own on both sides).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_rpc_core::transport::{SendData, Transport};
use rdma_rpc_core::{
    Access, Client, Code, MemoryRegion, RegionOffer, RemoteBuf, RemoteMemory, Request, Share,
    SharedRegion, Status,
};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::auth::Secret;
use super::codec::{Codec, CodecError, CpuCodec, Half, Slot, HEADER_LEN, TRAILER_LEN};
use super::handles::ConnectionHandles;
use crate::generated::storage_service::{
    BlockDone, BlockIo, InitStorage, StorageCommand, StorageControl, StorageGeometry,
    StorageService,
};
use crate::generated::storage_target::{
    Command, HalfDone, HalfIo, StorageTargetClient, TargetControl, TargetGeometry, TargetInit,
};

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
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            recovery_every: 0,
            control_timeout: Duration::from_secs(5),
            cores: 1,
            codec: None,
            target_secret: Secret::random(),
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
        if self.down.swap(false, Ordering::Relaxed) {
            tracing::warn!(target_slot = %self.slot, "the {} target takes writes again", self.slot);
        }
    }
}

/// Staging memory for the I/O in flight: per transaction, a private block area (the
/// initiator's block lands there, a read's block is decoded there) and three halves in memory
/// shared and offered once to every target connection.
struct Staging {
    blocks: MemoryRegion,
    halves: SharedRegion,
    /// The share and whole-region offer of `halves` per target lane, held while staging lives.
    _offers: Vec<(Share, RegionOffer)>,
    transactions: usize,
    free: Mutex<Vec<usize>>,
    permits: Arc<Semaphore>,
}

/// A staging slot, back in the free list when dropped.
struct StagingSlot<'a> {
    staging: &'a Staging,
    index: usize,
    _permit: OwnedSemaphorePermit,
}

impl Drop for StagingSlot<'_> {
    fn drop(&mut self) {
        self.staging.free.lock().unwrap().push(self.index);
    }
}

impl Staging {
    async fn slot(&self) -> StagingSlot<'_> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let index = self
            .free
            .lock()
            .unwrap()
            .pop()
            .expect("a permit means a free slot");
        StagingSlot {
            staging: self,
            index,
            _permit: permit,
        }
    }
}

thread_local! {
    /// Per thread: the three halves a block encodes to, or the halves a read decodes from,
    /// before or after they are copied to or from the shared staging memory (whose bytes
    /// local code only copies, since the targets may write them).
    static SCRATCH: RefCell<[Vec<u8>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

#[derive(Clone)]
enum State {
    /// Waiting for `init_storage`.
    Created,
    /// Initialized; I/O once started.
    Ready(Arc<Staging>),
    Running(Arc<Staging>),
    ShutDown,
}

/// The service.
pub struct Service {
    config: ServiceConfig,
    codec: Arc<dyn Codec>,
    links: [Link; 3],
    block_size: usize,
    half_size: usize,
    block_count: u64,
    state: Mutex<State>,
    /// The I/O memory each initiator connection offered at `init_storage`.
    initiators: ConnectionHandles,
    reads: AtomicU64,
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
    /// each) and checks that they agree.
    pub async fn connect(
        transport: Arc<dyn Transport>,
        targets: [&str; 3],
        config: ServiceConfig,
    ) -> Result<Service, Status> {
        let mut links = Vec::new();
        let mut geometry: Option<TargetGeometry> = None;
        for (addr, slot) in targets
            .into_iter()
            .zip([Slot::Data1, Slot::Data2, Slot::Parity])
        {
            let mut lanes = Vec::new();
            for _ in 0..config.cores.max(1) {
                let builder = Client::builder()
                    .transport(transport.clone())
                    .initial_receives(super::RECEIVES)
                    .recv_credits(super::RECEIVES)
                    .interceptor(config.target_secret.present());
                let client = tokio::time::timeout(config.control_timeout, builder.connect(addr))
                    .await
                    .map_err(|_| {
                        Status::unavailable(format!("{slot} target at {addr}: no answer"))
                    })?
                    .map_err(|e| Status::unavailable(format!("{slot} target at {addr}: {e}")))?;
                let stub = StorageTargetClient::new(client.clone());
                lanes.push(Lane { client, stub });
            }
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
        Ok(Service {
            config,
            codec,
            links,
            block_size: g.block_size as usize,
            half_size: g.half_size as usize,
            block_count: g.half_count,
            state: Mutex::new(State::Created),
            initiators: ConnectionHandles::new(MAX_INITIATOR_CONNECTIONS),
            reads: AtomicU64::new(0),
            shutdown: watch::channel(false).0,
        })
    }

    /// Resolves once the initiator asked the service to shut down.
    pub fn shut_down(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.shutdown.subscribe();
        async move {
            let _ = rx.wait_for(|down| *down).await;
        }
    }

    fn running(&self) -> Result<Arc<Staging>, Status> {
        match &*self.state.lock().unwrap() {
            State::Running(staging) => Ok(staging.clone()),
            State::Created => Err(Status::failed_precondition(
                "storage is not initialized: call init_storage, then start",
            )),
            State::Ready(_) => Err(Status::failed_precondition(
                "storage is initialized but not started: call start",
            )),
            State::ShutDown => Err(Status::failed_precondition("storage was shut down")),
        }
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

    /// Staging for `n` transactions: the halves' memory shared with and offered once to every
    /// lane of every target (one registration and export per connection, here and never per
    /// I/O), and each target told its handle.
    async fn make_staging(&self, n: usize) -> Result<Staging, Status> {
        let halves = SharedRegion::new(n * 3 * self.half_size).map_err(Status::from)?;
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mut offers = Vec::new();
        for link in &self.links {
            for lane in &link.lanes {
                let share = lane.client.remote_memory().share(&halves, rw)?;
                let offer = share.offer_all(rw)?;
                let init = TargetInit {
                    memory: Some(offer.handle()),
                };
                tokio::time::timeout(self.config.control_timeout, lane.stub.init(init))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Status::deadline_exceeded("no answer (control_timeout)"))
                    })
                    .map_err(|s| {
                        Status::unavailable(format!(
                            "the {} target did not take the staging memory: {}",
                            link.slot,
                            describe(&s)
                        ))
                    })?;
                offers.push((share, offer));
            }
        }
        Ok(Staging {
            blocks: MemoryRegion::new(n * self.block_size).map_err(Status::from)?,
            halves,
            _offers: offers,
            transactions: n,
            free: Mutex::new((0..n).collect()),
            permits: Arc::new(Semaphore::new(n)),
        })
    }

    /// Where half `h` (0 data 1, 1 data 2, 2 parity) of staging slot `slot` is in the shared
    /// staging memory.
    fn half_offset(&self, slot: usize, h: usize) -> usize {
        (slot * 3 + h) * self.half_size
    }

    /// The lane of target `t` that staging slot `slot` uses.
    fn lane(&self, t: usize, slot: usize) -> &Lane {
        let lanes = &self.links[t].lanes;
        &lanes[slot % lanes.len()]
    }

    /// Has target `t` fetch its half of `block` from the staging slot (its first `used` bytes
    /// and the trailer staged after them, by one RDMA read of the target).
    async fn store(&self, t: usize, block: u64, slot: usize, used: usize) -> Result<(), Status> {
        let io = HalfIo {
            block,
            offset: self.half_offset(slot, t) as u64,
            length: self.half_size as u32,
            used: used as u32,
        };
        self.lane(t, slot).stub.write_half(io).await.map(drop)
    }

    /// Has target `t` write its half of `block` into the staging slot (its data and trailer,
    /// by one RDMA write of the target): the bytes of the shard that carry data.
    async fn fetch(&self, t: usize, block: u64, slot: usize) -> Result<usize, Status> {
        let io = HalfIo {
            block,
            offset: self.half_offset(slot, t) as u64,
            length: self.half_size as u32,
            used: 0,
        };
        let done: HalfDone = self.lane(t, slot).stub.read_half(io).await?;
        if !done.stored {
            return Err(Status::not_found(format!(
                "the {} target does not hold block {block}",
                self.links[t].slot
            )));
        }
        let used = done.used as usize;
        if used > self.half_size - TRAILER_LEN {
            return Err(Status::data_loss(format!(
                "the {} target says {used} bytes of block {block}'s half carry data; a half \
                 holds {}",
                self.links[t].slot,
                self.half_size - TRAILER_LEN
            )));
        }
        Ok(used)
    }

    /// Copies half `h` of staging slot `slot` out of the shared staging memory into `dst`:
    /// its first `used` bytes and, staged right after them, its trailer, which goes to the
    /// end of `dst`, with zeros between (what a target moves, in one operation).
    fn copy_half_out(
        &self,
        staging: &Staging,
        slot: usize,
        h: usize,
        used: usize,
        dst: &mut Vec<u8>,
    ) -> Result<(), Status> {
        let trailer = self.half_size - TRAILER_LEN;
        dst.resize(self.half_size, 0);
        let half = staging
            .halves
            .lease(self.half_offset(slot, h), self.half_size)
            .map_err(Status::from)?;
        half.read_at(0, &mut dst[..used]).map_err(Status::from)?;
        dst[used..trailer].fill(0);
        half.read_at(used, &mut dst[trailer..])
            .map_err(Status::from)
    }

    /// Copies an encoded half into half `h` of staging slot `slot`: the bytes a target will
    /// take, in one operation (the first `used`, and the trailer right after them).
    fn copy_half_in(
        &self,
        staging: &Staging,
        slot: usize,
        h: usize,
        used: usize,
        bytes: &[u8],
    ) -> Result<(), Status> {
        let trailer = self.half_size - TRAILER_LEN;
        let mut half = staging
            .halves
            .lease(self.half_offset(slot, h), self.half_size)
            .map_err(Status::from)?;
        half.write_at(0, &bytes[..used]).map_err(Status::from)?;
        half.write_at(used, &bytes[trailer..]).map_err(Status::from)
    }

    /// Checks an I/O request: storage running, block and length in range, the connection's
    /// I/O memory known.
    fn start_io(
        &self,
        request: Request<BlockIo>,
    ) -> Result<(Arc<Staging>, RemoteMemory, BlockIo, RemoteBuf), Status> {
        let staging = self.running()?;
        let initiator = request
            .remote_memory()
            .cloned()
            .ok_or_else(|| Status::internal("a request without a connection"))?;
        let io = request.into_inner();
        self.check_io(&io)?;
        let memory = self
            .initiators
            .of(&initiator, "call init_storage on it first")?;
        Ok((staging, initiator, io, memory))
    }

    fn check_io(&self, io: &BlockIo) -> Result<(), Status> {
        if io.block >= self.block_count {
            return Err(Status::out_of_range(format!(
                "block {} is beyond the {} blocks of this storage",
                io.block, self.block_count
            )));
        }
        if io.length as usize > self.block_size || io.length == 0 {
            return Err(Status::invalid_argument(format!(
                "blocks are 1 to {} bytes, the request says {}",
                self.block_size, io.length
            )));
        }
        Ok(())
    }

    /// Recovers `block` into `out` from the surviving data half (already copied out of
    /// staging) and the parity: the block's length.
    async fn recover(
        &self,
        staging: &Staging,
        block: u64,
        slot: usize,
        surviving: &[u8],
        surviving_is: Half,
        out: &mut [u8],
    ) -> Result<usize, Status> {
        let used = self.fetch(2, block, slot).await.map_err(|s| {
            Status::new(
                s.code(),
                format!(
                    "block {block}: recovery needs the parity half: {}",
                    s.message()
                ),
            )
        })?;
        let mut parity = Vec::new();
        self.copy_half_out(staging, slot, 2, used, &mut parity)?;
        self.codec
            .recover_into(block, surviving, surviving_is, &parity, out)
            .map_err(|e| lost(block, &e))
    }
}

/// How many bytes of each shard (data 1, data 2, parity) of a half of `half_size` bytes carry
/// data, for a block whose payload took `payload_len` bytes: the stream (header, payload) fills
/// data 1 first, then data 2; the rest of each shard is zeros, and the parity (data 1 XOR
/// data 2) has no more than data 1. Only these bytes and each half's trailer need to move.
pub fn shards_used(half_size: usize, payload_len: usize) -> [usize; 3] {
    let shard = half_size - TRAILER_LEN;
    let stream = HEADER_LEN + payload_len;
    let data1 = stream.min(shard);
    [data1, stream.saturating_sub(shard).min(shard), data1]
}

/// A block that cannot be read back correctly.
fn lost(block: u64, e: &CodecError) -> Status {
    Status::data_loss(format!("block {block} cannot be read back: {e}"))
}

impl StorageService for Arc<Service> {
    async fn query_storage(&self, _: Request<()>) -> Result<StorageGeometry, Status> {
        Ok(StorageGeometry {
            block_size: self.block_size as u32,
            block_count: self.block_count,
            half_size: self.half_size as u32,
            // Each data target holds half of every block: together, twice one target.
            capacity: 2 * self.half_size as u64 * self.block_count,
        })
    }

    async fn init_storage(&self, request: Request<InitStorage>) -> Result<(), Status> {
        let initiator = request
            .remote_memory()
            .cloned()
            .ok_or_else(|| Status::internal("a request without a connection"))?;
        let init = request.into_inner();
        let handle = init
            .io_memory
            .clone()
            .ok_or_else(|| Status::invalid_argument("init_storage names no I/O memory"))?;
        if !initiator.holds(&handle) {
            return Err(Status::invalid_argument(
                "the I/O memory was not offered on this connection",
            ));
        }
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        if !handle.access().contains(rw) {
            return Err(Status::invalid_argument(
                "the I/O memory must be offered readable and writable",
            ));
        }
        if init.block_size as usize > self.block_size {
            return Err(Status::invalid_argument(format!(
                "blocks of {} bytes do not fit: this storage takes at most {}",
                init.block_size, self.block_size
            )));
        }
        let transactions =
            u64::from(init.core_count.max(1)) * u64::from(init.transactions_per_core.max(1));
        let max = (rdma_rpc_core::memory::MAX_BUFFER / (3 * self.half_size)) as u64;
        if transactions > max.min(4096) {
            return Err(Status::resource_exhausted(format!(
                "{transactions} transactions in flight need more staging memory than one \
                 region holds (at most {} here)",
                max.min(4096)
            )));
        }
        let current = self.state.lock().unwrap().clone();
        match current {
            State::Running(_) | State::ShutDown => {
                return Err(Status::failed_precondition(
                    "storage is running (or shut down): stop it before init_storage",
                ))
            }
            // Another connection of the initiator: the staging is there; it must be as large.
            State::Ready(staging) if staging.transactions >= transactions as usize => {}
            State::Ready(_) | State::Created => {
                let staging = self.make_staging(transactions as usize).await?;
                *self.state.lock().unwrap() = State::Ready(Arc::new(staging));
            }
        }
        self.initiators.remember(&initiator, handle)?;
        Ok(())
    }

    async fn control(&self, request: Request<StorageControl>) -> Result<(), Status> {
        let command = request.get_ref().command();
        let current = self.state.lock().unwrap().clone();
        match (command, current) {
            (StorageCommand::Start, State::Ready(staging)) => {
                let failed = self.control_targets(Command::Start).await;
                if let Some((slot, status)) = failed.first() {
                    return Err(Status::unavailable(format!(
                        "the {slot} target did not start: {}",
                        describe(status)
                    )));
                }
                *self.state.lock().unwrap() = State::Running(staging);
                Ok(())
            }
            (StorageCommand::Start, State::Running(_)) => {
                Err(Status::failed_precondition("storage is already running"))
            }
            (StorageCommand::Start, _) => Err(Status::failed_precondition(
                "storage is not initialized: call init_storage first",
            )),
            (StorageCommand::Stop, State::Running(staging)) => {
                let _ = self.control_targets(Command::Stop).await;
                *self.state.lock().unwrap() = State::Ready(staging);
                Ok(())
            }
            (StorageCommand::Stop, _) => Err(Status::failed_precondition("storage is not running")),
            (StorageCommand::Shutdown, _) => {
                let _ = self.control_targets(Command::Shutdown).await;
                *self.state.lock().unwrap() = State::ShutDown;
                self.shutdown.send_replace(true);
                Ok(())
            }
        }
    }

    async fn write_block(&self, request: Request<BlockIo>) -> Result<BlockDone, Status> {
        let (staging, initiator, io, memory) = self.start_io(request)?;
        let slot = staging.slot().await;
        // One RDMA read: the block, from the initiator's I/O memory into private staging.
        let area = staging
            .blocks
            .lease(slot.index * self.block_size, io.length as usize)
            .map_err(Status::from)?;
        let block = initiator.read(&memory, io.offset, area).await?;
        // Encoded on this thread, then copied into the shared halves the targets read.
        let compressed_len = SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let [h1, h2, hp] = &mut *scratch;
            for h in [&mut *h1, &mut *h2, &mut *hp] {
                h.resize(self.half_size, 0);
            }
            let len = self
                .codec
                .encode_into(io.block, block.as_slice(), [h1, h2, hp])
                .map_err(|e| Status::invalid_argument(format!("block {}: {e}", io.block)))?;
            let used = shards_used(self.half_size, len);
            for (h, bytes) in scratch.iter().enumerate() {
                self.copy_half_in(&staging, slot.index, h, used[h], bytes)?;
            }
            Ok::<_, Status>((len, used))
        })?;
        let (compressed_len, used) = compressed_len;
        drop(block);
        let (r1, r2, rp) = tokio::join!(
            self.store(0, io.block, slot.index, used[0]),
            self.store(1, io.block, slot.index, used[1]),
            self.store(2, io.block, slot.index, used[2])
        );
        let outcomes = [r1, r2, rp];
        for (link, outcome) in self.links.iter().zip(&outcomes) {
            match outcome {
                Err(status) => link.went_down(status),
                Ok(()) => link.came_back(),
            }
        }
        let failed: Vec<(Slot, Status)> = outcomes
            .into_iter()
            .zip([Slot::Data1, Slot::Data2, Slot::Parity])
            .filter_map(|(r, slot)| r.err().map(|s| (slot, s)))
            .collect();
        let mut degraded = String::new();
        for (slot, status) in &failed {
            let sep = if degraded.is_empty() { "" } else { "; " };
            let _ = write!(degraded, "{sep}{slot}: {}", describe(status));
        }
        if failed.len() >= 2 {
            return Err(Status::unavailable(format!(
                "block {} not stored: {degraded}",
                io.block
            )));
        }
        Ok(BlockDone {
            block: io.block,
            length: io.length,
            compressed_length: compressed_len as u32,
            recovered: false,
            degraded,
        })
    }

    async fn read_block(&self, request: Request<BlockIo>) -> Result<BlockDone, Status> {
        let (staging, initiator, io, memory) = self.start_io(request)?;
        let slot = staging.slot().await;
        let mut area = staging
            .blocks
            .lease(slot.index * self.block_size, self.block_size)
            .map_err(Status::from)?;
        let n = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        let planned =
            self.config.recovery_every > 0 && n.is_multiple_of(self.config.recovery_every);
        let mut degraded = String::new();
        let at = slot.index;
        let (len, recovered) = if planned {
            // A planned recovery read: data 1 and the parity.
            let used = self.fetch(0, io.block, at).await?;
            let mut d1 = Vec::new();
            self.copy_half_out(&staging, at, 0, used, &mut d1)?;
            let out = area.as_mut_slice();
            let len = self
                .recover(&staging, io.block, at, &d1, Half::Data1, out)
                .await?;
            (len, true)
        } else {
            let (r1, r2) = tokio::join!(self.fetch(0, io.block, at), self.fetch(1, io.block, at));
            match (r1, r2) {
                (Ok(u1), Ok(u2)) => {
                    let decoded = SCRATCH.with(|scratch| {
                        let mut scratch = scratch.borrow_mut();
                        let [d1, d2, _] = &mut *scratch;
                        self.copy_half_out(&staging, at, 0, u1, d1)?;
                        self.copy_half_out(&staging, at, 1, u2, d2)?;
                        Ok::<_, Status>(
                            match self
                                .codec
                                .decode_into(io.block, d1, d2, area.as_mut_slice())
                            {
                                Ok(len) => Ok(len),
                                // The half that survives, for a recovery.
                                Err(CodecError::CorruptHalf { half, .. }) => Err((
                                    half,
                                    match half {
                                        Half::Data1 => (d2.clone(), Half::Data2),
                                        Half::Data2 => (d1.clone(), Half::Data1),
                                    },
                                )),
                                Err(e) => return Err(lost(io.block, &e)),
                            },
                        )
                    })?;
                    match decoded {
                        Ok(len) => (len, false),
                        Err((half, (surviving, surviving_is))) => {
                            // One half went bad: rebuild it from the other and the parity.
                            degraded =
                                format!("{half} half of block {} failed its checksum", io.block);
                            tracing::warn!(block = io.block, "{degraded}; recovering from parity");
                            let out = area.as_mut_slice();
                            let len = self
                                .recover(&staging, io.block, at, &surviving, surviving_is, out)
                                .await?;
                            (len, true)
                        }
                    }
                }
                (Ok(u1), Err(s)) => {
                    degraded = format!("data 2: {}", describe(&s));
                    let mut d1 = Vec::new();
                    self.copy_half_out(&staging, at, 0, u1, &mut d1)?;
                    let out = area.as_mut_slice();
                    let len = self
                        .recover(&staging, io.block, at, &d1, Half::Data1, out)
                        .await?;
                    (len, true)
                }
                (Err(s), Ok(u2)) => {
                    degraded = format!("data 1: {}", describe(&s));
                    let mut d2 = Vec::new();
                    self.copy_half_out(&staging, at, 1, u2, &mut d2)?;
                    let out = area.as_mut_slice();
                    let len = self
                        .recover(&staging, io.block, at, &d2, Half::Data2, out)
                        .await?;
                    (len, true)
                }
                (Err(a), Err(b)) => {
                    let code = if a.code() == Code::NotFound {
                        Code::NotFound
                    } else {
                        Code::Unavailable
                    };
                    return Err(Status::new(
                        code,
                        format!(
                            "block {}: data 1: {}; data 2: {}",
                            io.block,
                            describe(&a),
                            describe(&b)
                        ),
                    ));
                }
            }
        };
        if len > io.length as usize {
            return Err(Status::out_of_range(format!(
                "block {} has {len} bytes, the buffer {}",
                io.block, io.length
            )));
        }
        // One RDMA write: the block, from staging into the initiator's I/O memory.
        area.set_len(len);
        initiator
            .write(&memory, io.offset, SendData::Registered(area))
            .await?;
        Ok(BlockDone {
            block: io.block,
            length: len as u32,
            compressed_length: 0,
            recovered,
            degraded,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::{encode, stored_half_size, TRAILER_LEN};
    use super::shards_used;

    /// Past the bytes `shards_used` names, every shard of a half is zeros, for blocks that
    /// compress well, not at all, and in between, of several sizes: moving only those bytes
    /// and the trailer loses nothing.
    #[test]
    fn only_the_used_bytes_of_a_shard_are_not_zero() {
        let mut x = 0x1234_5678_9abc_def1u64;
        for block_size in [512usize, 4096, 65536, 1 << 20] {
            let half = stored_half_size(block_size).unwrap();
            for noise in [0usize, 1, 4, 8] {
                let block: Vec<u8> = (0..block_size)
                    .map(|i| {
                        if i % 8 < noise {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        } else {
                            (i / 64) as u8
                        }
                    })
                    .collect();
                let encoded = encode(3, &block, block_size).unwrap();
                let used = shards_used(half, encoded.compressed_len);
                for (h, bytes) in [&encoded.data1, &encoded.data2, &encoded.parity]
                    .into_iter()
                    .enumerate()
                {
                    assert!(
                        bytes[used[h]..half - TRAILER_LEN].iter().all(|&b| b == 0),
                        "block {block_size}, noise {noise}/8, half {h}: data past {}",
                        used[h]
                    );
                }
            }
        }
    }
}
