//! Streams end to end: message streams every way (server, client, both) and bulk streams of
//! payloads many buffers long, byte for byte, with their flow control, cancellation and
//! limits. Suite functions (`*_on`) run over every transport and DOCA mode.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;

use super::{bounded, pattern, Backend, Harness};
use crate::codegen::{decode_request, encode_message, mismatched_call};
use crate::service::{EndpointDef, OpKind, ServerCall, Service, StreamKind};
use crate::status::{Code, Status};
use crate::transport::BoxFuture;
use crate::{Client, ServerConfig};

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Ask {
    /// How many messages (or bytes, for a read stream) the server sends.
    #[prost(uint64, tag = "1")]
    pub(crate) count: u64,
    /// Bytes of padding per message.
    #[prost(uint32, tag = "2")]
    pub(crate) pad: u32,
    /// The server's stream fails after this many messages.
    #[prost(uint64, optional, tag = "3")]
    pub(crate) fail_after: Option<u64>,
    /// Seed of the bytes of a read stream.
    #[prost(uint32, tag = "4")]
    pub(crate) seed: u32,
    /// The handler waits at the service's gate after its first chunk or message.
    #[prost(bool, tag = "5")]
    pub(crate) gated: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Item {
    #[prost(uint64, tag = "1")]
    pub(crate) seq: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) pad: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Summary {
    /// Messages or chunks.
    #[prost(uint64, tag = "1")]
    pub(crate) count: u64,
    /// Sum of the messages' `seq`, or bytes of a write stream.
    #[prost(uint64, tag = "2")]
    pub(crate) sum: u64,
    /// A write stream's bytes matched the pattern of `seed`.
    #[prost(bool, tag = "3")]
    pub(crate) exact: bool,
    /// The largest chunk.
    #[prost(uint64, tag = "4")]
    pub(crate) largest: u64,
}

/// Chunk size of the bulk endpoints.
pub(crate) const CHUNK: u64 = 256 << 10;
/// Most bytes a bulk stream of the test service moves.
pub(crate) const MAX_LEN: u64 = 64 << 20;

const fn ep(path: &'static str, op: OpKind, buffer_size: u64, stream: StreamKind) -> EndpointDef {
    EndpointDef {
        path,
        op,
        buffer_size,
        method: "streams",
        timeout_ms: None,
        stream,
    }
}

pub(crate) const LIST: usize = 0;
pub(crate) const SUM: usize = 1;
pub(crate) const ECHO: usize = 2;
pub(crate) const PUT: usize = 3;
pub(crate) const GET: usize = 4;
pub(crate) const SMALL: usize = 5;

pub(crate) static ENDPOINTS: &[EndpointDef] = &[
    ep(
        "/s/list",
        OpKind::Receive,
        4096,
        StreamKind::Messages {
            requests: false,
            responses: true,
        },
    ),
    ep(
        "/s/sum",
        OpKind::Send,
        4096,
        StreamKind::Messages {
            requests: true,
            responses: false,
        },
    ),
    ep(
        "/s/echo",
        OpKind::Send,
        4096,
        StreamKind::Messages {
            requests: true,
            responses: true,
        },
    ),
    ep(
        "/s/obj",
        OpKind::Write,
        CHUNK,
        StreamKind::Bulk { max_len: MAX_LEN },
    ),
    ep(
        "/s/obj",
        OpKind::Read,
        CHUNK,
        StreamKind::Bulk { max_len: MAX_LEN },
    ),
    ep("/s/small", OpKind::Read, 4096, StreamKind::Unary),
];

/// The streaming test service. Counts what its handlers did, for the tests to check.
#[derive(Clone)]
pub(crate) struct Streams {
    /// Messages the list handler handed to its sink so far.
    pub(crate) listed: Arc<AtomicU64>,
    /// Handlers dropped before they returned.
    pub(crate) dropped: Arc<AtomicU64>,
    /// Gated handlers wait here.
    pub(crate) gate: Arc<tokio::sync::Semaphore>,
    /// Handlers that reached the gate.
    pub(crate) at_gate: Arc<AtomicU64>,
    /// Largest chunk a write handler saw, per call.
    pub(crate) chunks: Arc<Mutex<Vec<u64>>>,
}

impl Default for Streams {
    fn default() -> Streams {
        Streams {
            listed: Arc::default(),
            dropped: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            at_gate: Arc::default(),
            chunks: Arc::default(),
        }
    }
}

/// Counts a handler that did not return (its future was dropped).
struct DropGuard(Arc<AtomicU64>, bool);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn item(seq: u64, pad: u32) -> Item {
    Item {
        seq,
        pad: vec![seq as u8; pad as usize],
    }
}

impl Streams {
    async fn wait_at_gate(&self) {
        self.at_gate.fetch_add(1, Ordering::SeqCst);
        let _ = self.gate.acquire().await;
    }

    async fn list(&self, ask: Ask, sink: &mut crate::stream::MessageSink) -> Result<Bytes, Status> {
        let mut guard = DropGuard(self.dropped.clone(), false);
        for seq in 0..ask.count {
            if ask.fail_after == Some(seq) {
                return Err(Status::failed_precondition(format!("failed after {seq}")));
            }
            sink.send(&item(seq, ask.pad)).await?;
            self.listed.fetch_add(1, Ordering::SeqCst);
            if ask.gated && seq == 0 {
                sink.flush().await?;
                self.wait_at_gate().await;
            }
        }
        guard.1 = true;
        Ok(Bytes::new())
    }

    async fn sum(&self, mut requests: crate::stream::Streaming<Item>) -> Result<Bytes, Status> {
        let mut guard = DropGuard(self.dropped.clone(), false);
        let (mut count, mut sum) = (0, 0);
        while let Some(item) = requests.message().await? {
            count += 1;
            sum += item.seq;
        }
        guard.1 = true;
        Ok(encode_message(&Summary {
            count,
            sum,
            ..Default::default()
        }))
    }

    async fn echo(
        &self,
        mut requests: crate::stream::Streaming<Item>,
        sink: &mut crate::stream::MessageSink,
    ) -> Result<Bytes, Status> {
        let mut guard = DropGuard(self.dropped.clone(), false);
        while let Some(mut item) = requests.message().await? {
            item.seq *= 2;
            sink.send(&item).await?;
        }
        guard.1 = true;
        Ok(Bytes::new())
    }

    async fn put(&self, ask: Ask, mut chunks: crate::stream::Chunks) -> Result<Bytes, Status> {
        let mut guard = DropGuard(self.dropped.clone(), false);
        let want = pattern(chunks.len() as usize, ask.seed);
        let (mut count, mut at, mut exact, mut largest) = (0, 0usize, true, 0);
        while let Some(chunk) = chunks.chunk().await? {
            exact &= want.get(at..at + chunk.len()) == Some(&chunk[..]);
            at += chunk.len();
            count += 1;
            largest = largest.max(chunk.len() as u64);
            if ask.gated && count == 1 {
                self.wait_at_gate().await;
            }
        }
        self.chunks.lock().unwrap().push(largest);
        guard.1 = true;
        Ok(encode_message(&Summary {
            count,
            sum: at as u64,
            exact: exact && at == want.len(),
            largest,
        }))
    }

    async fn get(&self, ask: Ask, sink: &mut crate::stream::ChunkSink) -> Result<Bytes, Status> {
        let mut guard = DropGuard(self.dropped.clone(), false);
        let data = pattern(ask.count as usize, ask.seed);
        let mut sent = 0;
        for part in data.chunks(sink.chunk_size()) {
            let mut buf = sink.buffer().await?;
            buf.fill_from(part).map_err(Status::from)?;
            sink.send(buf).await?;
            sent += 1;
            if ask.gated && sent == 1 {
                self.wait_at_gate().await;
            }
        }
        guard.1 = true;
        Ok(encode_message(&Summary {
            count: sent,
            sum: data.len() as u64,
            ..Default::default()
        }))
    }
}

impl Service for Streams {
    fn name(&self) -> &'static str {
        "Streams"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        ENDPOINTS
    }

    fn call<'a>(
        &'a self,
        index: usize,
        call: ServerCall<'a>,
    ) -> BoxFuture<'a, Result<Bytes, Status>> {
        match (index, call) {
            (
                LIST,
                ServerCall::Streaming {
                    request,
                    responses: Some(sink),
                    ..
                },
            ) => Box::pin(async move {
                let ask = decode_request::<Ask>(request)?.into_inner();
                self.list(ask, sink).await
            }),
            (
                SUM,
                ServerCall::Streaming {
                    requests: Some(requests),
                    ..
                },
            ) => Box::pin(self.sum(crate::stream::Streaming::new(requests))),
            (
                ECHO,
                ServerCall::Streaming {
                    requests: Some(requests),
                    responses: Some(sink),
                    ..
                },
            ) => Box::pin(self.echo(crate::stream::Streaming::new(requests), sink)),
            (PUT, ServerCall::InboundStream { request, chunks }) => Box::pin(async move {
                let ask = decode_request::<Ask>(request)?.into_inner();
                self.put(ask, chunks).await
            }),
            (GET, ServerCall::OutboundStream { request, sink }) => Box::pin(async move {
                let ask = decode_request::<Ask>(request)?.into_inner();
                self.get(ask, sink).await
            }),
            (SMALL, ServerCall::Outbound { request, buf }) => Box::pin(async move {
                let ask = decode_request::<Ask>(request)?.into_inner();
                buf.fill_from(&pattern(ask.count as usize, ask.seed))
                    .map_err(Status::from)?;
                Ok(Bytes::new())
            }),
            (index, call) => mismatched_call("Streams", index, call),
        }
    }
}

/// A server with the streaming service (and the usual test service) on `b`.
pub(crate) async fn start(b: &Backend, config: ServerConfig) -> (Harness, Streams) {
    let streams = Streams::default();
    let service = streams.clone();
    let h = Harness::start_built(b, config, move |builder| builder.add_service(service)).await;
    (h, streams)
}

/// The encoded items `from..to`.
struct Items {
    next: u64,
    end: u64,
}

impl Stream for Items {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.next == self.end {
            return Poll::Ready(None);
        }
        let seq = self.next;
        self.next += 1;
        Poll::Ready(Some(encode_message(&item(seq, 8))))
    }
}

fn items(count: u64) -> crate::client::RequestStream {
    Box::pin(Items {
        next: 0,
        end: count,
    })
}

pub(crate) async fn list(
    client: &Client,
    ask: Ask,
) -> Result<crate::stream::MessageStream, Status> {
    client
        .call_raw_server_stream(&ENDPOINTS[LIST], encode_message(&ask), None, None)
        .await
}

/// A server streams 100,000 messages in one call (no paging by hand): every one arrives, in
/// order; an error the handler returns midway arrives after the messages it sent.
pub(crate) async fn a_server_streams_a_hundred_thousand_messages_on(b: &Backend) {
    let (h, _) = start(b, ServerConfig::default()).await;
    let client = h.client().await;
    let ask = Ask {
        count: 100_000,
        pad: 24,
        ..Default::default()
    };
    let mut stream = crate::stream::Streaming::<Item>::new(list(&client, ask).await.unwrap());
    let mut next = 0;
    while let Some(item) = stream.message().await.unwrap() {
        assert_eq!(item.seq, next, "in order");
        assert_eq!(item.pad.len(), 24);
        next += 1;
    }
    assert_eq!(next, 100_000);
    let failing = Ask {
        count: 1000,
        fail_after: Some(600),
        ..Default::default()
    };
    let mut stream = crate::stream::Streaming::<Item>::new(list(&client, failing).await.unwrap());
    let mut got = 0;
    let status = loop {
        match stream.message().await {
            Ok(Some(_)) => got += 1,
            Ok(None) => panic!("the stream ended without its error"),
            Err(status) => break status,
        }
    };
    assert_eq!(got, 600, "every message before the error");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert_eq!(stream.message().await.unwrap(), None, "and then nothing");
    // The connection serves on.
    let mut stream = list(
        &client,
        Ask {
            count: 3,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut n = 0;
    while stream.message().await.unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 3);
}

/// A server's stream never runs ahead of its client by more than the client's window: a
/// client that reads slowly holds the server back (its sink waits), whatever the stream's
/// length.
pub(crate) async fn a_slow_reader_holds_the_server_back_on(b: &Backend) {
    let (h, streams) = start(b, ServerConfig::default()).await;
    let window = 64 << 10;
    let client = h
        .client_with(crate::ClientConfig {
            stream_window: window,
            ..Default::default()
        })
        .await;
    let pad = 100;
    let ask = Ask {
        count: 20_000,
        pad,
        ..Default::default()
    };
    let mut stream = list(&client, ask).await.unwrap();
    // A message costs its bytes and 16; one frame more may be queued in the sink.
    let cost = crate::protocol::stream::message_cost(pad as usize + 4);
    let ahead = window / cost + (16 << 10) / (pad as u64) + 1;
    let mut read = 0u64;
    while stream.message().await.unwrap().is_some() {
        read += 1;
        if read.is_multiple_of(500) {
            // Time for the server to run ahead, if it could.
            for _ in 0..200 {
                tokio::task::yield_now().await;
            }
            let listed = streams.listed.load(Ordering::SeqCst);
            assert!(
                listed <= read + ahead,
                "the server listed {listed} with {read} read: more than a window ahead"
            );
        }
    }
    assert_eq!(read, 20_000);
}

/// A client streams 50,000 messages; the server answers once with what it summed. A bidirectional
/// stream echoes each message as it comes.
pub(crate) async fn clients_stream_and_both_sides_stream_on(b: &Backend) {
    let (h, _) = start(b, ServerConfig::default()).await;
    let client = h.client().await;
    let n = 50_000u64;
    let summary = client
        .call_raw_client_stream(&ENDPOINTS[SUM], items(n), None)
        .await
        .unwrap();
    let summary: Summary = prost::Message::decode(summary).unwrap();
    assert_eq!((summary.count, summary.sum), (n, n * (n - 1) / 2));
    // An empty stream is a stream too.
    let summary = client
        .call_raw_client_stream(&ENDPOINTS[SUM], items(0), None)
        .await
        .unwrap();
    let summary: Summary = prost::Message::decode(summary).unwrap();
    assert_eq!(summary.count, 0);

    let echoed = client
        .call_raw_server_stream(&ENDPOINTS[ECHO], Bytes::new(), Some(items(n)), None)
        .await
        .unwrap();
    let mut echoed = crate::stream::Streaming::<Item>::new(echoed);
    let mut next = 0;
    while let Some(item) = echoed.message().await.unwrap() {
        assert_eq!(item.seq, next * 2);
        next += 1;
    }
    assert_eq!(next, n);
}

/// A client that drops a server's stream midway cancels the call: the handler, waiting at
/// its gate, is dropped, and the connection serves on.
pub(crate) async fn dropping_a_stream_cancels_its_call_on(b: &Backend) {
    let (h, streams) = start(b, ServerConfig::default()).await;
    let client = h.client().await;
    let ask = Ask {
        count: 10,
        gated: true,
        ..Default::default()
    };
    let mut stream = list(&client, ask).await.unwrap();
    assert!(
        stream.message().await.unwrap().is_some(),
        "the first message"
    );
    drop(stream);
    bounded("the handler is dropped", async {
        while streams.dropped.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // A bulk read dropped midway: its handler too, and its pool buffers come back.
    let ask = Ask {
        count: 8 * CHUNK,
        gated: true,
        seed: 3,
        ..Default::default()
    };
    let mut read = client
        .call_raw_read_stream(&ENDPOINTS[GET], encode_message(&ask), None)
        .await
        .unwrap();
    let first = read.chunk().await.unwrap().unwrap();
    assert_eq!(first[..], pattern(8 * CHUNK as usize, 3)[..CHUNK as usize]);
    drop(read);
    bounded("the read handler is dropped", async {
        while streams.dropped.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    bounded("every pool buffer comes back", async {
        loop {
            let pools = h.handle.pools();
            if pools.iter().all(|p| p.in_use == 0) {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let mut stream = list(
        &client,
        Ask {
            count: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(stream.message().await.unwrap().is_some());
}

/// Payloads many buffers long move through a 256 KiB endpoint, byte for byte: written from
/// plain bytes (staged a chunk at a time) and from a memory region (offered in place), read
/// whole, as a stream and into a caller's buffer; no chunk is larger than the buffer.
pub(crate) async fn bulk_streams_move_payloads_many_buffers_long_on(b: &Backend) {
    let (h, streams) = start(b, ServerConfig::default()).await;
    let client = h.client().await;
    for (len, seed) in [
        (0usize, 1u32),
        (1000, 2),
        (CHUNK as usize, 3),
        (24 << 20, 4),
        (3 * CHUNK as usize + 17, 5),
    ] {
        let data = Bytes::from(pattern(len, seed));
        let ask = Ask {
            seed,
            ..Default::default()
        };
        let (summary, _) = client
            .call_raw(
                &ENDPOINTS[PUT],
                encode_message(&ask),
                Some(data.clone()),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("put {len}: {e}"));
        let summary: Summary = prost::Message::decode(summary).unwrap();
        assert!(summary.exact, "put {len}: bytes differ");
        assert_eq!(summary.sum, len as u64);
        assert!(summary.largest <= CHUNK, "a chunk larger than the buffer");
        assert_eq!(
            summary.count,
            (len as u64).div_ceil(CHUNK),
            "put {len}: chunks"
        );

        let ask = Ask {
            count: len as u64,
            seed,
            ..Default::default()
        };
        let (summary, got) = client
            .call_raw(&ENDPOINTS[GET], encode_message(&ask), None, None)
            .await
            .unwrap_or_else(|e| panic!("get {len}: {e}"));
        assert!(got == data, "get {len}: bytes differ");
        let summary: Summary = prost::Message::decode(summary).unwrap();
        assert_eq!(summary.sum, len as u64);
    }
    assert!(streams.chunks.lock().unwrap().iter().all(|&c| c <= CHUNK));
    // From a memory region: offered where it is.
    let region = crate::MemoryRegion::new(16 << 20).unwrap();
    let mut lease = region.lease(0, 8 << 20).unwrap();
    let data = pattern(8 << 20, 9);
    lease.fill_from(&data).unwrap();
    let frozen = lease.freeze();
    let ask = Ask {
        seed: 9,
        ..Default::default()
    };
    let (summary, _) = client
        .call_raw(&ENDPOINTS[PUT], encode_message(&ask), Some(frozen), None)
        .await
        .unwrap();
    let summary: Summary = prost::Message::decode(summary).unwrap();
    assert!(summary.exact && summary.sum == 8 << 20);
    // Read as a stream, and into a caller's buffer.
    let ask = Ask {
        count: 5 << 20,
        seed: 6,
        ..Default::default()
    };
    let mut read = client
        .call_raw_read_stream(&ENDPOINTS[GET], encode_message(&ask), None)
        .await
        .unwrap();
    let mut all = Vec::new();
    while let Some(chunk) = read.chunk().await.unwrap() {
        assert!(chunk.len() as u64 <= CHUNK);
        all.extend_from_slice(&chunk);
    }
    assert!(all == pattern(5 << 20, 6));
    let summary: Summary = prost::Message::decode(read.response().unwrap().clone()).unwrap();
    assert_eq!(summary.count, (5u64 << 20).div_ceil(CHUNK));
    let dst = region.lease(8 << 20, 6 << 20).unwrap();
    let (_, dst) = client
        .call_raw_into(&ENDPOINTS[GET], encode_message(&ask), dst, None)
        .await
        .unwrap();
    assert_eq!(dst.len(), 5 << 20);
    assert!(dst.to_vec() == pattern(5 << 20, 6));
    let small = region.lease(14 << 20, 1 << 20).unwrap();
    let status = client
        .call_raw_into(&ENDPOINTS[GET], encode_message(&ask), small, None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status}");
    // Past max_len: refused before anything moves.
    let status = client
        .call_raw(
            &ENDPOINTS[PUT],
            encode_message(&Ask::default()),
            Some(Bytes::from(vec![0u8; MAX_LEN as usize + 1])),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("max_len"), "{status}");
}

/// A slow write handler holds the stream back: while it waits with one chunk taken, the server
/// holds no more of the path's pool than the chunks it reads ahead.
pub(crate) async fn a_slow_write_handler_holds_the_client_back_on(b: &Backend) {
    let (h, streams) = start(b, ServerConfig::default()).await;
    let client = h.client().await;
    let len = 16 << 20;
    let data = Bytes::from(pattern(len, 7));
    let ask = Ask {
        seed: 7,
        gated: true,
        ..Default::default()
    };
    let put = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .call_raw(&ENDPOINTS[PUT], encode_message(&ask), Some(data), None)
                .await
        }
    });
    // Gate: the handler took its first chunk and waits (the gate has no permit yet).
    let in_use = |h: &Harness| {
        h.handle
            .pools()
            .iter()
            .find(|p| p.path == "/s/obj")
            .map_or(0, |p| p.in_use)
    };
    bounded("the handler takes its first chunk", async {
        while streams.at_gate.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    for _ in 0..2000 {
        tokio::task::yield_now().await;
        assert!(
            in_use(&h) <= 3,
            "the stream holds {} buffers: more than its chunk and two read ahead",
            in_use(&h)
        );
    }
    assert!(
        !put.is_finished(),
        "a 16 MiB stream cannot end with its handler stopped"
    );
    streams.gate.add_permits(1);
    let (summary, _) = bounded("the put", put).await.unwrap().unwrap();
    let summary: Summary = prost::Message::decode(summary).unwrap();
    assert!(summary.exact);
}

/// A handler whose result does not fit (a unary buffer, a stream's `max_len`) fails with its
/// own error, naming the endpoint and the way out, never with one that blames the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_overflow_is_the_handlers_error_and_names_the_endpoint() {
    let (h, _) = start(&super::tcp_backend(), ServerConfig::default()).await;
    let client = h.client().await;
    let ask = Ask {
        count: 5000,
        ..Default::default()
    };
    let status = client
        .call_raw(&ENDPOINTS[SMALL], encode_message(&ask), None, None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status}");
    for says in [
        "the handler of read /s/small",
        "5000 bytes",
        "4096",
        "bulk stream",
    ] {
        assert!(status.message().contains(says), "{says:?} in {status}");
    }
    assert!(!status.message().contains("invalid argument"), "{status}");
    let ask = Ask {
        count: MAX_LEN + 1,
        ..Default::default()
    };
    let status = client
        .call_raw(&ENDPOINTS[GET], encode_message(&ask), None, None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status}");
    for says in ["the handler of read /s/obj", "max_len"] {
        assert!(status.message().contains(says), "{says:?} in {status}");
    }
    // The client's own payload over a unary buffer is the client's error, with the way out.
    let status = client
        .call_raw(
            &super::service::ENDPOINTS[0],
            Bytes::new(),
            Some(Bytes::from(vec![0u8; 17 << 20])),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("bulk stream"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_streams_a_hundred_thousand_messages() {
    bounded(
        "100,000 messages",
        a_server_streams_a_hundred_thousand_messages_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_holds_the_server_back() {
    bounded(
        "slow reader",
        a_slow_reader_holds_the_server_back_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_stream_and_both_sides_stream() {
    bounded(
        "client streams",
        clients_stream_and_both_sides_stream_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_cancels_its_call() {
    bounded(
        "cancel",
        dropping_a_stream_cancels_its_call_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_streams_move_payloads_many_buffers_long() {
    bounded(
        "bulk streams",
        bulk_streams_move_payloads_many_buffers_long_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_write_handler_holds_the_client_back() {
    bounded(
        "slow write handler",
        a_slow_write_handler_holds_the_client_back_on(&super::tcp_backend()),
    )
    .await;
}
