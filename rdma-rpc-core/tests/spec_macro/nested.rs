//! `spec!` output compiles without warnings: in nested modules, with server and client
//! options, implemented with `async fn` and called from an `async fn`.
#![deny(warnings, missing_docs)]

use std::time::Duration;

use rdma_rpc_core::Bytes;
use rdma_rpc_core::{RegisteredBuf, Request, Service, Status};

/// Two modules down.
pub mod outer {
    /// The block store.
    pub mod kv {
        rdma_rpc_core::spec!("../specs/kv_store.yaml");
    }
}

/// The doca-cpp spec, client only.
pub mod doca_client {
    rdma_rpc_core::spec!("../specs/doca_cpp_endpoints.yaml", server = false,);
}

/// The doca-cpp spec, server only.
pub mod doca_server {
    rdma_rpc_core::spec!("../specs/doca_cpp_endpoints.yaml", client = false);
}

use outer::kv;

struct Store;

impl kv::KvStore for Store {
    async fn put_block(
        &self,
        request: Request<kv::PutBlockRequest>,
        data: Bytes,
    ) -> Result<kv::PutBlockResponse, Status> {
        let version = u64::from(request.get_ref().length) + data.len() as u64;
        Ok(kv::PutBlockResponse {
            status: kv::Status::Ok.into(),
            version,
        })
    }

    async fn get_block(
        &self,
        _request: Request<kv::GetBlockRequest>,
        buf: &mut RegisteredBuf,
    ) -> Result<kv::GetBlockResponse, Status> {
        buf.set_len(0);
        let mut response = kv::GetBlockResponse::default();
        response.set_status(kv::Status::NotFound);
        Ok(response)
    }

    async fn control(&self, request: Request<kv::ControlCommand>) -> Result<(), Status> {
        match request.get_ref().action() {
            kv::Action::Flush | kv::Action::Compact | kv::Action::Evict => Ok(()),
        }
    }

    async fn stats(&self, _request: Request<()>) -> Result<kv::Stats, Status> {
        Ok(kv::Stats::default())
    }
}

struct Doca;

impl doca_server::DocaCppEndpoints for Doca {
    async fn rdma_ep0_receive(
        &self,
        _: Request<()>,
        buf: &mut RegisteredBuf,
    ) -> Result<(), Status> {
        buf.fill_from(b"pong")
            .map_err(|e| Status::internal(e.to_string()))
    }
    async fn rdma_ep1_write(&self, _: Request<()>, _: Bytes) -> Result<(), Status> {
        Ok(())
    }
    async fn rdma_ep0_send(&self, _: Request<()>, _: Bytes) -> Result<(), Status> {
        Ok(())
    }
    async fn rdma_ep1_read(&self, _: Request<()>, _: &mut RegisteredBuf) -> Result<(), Status> {
        Ok(())
    }
}

async fn client_calls(client: &kv::KvStoreClient) -> Result<u64, Status> {
    let put = client
        .put_block(
            kv::PutBlockRequest {
                key: b"key".to_vec(),
                length: 1,
                checksum: None,
            },
            vec![0u8; 1],
        )
        .await?;
    let request =
        Request::new(kv::GetBlockRequest::default()).with_timeout(Duration::from_millis(5));
    let (block, data) = client.get_block(request).await?;
    client.control(kv::ControlCommand::default()).await?;
    let stats = client.stats(()).await?;
    Ok(put.version + block.version + data.len() as u64 + stats.blocks)
}

async fn doca_calls(client: &doca_client::DocaCppEndpointsClient) -> Result<usize, Status> {
    client
        .rdma_ep1_write((), Bytes::from_static(b"block"))
        .await?;
    let ((), bytes) = client.rdma_ep0_receive(()).await?;
    Ok(bytes.len())
}

#[test]
fn spec_output_compiles_in_nested_modules_and_with_options() {
    let server = kv::KvStoreServer::new(Store);
    assert_eq!(server.name(), "KvStore");
    assert_eq!(server.endpoints().len(), 4);
    assert_eq!(kv::KV_STORE_ENDPOINTS[3].method, "stats");
    assert_eq!(
        kv::Status::from_str_name("NO_SPACE"),
        Some(kv::Status::NoSpace)
    );
    let shared = doca_server::DocaCppEndpointsServer::from_arc(std::sync::Arc::new(Doca));
    assert_eq!(
        shared.clone().endpoints(),
        doca_client::DOCA_CPP_ENDPOINTS_ENDPOINTS
    );
    println!("{server:?} {shared:?}");
    // Built, not run: there is no server to talk to.
    let _ = (client_calls, doca_calls);
}
