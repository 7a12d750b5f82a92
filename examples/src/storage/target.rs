//! A storage target: keeps one kind of half (data 1, data 2 or parity) of every block in a
//! registered memory region, and moves halves with one one-sided operation each: it reads the
//! half to store straight from the service's memory into its slot, and writes a stored half
//! straight from its slot into the service's memory. The service offers its staging memory
//! once per connection (`init`); each I/O names a place in it by offset, so no I/O offers,
//! registers or imports anything.
//!
//! A half is kept as it travels: the bytes of its shard that carry data, then its trailer,
//! from the start of the block's slot (the rest of the shard is zeros, which never move). So
//! a write lands in one RDMA read and a read leaves in one RDMA write, with no move inside
//! the slot.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rdma_rpc_core::server::ServerBuilder;
use rdma_rpc_core::{MemoryRegion, RemoteBuf, RemoteMemory, Request, Server, Status};
use tokio::sync::{watch, Notify};

use super::codec::{Slot, TRAILER_LEN};
use super::cores::PerCore;
use super::handles::ConnectionHandles;
use crate::generated::storage_target::StorageTargetServer;
use crate::generated::storage_target::{
    Command, HalfDone, HalfIo, StorageTarget, TargetControl, TargetGeometry, TargetInit,
};
use rdma_rpc_core::transport::SendData;

/// Longest a target waits for the service to answer the RDMA read or write of one half (the
/// server's `transfer_timeout`): a peer that has not answered by then loses its connection,
/// which frees the block's slot. A half moves in microseconds on RDMA; a peer that stops
/// answering must not keep blocks busy for long.
pub const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// One I/O's hold on its block: cleared when dropped.
struct Claim<'a> {
    flag: &'a AtomicBool,
    /// The busy count of the core that claimed the block.
    counted: &'a AtomicU64,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::Release);
        self.counted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Halves stored so far, and the waiters for a count ([`Target::stored`]): a write wakes
/// anyone only while someone waits, so the I/O path pays one atomic add, on its own core's
/// counter, and one load.
#[derive(Debug)]
struct Written {
    count: PerCore,
    waiters: AtomicUsize,
    changed: Notify,
}

impl Written {
    fn new(cores: usize) -> Written {
        Written {
            count: PerCore::new(cores),
            waiters: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    fn add(&self) {
        self.count.counter().fetch_add(1, Ordering::SeqCst);
        // Sequentially consistent with `reach`: either this sees its waiter, or the waiter
        // sees this count.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.changed.notify_waiters();
        }
    }

    async fn reach(self: Arc<Self>, n: u64) {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiters);
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before the count is read: a write after the read wakes it.
            changed.as_mut().enable();
            if self.count.sum(Ordering::SeqCst) >= n {
                return;
            }
            changed.await;
        }
    }
}

/// A block's entry in [`Target`]'s `stored` until its half is stored (a half carries at most
/// a shard's bytes of data, far fewer).
const NOT_STORED: u32 = u32::MAX;

/// Most service connections whose staging memory handles a target keeps.
const MAX_SERVICE_CONNECTIONS: usize = 256;

/// What a target stores.
#[derive(Debug, Clone, Copy)]
pub struct TargetConfig {
    /// Which halves it keeps.
    pub slot: Slot,
    /// The block size the halves are for.
    pub block_size: usize,
    /// Bytes of each stored half ([`super::codec::stored_half_size`] of the block size).
    pub half_size: usize,
    /// How many halves it holds.
    pub half_count: u64,
    /// Cores whose threads serve it (one listener each): the halves each one moved are
    /// counted ([`Target::halves_by_core_line`]). 1 unless set.
    pub cores: usize,
}

/// The target's state: its memory, which blocks it holds, whether it is started.
pub struct Target {
    config: TargetConfig,
    memory: MemoryRegion,
    /// Per block: [`NOT_STORED`] until stored, then the bytes of the shard that carry data
    /// (the rest up to the trailer are zeros, never moved). Read and written under the
    /// block's claim, so each I/O touches only its own block's entry.
    stored: Vec<AtomicU32>,
    /// Per block: an I/O is running on it (one at a time).
    busy: Vec<AtomicBool>,
    /// Blocks with an I/O running, counted per core.
    busy_count: PerCore,
    /// The service's staging memory, one handle per connection it came on (`init`).
    service_memory: ConnectionHandles,
    /// Halves stored so far (each write counts once).
    writes: Arc<Written>,
    started: AtomicBool,
    /// Halves moved (stored or fetched) on each core's thread, and elsewhere.
    by_core: PerCore,
    /// Set once asked to shut down.
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl TargetConfig {
    /// A target of `slot` for `half_count` blocks of `block_size` bytes.
    pub fn new(slot: Slot, block_size: usize, half_count: u64) -> Result<TargetConfig, Status> {
        let half_size = super::codec::stored_half_size(block_size)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(TargetConfig {
            slot,
            block_size,
            half_size,
            half_count,
            cores: 1,
        })
    }
}

impl Target {
    /// A stopped target with zeroed memory for `config.half_count` halves.
    pub fn new(config: TargetConfig) -> Result<Target, Status> {
        let bytes = (config.half_size as u64)
            .checked_mul(config.half_count)
            .filter(|&b| b <= rdma_rpc_core::memory::MAX_BUFFER as u64)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{} halves of {} bytes do not fit one registered region (1 GiB)",
                    config.half_count, config.half_size
                ))
            })?;
        Ok(Target {
            config,
            memory: MemoryRegion::new(bytes as usize).map_err(Status::from)?,
            stored: (0..config.half_count)
                .map(|_| AtomicU32::new(NOT_STORED))
                .collect(),
            busy: (0..config.half_count)
                .map(|_| AtomicBool::new(false))
                .collect(),
            busy_count: PerCore::new(config.cores.max(1)),
            service_memory: ConnectionHandles::new(MAX_SERVICE_CONNECTIONS, config.cores.max(1)),
            writes: Arc::new(Written::new(config.cores.max(1))),
            started: AtomicBool::new(false),
            by_core: PerCore::new(config.cores.max(1)),
            shutdown: watch::channel(false).0,
        })
    }

    /// Resolves once this target has stored `n` halves (for demos and tests that act
    /// mid-run).
    pub fn stored(&self, n: u64) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.writes.clone().reach(n)
    }

    /// The bytes of block `block`'s shard that carry data, if it is stored here.
    fn used_of(&self, block: u64) -> Option<u32> {
        let used = self.stored.get(block as usize)?.load(Ordering::Acquire);
        (used != NOT_STORED).then_some(used)
    }

    /// Halves with an I/O in flight now (their slots are leased).
    pub fn busy(&self) -> usize {
        self.busy_count.sum(Ordering::SeqCst) as usize
    }

    /// Bytes of each half it stores.
    pub fn half_size(&self) -> usize {
        self.config.half_size
    }

    /// Which halves this target keeps.
    pub fn slot(&self) -> Slot {
        self.config.slot
    }

    /// How many halves (stored or fetched) each core's thread moved, by core
    /// ([`TargetConfig::cores`]), and elsewhere.
    pub fn halves_by_core(&self) -> (Vec<u64>, u64) {
        self.by_core.get()
    }

    /// [`Target::halves_by_core`] as the binaries print it.
    pub fn halves_by_core_line(&self) -> String {
        self.by_core
            .line(&format!("{} halves moved", self.config.slot))
    }

    /// Resolves once the service asked this target to shut down.
    pub fn shut_down(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.shutdown.subscribe();
        async move {
            let _ = rx.wait_for(|down| *down).await;
        }
    }

    /// Checks an I/O request: started, block in range, of the half's size, and the service's
    /// memory known on this connection: where the half goes here, and the service's handle.
    fn io(&self, memory: &RemoteMemory, io: &HalfIo) -> Result<(usize, RemoteBuf), Status> {
        if !self.started.load(Ordering::SeqCst) {
            return Err(Status::failed_precondition(format!(
                "{} target is not started",
                self.config.slot
            )));
        }
        if io.block >= self.config.half_count {
            return Err(Status::out_of_range(format!(
                "block {} is beyond the {} blocks of this target",
                io.block, self.config.half_count
            )));
        }
        if io.length as usize != self.config.half_size {
            return Err(Status::invalid_argument(format!(
                "halves here are {} bytes, the request says {}",
                self.config.half_size, io.length
            )));
        }
        let handle = self.service_memory.of(memory, "call init first")?;
        self.by_core.count();
        Ok((io.block as usize * self.config.half_size, handle))
    }

    fn lease(&self, at: usize) -> Result<rdma_rpc_core::RegisteredBuf, Status> {
        self.memory
            .lease(at, self.config.half_size)
            .map_err(|e| Status::aborted(format!("block busy with another I/O: {e}")))
    }

    /// Claims block `block` for one I/O until the guard drops; `ABORTED` if another holds it.
    fn claim(&self, block: u64) -> Result<Claim<'_>, Status> {
        let flag = &self.busy[block as usize];
        if flag.swap(true, Ordering::AcqRel) {
            return Err(Status::aborted(format!(
                "block {block} busy with another I/O"
            )));
        }
        let counted = self.busy_count.counter();
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(Claim { flag, counted })
    }

    /// The bytes of the shard a write says carry data, checked against the half's size.
    fn used(&self, io: &HalfIo) -> Result<usize, Status> {
        let room = self.config.half_size - TRAILER_LEN;
        if io.used as usize > room {
            return Err(Status::invalid_argument(format!(
                "a shard here holds at most {room} bytes, the request says {} carry data",
                io.used
            )));
        }
        Ok(io.used as usize)
    }
}

fn remote<T>(request: &Request<T>) -> Result<RemoteMemory, Status> {
    request
        .remote_memory()
        .cloned()
        .ok_or_else(|| Status::internal("a request without a connection"))
}

impl StorageTarget for Arc<Target> {
    async fn query(&self, _: Request<()>) -> Result<TargetGeometry, Status> {
        Ok(TargetGeometry {
            block_size: self.config.block_size as u32,
            half_size: self.config.half_size as u32,
            half_count: self.config.half_count,
            slot: self.config.slot.to_string(),
        })
    }

    async fn init(&self, request: Request<TargetInit>) -> Result<(), Status> {
        let memory = remote(&request)?;
        let handle = request
            .into_inner()
            .memory
            .ok_or_else(|| Status::invalid_argument("init names no memory"))?;
        self.service_memory.remember(&memory, handle)
    }

    async fn control(&self, request: Request<TargetControl>) -> Result<(), Status> {
        match request.get_ref().command() {
            Command::Start => self.started.store(true, Ordering::SeqCst),
            Command::Stop => self.started.store(false, Ordering::SeqCst),
            Command::Shutdown => {
                self.started.store(false, Ordering::SeqCst);
                self.shutdown.send_replace(true);
            }
        }
        Ok(())
    }

    async fn write_half(&self, request: Request<HalfIo>) -> Result<HalfDone, Status> {
        let memory = remote(&request)?;
        let io = request.into_inner();
        let (at, source) = self.io(&memory, &io)?;
        let used = self.used(&io)?;
        let _claim = self.claim(io.block)?;
        // One RDMA read from the service's memory straight into this block's slot: the
        // shard's data and, right after it, the trailer, kept as the service stages them.
        let dst = self
            .memory
            .lease(at, used + TRAILER_LEN)
            .map_err(Status::from)?;
        drop(memory.read(&source, io.offset, dst).await?);
        // Under the block's claim: no other I/O of this block reads or writes it meanwhile.
        self.stored[io.block as usize].store(used as u32, Ordering::Release);
        self.writes.add();
        Ok(HalfDone {
            block: io.block,
            stored: true,
            used: used as u32,
        })
    }

    async fn read_half(&self, request: Request<HalfIo>) -> Result<HalfDone, Status> {
        let memory = remote(&request)?;
        let io = request.into_inner();
        let (at, destination) = self.io(&memory, &io)?;
        let _claim = self.claim(io.block)?;
        let Some(used) = self.used_of(io.block) else {
            return Ok(HalfDone {
                block: io.block,
                stored: false,
                used: 0,
            });
        };
        // The data and the trailer right after it, as stored: one RDMA write straight into
        // the service's memory, posted ahead of this response (which tells the service the
        // bytes landed: no round trip of its own).
        let n = used as usize;
        let src = self
            .memory
            .lease(at, n + TRAILER_LEN)
            .map_err(Status::from)?;
        memory
            .write_posted(&destination, io.offset, SendData::Registered(src))
            .await?;
        Ok(HalfDone {
            block: io.block,
            stored: true,
            used,
        })
    }
}

/// A server of `target` as every storage process runs it: the receives the storage connections
/// post ([`super::RECEIVES`]), [`IO_TIMEOUT`] for its one-sided operations, and calls taken
/// only from the service that presents `secret`.
pub fn server(target: &Arc<Target>, secret: &super::auth::Secret) -> ServerBuilder {
    Server::builder()
        .initial_receives(super::RECEIVES)
        .recv_credits(super::RECEIVES)
        .transfer_timeout(IO_TIMEOUT)
        .interceptor(secret.require("their storage service"))
        .add_service(StorageTargetServer::new(target.clone()))
}

/// Test and demo hook: flips one bit of a stored half, as a failing disk would. `byte` counts
/// in the half as the codec lays it out (the shard, then the trailer at the end); a byte of
/// the shard past its data is a zero that is never stored, and cannot go bad.
pub fn corrupt(target: &Target, block: u64, byte: usize) -> Result<(), Status> {
    let at = block as usize * target.config.half_size;
    let trailer = target.config.half_size - TRAILER_LEN;
    let used = target
        .used_of(block)
        .ok_or_else(|| Status::not_found(format!("block {block} is not stored here")))?
        as usize;
    let stored_at = match byte {
        b if b < used => b,
        b if b < trailer => {
            return Err(Status::invalid_argument(format!(
                "byte {b} of block {block}'s half is past its {used} bytes of data: a zero \
                 that is never stored"
            )))
        }
        b if b < target.config.half_size => used + (b - trailer),
        b => return Err(Status::out_of_range(format!("byte {b} is beyond the half"))),
    };
    let mut slot = target.lease(at)?;
    slot.as_mut_slice()[stored_at] ^= 0x10;
    Ok(())
}
