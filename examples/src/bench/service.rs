//! The benchmark's rdma-rpc service, generated from `specs/bench.yaml`, and its
//! implementation: handlers that only account for bytes, so the figures show the framework
//! and the transport, not handler work.

use bytes::Bytes;
use rdma_rpc_core::{RegisteredBuf, Request, Status};

rdma_rpc_core::include_spec!("bench");

/// Handlers that take or produce `len` bytes without touching them.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sink;

fn produce(request: Request<Len>, buf: &mut RegisteredBuf) -> Result<Len, Status> {
    let len = request.into_inner().len;
    if len > buf.capacity() as u64 {
        return Err(Status::out_of_range(format!(
            "{len} bytes asked, the buffer holds {}",
            buf.capacity()
        )));
    }
    // The pool buffer's bytes are sent as they are: the benchmark measures moving them.
    buf.set_len(len as usize);
    Ok(Len { len })
}

impl Bench for Sink {
    async fn send_bytes(&self, _: Request<Len>, data: Bytes) -> Result<Len, Status> {
        Ok(Len {
            len: data.len() as u64,
        })
    }

    async fn receive_bytes(
        &self,
        request: Request<Len>,
        buf: &mut RegisteredBuf,
    ) -> Result<Len, Status> {
        produce(request, buf)
    }

    async fn write_bytes(&self, _: Request<Len>, data: Bytes) -> Result<Len, Status> {
        Ok(Len {
            len: data.len() as u64,
        })
    }

    async fn read_bytes(
        &self,
        request: Request<Len>,
        buf: &mut RegisteredBuf,
    ) -> Result<Len, Status> {
        produce(request, buf)
    }
}
