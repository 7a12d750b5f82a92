//! The benchmark's streams: one large object written and read through an endpoint of 4 MiB
//! buffers (bulk streams), a server stream of 64 B messages, and the process's memory growth
//! while the object streams. The service is written against the runtime's `Service` trait:
//! handlers that only account for bytes, as the other benchmark handlers do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rdma_rpc_core::codegen::{decode_request, encode_message, mismatched_call};
use rdma_rpc_core::service::{EndpointDef, OpKind, ServerCall, Service, StreamKind};
use rdma_rpc_core::transport::BoxFuture;
use rdma_rpc_core::{Client, MemoryRegion, Status};
use serde::Serialize;

use super::measure::BenchError;
use super::service::Len;

/// Chunk size of the bulk streams: the endpoint's buffer.
pub const STREAM_BUFFER: u64 = 4 << 20;
/// Most bytes one bulk stream of the benchmark moves.
pub const STREAM_MAX: u64 = 2 << 30;
/// Bytes of each streamed message, as encoded.
pub const MESSAGE: usize = 64;

const fn ep(op: OpKind, path: &'static str, buffer_size: u64, stream: StreamKind) -> EndpointDef {
    EndpointDef {
        path,
        op,
        buffer_size,
        method: "stream",
        timeout_ms: None,
        stream,
    }
}

const WRITE: usize = 0;
const READ: usize = 1;
const MESSAGES: usize = 2;

/// The streaming endpoints of the benchmark.
pub static ENDPOINTS: &[EndpointDef] = &[
    ep(
        OpKind::Write,
        "/bench/stream",
        STREAM_BUFFER,
        StreamKind::Bulk {
            max_len: STREAM_MAX,
        },
    ),
    ep(
        OpKind::Read,
        "/bench/stream",
        STREAM_BUFFER,
        StreamKind::Bulk {
            max_len: STREAM_MAX,
        },
    ),
    ep(
        OpKind::Receive,
        "/bench/messages",
        4096,
        StreamKind::Messages {
            requests: false,
            responses: true,
        },
    ),
];

/// Takes and makes streams without touching their bytes.
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamSink;

/// A message of [`MESSAGE`] bytes as encoded (a `bytes` field of 62).
fn message() -> Bytes {
    let mut m = vec![0x0a, (MESSAGE - 2) as u8];
    m.resize(MESSAGE, 0x5a);
    Bytes::from(m)
}

impl Service for StreamSink {
    fn name(&self) -> &'static str {
        "BenchStreams"
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
            (WRITE, ServerCall::InboundStream { mut chunks, .. }) => Box::pin(async move {
                let mut len = 0;
                while let Some(chunk) = chunks.chunk().await? {
                    len += chunk.len() as u64;
                }
                Ok(encode_message(&Len { len }))
            }),
            (READ, ServerCall::OutboundStream { request, sink }) => Box::pin(async move {
                let len = decode_request::<Len>(request)?.into_inner().len;
                let mut left = len;
                while left > 0 {
                    let mut buf = sink.buffer().await?;
                    let n = left.min(buf.capacity() as u64);
                    // The pool buffer's bytes go as they are: the benchmark measures moving them.
                    buf.set_len(n as usize);
                    sink.send(buf).await?;
                    left -= n;
                }
                Ok(encode_message(&Len { len }))
            }),
            (
                MESSAGES,
                ServerCall::Streaming {
                    request,
                    responses: Some(sink),
                    ..
                },
            ) => Box::pin(async move {
                let count = decode_request::<Len>(request)?.into_inner().len;
                let message = message();
                for _ in 0..count {
                    sink.send_raw(message.clone()).await?;
                }
                Ok(Bytes::new())
            }),
            (index, call) => mismatched_call("BenchStreams", index, call),
        }
    }
}

/// What the streams measured.
#[derive(Debug, Clone, Serialize)]
pub struct StreamFigures {
    /// Bytes of the object streamed each way.
    pub object_bytes: u64,
    /// The object written from a memory region's lease (offered in place), GB/s.
    pub write_gb_per_s: f64,
    /// The object written from plain `Bytes` (staged a chunk at a time), GB/s.
    pub write_staged_gb_per_s: f64,
    /// The object read as a stream of chunks, each dropped once counted, GB/s.
    pub read_gb_per_s: f64,
    /// Growth of this process's resident memory (server and client together) while the
    /// object streamed, MiB.
    pub rss_growth_mib: f64,
    /// The stream path's pool budget on the server, MiB.
    pub pool_budget_mib: f64,
    /// Memory the client's stream windows hold at most, MiB.
    pub client_windows_mib: f64,
    /// The same object written as 4 MiB write calls with the bench's depth in flight, each
    /// from its own part of the object's region (so that the source is as large, and as far
    /// from the CPU caches, as the stream's), GB/s; `None` where not measured.
    #[serde(default)]
    pub calls_over_object_gb_per_s: Option<f64>,
    /// Messages of 64 B streamed by the server in one call.
    pub messages: u64,
    /// Those messages per second.
    pub messages_per_s: f64,
}

/// The resident memory of this process now, in MiB (Linux; 0 elsewhere).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0 / (1024.0 * 1024.0))
}

/// Samples the resident memory every 2 ms from a thread of its own until dropped; the largest
/// sample is kept.
struct RssWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<f64>>,
}

impl RssWatch {
    fn start() -> RssWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = rss_mib();
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(rss_mib());
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak.max(rss_mib())
        });
        RssWatch {
            stop,
            thread: Some(thread),
        }
    }

    fn peak(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or(0.0)
    }
}

/// Streams an object of `object` bytes each way and `messages` messages, on `client`, whose
/// server serves [`StreamSink`] with a pool of `pool_budget` bytes for the stream path.
pub async fn measure(
    client: &Client,
    object: u64,
    messages: u64,
    pool_budget: usize,
    depth: usize,
) -> Result<StreamFigures, BenchError> {
    let write = |data: Bytes| {
        let client = client.clone();
        async move {
            let len = data.len() as u64;
            let (response, _) = client
                .call_raw(
                    &ENDPOINTS[WRITE],
                    encode_message(&Len { len }),
                    Some(data),
                    None,
                )
                .await?;
            let got: Len = prost::Message::decode(response)?;
            if got.len != len {
                return Err(format!("the write stream moved {} bytes of {len}", got.len).into());
            }
            Ok::<_, BenchError>(())
        }
    };
    let read = || async {
        let mut stream = client
            .call_raw_read_stream(&ENDPOINTS[READ], encode_message(&Len { len: object }), None)
            .await?;
        let mut got = 0;
        while let Some(chunk) = stream.chunk().await? {
            got += chunk.len() as u64;
        }
        if got != object {
            return Err(format!("the read stream moved {got} bytes of {object}").into());
        }
        Ok::<_, BenchError>(())
    };
    // Everything the object needs is in place before the clock and the memory watch start.
    let region = MemoryRegion::new(object as usize)?;
    let mut lease = region.lease(0, object as usize)?;
    lease.fill_from(&vec![0x5a; object as usize])?;
    let in_place = lease.freeze();
    let plain = Bytes::from(vec![0x5a; object as usize]);
    // Warm-up: pools, staging and the connection's receives.
    write(plain.slice(..(8 * STREAM_BUFFER as usize).min(plain.len()))).await?;

    let before = rss_mib();
    let watch = RssWatch::start();
    let started = Instant::now();
    write(in_place.clone()).await?;
    let write_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    write(plain.clone()).await?;
    let staged_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    read().await?;
    let read_secs = started.elapsed().as_secs_f64();
    let peak = watch.peak();

    let count = || async {
        let mut stream = client
            .call_raw_server_stream(
                &ENDPOINTS[MESSAGES],
                encode_message(&Len { len: messages }),
                None,
                None,
            )
            .await?;
        let mut got = 0u64;
        while stream.message().await?.is_some() {
            got += 1;
        }
        if got != messages {
            return Err(format!("{got} messages of {messages}").into());
        }
        Ok::<_, BenchError>(())
    };
    count().await?;
    let started = Instant::now();
    count().await?;
    let messages_secs = started.elapsed().as_secs_f64();

    let gb = |secs: f64| object as f64 / secs.max(1e-9) / 1e9;
    Ok(StreamFigures {
        object_bytes: object,
        write_gb_per_s: gb(write_secs),
        write_staged_gb_per_s: gb(staged_secs),
        read_gb_per_s: gb(read_secs),
        rss_growth_mib: (peak - before).max(0.0),
        pool_budget_mib: pool_budget as f64 / (1024.0 * 1024.0),
        client_windows_mib: (depth as u64 * STREAM_BUFFER) as f64 / (1024.0 * 1024.0),
        calls_over_object_gb_per_s: None,
        messages,
        messages_per_s: messages as f64 / messages_secs.max(1e-9),
    })
}
