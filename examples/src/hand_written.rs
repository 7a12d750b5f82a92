//! The doca-cpp example spec (`specs/doca_cpp_endpoints.yaml`) as a service, written by hand
//! the way `rdma-rpc-codegen` writes it: a readable reference of what generated code looks
//! like and what it asks of the runtime (the examples themselves use the generated
//! [`crate::generated::doca_cpp`]). It refers to the runtime only through
//! `::rdma_rpc_core::codegen`, so it works from any module. A [`Service`] can always be
//! written by hand like this, without a spec.
//!
//! [`Service`]: rdma_rpc_core::Service

/// The endpoints of `DocaCppEndpoints`: path, operation, buffer size.
pub const DOCA_CPP_ENDPOINTS_ENDPOINTS: &[::rdma_rpc_core::codegen::EndpointDef] = &[
    ::rdma_rpc_core::codegen::EndpointDef {
        path: "/rdma/ep0",
        op: ::rdma_rpc_core::codegen::OpKind::Receive,
        buffer_size: 4096,
        method: "rdma_ep0_receive",
        timeout_ms: None,
        stream: rdma_rpc_core::StreamKind::Unary,
    },
    ::rdma_rpc_core::codegen::EndpointDef {
        path: "/rdma/ep1",
        op: ::rdma_rpc_core::codegen::OpKind::Write,
        buffer_size: 4194304,
        method: "rdma_ep1_write",
        timeout_ms: None,
        stream: rdma_rpc_core::StreamKind::Unary,
    },
    ::rdma_rpc_core::codegen::EndpointDef {
        path: "/rdma/ep0",
        op: ::rdma_rpc_core::codegen::OpKind::Send,
        buffer_size: 4096,
        method: "rdma_ep0_send",
        timeout_ms: None,
        stream: rdma_rpc_core::StreamKind::Unary,
    },
    ::rdma_rpc_core::codegen::EndpointDef {
        path: "/rdma/ep1",
        op: ::rdma_rpc_core::codegen::OpKind::Read,
        buffer_size: 4194304,
        method: "rdma_ep1_read",
        timeout_ms: None,
        stream: rdma_rpc_core::StreamKind::Unary,
    },
];

/// The server side of `DocaCppEndpoints`: implement it with `async fn`s.
pub trait DocaCppEndpoints: ::core::marker::Send + ::core::marker::Sync + 'static {
    /// `receive /rdma/ep0` (buffer 4096 bytes): fill `buf` with the message for the client.
    fn rdma_ep0_receive(
        &self,
        request: ::rdma_rpc_core::codegen::Request<()>,
        buf: &mut ::rdma_rpc_core::codegen::RegisteredBuf,
    ) -> impl ::core::future::Future<
        Output = ::core::result::Result<(), ::rdma_rpc_core::codegen::Status>,
    > + ::core::marker::Send;

    /// `write /rdma/ep1` (buffer 4194304 bytes): the bytes the client wrote.
    fn rdma_ep1_write(
        &self,
        request: ::rdma_rpc_core::codegen::Request<()>,
        data: ::rdma_rpc_core::codegen::Bytes,
    ) -> impl ::core::future::Future<
        Output = ::core::result::Result<(), ::rdma_rpc_core::codegen::Status>,
    > + ::core::marker::Send;

    /// `send /rdma/ep0` (buffer 4096 bytes): the message the client sent.
    fn rdma_ep0_send(
        &self,
        request: ::rdma_rpc_core::codegen::Request<()>,
        data: ::rdma_rpc_core::codegen::Bytes,
    ) -> impl ::core::future::Future<
        Output = ::core::result::Result<(), ::rdma_rpc_core::codegen::Status>,
    > + ::core::marker::Send;

    /// `read /rdma/ep1` (buffer 4194304 bytes): fill `buf` with the bytes the client reads.
    fn rdma_ep1_read(
        &self,
        request: ::rdma_rpc_core::codegen::Request<()>,
        buf: &mut ::rdma_rpc_core::codegen::RegisteredBuf,
    ) -> impl ::core::future::Future<
        Output = ::core::result::Result<(), ::rdma_rpc_core::codegen::Status>,
    > + ::core::marker::Send;
}

/// Serves a [`DocaCppEndpoints`] implementation: pass it to `Server::builder().add_service(..)`.
#[derive(Debug)]
pub struct DocaCppEndpointsServer<T> {
    inner: ::std::sync::Arc<T>,
}

impl<T: DocaCppEndpoints> DocaCppEndpointsServer<T> {
    /// Wraps an implementation.
    pub fn new(inner: T) -> Self {
        Self {
            inner: ::std::sync::Arc::new(inner),
        }
    }

    /// Wraps a shared implementation.
    pub fn from_arc(inner: ::std::sync::Arc<T>) -> Self {
        Self { inner }
    }
}

impl<T: DocaCppEndpoints> ::rdma_rpc_core::codegen::Service for DocaCppEndpointsServer<T> {
    fn name(&self) -> &'static str {
        "DocaCppEndpoints"
    }

    fn endpoints(&self) -> &'static [::rdma_rpc_core::codegen::EndpointDef] {
        DOCA_CPP_ENDPOINTS_ENDPOINTS
    }

    fn call<'a>(
        &'a self,
        index: usize,
        call: ::rdma_rpc_core::codegen::ServerCall<'a>,
    ) -> ::rdma_rpc_core::codegen::BoxFuture<
        'a,
        ::core::result::Result<::rdma_rpc_core::codegen::Bytes, ::rdma_rpc_core::codegen::Status>,
    > {
        match (index, call) {
            (0usize, ::rdma_rpc_core::codegen::ServerCall::Outbound { request, buf }) => {
                ::std::boxed::Box::pin(async move {
                    let request = ::rdma_rpc_core::codegen::decode_request::<()>(request)?;
                    Ok(::rdma_rpc_core::codegen::encode_message(
                        &self.inner.rdma_ep0_receive(request, buf).await?,
                    ))
                })
            }
            (1usize, ::rdma_rpc_core::codegen::ServerCall::Inbound { request, data }) => {
                ::std::boxed::Box::pin(async move {
                    let request = ::rdma_rpc_core::codegen::decode_request::<()>(request)?;
                    Ok(::rdma_rpc_core::codegen::encode_message(
                        &self.inner.rdma_ep1_write(request, data).await?,
                    ))
                })
            }
            (2usize, ::rdma_rpc_core::codegen::ServerCall::Inbound { request, data }) => {
                ::std::boxed::Box::pin(async move {
                    let request = ::rdma_rpc_core::codegen::decode_request::<()>(request)?;
                    Ok(::rdma_rpc_core::codegen::encode_message(
                        &self.inner.rdma_ep0_send(request, data).await?,
                    ))
                })
            }
            (3usize, ::rdma_rpc_core::codegen::ServerCall::Outbound { request, buf }) => {
                ::std::boxed::Box::pin(async move {
                    let request = ::rdma_rpc_core::codegen::decode_request::<()>(request)?;
                    Ok(::rdma_rpc_core::codegen::encode_message(
                        &self.inner.rdma_ep1_read(request, buf).await?,
                    ))
                })
            }
            (index, call) => {
                ::rdma_rpc_core::codegen::mismatched_call("DocaCppEndpoints", index, call)
            }
        }
    }
}

/// Client of `DocaCppEndpoints`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DocaCppEndpointsClient {
    inner: ::rdma_rpc_core::codegen::Client,
}

impl DocaCppEndpointsClient {
    /// Connects to `addr` (e.g. `tcp://127.0.0.1:7470`).
    pub async fn connect(
        addr: &str,
    ) -> ::core::result::Result<Self, ::rdma_rpc_core::codegen::Error> {
        Ok(Self::new(
            ::rdma_rpc_core::codegen::Client::connect(addr).await?,
        ))
    }

    /// Uses an existing connection.
    pub fn new(inner: ::rdma_rpc_core::codegen::Client) -> Self {
        Self { inner }
    }

    /// The underlying client.
    pub fn inner(&self) -> &::rdma_rpc_core::codegen::Client {
        &self.inner
    }

    /// `receive /rdma/ep0` (buffer 4096 bytes): the message the server sends back.
    pub async fn rdma_ep0_receive(
        &self,
        request: impl ::rdma_rpc_core::codegen::IntoRequest<()>,
    ) -> ::core::result::Result<
        ((), ::rdma_rpc_core::codegen::Bytes),
        ::rdma_rpc_core::codegen::Status,
    > {
        ::rdma_rpc_core::codegen::call_outbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[0usize],
            ::rdma_rpc_core::codegen::IntoRequest::into_request(request),
        )
        .await
    }

    /// `write /rdma/ep1` (buffer 4194304 bytes): RDMA-writes `data` into the server buffer.
    pub async fn rdma_ep1_write(
        &self,
        request: impl ::rdma_rpc_core::codegen::IntoRequest<()>,
        data: impl ::core::convert::Into<::rdma_rpc_core::codegen::Bytes>,
    ) -> ::core::result::Result<(), ::rdma_rpc_core::codegen::Status> {
        ::rdma_rpc_core::codegen::call_inbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[1usize],
            ::rdma_rpc_core::codegen::IntoRequest::into_request(request),
            data.into(),
        )
        .await
    }

    /// `send /rdma/ep0` (buffer 4096 bytes): sends `data` as a message.
    pub async fn rdma_ep0_send(
        &self,
        request: impl ::rdma_rpc_core::codegen::IntoRequest<()>,
        data: impl ::core::convert::Into<::rdma_rpc_core::codegen::Bytes>,
    ) -> ::core::result::Result<(), ::rdma_rpc_core::codegen::Status> {
        ::rdma_rpc_core::codegen::call_inbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[2usize],
            ::rdma_rpc_core::codegen::IntoRequest::into_request(request),
            data.into(),
        )
        .await
    }

    /// `read /rdma/ep1` (buffer 4194304 bytes): RDMA-reads the server buffer.
    pub async fn rdma_ep1_read(
        &self,
        request: impl ::rdma_rpc_core::codegen::IntoRequest<()>,
    ) -> ::core::result::Result<
        ((), ::rdma_rpc_core::codegen::Bytes),
        ::rdma_rpc_core::codegen::Status,
    > {
        ::rdma_rpc_core::codegen::call_outbound(
            &self.inner,
            &DOCA_CPP_ENDPOINTS_ENDPOINTS[3usize],
            ::rdma_rpc_core::codegen::IntoRequest::into_request(request),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_hand_written_table_is_the_generated_one() {
        assert_eq!(
            super::DOCA_CPP_ENDPOINTS_ENDPOINTS,
            crate::generated::doca_cpp::DOCA_CPP_ENDPOINTS_ENDPOINTS
        );
    }
}
