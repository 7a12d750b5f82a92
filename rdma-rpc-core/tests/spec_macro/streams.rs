//! The streaming endpoints of `specs/object_store.yaml` compile without warnings: a server
//! implements every kind (bulk write and read streams; server, client and bidirectional
//! message streams) with `async fn`s, and a client calls every generated method.
#![deny(warnings, missing_docs)]

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rdma_rpc_core::Stream;
use rdma_rpc_core::{ChunkSink, Chunks, RegisteredBuf, Request, Service, Status, Streaming};

/// The object store.
pub mod store {
    rdma_rpc_core::spec!("../specs/object_store.yaml");
}

use store::{
    AppendSummary, DeleteObjectRequest, DeleteObjectResponse, EventKind, GetObjectRequest,
    ListRequest, LogLine, ObjectEvent, ObjectInfo, ObjectStore, ObjectStoreClient,
    ObjectStoreServer, PutObjectRequest, WatchRequest,
};

/// The items of an iterator, as a stream that is always ready.
struct Iter<I>(I);

impl<I: Iterator + Unpin> Stream for Iter<I> {
    type Item = I::Item;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<I::Item>> {
        Poll::Ready(self.0.next())
    }
}

/// An event for each prefix the client watches.
struct Events(Streaming<WatchRequest>);

impl Stream for Events {
    type Item = Result<ObjectEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0).poll_next(cx).map(|next| {
            next.map(|watch| {
                let watch = watch?;
                let mut event = ObjectEvent {
                    object: Some(ObjectInfo {
                        key: watch.prefix,
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                event.set_kind(if watch.stop {
                    EventKind::Deleted
                } else {
                    EventKind::Stored
                });
                Ok(event)
            })
        })
    }
}

struct Store;

impl ObjectStore for Store {
    async fn put_object(
        &self,
        request: Request<PutObjectRequest>,
        mut chunks: Chunks,
    ) -> Result<ObjectInfo, Status> {
        let declared = chunks.len();
        let mut size = 0;
        while let Some(chunk) = chunks.chunk().await? {
            size += chunk.len() as u64;
        }
        assert_eq!(size, declared);
        Ok(ObjectInfo {
            key: request.into_inner().key,
            size,
            crc32c: 0,
        })
    }

    async fn get_object(
        &self,
        request: Request<GetObjectRequest>,
        sink: &mut ChunkSink,
    ) -> Result<ObjectInfo, Status> {
        let mut buf = sink.buffer().await?;
        buf.fill_from(b"first chunk").map_err(Status::from)?;
        sink.send(buf).await?;
        sink.send_bytes(&vec![7u8; sink.chunk_size() * 2]).await?;
        Ok(ObjectInfo {
            key: request.into_inner().key,
            size: sink.sent(),
            crc32c: 0,
        })
    }

    type ListObjectsStream = Iter<std::vec::IntoIter<Result<ObjectInfo, Status>>>;

    async fn list_objects(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Self::ListObjectsStream, Status> {
        let ListRequest { prefix, limit } = request.into_inner();
        let all: Vec<_> = (0..limit.unwrap_or(3))
            .map(|i| {
                Ok(ObjectInfo {
                    key: format!("{prefix}{i}"),
                    size: u64::from(i),
                    crc32c: 0,
                })
            })
            .collect();
        Ok(Iter(all.into_iter()))
    }

    async fn append_log(
        &self,
        mut request: Request<Streaming<LogLine>>,
    ) -> Result<AppendSummary, Status> {
        let mut summary = AppendSummary::default();
        while let Some(line) = request.get_mut().message().await? {
            summary.lines += 1;
            summary.bytes += line.text.len() as u64;
        }
        Ok(summary)
    }

    type WatchStream = Events;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Self::WatchStream, Status> {
        Ok(Events(request.into_inner()))
    }

    async fn delete_object(
        &self,
        request: Request<DeleteObjectRequest>,
    ) -> Result<DeleteObjectResponse, Status> {
        Ok(DeleteObjectResponse {
            existed: !request.get_ref().key.is_empty(),
        })
    }
}

/// Calls every method of the client.
pub async fn calls(client: &ObjectStoreClient, dst: RegisteredBuf) -> Result<u64, Status> {
    let stored = client
        .put_object(
            PutObjectRequest {
                key: "a".into(),
                crc32c: None,
            },
            vec![0u8; 64 << 20],
        )
        .await?;
    let (info, bytes) = client
        .get_object(GetObjectRequest { key: "a".into() })
        .await?;
    let (_, dst) = client
        .get_object_into(GetObjectRequest { key: "a".into() }, dst)
        .await?;
    let request =
        Request::new(GetObjectRequest { key: "a".into() }).with_timeout(Duration::from_secs(5));
    let mut download = client.get_object_stream(request).await?;
    let mut streamed = 0;
    while let Some(chunk) = download.chunk().await? {
        streamed += chunk.len() as u64;
    }
    let last: ObjectInfo = download.response().transpose()?.unwrap_or_default();

    let mut listing = client
        .list_objects(ListRequest {
            prefix: "a".into(),
            limit: Some(10),
        })
        .await?;
    let mut listed = 0;
    while let Some(object) = listing.message().await? {
        listed += object.size;
    }

    let lines = vec![
        LogLine { text: "one".into() },
        LogLine { text: "two".into() },
    ];
    let summary = client.append_log(Iter(lines.into_iter())).await?;
    let lines = Request::new(Iter(vec![LogLine::default()].into_iter()))
        .with_timeout(Duration::from_secs(1));
    let again = client.append_log(lines).await?;

    let watches = vec![WatchRequest {
        prefix: "a".into(),
        stop: false,
    }];
    let mut events = client.watch(Iter(watches.into_iter())).await?;
    let mut stored_events = 0;
    while let Some(event) = events.message().await? {
        if event.kind() == EventKind::Stored {
            stored_events += 1;
        }
    }

    let deleted = client
        .delete_object(DeleteObjectRequest { key: "a".into() })
        .await?;
    Ok(stored.size
        + info.size
        + bytes.len() as u64
        + dst.len() as u64
        + streamed
        + last.size
        + listed
        + summary.lines
        + again.bytes
        + stored_events
        + u64::from(deleted.existed))
}

#[test]
fn every_kind_of_stream_compiles_and_checks() {
    let server = ObjectStoreServer::new(Store);
    assert_eq!(server.name(), "ObjectStore");
    let endpoints = server.endpoints();
    assert_eq!(endpoints.len(), 6);
    for endpoint in endpoints {
        endpoint.check().unwrap();
    }
    assert_eq!(endpoints[0].max_payload(), 1 << 30);
    // Built, not run: there is no server to talk to.
    let _ = calls;
}
