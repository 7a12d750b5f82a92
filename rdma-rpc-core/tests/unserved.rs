//! A server that was bound but is never served: its clients are told so, by name, instead of
//! a transport error that points elsewhere.

use std::time::Duration;

use bytes::Bytes;
use rdma_rpc_core::service::{EndpointDef, OpKind, ServerCall, Service};
use rdma_rpc_core::transport::mem::MemTransport;
use rdma_rpc_core::transport::BoxFuture;
use rdma_rpc_core::{Client, Server, Status};

static ENDPOINTS: &[EndpointDef] = &[EndpointDef {
    path: "/nothing",
    op: OpKind::Send,
    buffer_size: 64,
    method: "nothing",
    timeout_ms: None,
    stream: rdma_rpc_core::StreamKind::Unary,
}];

/// A service that answers every call with no bytes (it is never reached here).
struct Nothing;

impl Service for Nothing {
    fn name(&self) -> &'static str {
        "Nothing"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        ENDPOINTS
    }

    fn call<'a>(&'a self, _: usize, _: ServerCall<'a>) -> BoxFuture<'a, Result<Bytes, Status>> {
        Box::pin(async { Ok(Bytes::new()) })
    }
}

#[tokio::test]
async fn a_server_bound_but_never_served_says_so_to_its_clients() {
    let mem = std::sync::Arc::new(MemTransport::new());
    for (addr, mem) in [("tcp://127.0.0.1:0", None), ("mem://", Some(mem))] {
        let mut builder = Server::builder().add_service(Nothing);
        if let Some(t) = &mem {
            builder = builder.transport(t.clone());
        }
        let server = builder.bind(addr).await.unwrap();
        let mut client = Client::builder().connect_timeout(Duration::from_secs(5));
        if let Some(t) = &mem {
            client = client.transport(t.clone());
        }
        let err = client.connect(&server.local_addr()).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("serve()"), "{addr}: {text}");
        drop(server);
    }
}
