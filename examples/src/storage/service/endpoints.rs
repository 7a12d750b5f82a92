//! The service's endpoints, as the initiator calls them: its geometry, `init_storage` (the
//! initiator's I/O memory and the staging for its transactions), start, stop and shutdown,
//! and the block writes and reads.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdma_rpc_core::transport::SendData;
use rdma_rpc_core::{Access, Code, Request, Status};

use super::super::codec::{CodecError, Half, Slot};
use super::io::lost;
use super::staging::{shards_used, Halves, SCRATCH};
use super::{describe, Service, State};
use crate::generated::storage_service::{
    BlockDone, BlockIo, InitStorage, StorageCommand, StorageControl, StorageGeometry,
    StorageService,
};
use crate::generated::storage_target::Command;

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
                self.set_state(State::Ready(Arc::new(staging)));
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
                self.set_state(State::Running(staging));
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
                self.set_state(State::Ready(staging));
                Ok(())
            }
            (StorageCommand::Stop, _) => Err(Status::failed_precondition("storage is not running")),
            (StorageCommand::Shutdown, _) => {
                let _ = self.control_targets(Command::Shutdown).await;
                self.set_state(State::ShutDown);
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
            scratch.written(self.half_size);
            let [h1, h2, hp] = &mut scratch.bytes;
            let len = self
                .codec
                .encode_into(io.block, block.as_slice(), [h1, h2, hp])
                .map_err(|e| Status::invalid_argument(format!("block {}: {e}", io.block)))?;
            let used = shards_used(self.half_size, len);
            for (h, bytes) in scratch.bytes.iter().enumerate() {
                self.copy_half_in(&staging, slot.index, h, used[h], bytes)?;
            }
            Ok::<_, Status>((len, used))
        })?;
        let (compressed_len, used) = compressed_len;
        drop(block);
        let (r1, r2, rp) = tokio::join!(
            self.store(&staging, 0, io.block, slot.index, used[0]),
            self.store(&staging, 1, io.block, slot.index, used[1]),
            self.store(&staging, 2, io.block, slot.index, used[2])
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
            let used = self.fetch(&staging, 0, io.block, at).await?;
            let mut d1 = Vec::new();
            self.copy_half_out(&staging, at, 0, used, &mut d1, &mut 0)?;
            let out = area.as_mut_slice();
            let len = self
                .recover(&staging, io.block, at, &d1, Half::Data1, out)
                .await?;
            (len, true)
        } else {
            let (r1, r2) = tokio::join!(
                self.fetch(&staging, 0, io.block, at),
                self.fetch(&staging, 1, io.block, at)
            );
            match (r1, r2) {
                (Ok(u1), Ok(u2)) => {
                    let decoded = SCRATCH.with(|scratch| {
                        let mut scratch = scratch.borrow_mut();
                        let Halves {
                            bytes: [d1, d2, _],
                            dirty: [dirty1, dirty2, _],
                        } = &mut *scratch;
                        self.copy_half_out(&staging, at, 0, u1, d1, dirty1)?;
                        self.copy_half_out(&staging, at, 1, u2, d2, dirty2)?;
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
                    self.copy_half_out(&staging, at, 0, u1, &mut d1, &mut 0)?;
                    let out = area.as_mut_slice();
                    let len = self
                        .recover(&staging, io.block, at, &d1, Half::Data1, out)
                        .await?;
                    (len, true)
                }
                (Err(s), Ok(u2)) => {
                    degraded = format!("data 1: {}", describe(&s));
                    let mut d2 = Vec::new();
                    self.copy_half_out(&staging, at, 1, u2, &mut d2, &mut 0)?;
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
        // One RDMA write: the block, from staging into the initiator's I/O memory, posted
        // ahead of this response, which tells the initiator it landed.
        area.set_len(len);
        initiator
            .write_posted(&memory, io.offset, SendData::Registered(area))
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
