//! A spec whose messages are named like the runtime's types (`Status`, `ClientStats`,
//! `Request`, `Client`, `Bytes`, `Streaming`, `Chunks`) compiles without warnings next to the
//! runtime's own names: generated code names the runtime by absolute paths and the spec's
//! types through `super::`, so neither hides the other. Included privately, as a build
//! script's output (the golden file of `rdma-rpc-codegen/tests/specs/shadowing.yaml`).
#![deny(warnings, missing_docs)]

use std::pin::Pin;
use std::task::{Context, Poll};

use rdma_rpc_core::{Bytes, Chunks, ClientStats, RegisteredBuf, Request, Status, Stream};

// Generated items are `pub` by design (as prost's): included privately, the workspace's
// `unreachable_pub` (allowed by default in Rust) would name each.
#[allow(unreachable_pub)]
mod monitor {
    include!("../../../rdma-rpc-codegen/tests/golden/shadowing.rs");
}

use monitor::monitor_client::MonitorClient;
use monitor::monitor_server::{Monitor, MonitorServer};

/// The spec's `Status` with the runtime's `Status` in scope.
fn up() -> monitor::Status {
    let mut status = monitor::Status {
        code: 0,
        message: "up".into(),
    };
    status.set_code(monitor::Code::Ok);
    status
}

/// One event, then the end.
struct Events(Option<monitor::Streaming>);

impl Stream for Events {
    type Item = Result<monitor::Streaming, Status>;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.0.take().map(Ok))
    }
}

struct Mon;

impl Monitor for Mon {
    async fn status(&self, request: Request<monitor::Request>) -> Result<monitor::Status, Status> {
        match request.into_inner().client {
            Some(monitor::Client { id }) if id.is_empty() => Err(Status::invalid_argument("no id")),
            _ => Ok(up()),
        }
    }

    async fn report(
        &self,
        request: Request<monitor::ClientStats>,
        data: Bytes,
    ) -> Result<monitor::Status, Status> {
        let stats: monitor::ClientStats = request.into_inner();
        let _ = (stats.calls, stats.last, data.len());
        Ok(up())
    }

    async fn put(
        &self,
        request: Request<monitor::Bytes>,
        data: Bytes,
    ) -> Result<monitor::Status, Status> {
        if request.get_ref().len != data.len() as u64 {
            return Err(Status::data_loss("short"));
        }
        Ok(up())
    }

    async fn get(
        &self,
        _: Request<monitor::Request>,
        buf: &mut RegisteredBuf,
    ) -> Result<monitor::Bytes, Status> {
        buf.fill_from(b"blob").map_err(Status::from)?;
        Ok(monitor::Bytes { len: 4 })
    }

    type WatchStream = Events;

    async fn watch(&self, _: Request<monitor::Request>) -> Result<Events, Status> {
        Ok(Events(Some(monitor::Streaming { status: Some(up()) })))
    }

    async fn upload(
        &self,
        request: Request<monitor::Chunks>,
        mut chunks: Chunks,
    ) -> Result<monitor::Status, Status> {
        let mut got = 0;
        while let Some(chunk) = chunks.chunk().await? {
            got += 1;
            drop(chunk);
        }
        if got != request.get_ref().count {
            return Err(Status::data_loss("chunks missing"));
        }
        Ok(up())
    }
}

async fn calls(client: &MonitorClient) -> Result<u64, Status> {
    let status: monitor::Status = client.status(monitor::Request::default()).await?;
    let (len, bytes): (monitor::Bytes, Bytes) = client.get(monitor::Request::default()).await?;
    let mut events = client.watch(monitor::Request::default()).await?;
    while let Some(event) = events.message().await? {
        let _: Option<monitor::Status> = event.status;
    }
    client
        .report(monitor::ClientStats::default(), Bytes::new())
        .await?;
    client.put(monitor::Bytes { len: 1 }, vec![1]).await?;
    client
        .upload(monitor::Chunks { count: 1 }, vec![0u8; 16])
        .await?;
    Ok(status.code as u64 + len.len + bytes.len() as u64)
}

#[test]
fn spec_names_never_hide_the_runtimes() {
    // The runtime's `ClientStats` is a client's counters, the spec's a message.
    fn runtime_stats(_: Option<ClientStats>) {}
    runtime_stats(None);
    let server = MonitorServer::new(Mon);
    let _ = (server, calls);
    assert_eq!(monitor::MONITOR_ENDPOINTS.len(), 6);
}
