//! The doca-cpp example spec (`specs/doca_cpp_endpoints.yaml`) as a service written by hand,
//! on the public API that generated code calls: the endpoint table ([`EndpointDef`]), a
//! [`Service`] whose `call` uses [`typed::server`], and a client over [`Client`] whose
//! methods use [`typed::client`]. Nothing here is generated and nothing is hidden API; a
//! service that has no spec is written the same way. The examples themselves use the
//! generated [`crate::generated::doca_cpp`], which has the same table and the same methods
//! (its server trait in `doca_cpp_endpoints_server`, its client in
//! `doca_cpp_endpoints_client`).
//!
//! The endpoints have no messages (`()` each way), only payloads: `send` and `write` take
//! bytes, `receive` and `read` return the bytes the handler put in its buffer.
//!
//! [`typed::server`]: rdma_rpc_core::typed::server
//! [`typed::client`]: rdma_rpc_core::typed::client

use std::future::Future;
use std::sync::Arc;

use rdma_rpc_core::transport::BoxFuture;
use rdma_rpc_core::typed::{client, server};
use rdma_rpc_core::{
    Bytes, Client, EndpointDef, IntoRequest, OpKind, RegisteredBuf, Request, ServerCall, Service,
    Status, StreamKind,
};

/// The endpoints of `DocaCppEndpoints`, in spec order: entry `i` is what
/// [`DocaCppEndpointsServer`] runs for index `i`.
pub const DOCA_CPP_ENDPOINTS_ENDPOINTS: &[EndpointDef] = &[
    EndpointDef {
        path: "/rdma/ep0",
        op: OpKind::Receive,
        buffer_size: 4096,
        method: "rdma_ep0_receive",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
    EndpointDef {
        path: "/rdma/ep1",
        op: OpKind::Write,
        buffer_size: 4194304,
        method: "rdma_ep1_write",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
    EndpointDef {
        path: "/rdma/ep0",
        op: OpKind::Send,
        buffer_size: 4096,
        method: "rdma_ep0_send",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
    EndpointDef {
        path: "/rdma/ep1",
        op: OpKind::Read,
        buffer_size: 4194304,
        method: "rdma_ep1_read",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
];

/// The server side of `DocaCppEndpoints`: implement it with `async fn`s and serve it with
/// [`DocaCppEndpointsServer`].
pub trait DocaCppEndpoints: Send + Sync + 'static {
    /// `receive /rdma/ep0` (buffer 4096 bytes): fill `buf` with the message for the client.
    fn rdma_ep0_receive(
        &self,
        request: Request<()>,
        buf: &mut RegisteredBuf,
    ) -> impl Future<Output = Result<(), Status>> + Send;

    /// `write /rdma/ep1` (buffer 4194304 bytes): the bytes the client moved.
    fn rdma_ep1_write(
        &self,
        request: Request<()>,
        data: Bytes,
    ) -> impl Future<Output = Result<(), Status>> + Send;

    /// `send /rdma/ep0` (buffer 4096 bytes): the message the client sent.
    fn rdma_ep0_send(
        &self,
        request: Request<()>,
        data: Bytes,
    ) -> impl Future<Output = Result<(), Status>> + Send;

    /// `read /rdma/ep1` (buffer 4194304 bytes): fill `buf` with the bytes the client gets.
    fn rdma_ep1_read(
        &self,
        request: Request<()>,
        buf: &mut RegisteredBuf,
    ) -> impl Future<Output = Result<(), Status>> + Send;
}

/// Serves a [`DocaCppEndpoints`] implementation: pass it to `Server::builder().add_service(..)`.
#[derive(Debug)]
pub struct DocaCppEndpointsServer<T> {
    inner: Arc<T>,
}

impl<T: DocaCppEndpoints> DocaCppEndpointsServer<T> {
    /// Wraps an implementation.
    pub fn new(inner: T) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Wraps a shared implementation.
    pub fn from_arc(inner: Arc<T>) -> Self {
        Self { inner }
    }
}

impl<T: DocaCppEndpoints> Service for DocaCppEndpointsServer<T> {
    fn name(&self) -> &'static str {
        "DocaCppEndpoints"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        DOCA_CPP_ENDPOINTS_ENDPOINTS
    }

    fn call<'a>(
        &'a self,
        index: usize,
        call: ServerCall<'a>,
    ) -> BoxFuture<'a, Result<Bytes, Status>> {
        // The runtime checks each call against the table, so `index` and the kind of call
        // always match one arm; any other pair is a bug, answered by `mismatched_call`.
        match (index, call) {
            (0, ServerCall::Outbound { request, buf }) => Box::pin(async move {
                let request = server::decode_request::<()>(request)?;
                self.inner.rdma_ep0_receive(request, buf).await?;
                Ok(server::encode_message(&()))
            }),
            (1, ServerCall::Inbound { request, data }) => Box::pin(async move {
                let request = server::decode_request::<()>(request)?;
                self.inner.rdma_ep1_write(request, data).await?;
                Ok(server::encode_message(&()))
            }),
            (2, ServerCall::Inbound { request, data }) => Box::pin(async move {
                let request = server::decode_request::<()>(request)?;
                self.inner.rdma_ep0_send(request, data).await?;
                Ok(server::encode_message(&()))
            }),
            (3, ServerCall::Outbound { request, buf }) => Box::pin(async move {
                let request = server::decode_request::<()>(request)?;
                self.inner.rdma_ep1_read(request, buf).await?;
                Ok(server::encode_message(&()))
            }),
            (index, call) => server::mismatched_call("DocaCppEndpoints", index, call),
        }
    }
}

/// Client of `DocaCppEndpoints`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DocaCppEndpointsClient {
    inner: Client,
}

impl DocaCppEndpointsClient {
    /// Connects to `addr` (e.g. `tcp://127.0.0.1:7470`).
    pub async fn connect(addr: &str) -> rdma_rpc_core::Result<Self> {
        Ok(Self::new(Client::connect(addr).await?))
    }

    /// Uses an existing connection.
    pub fn new(inner: Client) -> Self {
        Self { inner }
    }

    /// The underlying client.
    pub fn inner(&self) -> &Client {
        &self.inner
    }

    /// `receive /rdma/ep0` (buffer 4096 bytes): the bytes the server's handler sends back.
    pub async fn rdma_ep0_receive(
        &self,
        request: impl IntoRequest<()>,
    ) -> Result<((), Bytes), Status> {
        client::call_outbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[0],
            request.into_request(),
        )
        .await
    }

    /// `write /rdma/ep1` (buffer 4194304 bytes): moves `data` to the server's handler.
    pub async fn rdma_ep1_write(
        &self,
        request: impl IntoRequest<()>,
        data: impl Into<Bytes>,
    ) -> Result<(), Status> {
        client::call_inbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[1],
            request.into_request(),
            data.into(),
        )
        .await
    }

    /// `send /rdma/ep0` (buffer 4096 bytes): sends `data` as a message.
    pub async fn rdma_ep0_send(
        &self,
        request: impl IntoRequest<()>,
        data: impl Into<Bytes>,
    ) -> Result<(), Status> {
        client::call_inbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[2],
            request.into_request(),
            data.into(),
        )
        .await
    }

    /// `read /rdma/ep1` (buffer 4194304 bytes): the bytes the server's handler put in its
    /// buffer.
    pub async fn rdma_ep1_read(
        &self,
        request: impl IntoRequest<()>,
    ) -> Result<((), Bytes), Status> {
        client::call_outbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[3],
            request.into_request(),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn the_hand_written_table_is_the_generated_one() {
        assert_eq!(
            DOCA_CPP_ENDPOINTS_ENDPOINTS,
            crate::generated::doca_cpp::DOCA_CPP_ENDPOINTS_ENDPOINTS
        );
    }

    /// Keeps what was sent and written; sends and reads it back.
    #[derive(Default)]
    struct Echo {
        sent: Mutex<Bytes>,
        written: Mutex<Bytes>,
    }

    impl DocaCppEndpoints for Echo {
        async fn rdma_ep0_receive(
            &self,
            _: Request<()>,
            buf: &mut RegisteredBuf,
        ) -> Result<(), Status> {
            let sent = self.sent.lock().unwrap().clone();
            buf.fill_from(&sent).map_err(Status::from)
        }

        async fn rdma_ep1_write(&self, _: Request<()>, data: Bytes) -> Result<(), Status> {
            *self.written.lock().unwrap() = Bytes::copy_from_slice(&data);
            Ok(())
        }

        async fn rdma_ep0_send(&self, _: Request<()>, data: Bytes) -> Result<(), Status> {
            *self.sent.lock().unwrap() = Bytes::copy_from_slice(&data);
            Ok(())
        }

        async fn rdma_ep1_read(
            &self,
            _: Request<()>,
            buf: &mut RegisteredBuf,
        ) -> Result<(), Status> {
            let written = self.written.lock().unwrap().clone();
            buf.fill_from(&written).map_err(Status::from)
        }
    }

    /// The hand-written server and client talk to each other, and to the generated ones,
    /// on every operation: small payloads inline and a large one by RDMA.
    #[tokio::test]
    async fn hand_written_and_generated_interoperate() {
        use crate::generated::doca_cpp::DocaCppEndpointsClient as Generated;

        let server = rdma_rpc_core::Server::builder()
            .add_service(DocaCppEndpointsServer::new(Echo::default()))
            .bind("mem://")
            .await
            .unwrap();
        let addr = server.local_addr();
        tokio::spawn(server.serve());

        let client = DocaCppEndpointsClient::connect(&addr).await.unwrap();
        client.rdma_ep0_send((), &b"ping"[..]).await.unwrap();
        let ((), got) = client.rdma_ep0_receive(()).await.unwrap();
        assert_eq!(&got[..], b"ping");
        let block = Bytes::from((0..1 << 20).map(|i| i as u8).collect::<Vec<u8>>());
        client.rdma_ep1_write((), block.clone()).await.unwrap();
        let ((), got) = client.rdma_ep1_read(()).await.unwrap();
        assert_eq!(got, block);

        let generated = Generated::new(client.inner().clone());
        let ((), got) = generated.rdma_ep1_read(()).await.unwrap();
        assert_eq!(got, block);
    }
}
