//! A hand-written test service covering every operation, written the way generated code is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::codegen::{decode_request, encode_message, mismatched_call};
use crate::service::{EndpointDef, OpKind, ServerCall, Service};
use crate::status::Status;
use crate::transport::BoxFuture;

/// Request metadata of every test endpoint.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TestRequest {
    /// Bytes expected (inbound) or to produce (outbound).
    #[prost(uint64, tag = "1")]
    pub(crate) len: u64,
    /// Seed of the byte pattern.
    #[prost(uint32, tag = "2")]
    pub(crate) seed: u32,
    /// The handler waits until the test opens the service's gate ([`TestService::open_gate`]).
    #[prost(bool, tag = "4")]
    pub(crate) gated: bool,
    /// The handler keeps the payload it got ([`TestService::kept`]).
    #[prost(bool, tag = "5")]
    pub(crate) keep: bool,
    /// The handler pads its response message with this many bytes.
    #[prost(uint64, tag = "6")]
    pub(crate) pad_response: u64,
    /// The handler fails with an `INTERNAL` status whose message has this many bytes.
    #[prost(uint64, tag = "7")]
    pub(crate) fail_with: u64,
    /// The handler spawns a task that waits for the call's end (`Request::cancelled`) and
    /// counts it ([`TestService::saw_cancel`]).
    #[prost(bool, tag = "8")]
    pub(crate) watch_cancel: bool,
}

/// Response metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TestResponse {
    /// Bytes the handler saw or produced.
    #[prost(uint64, tag = "1")]
    pub(crate) len: u64,
    /// Whether inbound bytes matched the pattern exactly.
    #[prost(bool, tag = "2")]
    pub(crate) exact: bool,
    /// `pad_response` bytes.
    #[prost(bytes = "vec", tag = "3")]
    pub(crate) padding: Vec<u8>,
}

pub(crate) const MAX: u64 = 16 << 20;

pub(crate) static ENDPOINTS: &[EndpointDef] = &[
    EndpointDef {
        path: "/blob",
        op: OpKind::Write,
        buffer_size: MAX,
        method: "blob_write",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    },
    EndpointDef {
        path: "/blob",
        op: OpKind::Read,
        buffer_size: MAX,
        method: "blob_read",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    },
    EndpointDef {
        path: "/msg",
        op: OpKind::Send,
        buffer_size: MAX,
        method: "msg_send",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    },
    EndpointDef {
        path: "/msg",
        op: OpKind::Receive,
        buffer_size: MAX,
        method: "msg_receive",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    },
    EndpointDef {
        path: "/small",
        op: OpKind::Write,
        buffer_size: 1024,
        method: "small_write",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    },
    EndpointDef {
        path: "/panic",
        op: OpKind::Send,
        buffer_size: 64,
        method: "panic_send",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    },
    EndpointDef {
        path: "/tiny",
        op: OpKind::Receive,
        buffer_size: 4096,
        method: "tiny_receive",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    },
];

/// Index of `/tiny` (receive, a 4 KiB buffer, so messages of at most 4 KiB).
pub(crate) const TINY_RECEIVE: usize = 6;

/// The deterministic bytes of a test transfer: up to 4 KiB, pseudo-random bytes of `seed`;
/// longer, 4 KiB blocks that are copies of the first with their first 8 bytes XORed with the
/// block's number, so a block out of place, or another seed's, shows. Any length is a prefix
/// of every longer one. Built by copies: a byte-at-a-time generator took a third of this
/// crate's unit-test time in debug builds (its transfers reach 16 MiB, over eight transports).
pub(crate) fn pattern(len: usize, seed: u32) -> Vec<u8> {
    const BLOCK: usize = 4096;
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let first: Vec<u8> = (0..len.min(BLOCK))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    if len <= BLOCK {
        return first;
    }
    let mut out = Vec::with_capacity(len);
    let mut block = first;
    let head = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
    let mut n = 0u64;
    while out.len() < len {
        block[..8].copy_from_slice(&(head ^ n).to_le_bytes());
        let take = (len - out.len()).min(BLOCK);
        out.extend_from_slice(&block[..take]);
        n += 1;
    }
    out
}

/// Counts handler runs, to prove which ran and which did not.
#[derive(Clone)]
pub(crate) struct TestService {
    pub(crate) inbound_runs: Arc<AtomicUsize>,
    pub(crate) outbound_runs: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    /// Handler runs started (inbound and outbound).
    entered: Arc<tokio::sync::watch::Sender<usize>>,
    /// Payloads handlers kept, as they hold them.
    pub(crate) kept: Arc<std::sync::Mutex<Vec<Bytes>>>,
    /// The metadata of every inbound call that carried some, as its handler saw it.
    pub(crate) metadata_seen: Arc<std::sync::Mutex<Vec<crate::Metadata>>>,
    /// Handlers stopped (their future dropped) while they waited: proof that a cancelled or
    /// timed-out call's handler does not run on.
    pub(crate) dropped: Arc<tokio::sync::watch::Sender<usize>>,
    /// Tasks spawned by handlers (`watch_cancel`) that saw their call end early.
    pub(crate) saw_cancel: Arc<tokio::sync::watch::Sender<usize>>,
    /// `Request::max_response_len` as each handler saw it.
    pub(crate) max_response_seen: Arc<std::sync::Mutex<Vec<usize>>>,
    /// `Request::peer_identity` as the last handler saw it.
    pub(crate) identity_seen: Arc<std::sync::Mutex<Option<crate::PeerIdentity>>>,
}

/// Counts a handler's future dropped before it went past its wait.
struct DroppedWhileWaiting(Option<Arc<tokio::sync::watch::Sender<usize>>>);

impl Drop for DroppedWhileWaiting {
    fn drop(&mut self) {
        if let Some(count) = self.0.take() {
            count.send_modify(|n| *n += 1);
        }
    }
}

impl Default for TestService {
    fn default() -> Self {
        TestService {
            inbound_runs: Arc::default(),
            outbound_runs: Arc::default(),
            gate: Arc::new(tokio::sync::watch::channel(false).0),
            entered: Arc::new(tokio::sync::watch::channel(0).0),
            kept: Arc::default(),
            metadata_seen: Arc::default(),
            dropped: Arc::new(tokio::sync::watch::channel(0).0),
            saw_cancel: Arc::new(tokio::sync::watch::channel(0).0),
            max_response_seen: Arc::default(),
            identity_seen: Arc::default(),
        }
    }
}

impl TestService {
    /// Lets every gated handler (now and later) go on.
    pub(crate) fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// Makes gated handlers wait again (until the next [`open_gate`](Self::open_gate)).
    #[cfg_attr(not(feature = "doca"), allow(dead_code))] // the registration tests
    pub(crate) fn close_gate(&self) {
        self.gate.send_replace(false);
    }

    /// Handler runs started so far.
    pub(crate) fn entered_now(&self) -> usize {
        *self.entered.borrow()
    }

    /// This service's gate and count of runs, for another test service to share.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))] // the registration tests
    pub(crate) fn gate_parts(
        &self,
    ) -> (
        Arc<tokio::sync::watch::Sender<bool>>,
        Arc<tokio::sync::watch::Sender<usize>>,
    ) {
        (self.gate.clone(), self.entered.clone())
    }

    /// Waits until `n` handler runs have started.
    pub(crate) async fn entered(&self, n: usize) {
        let _ = self.entered.subscribe().wait_for(|runs| *runs >= n).await;
    }

    /// Waits until `n` handlers were stopped while they waited.
    pub(crate) async fn dropped(&self, n: usize) {
        let _ = self.dropped.subscribe().wait_for(|d| *d >= n).await;
    }

    /// Waits until `n` spawned watchers saw their call end early.
    pub(crate) async fn saw_cancel(&self, n: usize) {
        let _ = self.saw_cancel.subscribe().wait_for(|d| *d >= n).await;
    }

    /// What a handler does first with its request's context: records the response's limit,
    /// and with `watch_cancel` spawns a task that waits for the call's end.
    fn look_at<T>(&self, request: &crate::Request<T>, req: &TestRequest) {
        if let Some(max) = request.max_response_len() {
            self.max_response_seen.lock().unwrap().push(max);
        }
        *self.identity_seen.lock().unwrap() = request.peer_identity().cloned();
        if req.watch_cancel {
            let context = request.context().expect("server side").clone();
            let saw = self.saw_cancel.clone();
            tokio::spawn(async move {
                context.cancelled().await;
                assert!(context.is_cancelled());
                saw.send_modify(|n| *n += 1);
            });
        }
    }

    async fn wait(&self, req: &TestRequest) {
        self.entered.send_modify(|runs| *runs += 1);
        let mut dropped = DroppedWhileWaiting(Some(self.dropped.clone()));
        if req.gated {
            let _ = self.gate.subscribe().wait_for(|open| *open).await;
        }
        dropped.0 = None;
    }

    async fn inbound(&self, req: TestRequest, data: Bytes) -> Result<TestResponse, Status> {
        self.inbound_runs.fetch_add(1, Ordering::SeqCst);
        self.wait(&req).await;
        if req.fail_with > 0 {
            return Err(Status::internal("x".repeat(req.fail_with as usize)));
        }
        let exact = data.len() as u64 == req.len && data[..] == pattern(data.len(), req.seed)[..];
        let len = data.len() as u64;
        if req.keep {
            self.kept.lock().unwrap().push(data);
        }
        let padding = vec![0x5a; req.pad_response as usize];
        Ok(TestResponse {
            len,
            exact,
            padding,
        })
    }

    async fn outbound(
        &self,
        req: TestRequest,
        buf: &mut crate::RegisteredBuf,
    ) -> Result<TestResponse, Status> {
        self.outbound_runs.fetch_add(1, Ordering::SeqCst);
        self.wait(&req).await;
        if req.len > buf.capacity() as u64 {
            return Err(Status::out_of_range(format!(
                "asked for {} bytes, the buffer holds {}",
                req.len,
                buf.capacity()
            )));
        }
        buf.fill_from(&pattern(req.len as usize, req.seed))
            .map_err(Status::from)?;
        Ok(TestResponse {
            len: req.len,
            exact: true,
            padding: vec![0x5a; req.pad_response as usize],
        })
    }
}

impl Service for TestService {
    fn name(&self) -> &'static str {
        "TestService"
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
            (0 | 2 | 4, ServerCall::Inbound { request, data }) => Box::pin(async move {
                let request = decode_request::<TestRequest>(request)?;
                if !request.metadata().is_empty() {
                    let seen = request.metadata().clone();
                    self.metadata_seen.lock().unwrap().push(seen);
                }
                self.look_at(&request, request.get_ref());
                let response = self.inbound(request.into_inner(), data).await?;
                Ok(encode_message(&response))
            }),
            (1 | 3 | 6, ServerCall::Outbound { request, buf }) => Box::pin(async move {
                let request = decode_request::<TestRequest>(request)?;
                self.look_at(&request, request.get_ref());
                let response = self.outbound(request.into_inner(), buf).await?;
                Ok(encode_message(&response))
            }),
            // Panics at once, or (gated) after waiting, on a task of its own.
            (5, ServerCall::Inbound { request, .. }) => Box::pin(async move {
                let request = decode_request::<TestRequest>(request)?;
                self.wait(request.get_ref()).await;
                panic!("the handler panics on purpose")
            }),
            (index, call) => mismatched_call("TestService", index, call),
        }
    }
}

/// What the tests rely on in [`pattern`]: lengths are prefixes of each other, seeds differ,
/// and no 4 KiB block of a long transfer equals another (a block out of place shows).
#[test]
fn patterns_are_prefixes_and_their_blocks_differ() {
    let long = pattern(5 * 4096 + 100, 7);
    for len in [0, 1, 8, 4095, 4096, 4097, 3 * 4096, 5 * 4096 + 100] {
        assert_eq!(pattern(len, 7)[..], long[..len], "{len}");
    }
    assert_ne!(pattern(64, 7), pattern(64, 8));
    let blocks: Vec<&[u8]> = long.chunks(4096).take(5).collect();
    for (i, a) in blocks.iter().enumerate() {
        for b in &blocks[i + 1..] {
            assert_ne!(a, b);
        }
    }
}
