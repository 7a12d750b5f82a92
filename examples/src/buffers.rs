//! An implementation of the doca-cpp endpoints: each path is one buffer shared by the
//! operations of that path, as in doca-cpp. A write or send stores bytes in the path's
//! buffer; a read or receive returns what the buffer holds.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use rdma_rpc_core::{RegisteredBuf, Request, Status};

use crate::generated::doca_cpp::DocaCppEndpoints;

/// The buffers of the doca-cpp endpoints, in memory.
#[derive(Debug, Default)]
pub struct PathBuffers {
    buffers: Mutex<HashMap<&'static str, Bytes>>,
}

impl PathBuffers {
    fn store(&self, path: &'static str, data: Bytes) {
        self.buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path, data);
    }

    fn load(&self, path: &'static str, buf: &mut RegisteredBuf) -> Result<(), Status> {
        let data = self
            .buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()
            .unwrap_or_default();
        buf.fill_from(&data).map_err(Status::from)
    }
}

impl DocaCppEndpoints for PathBuffers {
    async fn rdma_ep0_receive(
        &self,
        _: Request<()>,
        buf: &mut RegisteredBuf,
    ) -> Result<(), Status> {
        self.load("/rdma/ep0", buf)
    }

    async fn rdma_ep1_write(&self, _: Request<()>, data: Bytes) -> Result<(), Status> {
        self.store("/rdma/ep1", data);
        Ok(())
    }

    async fn rdma_ep0_send(&self, _: Request<()>, data: Bytes) -> Result<(), Status> {
        self.store("/rdma/ep0", data);
        Ok(())
    }

    async fn rdma_ep1_read(&self, _: Request<()>, buf: &mut RegisteredBuf) -> Result<(), Status> {
        self.load("/rdma/ep1", buf)
    }
}
