//! A `remote_buffer` field is an `Option<RemoteBuf>` that a handler uses with the remote
//! memory of its request's connection, and a client fills from an offer.
#![deny(warnings, missing_docs)]

use rdma_rpc_core::codegen::Bytes;
use rdma_rpc_core::{Access, Client, MemoryRegion, RegisteredBuf, RemoteBuf, Request, Status};

/// The storage target's spec.
pub mod target {
    rdma_rpc_macros::spec!("../specs/storage_target.yaml");
}

struct Target;

impl target::StorageTarget for Target {
    async fn query(&self, _: Request<()>) -> Result<target::TargetGeometry, Status> {
        Ok(target::TargetGeometry::default())
    }

    async fn control(&self, _: Request<target::TargetControl>) -> Result<(), Status> {
        Ok(())
    }

    async fn write_half(
        &self,
        request: Request<target::HalfIo>,
    ) -> Result<target::HalfDone, Status> {
        let memory = request.remote_memory().cloned().ok_or_else(|| Status::internal("no peer"))?;
        let io = request.into_inner();
        let source: RemoteBuf = io.buffer.ok_or_else(|| Status::invalid_argument("no buffer"))?;
        let half = RegisteredBuf::new(io.length as usize, Access::LOCAL_WRITE).map_err(Status::from)?;
        let half = memory.read(&source, 0, half).await?;
        Ok(target::HalfDone {
            block: io.block + half.len() as u64,
            stored: true,
        })
    }

    async fn read_half(
        &self,
        request: Request<target::HalfIo>,
    ) -> Result<target::HalfDone, Status> {
        let memory = request.remote_memory().cloned().ok_or_else(|| Status::internal("no peer"))?;
        let io = request.into_inner();
        let destination = io.buffer.ok_or_else(|| Status::invalid_argument("no buffer"))?;
        memory.write(&destination, 0, Bytes::from(vec![0u8; io.length as usize])).await?;
        Ok(target::HalfDone { block: io.block, stored: true })
    }
}

/// Offers a lease for one call and takes it back.
pub async fn store(client: Client, region: &MemoryRegion) -> Result<(), Status> {
    let offer = client
        .remote_memory()
        .offer(region.lease(0, 4096).map_err(Status::from)?, Access::REMOTE_READ)?;
    let io = target::HalfIo {
        block: 1,
        buffer: Some(offer.handle()),
        length: 4096,
    };
    target::StorageTargetClient::new(client).write_half(io).await?;
    offer.revoke().await;
    Ok(())
}

fn main() {
    let _ = target::StorageTargetServer::new(Target);
}
