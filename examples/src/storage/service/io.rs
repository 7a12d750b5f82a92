//! The pieces of the I/O path the endpoints combine: checking a request, having a target
//! store or fetch its half of a staging slot (over the lane whose staging the slot is in), and
//! recovering a block from the surviving data half and the parity.

use std::sync::Arc;

use rdma_rpc_core::{RemoteBuf, RemoteMemory, Request, Status};

use super::super::codec::{CodecError, Half, TRAILER_LEN};
use super::staging::Staging;
use super::{Lane, Service};
use crate::generated::storage_service::BlockIo;
use crate::generated::storage_target::{HalfDone, HalfIo};

impl Service {
    /// Lane `lane` of target `t`: the connection that was offered that lane's staging.
    fn lane(&self, t: usize, lane: usize) -> &Lane {
        &self.links[t].lanes[lane]
    }

    /// Has target `t` fetch its half of `block` from the staging slot (its first `used` bytes
    /// and the trailer staged after them, by one RDMA read of the target).
    pub(super) async fn store(
        &self,
        staging: &Staging,
        t: usize,
        block: u64,
        slot: usize,
        used: usize,
    ) -> Result<(), Status> {
        let io = HalfIo {
            block,
            offset: self.half_offset(slot, t) as u64,
            length: self.half_size as u32,
            used: used as u32,
        };
        self.lane(t, staging.lane)
            .stub
            .write_half(io)
            .await
            .map(drop)
    }

    /// Has target `t` write its half of `block` into the staging slot (its data and trailer,
    /// by one RDMA write of the target): the bytes of the shard that carry data.
    pub(super) async fn fetch(
        &self,
        staging: &Staging,
        t: usize,
        block: u64,
        slot: usize,
    ) -> Result<usize, Status> {
        let io = HalfIo {
            block,
            offset: self.half_offset(slot, t) as u64,
            length: self.half_size as u32,
            used: 0,
        };
        let done: HalfDone = self.lane(t, staging.lane).stub.read_half(io).await?;
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

    /// Checks an I/O request: storage running, block and length in range, the connection's
    /// I/O memory known.
    pub(super) fn start_io(
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
        self.by_core.count();
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
    pub(super) async fn recover(
        &self,
        staging: &Staging,
        block: u64,
        slot: usize,
        surviving: &[u8],
        surviving_is: Half,
        out: &mut [u8],
    ) -> Result<usize, Status> {
        let used = self.fetch(staging, 2, block, slot).await.map_err(|s| {
            Status::new(
                s.code(),
                format!(
                    "block {block}: recovery needs the parity half: {}",
                    s.message()
                ),
            )
        })?;
        let mut parity = Vec::new();
        self.copy_half_out(staging, slot, 2, used, &mut parity, &mut 0)?;
        self.codec
            .recover_into(block, surviving, surviving_is, &parity, out)
            .map_err(|e| lost(block, &e))
    }
}

/// A block that cannot be read back correctly.
pub(super) fn lost(block: u64, e: &CodecError) -> Status {
    Status::data_loss(format!("block {block} cannot be read back: {e}"))
}
