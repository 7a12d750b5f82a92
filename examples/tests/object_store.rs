//! The object store (`specs/object_store.yaml`, `examples/src/object_store.rs`) end to end,
//! through its generated client: a 1 GiB object put and got back through the path's 4 MiB
//! buffers, byte for byte, over TCP, `mem://` and every DOCA mode (software provider), with no
//! hand-written multipart; 100,000 keys listed as one server stream; the log as a client
//! stream; change notifications both ways.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use examples::object_store::{
    crc32c, DeleteObjectRequest, EventKind, GetObjectRequest, ListRequest, LogLine, MemoryStore,
    ObjectStoreClient, ObjectStoreServer, PutObjectRequest, WatchRequest,
};
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport, ProgressMode};
use rdma_rpc_core::transport::{transport_for, Transport};
use rdma_rpc_core::{Client, Code, Server};

/// A server of `store` on `transport` at `bind`, and a client of it.
async fn start(transport: Arc<dyn Transport>, bind: &str, store: MemoryStore) -> ObjectStoreClient {
    let server = Server::builder()
        .transport(transport.clone())
        .add_service(ObjectStoreServer::new(store))
        .bind(bind)
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    let client = Client::builder()
        .transport(transport)
        .connect(&addr)
        .await
        .unwrap();
    ObjectStoreClient::new(client)
}

async fn start_at(bind: &str, store: MemoryStore) -> ObjectStoreClient {
    start(transport_for(bind).unwrap(), bind, store).await
}

/// An object of `len` bytes whose 4 KiB blocks all differ (each starts with its number): a
/// chunk out of place or repeated shows. Built with copies only, quick in debug builds too.
fn object(len: usize) -> Bytes {
    let mut block = vec![0u8; 4096];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    let mut data = BytesMut::with_capacity(len);
    let mut n = 0u64;
    while data.len() < len {
        block[..8].copy_from_slice(&n.to_le_bytes());
        let take = (len - data.len()).min(block.len());
        data.extend_from_slice(&block[..take]);
        n += 1;
    }
    data.freeze()
}

/// The 1 GiB object and its checksum, made once for every test of this binary (in debug
/// builds both take seconds).
fn gibibyte() -> (Bytes, u32) {
    static ONCE: std::sync::OnceLock<(Bytes, u32)> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let data = object(1 << 30);
        let crc = crc32c(0, &data);
        (data, crc)
    })
    .clone()
}

/// Puts a 1 GiB object and gets it back whole, and a smaller one as a stream of chunks.
async fn a_gibibyte_goes_and_comes_back(client: &ObjectStoreClient) {
    let (data, crc) = gibibyte();
    let put = PutObjectRequest {
        key: "big".into(),
        crc32c: Some(crc),
    };
    let info = client.put_object(put, data.clone()).await.unwrap();
    assert_eq!((info.size, info.crc32c), (1 << 30, crc));
    let (info, back) = client
        .get_object(GetObjectRequest { key: "big".into() })
        .await
        .unwrap();
    assert_eq!(info.size, 1 << 30);
    assert!(back == data, "1 GiB back, byte for byte");
    drop(back);
    // As a stream: chunks of at most the 4 MiB buffer, in order, then the info.
    let small = object(10 << 20);
    client
        .put_object(
            PutObjectRequest {
                key: "small".into(),
                crc32c: None,
            },
            small.clone(),
        )
        .await
        .unwrap();
    let mut download = client
        .get_object_stream(GetObjectRequest {
            key: "small".into(),
        })
        .await
        .unwrap();
    let mut at = 0;
    while let Some(chunk) = download.chunk().await.unwrap() {
        assert!(chunk.len() <= 4 << 20, "a chunk of {}", chunk.len());
        assert!(chunk == small.slice(at..at + chunk.len()), "chunk at {at}");
        at += chunk.len();
    }
    assert_eq!(at, small.len());
    let info = download.response().unwrap().unwrap();
    assert_eq!(info.crc32c, crc32c(0, &small));
    // A wrong checksum loses nothing already stored, and says what it saw.
    let status = client
        .put_object(
            PutObjectRequest {
                key: "small".into(),
                crc32c: Some(1),
            },
            object(5 << 20),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DataLoss, "{status}");
    let (_, still) = client
        .get_object(GetObjectRequest {
            key: "small".into(),
        })
        .await
        .unwrap();
    assert!(still == small);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_object_round_trips_over_tcp() {
    a_gibibyte_goes_and_comes_back(&start_at("tcp://127.0.0.1:0", MemoryStore::new()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_object_round_trips_over_mem() {
    a_gibibyte_goes_and_comes_back(&start_at("mem://", MemoryStore::new()).await).await;
}

/// Over each DOCA mode of the software provider: RDMA CM and out of band, progress by events,
/// by a polling thread, and by each context's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_object_round_trips_over_every_doca_mode() {
    for (bind, progress) in [
        ("doca://127.0.0.1:0", ProgressMode::Event),
        ("doca://127.0.0.1:0", ProgressMode::BusyPoll),
        ("doca://127.0.0.1:0", ProgressMode::Spin),
        ("doca+oob://127.0.0.1:0", ProgressMode::Event),
        ("doca+oob://127.0.0.1:0", ProgressMode::BusyPoll),
    ] {
        let doca = DocaTransport::new(DocaConfig::from_env().with_progress(progress)).unwrap();
        let client = start(Arc::new(doca), bind, MemoryStore::new()).await;
        a_gibibyte_goes_and_comes_back(&client).await;
    }
    let violations = doca_sys::take_contract_violations();
    assert!(violations.is_empty(), "DOCA misuse: {violations:#?}");
}

/// Listing 100,000 keys is one call: the server streams them in key order, as many per frame
/// as fit, and the client takes them as they come; no paging by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_keys_are_listed_in_one_stream() {
    let store = MemoryStore::new();
    for i in 0..100_000u32 {
        store.insert(format!("logs/{i:06}"), Bytes::from_static(b"x"));
    }
    store.insert("other", Bytes::from_static(b"y"));
    let client = start_at("tcp://127.0.0.1:0", store).await;
    let mut listed = client
        .list_objects(ListRequest {
            prefix: "logs/".into(),
            limit: None,
        })
        .await
        .unwrap();
    let mut n = 0u32;
    while let Some(info) = listed.message().await.unwrap() {
        assert_eq!(info.key, format!("logs/{n:06}"), "in key order");
        assert_eq!(info.size, 1);
        n += 1;
    }
    assert_eq!(n, 100_000);
    // With a limit, and as a `Stream`.
    let limited = client
        .list_objects(ListRequest {
            prefix: String::new(),
            limit: Some(10),
        })
        .await
        .unwrap();
    use tokio_stream::StreamExt;
    let keys: Vec<_> = limited.map(|r| r.unwrap().key).collect().await;
    assert_eq!(keys.len(), 10);
    assert_eq!(keys[0], "logs/000000");
}

/// The log is a client stream (the server answers once it ended); changes come back to a
/// watcher as they happen, for the prefixes it streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_and_the_watchers_stream() {
    let store = MemoryStore::new();
    let client = start_at("tcp://127.0.0.1:0", store.clone()).await;
    let lines: Vec<LogLine> = (0..5000)
        .map(|i| LogLine {
            text: format!("line {i}"),
        })
        .collect();
    let bytes: u64 = lines.iter().map(|l| l.text.len() as u64).sum();
    let summary = client.append_log(tokio_stream::iter(lines)).await.unwrap();
    assert_eq!((summary.lines, summary.bytes), (5000, bytes));
    assert_eq!(store.log().len(), 5000);
    assert_eq!(store.log()[4999], "line 4999");

    // The watcher's requests stay open (a channel), so that it can add prefixes later.
    let (watching, requests) = tokio::sync::mpsc::channel(4);
    let mut events = client
        .watch(tokio_stream::wrappers::ReceiverStream::new(requests))
        .await
        .unwrap();
    watching
        .send(WatchRequest {
            prefix: "a/".into(),
            stop: false,
        })
        .await
        .unwrap();
    // The watch is in place once a change it covers comes back: objects are stored until
    // one does (gated by the event, not by time).
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let putter = tokio::spawn({
        let (client, done) = (client.clone(), done.clone());
        async move {
            let mut stored = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                stored += 1;
                let put = PutObjectRequest {
                    key: format!("a/{stored}"),
                    crc32c: None,
                };
                client.put_object(put, object(1000)).await.unwrap();
            }
            stored
        }
    });
    let first = events.message().await.unwrap().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let stored = putter.await.unwrap();
    assert_eq!(first.kind(), EventKind::Stored);
    // Other prefixes are not watched; deletions are seen.
    client
        .put_object(
            PutObjectRequest {
                key: "b/1".into(),
                crc32c: None,
            },
            object(10),
        )
        .await
        .unwrap();
    let deleted = client
        .delete_object(DeleteObjectRequest {
            key: format!("a/{stored}"),
        })
        .await
        .unwrap();
    assert!(deleted.existed);
    let mut next = events.message().await.unwrap().unwrap();
    while next.kind() == EventKind::Stored {
        // Stores of `a/` made while the watch was being set up.
        assert!(next.object.as_ref().unwrap().key.starts_with("a/"));
        next = events.message().await.unwrap().unwrap();
    }
    assert_eq!(next.kind(), EventKind::Deleted);
    assert_eq!(next.object.unwrap().key, format!("a/{stored}"));
    // Dropping the watch ends the call; the connection serves on.
    drop(events);
    drop(watching);
    let status = client
        .get_object(GetObjectRequest { key: "none".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status}");
}
