//! A `remote_buffer` field is an `Option<RemoteBuf>` that a handler uses with the remote
//! memory of its request's connection, and a client fills from an offer.
#![deny(warnings, missing_docs)]

use std::sync::Mutex;

use rdma_rpc_core::Bytes;
use rdma_rpc_core::{
    Access, Client, MemoryRegion, RegisteredBuf, RemoteBuf, RemoteMemory, Request, Status,
};

/// The storage target's spec.
pub mod target {
    rdma_rpc_core::spec!("../specs/storage_target.yaml");
}

#[derive(Default)]
struct Target {
    /// The service's memory, offered once (`init`).
    memory: Mutex<Option<RemoteBuf>>,
}

impl Target {
    fn handle(&self) -> Result<RemoteBuf, Status> {
        self.memory
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| Status::failed_precondition("call init first"))
    }
}

impl target::StorageTarget for Target {
    async fn init(&self, request: Request<target::TargetInit>) -> Result<(), Status> {
        let memory: Option<RemoteBuf> = request.into_inner().memory;
        *self.memory.lock().unwrap() = memory;
        Ok(())
    }

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
        let (memory, io) = peer_io(request)?;
        let source = self.handle()?;
        let half =
            RegisteredBuf::new(io.used as usize, Access::LOCAL_WRITE).map_err(Status::from)?;
        let half = memory.read(&source, io.offset, half).await?;
        Ok(target::HalfDone {
            block: io.block,
            stored: true,
            used: half.len() as u32,
        })
    }

    async fn read_half(
        &self,
        request: Request<target::HalfIo>,
    ) -> Result<target::HalfDone, Status> {
        let (memory, io) = peer_io(request)?;
        let destination = self.handle()?;
        memory
            .write(
                &destination,
                io.offset,
                Bytes::from(vec![0u8; io.length as usize]),
            )
            .await?;
        Ok(target::HalfDone {
            block: io.block,
            stored: true,
            used: 0,
        })
    }
}

/// The calling peer's memory and the half a request names.
fn peer_io(request: Request<target::HalfIo>) -> Result<(RemoteMemory, target::HalfIo), Status> {
    let memory = request
        .remote_memory()
        .cloned()
        .ok_or_else(|| Status::internal("no peer"))?;
    Ok((memory, request.into_inner()))
}

/// Offers a region once, then names parts of it by offset.
pub async fn store(client: Client, region: &MemoryRegion) -> Result<(), Status> {
    let offer = client.remote_memory().offer(
        region.lease(0, 4096).map_err(Status::from)?,
        Access::REMOTE_READ,
    )?;
    let stub = target::StorageTargetClient::new(client);
    stub.init(target::TargetInit {
        memory: Some(offer.handle()),
    })
    .await?;
    let io = target::HalfIo {
        block: 1,
        offset: 0,
        length: 4096,
        used: 4064,
    };
    stub.write_half(io).await?;
    offer.revoke().await;
    Ok(())
}

#[test]
fn remote_buffer_endpoints_compile() {
    let _ = Target::default();
    let _ = target::StorageTargetServer::new(Target::default());
}
