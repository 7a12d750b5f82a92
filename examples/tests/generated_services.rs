//! The generated services end to end: generated clients against servers built from the
//! generated traits, over the software transport.

use std::time::Duration;

use bytes::Bytes;
use examples::buffers::PathBuffers;
use examples::generated::doca_cpp::{DocaCppEndpointsClient, DocaCppEndpointsServer};
use examples::generated::kv_store::{
    Action, ControlCommand, GetBlockRequest, KvStoreClient, KvStoreServer, PutBlockRequest,
    Status as BlockStatus,
};
use examples::kv::{MemoryKv, PutGate};
use rdma_rpc_core::{BoundServer, Code, Request, Server, Service};

async fn start(service: impl Service) -> String {
    let server: BoundServer = Server::builder()
        .add_service(service)
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    addr
}

fn bytes(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn doca_cpp_spec_every_endpoint_byte_exact() {
    let addr = start(DocaCppEndpointsServer::new(PathBuffers::default())).await;
    let client = DocaCppEndpointsClient::connect(&addr).await.unwrap();
    for len in [0, 1, 4096] {
        let message = bytes(len, 1);
        client.rdma_ep0_send((), message.clone()).await.unwrap();
        let ((), back) = client.rdma_ep0_receive(()).await.unwrap();
        assert_eq!(back, message);
    }
    for len in [0, 100, 64 << 10, 4 << 20] {
        let block = bytes(len, 2);
        client.rdma_ep1_write((), block.clone()).await.unwrap();
        let ((), back) = client.rdma_ep1_read(()).await.unwrap();
        assert!(back == block, "read back {len} bytes");
    }
    // One byte over the spec's 4 MiB buffer: refused with the sizes named.
    let err = client
        .rdma_ep1_write((), bytes((4 << 20) + 1, 3))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("4194304 byte buffer"), "{err}");
}

#[tokio::test]
async fn kv_store_spec_messages_enums_and_blocks() {
    let addr = start(KvStoreServer::new(MemoryKv::new(2))).await;
    let client = KvStoreClient::connect(&addr).await.unwrap();

    let block = bytes(1 << 20, 9);
    let put = PutBlockRequest {
        key: b"a".to_vec(),
        length: block.len() as u32,
        checksum: None,
    };
    let r = client.put_block(put.clone(), block.clone()).await.unwrap();
    assert_eq!((r.status(), r.version), (BlockStatus::Ok, 1));
    let r = client.put_block(put, block.clone()).await.unwrap();
    assert_eq!(r.version, 2);

    let (r, data) = client
        .get_block(GetBlockRequest {
            key: b"a".to_vec(),
            min_version: None,
        })
        .await
        .unwrap();
    assert_eq!(
        (r.status(), r.length, r.version),
        (BlockStatus::Ok, 1 << 20, 2)
    );
    assert!(data == block);

    let (r, _) = client
        .get_block(GetBlockRequest {
            key: b"a".to_vec(),
            min_version: Some(5),
        })
        .await
        .unwrap();
    assert_eq!(r.status(), BlockStatus::Stale);
    let (r, _) = client
        .get_block(GetBlockRequest {
            key: b"missing".to_vec(),
            min_version: None,
        })
        .await
        .unwrap();
    assert_eq!(r.status(), BlockStatus::NotFound);

    let stats = client.stats(()).await.unwrap();
    assert_eq!((stats.blocks, stats.bytes_stored), (1, 1 << 20));
    assert_eq!(stats.per_client.len(), 1);
    assert_eq!((stats.per_client[0].puts, stats.per_client[0].gets), (2, 3));

    let mut evict = ControlCommand::default();
    evict.set_action(Action::Evict);
    client.control(evict).await.unwrap();
    let stats = client.stats(()).await.unwrap();
    assert_eq!(stats.blocks, 0);
}

#[tokio::test]
async fn spec_timeouts_apply_and_requests_can_override_them() {
    // Every put waits at a gate the test opens; the spec gives put_block a 250 ms deadline.
    let gate = PutGate::new();
    let kv = MemoryKv::new(2).with_put_gate(gate.clone());
    let addr = start(KvStoreServer::new(kv)).await;
    let client = KvStoreClient::connect(&addr).await.unwrap();
    let put = PutBlockRequest {
        key: b"k".to_vec(),
        length: 4,
        checksum: None,
    };
    // A request may ask for more time than the spec's default: this one starts first, and
    // waits at the gate.
    let patient = {
        let (client, put) = (client.clone(), put.clone());
        tokio::spawn(async move {
            let request = Request::new(put).with_timeout(Duration::from_secs(30));
            client.put_block(request, Bytes::from_static(b"abcd")).await
        })
    };
    gate.arrived(1).await;
    // A put under the spec's deadline, started after it, ends with that deadline...
    let err = client
        .put_block(put, Bytes::from_static(b"abcd"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(err.message().contains("250ms"), "{err}");
    // ... by when the patient one has waited longer than 250 ms: let go, it succeeds.
    gate.open();
    let r = patient.await.unwrap().unwrap();
    assert_eq!(r.status(), BlockStatus::Ok);
}

/// `/kv/control` carries no payload (`payload: false`) and `/kv/stats` none either (a receive
/// without a buffer): their methods take and return messages only, and the generated server
/// refuses bytes a client sends anyway, before the handler runs.
#[tokio::test]
async fn endpoints_without_payload_take_messages_only_and_refuse_bytes() {
    use examples::generated::kv_store::KV_STORE_ENDPOINTS;

    let kv = MemoryKv::new(16);
    let addr = start(KvStoreServer::new(kv)).await;
    let client = KvStoreClient::connect(&addr).await.unwrap();
    let stats = client.stats(()).await.unwrap();
    assert_eq!(stats.blocks, 0);
    client.control(ControlCommand::default()).await.unwrap();

    let control = KV_STORE_ENDPOINTS
        .iter()
        .find(|e| e.path == "/kv/control")
        .unwrap();
    let message = rdma_rpc_core::codegen::encode_message(&ControlCommand::default());
    let err = client
        .inner()
        .call_raw(control, message, Some(Bytes::from_static(b"extra")), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert_eq!(
        err.message(),
        "send /kv/control carries no payload: send the request message alone"
    );
    // The server serves on.
    assert_eq!(client.stats(()).await.unwrap().blocks, 0);
}
