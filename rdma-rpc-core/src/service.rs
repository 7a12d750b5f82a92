//! The service abstraction: what a server runs and what generated code implements.
//!
//! A service is a table of endpoints ([`EndpointDef`]: path, operation, buffer size) and one
//! [`Service::call`] that runs the handler of an endpoint. `rdma-rpc-codegen` writes an
//! implementation for each spec (the `<Name>Server<T>` adapter); it can also be written by
//! hand, as `examples/src/hand_written.rs` shows.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::memory::RegisteredBuf;
use crate::metadata::Metadata;
use crate::protocol::mailbox::EndSignal;
use crate::remote::RemoteMemory;
use crate::server::ClientEvent;
use crate::status::Status;
use crate::transport::{BoxFuture, PeerIdentity};

/// The operation of an endpoint, named from the client's side (as in doca-cpp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// The client sends a message (bytes and metadata) to the server.
    Send,
    /// The client asks and the server sends a message back.
    Receive,
    /// The client RDMA-writes bytes into a server buffer; the handler runs on them.
    Write,
    /// The handler fills a server buffer; the client RDMA-reads it.
    Read,
}

impl OpKind {
    /// The wire number (doca-cpp's opcodes: send 1, receive 2, write 3, read 4).
    pub const fn as_u32(self) -> u32 {
        match self {
            OpKind::Send => 1,
            OpKind::Receive => 2,
            OpKind::Write => 3,
            OpKind::Read => 4,
        }
    }

    /// From the wire number.
    pub const fn from_u32(v: u32) -> Option<OpKind> {
        match v {
            1 => Some(OpKind::Send),
            2 => Some(OpKind::Receive),
            3 => Some(OpKind::Write),
            4 => Some(OpKind::Read),
            _ => None,
        }
    }

    /// The spec name: `send`, `receive`, `write` or `read`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::Receive => "receive",
            OpKind::Write => "write",
            OpKind::Read => "read",
        }
    }

    /// Whether bytes flow from the client to the server (send, write).
    pub const fn is_inbound(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Write)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Whether and how an endpoint's calls stream (`stream:` in the spec; see docs/spec.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamKind {
    /// One request and one response, and at most one buffer of bytes.
    #[default]
    Unary,
    /// Write and read endpoints: the payload moves through the endpoint's buffers in chunks
    /// of at most `buffer_size`, several in flight, up to `max_len` bytes in all.
    Bulk {
        /// The most bytes one call moves.
        max_len: u64,
    },
    /// Send and receive endpoints: the client sends a stream of request messages
    /// (`requests`), the server a stream of response messages (`responses`), or both.
    Messages {
        /// The client streams its requests.
        requests: bool,
        /// The server streams its responses.
        responses: bool,
    },
}

impl StreamKind {
    /// Whether calls stream at all.
    pub const fn is_streaming(self) -> bool {
        !matches!(self, StreamKind::Unary)
    }
}

/// One endpoint: a path and an operation, with the size of its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointDef {
    /// The path, for example `/rdma/ep0`.
    pub path: &'static str,
    /// The operation.
    pub op: OpKind,
    /// Size of the server buffer of this endpoint: the most bytes one call moves.
    pub buffer_size: u64,
    /// The Rust method name (for messages).
    pub method: &'static str,
    /// Default deadline of a call, in milliseconds, if the spec gives one.
    pub timeout_ms: Option<u64>,
    /// Whether and how its calls stream.
    pub stream: StreamKind,
}

impl EndpointDef {
    /// The default deadline, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }

    /// The most payload bytes one call moves: the buffer's size, or a bulk stream's limit.
    pub fn max_payload(&self) -> u64 {
        match self.stream {
            StreamKind::Bulk { max_len } => max_len,
            _ => self.buffer_size,
        }
    }

    /// Whether the client streams request messages.
    pub(crate) fn streams_requests(&self) -> bool {
        matches!(self.stream, StreamKind::Messages { requests: true, .. })
    }

    /// Whether the server streams response messages.
    pub(crate) fn streams_responses(&self) -> bool {
        matches!(
            self.stream,
            StreamKind::Messages {
                responses: true,
                ..
            }
        )
    }

    /// Whether the endpoint is a bulk stream.
    pub(crate) fn is_bulk(&self) -> bool {
        matches!(self.stream, StreamKind::Bulk { .. })
    }

    /// Why this definition cannot be served or called, if it cannot: a stream kind its
    /// operation does not carry, a bulk stream without room for a chunk.
    pub fn check(&self) -> Result<(), String> {
        let (op, path) = (self.op, self.path);
        match self.stream {
            StreamKind::Unary => Ok(()),
            StreamKind::Bulk { .. } if !matches!(op, OpKind::Write | OpKind::Read) => Err(format!(
                "{op} {path}: bulk streams are for write and read endpoints"
            )),
            StreamKind::Bulk { .. } if self.buffer_size == 0 => Err(format!(
                "{op} {path}: a bulk stream needs a buffer to move its chunks through"
            )),
            StreamKind::Bulk { max_len } if max_len < self.buffer_size => Err(format!(
                "{op} {path}: the stream's max_len ({max_len}) is smaller than its buffer ({})",
                self.buffer_size
            )),
            StreamKind::Messages { .. } if !matches!(op, OpKind::Send | OpKind::Receive) => Err(
                format!("{op} {path}: message streams are for send and receive endpoints"),
            ),
            StreamKind::Messages {
                requests: false,
                responses: false,
            } => Err(format!(
                "{op} {path}: a message stream streams one way at least"
            )),
            _ => Ok(()),
        }
    }
}

/// What a handler can learn about its call while it runs (server side): whether the call is
/// over, when it must be done, and how large its response message may be.
///
/// A call ends early when the client cancels it (it dropped the call, or its own deadline
/// passed), when its deadline passes on the server (the client's, or the endpoint's `timeout:`
/// when the client gave none, capped by
/// [`ServerConfig::max_call_duration`](crate::ServerConfig)), or
/// when its connection ends. The server then drops the handler's future, as tonic does, and
/// answers `CANCELLED` or `DEADLINE_EXCEEDED`. Work the handler spawned is not dropped with it:
/// [`cancelled`](Self::cancelled) tells it to stop.
#[derive(Clone)]
pub struct CallContext {
    /// The call's mailbox: its end, and its limits.
    end: EndSignal<ClientEvent>,
}

impl CallContext {
    pub(crate) fn new(end: EndSignal<ClientEvent>) -> CallContext {
        CallContext { end }
    }

    fn at(&self) -> Option<tokio::time::Instant> {
        self.end.limits().deadline.map(|d| d.at)
    }

    /// The call's deadline on the server, if it has one.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.at().map(tokio::time::Instant::into_std)
    }

    /// The deadline as the runtime's timers keep it.
    pub(crate) fn deadline_at(&self) -> Option<tokio::time::Instant> {
        self.at()
    }

    /// Time left until the deadline (zero once it passed), if the call has one.
    pub fn time_left(&self) -> Option<Duration> {
        self.at()
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// Whether the call is over early: cancelled by the client, past its deadline, or its
    /// connection ended.
    pub fn is_cancelled(&self) -> bool {
        self.end.ended().is_some() || self.at().is_some_and(|d| d <= tokio::time::Instant::now())
    }

    /// Resolves once the call is over early (see [`is_cancelled`](Self::is_cancelled)); never,
    /// for a call that ends with its answer. For work a handler spawned: the handler's own
    /// future is dropped at that moment anyway.
    pub async fn cancelled(&self) {
        match self.at() {
            Some(at) => {
                tokio::select! {
                    _ = self.end.wait() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => {
                self.end.wait().await;
            }
        }
    }

    /// The most bytes the response message may encode to: the connection's frame, less what
    /// wraps the message, and on `send` and `receive` endpoints the endpoint's buffer as well.
    /// A larger response fails the call with `RESOURCE_EXHAUSTED` after the handler ran, so a
    /// handler that changes state checks first (`prost::Message::encoded_len`).
    pub fn max_response_len(&self) -> usize {
        self.end.limits().max_response_len
    }
}

impl fmt::Debug for CallContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallContext")
            .field("time_left", &self.time_left())
            .field("cancelled", &self.is_cancelled())
            .field("max_response_len", &self.max_response_len())
            .finish()
    }
}

/// A request as a handler sees it: a message plus call information.
#[derive(Debug, Clone)]
pub struct Request<T> {
    message: T,
    timeout: Option<Duration>,
    metadata: Metadata,
    /// Server side: the call's connection and the call itself.
    served: Option<Served>,
}

impl<T> Request<T> {
    /// A request carrying `message`.
    pub fn new(message: T) -> Request<T> {
        Request {
            message,
            timeout: None,
            metadata: Metadata::new(),
            served: None,
        }
    }

    /// Sets a deadline for the call (client side); it overrides the endpoint's default.
    pub fn with_timeout(mut self, timeout: Duration) -> Request<T> {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the deadline (client side).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = Some(timeout);
    }

    /// The deadline: on the client, what was set; on the server, the time the client has
    /// left, as it said when sending.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The call's metadata: on the client, what the call will carry; on the server, what the
    /// client sent (after the server's interceptors).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The call's metadata, to add to (client side): `request.metadata_mut().insert("k", "v")`.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// The call's metadata, by value.
    pub fn into_metadata(self) -> Metadata {
        self.metadata
    }

    /// The message and the call's options (deadline and metadata), for a client call.
    pub(crate) fn into_call(self) -> (T, crate::client::CallOptions) {
        let options = crate::client::CallOptions {
            timeout: self.timeout,
            metadata: self.metadata,
        };
        (self.message, options)
    }

    /// The peer's address (server side).
    pub fn peer(&self) -> Option<&str> {
        self.served.as_ref().map(|s| &*s.conn.call_conn().peer)
    }

    /// Who the client proved to be (server side): its certificate, over `tls://` with client
    /// certificates (mutual TLS); `None` otherwise. See [`PeerIdentity`].
    pub fn peer_identity(&self) -> Option<&PeerIdentity> {
        self.served
            .as_ref()?
            .conn
            .call_conn()
            .peer_identity
            .as_deref()
    }

    /// The connection's remote memory (server side): to use the [`RemoteBuf`]s of the request
    /// (read, write, atomics) and to offer memory of the server's own.
    ///
    /// [`RemoteBuf`]: crate::RemoteBuf
    pub fn remote_memory(&self) -> Option<&RemoteMemory> {
        self.served.as_ref().map(Served::remote_memory)
    }

    /// What the handler can learn about its call while it runs (server side): whether it
    /// is over, its deadline, the size its response may have. See [`CallContext`].
    pub fn context(&self) -> Option<&CallContext> {
        self.served.as_ref().map(|s| &s.context)
    }

    /// Resolves once the call is over early: the client cancelled it, its deadline passed, or
    /// its connection ended (server side; never on the client). See [`CallContext`].
    pub async fn cancelled(&self) {
        match &self.served {
            Some(served) => served.context.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// The most bytes the response message may encode to (server side), to check before a
    /// handler changes state. See [`CallContext::max_response_len`].
    pub fn max_response_len(&self) -> Option<usize> {
        self.context().map(CallContext::max_response_len)
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, mutable.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// The message, by value.
    pub fn into_inner(self) -> T {
        self.message
    }

    pub(crate) fn from_parts(message: T, raw: RawRequest) -> Request<T> {
        Request {
            message,
            timeout: raw.timeout,
            metadata: raw.metadata,
            served: Some(raw.served),
        }
    }
}

/// Anything a client method accepts as a request: a message, or a [`Request`] with options.
pub trait IntoRequest<T> {
    /// Wraps into a [`Request`].
    fn into_request(self) -> Request<T>;
}

impl<T> IntoRequest<T> for T {
    fn into_request(self) -> Request<T> {
        Request::new(self)
    }
}

impl<T> IntoRequest<T> for Request<T> {
    fn into_request(self) -> Request<T> {
        self
    }
}

/// Anything a client method of a streaming endpoint accepts as its request stream: a
/// [`Stream`](futures_core::Stream) of messages, or a [`Request`] wrapping one (to set a
/// deadline or metadata), as tonic's `IntoStreamingRequest`.
pub trait IntoStreamingRequest {
    /// The messages.
    type Message: prost::Message + 'static;
    /// The stream of them.
    type Stream: futures_core::Stream<Item = Self::Message> + Send + 'static;

    /// Wraps into a [`Request`].
    fn into_streaming_request(self) -> Request<Self::Stream>;
}

impl<S, M> IntoStreamingRequest for S
where
    S: futures_core::Stream<Item = M> + Send + 'static,
    M: prost::Message + 'static,
{
    type Message = M;
    type Stream = S;

    fn into_streaming_request(self) -> Request<S> {
        Request::new(self)
    }
}

impl<S, M> IntoStreamingRequest for Request<S>
where
    S: futures_core::Stream<Item = M> + Send + 'static,
    M: prost::Message + 'static,
{
    type Message = M;
    type Stream = S;

    fn into_streaming_request(self) -> Request<S> {
        self
    }
}

/// A request before its metadata is decoded.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RawRequest {
    /// The encoded request message (prost).
    pub message: Bytes,
    /// The call's metadata, as the client sent it and the server's interceptors left it.
    pub metadata: Metadata,
    /// The time the client has left, if it set a deadline.
    pub timeout: Option<Duration>,
    /// The call's connection (its peer, the peer's identity, its remote memory) and the call
    /// itself (its end, its deadline, its response's limit).
    served: Served,
}

impl RawRequest {
    pub(crate) fn new(
        message: Bytes,
        metadata: Metadata,
        timeout: Option<Duration>,
        conn: Arc<dyn HasCallConn>,
        context: CallContext,
    ) -> RawRequest {
        RawRequest {
            message,
            metadata,
            timeout,
            served: Served {
                conn,
                context,
                remote: std::sync::OnceLock::new(),
            },
        }
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.served.conn.call_conn().peer
    }

    /// Who the peer proved to be (mutual TLS); `None` otherwise. See [`PeerIdentity`].
    pub fn peer_identity(&self) -> Option<&PeerIdentity> {
        self.served.conn.call_conn().peer_identity.as_deref()
    }

    /// The connection's remote memory, its operations bounded by this call's deadline (see
    /// [`Request::remote_memory`]).
    pub fn remote_memory(&self) -> &RemoteMemory {
        self.served.remote_memory()
    }

    /// The call while it runs: its end, its deadline, its response's limit.
    pub fn context(&self) -> &CallContext {
        &self.served.context
    }
}

/// What a request on a server knows of its call: the connection's part, shared by its
/// calls (one reference to count per call, not one per field), and the call's own.
#[derive(Debug, Clone)]
struct Served {
    conn: Arc<dyn HasCallConn>,
    context: CallContext,
    /// The connection's remote memory as this call uses it, made when first asked for (most
    /// calls never ask: making it costs two references counted).
    remote: std::sync::OnceLock<RemoteMemory>,
}

impl Served {
    fn remote_memory(&self) -> &RemoteMemory {
        self.remote
            .get_or_init(|| self.conn.call_conn().remote.for_call(self.context.clone()))
    }
}

/// What holds a connection's [`CallConn`]: the server's state of the connection, whose one
/// reference a request shares with its call (one count per call, on a line the call touches
/// anyway, where a reference of its own cost another line per call among many connections).
pub(crate) trait HasCallConn: Send + Sync + std::fmt::Debug {
    fn call_conn(&self) -> &CallConn;
}

/// What the calls of one server connection tell their handlers of it.
#[derive(Debug)]
pub(crate) struct CallConn {
    /// The client's address.
    pub(crate) peer: Arc<str>,
    /// Who the client proved to be (TLS).
    pub(crate) peer_identity: Option<Arc<PeerIdentity>>,
    /// Offers both ways on this connection.
    pub(crate) remote: RemoteMemory,
}

/// What a service's [`call`](Service::call) gets, by operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServerCall<'a> {
    /// Send and write endpoints: the bytes the client moved (the whole payload, never
    /// partial). The `Bytes` may refer to a pooled server buffer: keeping it keeps the buffer.
    Inbound {
        /// The request.
        request: RawRequest,
        /// The bytes received.
        data: Bytes,
    },
    /// Receive and read endpoints: fill `buf` (its capacity is the endpoint's buffer size; set
    /// its length with `set_len` or `fill_from`); the client gets `buf.as_slice()`.
    Outbound {
        /// The request.
        request: RawRequest,
        /// The server buffer to fill.
        buf: &'a mut RegisteredBuf,
    },
    /// Message-streaming endpoints (send and receive): the client's messages, when it streams
    /// them, and where the handler's go, when it streams them. The call's answer is the
    /// response message (empty when the responses stream).
    Streaming {
        /// The request (its message is empty when the client streams its requests).
        request: RawRequest,
        /// The client's messages, when it streams them.
        requests: Option<crate::stream::MessageStream>,
        /// Where the handler's messages go, when it streams them.
        responses: Option<&'a mut crate::stream::MessageSink>,
    },
    /// Bulk write streams: the payload, in chunks as they arrive.
    InboundStream {
        /// The request.
        request: RawRequest,
        /// The payload's chunks.
        chunks: crate::stream::Chunks,
    },
    /// Bulk read streams: the handler sends its chunks into `sink`.
    OutboundStream {
        /// The request.
        request: RawRequest,
        /// Where the chunks go.
        sink: &'a mut crate::stream::ChunkSink,
    },
}

/// A service a [`Server`](crate::Server) can run.
pub trait Service: Send + Sync + 'static {
    /// The service name (for messages and listings).
    fn name(&self) -> &'static str;

    /// The endpoints. Each (path, operation) pair appears once.
    fn endpoints(&self) -> &'static [EndpointDef];

    /// Runs the handler of `self.endpoints()[index]`. Returns the encoded response message.
    fn call<'a>(
        &'a self,
        index: usize,
        call: ServerCall<'a>,
    ) -> BoxFuture<'a, Result<Bytes, Status>>;
}
