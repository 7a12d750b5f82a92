//! The storage service: between the initiator and the three targets.
//!
//! A write fetches the block from the initiator's memory with one RDMA read, compresses and
//! splits it ([`super::codec`]), and has each target fetch its half from the service's memory
//! with one RDMA read. A read has the two data targets write their halves into the service's
//! memory, decodes, and writes the block into the initiator's memory with one RDMA write.
//! Every Nth read, or when a data half is missing, unreachable or corrupt, the read goes
//! through the parity target instead (a recovery read).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{
    Access, Client, Code, MemoryRegion, RegisteredBuf, RemoteBuf, RemoteMemory, Request, Status,
};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::codec::{self, CodecError, Half, Slot};
use crate::generated::storage_service::{
    BlockDone, BlockIo, InitStorage, StorageCommand, StorageControl, StorageGeometry,
    StorageService,
};
use crate::generated::storage_target::{
    Command, HalfDone, HalfIo, StorageTargetClient, TargetControl, TargetGeometry,
};

/// How the service behaves.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Every Nth read goes through the parity target (0: only when needed).
    pub recovery_every: u64,
    /// Longest wait for a target's answer to a control command.
    pub control_timeout: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            recovery_every: 0,
            control_timeout: Duration::from_secs(5),
        }
    }
}

/// One target as the service sees it.
struct Link {
    slot: Slot,
    client: Client,
    stub: StorageTargetClient,
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

/// Staging memory for the I/O in flight: one slot per transaction, each holding a block and
/// its three halves.
struct Staging {
    memory: MemoryRegion,
    slot_size: usize,
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
    links: [Link; 3],
    block_size: usize,
    half_size: usize,
    block_count: u64,
    state: Mutex<State>,
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
    /// Connects to the data 1, data 2 and parity targets and checks that they agree.
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
            let client = tokio::time::timeout(
                config.control_timeout,
                Client::builder().transport(transport.clone()).connect(addr),
            )
            .await
            .map_err(|_| Status::unavailable(format!("{slot} target at {addr}: no answer")))?
            .map_err(|e| Status::unavailable(format!("{slot} target at {addr}: {e}")))?;
            let stub = StorageTargetClient::new(client.clone());
            let g = stub.query(()).await?;
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
                client,
                stub,
                down: Default::default(),
            });
        }
        let g = geometry.expect("three targets");
        let expected = codec::stored_half_size(g.block_size as usize)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if expected != g.half_size as usize {
            return Err(Status::failed_precondition(format!(
                "halves of {} bytes do not match {}-byte blocks ({expected} expected)",
                g.half_size, g.block_size
            )));
        }
        let links: [Link; 3] = super::cluster::three(links);
        Ok(Service {
            config,
            links,
            block_size: g.block_size as usize,
            half_size: g.half_size as usize,
            block_count: g.half_count,
            state: Mutex::new(State::Created),
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
            let sent =
                tokio::time::timeout(self.config.control_timeout, link.stub.control(request))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Status::deadline_exceeded("no answer (control_timeout)"))
                    });
            if let Err(status) = sent {
                failed.push((link.slot, status));
            }
        }
        failed
    }

    /// Has target `t` fetch its half of `block` from `half` (one RDMA read by the target).
    async fn store(&self, t: usize, block: u64, half: RegisteredBuf) -> Result<(), Status> {
        let (done, _) = self.lend(t, block, half, Access::REMOTE_READ, true).await?;
        done.map(drop)
    }

    /// Has target `t` write its half of `block` into `half` (one RDMA write by the target).
    async fn fetch(
        &self,
        t: usize,
        block: u64,
        half: RegisteredBuf,
    ) -> Result<RegisteredBuf, Status> {
        let link = &self.links[t];
        let (done, half) = self
            .lend(t, block, half, Access::REMOTE_WRITE, false)
            .await?;
        let done = done?;
        if !done.stored {
            return Err(Status::not_found(format!(
                "the {} target does not hold block {block}",
                link.slot
            )));
        }
        half.ok_or_else(|| Status::unavailable(format!("the {} target went away", link.slot)))
    }

    /// Lends `half` to target `t` for one I/O request about `block` (a write when `write`).
    async fn lend(
        &self,
        t: usize,
        block: u64,
        half: RegisteredBuf,
        access: Access,
        write: bool,
    ) -> Result<(Result<HalfDone, Status>, Option<RegisteredBuf>), Status> {
        let link = &self.links[t];
        let length = self.half_size as u32;
        let io = |handle| HalfIo {
            block,
            buffer: Some(handle),
            length,
        };
        link.client
            .remote_memory()
            .lend(half, access, |handle| async move {
                if write {
                    link.stub.write_half(io(handle)).await
                } else {
                    link.stub.read_half(io(handle)).await
                }
            })
            .await
    }

    /// The three half areas of a staging slot.
    fn halves(
        &self,
        staging: &Staging,
        slot: &StagingSlot<'_>,
    ) -> Result<[RegisteredBuf; 3], Status> {
        let base = slot.index * staging.slot_size + self.block_size;
        let lease = |i: usize| {
            staging
                .memory
                .lease(base + i * self.half_size, self.half_size)
                .map_err(Status::from)
        };
        Ok([lease(0)?, lease(1)?, lease(2)?])
    }

    /// Checks an I/O request: storage running, block and length in range, a buffer named.
    #[allow(clippy::type_complexity)]
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
        let buffer = self.check_io(&io)?;
        Ok((staging, initiator, io, buffer))
    }

    fn check_io(&self, io: &BlockIo) -> Result<RemoteBuf, Status> {
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
        io.buffer
            .clone()
            .ok_or_else(|| Status::invalid_argument("the request names no buffer"))
    }

    /// Recovers `block` from the surviving data half and the parity.
    async fn recover(
        &self,
        block: u64,
        surviving: RegisteredBuf,
        surviving_is: Half,
        parity_area: RegisteredBuf,
    ) -> Result<Vec<u8>, Status> {
        let parity = self.fetch(2, block, parity_area).await.map_err(|s| {
            Status::new(
                s.code(),
                format!(
                    "block {block}: recovery needs the parity half: {}",
                    s.message()
                ),
            )
        })?;
        codec::recover(
            block,
            surviving.as_slice(),
            surviving_is,
            parity.as_slice(),
            self.block_size,
        )
        .map_err(|e| lost(block, &e))
    }
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
        let init = request.into_inner();
        if matches!(
            *self.state.lock().unwrap(),
            State::Running(_) | State::ShutDown
        ) {
            return Err(Status::failed_precondition(
                "storage is running (or shut down): stop it before init_storage",
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
        let slot_size = self.block_size + 3 * self.half_size;
        let max = (rdma_rpc_core::memory::MAX_BUFFER / slot_size) as u64;
        if transactions > max.min(4096) {
            return Err(Status::resource_exhausted(format!(
                "{transactions} transactions in flight need more staging memory than one \
                 region holds (at most {} here)",
                max.min(4096)
            )));
        }
        let n = transactions as usize;
        // Each transaction lends one half to each target at a time: register what they hold at
        // once now (over DOCA, each target connection's bounce memory), not per I/O.
        for link in &self.links {
            for access in [Access::REMOTE_READ, Access::REMOTE_WRITE] {
                link.client
                    .remote_memory()
                    .reserve(self.half_size, n, access)?;
            }
        }
        let staging = Staging {
            memory: MemoryRegion::new(n * slot_size).map_err(Status::from)?,
            slot_size,
            free: Mutex::new((0..n).collect()),
            permits: Arc::new(Semaphore::new(n)),
        };
        *self.state.lock().unwrap() = State::Ready(Arc::new(staging));
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
        let (staging, initiator, io, buffer) = self.start_io(request)?;
        let slot = staging.slot().await;
        // One RDMA read: the block, from the initiator's memory into staging.
        let area = staging
            .memory
            .lease(slot.index * staging.slot_size, io.length as usize)
            .map_err(Status::from)?;
        let block = initiator.read(&buffer, 0, area).await?;
        let encoded = codec::encode(io.block, block.as_slice(), self.block_size)
            .map_err(|e| Status::invalid_argument(format!("block {}: {e}", io.block)))?;
        drop(block);
        let mut halves = self.halves(&staging, &slot)?;
        for (area, bytes) in
            halves
                .iter_mut()
                .zip([&encoded.data1, &encoded.data2, &encoded.parity])
        {
            area.as_mut_slice().copy_from_slice(bytes);
        }
        let [h1, h2, hp] = halves;
        let (r1, r2, rp) = tokio::join!(
            self.store(0, io.block, h1),
            self.store(1, io.block, h2),
            self.store(2, io.block, hp)
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
            compressed_length: encoded.compressed_len as u32,
            recovered: false,
            degraded,
        })
    }

    async fn read_block(&self, request: Request<BlockIo>) -> Result<BlockDone, Status> {
        let (staging, initiator, io, buffer) = self.start_io(request)?;
        let slot = staging.slot().await;
        let [h1, h2, hp] = self.halves(&staging, &slot)?;
        let n = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        let planned =
            self.config.recovery_every > 0 && n.is_multiple_of(self.config.recovery_every);
        let mut degraded = String::new();
        let (block, recovered) = if planned {
            // A planned recovery read: data 1 and the parity.
            let d1 = self.fetch(0, io.block, h1).await?;
            (self.recover(io.block, d1, Half::Data1, hp).await?, true)
        } else {
            let (r1, r2) = tokio::join!(self.fetch(0, io.block, h1), self.fetch(1, io.block, h2));
            match (r1, r2) {
                (Ok(d1), Ok(d2)) => {
                    match codec::decode(io.block, d1.as_slice(), d2.as_slice(), self.block_size) {
                        Ok(block) => (block, false),
                        Err(CodecError::CorruptHalf { half, .. }) => {
                            // One half went bad: rebuild it from the other and the parity.
                            degraded =
                                format!("{half} half of block {} failed its checksum", io.block);
                            tracing::warn!(block = io.block, "{degraded}; recovering from parity");
                            let surviving = match half {
                                Half::Data1 => (d2, Half::Data2),
                                Half::Data2 => (d1, Half::Data1),
                            };
                            (
                                self.recover(io.block, surviving.0, surviving.1, hp).await?,
                                true,
                            )
                        }
                        Err(e) => return Err(lost(io.block, &e)),
                    }
                }
                (Ok(d1), Err(s)) => {
                    degraded = format!("data 2: {}", describe(&s));
                    (self.recover(io.block, d1, Half::Data1, hp).await?, true)
                }
                (Err(s), Ok(d2)) => {
                    degraded = format!("data 1: {}", describe(&s));
                    (self.recover(io.block, d2, Half::Data2, hp).await?, true)
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
        if block.len() > io.length as usize {
            return Err(Status::out_of_range(format!(
                "block {} has {} bytes, the buffer {}",
                io.block,
                block.len(),
                io.length
            )));
        }
        // One RDMA write: the block, from staging into the initiator's memory.
        let mut area = staging
            .memory
            .lease(slot.index * staging.slot_size, block.len())
            .map_err(Status::from)?;
        area.as_mut_slice().copy_from_slice(&block);
        initiator.write(&buffer, 0, area).await?;
        Ok(BlockDone {
            block: io.block,
            length: block.len() as u32,
            compressed_length: 0,
            recovered,
            degraded,
        })
    }
}
