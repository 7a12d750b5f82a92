//! The client side of streaming calls (the server side is in `server/stream.rs`; the rules in
//! `protocol::stream`).
//!
//! - Message streams: the request is sent at once; the client's messages follow in
//!   `Messages` frames within the server's window ([`MessageSink`]), the last one marked as
//!   the end, and the server's messages arrive into this client's window
//!   ([`MessageStream`]) until the response ends the call.
//! - Bulk write streams: the request offers the first windows of the payload, a window per
//!   chunk copied into staging memory (or, for bytes frozen from a memory region over a
//!   transport that fences, one window of the whole payload, no copy); as the server reports
//!   windows read, their memory takes the next chunk and is offered again.
//! - Bulk read streams: the request offers `stream_depth` empty windows of one chunk each; each
//!   chunk the server reports written in one is handed to the caller (without a copy where the
//!   transport fences) and a fresh window is offered in its place.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;

use super::read_stream::ReadStream;
use super::{CallOptions, Client, Inner};
use crate::memory::Access;
use crate::protocol::frames::{
    ChunksFrame, DescriptorFrame, Kind, RequestFrame, ResponseFrame, WindowOffer,
};
use crate::protocol::stream::{Direction, Window};
use crate::service::EndpointDef;
use crate::status::Status;
use crate::stream::{MessageSink, MessageStream, Setup, StreamCell};
use crate::transport::{Fencing, Grant};

/// A streaming call in flight, owned by whatever the caller holds (a stream, a future). Dropped
/// before the server's response, it cancels the call; the windows it offered stay open until
/// that response, since the server may still be using them.
pub(crate) struct OpenCall {
    pub(super) inner: Arc<Inner>,
    pub(super) id: u64,
    pub(super) cell: Arc<StreamCell>,
    /// Windows offered, by number.
    pub(super) windows: HashMap<u32, Grant>,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        if self.cell.responded() {
            return;
        }
        self.cell
            .end(Status::cancelled("the call was cancelled by the client"));
        let windows = self.windows.drain().map(|(_, w)| w);
        self.inner.abandon(self.id, windows);
    }
}

impl OpenCall {
    /// Registers a streaming call of `endpoint` (its place in the in-flight window, its id,
    /// its streams).
    async fn open(inner: &Arc<Inner>, endpoint: &EndpointDef) -> Result<OpenCall, Status> {
        let setup = match endpoint.stream {
            crate::StreamKind::Messages {
                requests,
                responses,
            } => Setup {
                sends: requests.then_some(inner.negotiated.peer_stream_window),
                receives: responses.then_some(inner.negotiated.stream_window),
                ..Setup::default()
            },
            crate::StreamKind::Bulk { max_len } => Setup {
                offering: Some((direction(endpoint), max_len)),
                ..Setup::default()
            },
            crate::StreamKind::Unary => {
                return Err(Status::internal(format!(
                    "{} {} does not stream",
                    endpoint.op, endpoint.path
                )))
            }
        };
        let cell = StreamCell::new(setup);
        let opened = inner.open(endpoint, None, Some(cell.clone()), None).await?;
        Ok(OpenCall {
            inner: inner.clone(),
            id: opened.id,
            cell,
            windows: HashMap::new(),
        })
    }

    fn request(
        &self,
        endpoint: &EndpointDef,
        message: Bytes,
        timeout: Option<Duration>,
        options: &CallOptions,
    ) -> RequestFrame {
        RequestFrame {
            id: self.id,
            path: Bytes::from_static(endpoint.path.as_bytes()),
            op: endpoint.op.as_u32(),
            metadata: message,
            timeout_us: timeout.map_or(0, |t| t.as_micros().max(1) as u64),
            call_metadata: if options.metadata.is_empty() {
                Vec::new()
            } else {
                options.metadata.to_frames()
            },
            ..Default::default()
        }
    }

    fn send(&self, kind: Kind) -> Result<(), Status> {
        self.inner.session.send(kind).map_err(Status::from)
    }

    /// Sends the call's request (a call whose request cannot go is forgotten).
    fn send_request(&self, request: RequestFrame) -> Result<(), Status> {
        let sent = self
            .inner
            .session
            .lock()
            .proto
            .send_request(self.id, &request, None);
        sent.map_err(Status::from)
    }

    /// The server's response, once it came.
    async fn response(&self) -> Result<ResponseFrame, Status> {
        std::future::poll_fn(|cx| self.cell.poll_response(cx)).await
    }

    /// Offers a window of a staging buffer holding `data` (write) or of `len` bytes (read).
    pub(super) fn offer(&mut self, data: Option<&[u8]>, len: usize) -> Result<WindowOffer, Status> {
        let conn = self.inner.session.transport();
        let mut buf = self.inner.staging.acquire(len).map_err(Status::from)?;
        let access = match data {
            Some(data) => {
                buf.copy_in(0, data);
                buf.set_len(data.len());
                Access::REMOTE_READ
            }
            None => Access::REMOTE_WRITE,
        };
        let grant = conn.grant(buf, 0, len, access).map_err(Status::from)?;
        Ok(self.offered(grant, len as u64))
    }

    /// Records `grant` as the next window of the stream.
    fn offered(&mut self, grant: Grant, len: u64) -> WindowOffer {
        let Window { id, offset, .. } = self.cell.offer(len);
        let offer = WindowOffer {
            window: id,
            offset,
            descriptor: Some(DescriptorFrame::from(grant.descriptor())),
        };
        self.windows.insert(id, grant);
        offer
    }

    fn offer_more(&self, offers: Vec<WindowOffer>) -> Result<(), Status> {
        if offers.is_empty() {
            return Ok(());
        }
        self.send(Kind::Chunks(ChunksFrame {
            id: self.id,
            offers,
            used: Vec::new(),
        }))
    }
}

fn direction(endpoint: &EndpointDef) -> Direction {
    if endpoint.op.is_inbound() {
        Direction::Write
    } else {
        Direction::Read
    }
}

/// A response frame's outcome: its message, or its error.
pub(super) fn outcome(response: ResponseFrame) -> Result<(Bytes, u64), Status> {
    match response.status {
        Some(status) => Err(Status::from(status)),
        None => Ok((response.metadata, response.pushed_len)),
    }
}

/// A stream of request messages, encoded (what the typed clients pass).
pub type RequestStream = Pin<Box<dyn Stream<Item = Bytes> + Send + 'static>>;

impl Client {
    /// Starts a call of a message-streaming endpoint whose server streams its responses:
    /// sends the request `message` (and, when the endpoint streams requests too, the
    /// messages of `requests`, from a task of their own) and returns the server's messages
    /// as they arrive. The stream ends when the server answers; an error status ends it
    /// with that error. Dropping it cancels the call. Used by generated clients.
    pub async fn call_raw_server_stream(
        &self,
        endpoint: &EndpointDef,
        message: Bytes,
        requests: Option<RequestStream>,
        options: impl Into<CallOptions>,
    ) -> Result<MessageStream, Status> {
        let mut options = options.into();
        let timeout = self.prologue(endpoint, &mut options)?;
        if !endpoint.streams_responses() {
            return Err(not_this_way(endpoint, "its server streams no responses"));
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let open = async {
            let inner = self.connection().await?;
            let call = OpenCall::open(&inner, endpoint).await?;
            call.send_request(call.request(endpoint, message, timeout, &options))?;
            if let Some(requests) = requests {
                let sink = self.sink(&inner, &call, endpoint);
                let cell = call.cell.clone();
                tokio::spawn(pump(requests, sink, cell));
            }
            let stream =
                MessageStream::new(call.cell.clone(), inner.session.clone(), call.id, *endpoint);
            Ok(stream.holding(Box::new(call), deadline))
        };
        match timeout {
            Some(limit) => tokio::time::timeout(limit, open)
                .await
                .unwrap_or_else(|_| Err(late(endpoint, limit))),
            None => open.await,
        }
    }

    /// Runs a call of a message-streaming endpoint whose client streams its requests and the
    /// server answers once: sends every message of `requests` and returns the server's
    /// response message (also when the server answers before the stream ended: the rest is
    /// not sent). Used by generated clients.
    pub async fn call_raw_client_stream(
        &self,
        endpoint: &EndpointDef,
        requests: RequestStream,
        options: impl Into<CallOptions>,
    ) -> Result<Bytes, Status> {
        let mut options = options.into();
        let timeout = self.prologue(endpoint, &mut options)?;
        if !endpoint.streams_requests() || endpoint.streams_responses() {
            return Err(not_this_way(
                endpoint,
                "it is not a client stream with one response",
            ));
        }
        let call = async {
            let inner = self.connection().await?;
            let call = OpenCall::open(&inner, endpoint).await?;
            call.send_request(call.request(endpoint, Bytes::new(), timeout, &options))?;
            let sink = self.sink(&inner, &call, endpoint);
            let sending = pump(requests, sink, call.cell.clone());
            tokio::pin!(sending);
            let response = tokio::select! {
                response = call.response() => response,
                () = &mut sending => call.response().await,
            };
            let (message, _) = outcome(response?)?;
            Ok(message)
        };
        self.timed(endpoint, timeout, call).await
    }

    /// Starts a call of a bulk read endpoint: the server's chunks as they arrive, then its
    /// response message ([`ReadStream`]). Dropping the stream cancels the call.
    pub async fn call_raw_read_stream(
        &self,
        endpoint: &EndpointDef,
        message: Bytes,
        options: impl Into<CallOptions>,
    ) -> Result<ReadStream, Status> {
        let mut options = options.into();
        let timeout = self.prologue(endpoint, &mut options)?;
        self.open_read_stream(endpoint, message, timeout, &options)
            .await
    }

    /// [`call_raw_read_stream`](Self::call_raw_read_stream) after the prologue.
    pub(super) async fn open_read_stream(
        &self,
        endpoint: &EndpointDef,
        message: Bytes,
        timeout: Option<Duration>,
        options: &CallOptions,
    ) -> Result<ReadStream, Status> {
        if !endpoint.is_bulk() || endpoint.op.is_inbound() {
            return Err(not_this_way(endpoint, "it is not a bulk read stream"));
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let open = async {
            let inner = self.connection().await?;
            let mut call = OpenCall::open(&inner, endpoint).await?;
            let window = endpoint.buffer_size as usize;
            let depth = read_depth(&inner, window);
            let mut request = call.request(endpoint, message, timeout, options);
            for _ in 0..depth {
                request.offers.push(call.offer(None, window)?);
            }
            call.send_request(request)?;
            Ok(ReadStream {
                call,
                endpoint: *endpoint,
                window,
                deadline: crate::stream::StreamDeadline::at(deadline),
                response: None,
                done: false,
                next: None,
            })
        };
        match timeout {
            Some(limit) => tokio::time::timeout(limit, open)
                .await
                .unwrap_or_else(|_| Err(late(endpoint, limit))),
            None => open.await,
        }
    }

    /// A sink for `call`'s request messages.
    fn sink(&self, inner: &Arc<Inner>, call: &OpenCall, endpoint: &EndpointDef) -> MessageSink {
        MessageSink::new(
            call.cell.clone(),
            inner.session.clone(),
            call.id,
            *endpoint,
            inner.negotiated.peer_stream_window,
            self.shared.config.transfer_timeout,
        )
    }
}

impl Inner {
    /// A bulk write: `data` through windows of one chunk each (see the module's docs).
    /// Returns the response message.
    pub(super) async fn bulk_write(
        self: &Arc<Self>,
        endpoint: &EndpointDef,
        message: Bytes,
        data: Bytes,
        timeout: Option<Duration>,
        options: &CallOptions,
    ) -> Result<Bytes, Status> {
        let max = endpoint.max_payload();
        if data.len() as u64 > max {
            return Err(Status::invalid_argument(format!(
                "{} bytes are more than the {max} bytes a call of {} {} may move (max_len)",
                data.len(),
                endpoint.op,
                endpoint.path
            )));
        }
        let mut call = OpenCall::open(self, endpoint).await?;
        let mut request = call.request(endpoint, message, timeout, options);
        request.payload_len = data.len() as u64;
        let conn = self.session.transport().clone();
        let chunk = endpoint.buffer_size as usize;
        let mut next = 0usize;
        // Bytes frozen from a memory region are offered where they are, in one window.
        match crate::memory::frozen_view(&data) {
            Some(view) if conn.fencing() == Fencing::Revocable && !data.is_empty() => {
                let grant = conn
                    .grant(view, 0, data.len(), Access::REMOTE_READ)
                    .map_err(Status::from)?;
                request.offers.push(call.offered(grant, data.len() as u64));
                next = data.len();
            }
            _ => {
                while next < data.len() && request.offers.len() < self.stream_depth {
                    let end = (next + chunk).min(data.len());
                    request
                        .offers
                        .push(call.offer(Some(&data[next..end]), end - next)?);
                    next = end;
                }
            }
        }
        call.send_request(request)?;
        loop {
            let used = tokio::select! {
                used = std::future::poll_fn(|cx| call.cell.poll_used(cx)) => used?,
                response = call.response() => return Ok(outcome(response?)?.0),
            };
            let Some(done) = used else {
                return Ok(outcome(call.response().await?)?.0);
            };
            // Read to its end: its memory takes the next chunk.
            if let Some(window) = call.windows.remove(&done.window.id) {
                window.release();
            }
            if next < data.len() {
                let end = (next + chunk).min(data.len());
                let offer = call.offer(Some(&data[next..end]), end - next)?;
                next = end;
                call.offer_more(vec![offer])?;
            }
        }
    }
}

/// Sends every message of `requests` into `sink`, then the stream's end; stops when the call
/// is over.
async fn pump(requests: RequestStream, mut sink: MessageSink, cell: Arc<StreamCell>) {
    let sending = async {
        sink.drain(Infallible(requests), |_, message| Ok(message))
            .await?;
        sink.finish().await
    };
    tokio::select! {
        result = sending => {
            if let Err(status) = result {
                tracing::debug!(%status, "a request stream stopped");
            }
        }
        () = std::future::poll_fn(|cx| cell.poll_over(cx)) => {}
    }
}

/// The items of a request stream, none of which is an error.
struct Infallible(RequestStream);

impl Stream for Infallible {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.as_mut().poll_next(cx).map(|next| next.map(Ok))
    }
}

fn not_this_way(endpoint: &EndpointDef, why: &str) -> Status {
    Status::invalid_argument(format!(
        "{} {} cannot be called this way: {why}",
        endpoint.op, endpoint.path
    ))
}

fn late(endpoint: &EndpointDef, limit: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "{} {} did not complete within {limit:?}",
        endpoint.op, endpoint.path
    ))
}

/// Windows a read stream offers at once: `stream_depth`, fewer when the chunks are so large
/// that the staging memory would not hold them (at least one).
fn read_depth(inner: &Inner, window: usize) -> usize {
    let budget = inner.staging.budget();
    inner.stream_depth.min(budget / window.max(1)).max(1)
}
