//! The client side of one call, for every operation (the server side is in
//! `server/call.rs`).
//!
//! - send / write: the request carries small payloads inline. A payload that fits a free
//!   write slot of the connection is RDMA-written there first, and the request that follows
//!   names the slot (one round trip). Otherwise, in pull mode, the client copies the payload
//!   into a registered staging buffer and offers a read-only window of it in the request (one
//!   round trip); in grant mode the server answers with a write-only window of exactly the
//!   payload's length, and the client RDMA-writes the bytes and acks (two round trips).
//! - receive / read: the response carries small results inline. For larger ones the client
//!   offers a write-only window of a staging buffer in the request, sized by the endpoint's
//!   last result; the server writes the result there before it responds (one round trip). If
//!   the result does not fit, the server says how large it is and the client offers a window
//!   that fits (two round trips). Either way the result is returned without a copy.
//!
//! Windows a call offered stay open until the server's response, also when the caller gave
//! up: the server may still be using them.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::post::{Sending, Sent, Unsent};
use super::sent::{SentCall, TypedCall, Unstarted};
use super::{CallOptions, Client, Inner};
use crate::call_box::CallBox;
use crate::encoded::Encoded;
use crate::interceptor::OutgoingCall;
use crate::memory::{Access, RegisteredBuf};
use crate::protocol::call::{self, GrantStep, Offered, ResultAt};
use crate::protocol::connection::ServerEvent;
use crate::protocol::frames::{GrantFrame, Kind, MetadataEntry, ResponseFrame};
use crate::service::EndpointDef;
use crate::status::Status;
use crate::transport::{Descriptor, Fencing, Grant, SendData};

/// What a call sends: bytes (send, write; none for receive, read), or for receive and read
/// the caller's buffer for the result.
pub(super) enum Payload {
    Data(Option<Bytes>),
    Into(RegisteredBuf),
}

/// What a call got back.
enum Received {
    Bytes(Bytes),
    Into(RegisteredBuf),
}

/// Tells the server when the caller stops waiting (deadline, or the future was dropped) before
/// the response.
pub(super) struct CallGuard<'a> {
    inner: &'a Inner,
    id: u64,
    done: bool,
    /// The payload went in the request (and the call no longer holds it): a grant for it is a
    /// protocol violation. (Here, next to `done`, it costs the call's future no byte.)
    pub(super) sent_inline: bool,
    /// Windows this call offered the server; kept open until its response.
    pub(super) windows: Vec<Grant>,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.inner
            .abandon(self.id, std::mem::take(&mut self.windows));
    }
}

impl Inner {
    /// The caller gave up on call `id` before its response: the server is told (`Cancel`),
    /// and the call (its place in the window, and `windows`, which the server may still
    /// write or read) stays until the server's response arrives.
    pub(super) fn abandon(&self, id: u64, windows: impl IntoIterator<Item = Grant>) {
        let mut locked = self.session.lock();
        locked.proto.abandon(id, windows);
        self.session.hand_off(&mut locked, id);
    }

    /// Waits for room in the window and opens a call there: its id, the write slot its
    /// payload of `slot_len` bytes goes in (if it wants one and one is free), and the window
    /// to offer for a result of `endpoint` (outbound calls).
    pub(super) async fn open(
        &self,
        endpoint: &EndpointDef,
        slot_len: Option<usize>,
        stream: Option<std::sync::Arc<crate::stream::StreamCell>>,
        deadline: Option<std::time::Instant>,
    ) -> Result<Opened, Status> {
        let mut line = Line {
            inner: self,
            ticket: None,
        };
        let mut stream = stream;
        std::future::poll_fn(|cx| {
            let mut locked = self.session.lock();
            let proto = &mut locked.proto;
            match proto.poll_room(&mut line.ticket, cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Err(status)) => Poll::Ready(Err(status)),
                Poll::Ready(Ok(())) => {
                    let id = proto.open_call(stream.take(), deadline);
                    let slot = slot_len.and_then(|len| proto.take_slot(len));
                    let reply = (!endpoint.op.is_inbound())
                        .then(|| proto.reply_size(endpoint))
                        .flatten();
                    Poll::Ready(Ok(Opened { id, slot, reply }))
                }
            }
        })
        .await
    }
}

/// A call opened on a connection.
pub(super) struct Opened {
    pub(super) id: u64,
    /// The write slot taken for its payload: (index, window).
    pub(super) slot: Option<(u32, Descriptor)>,
    /// The size of the window to offer for its result.
    pub(super) reply: Option<usize>,
}

/// A caller's place in line for room in the window: given up when the caller stops waiting.
struct Line<'a> {
    inner: &'a Inner,
    ticket: Option<u64>,
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.inner.session.lock().proto.leave_line(ticket);
        }
    }
}

/// A unary call's deadline. While the call waits for the server, the deadline is in its
/// connection's one timer (`protocol::connection`, `open_call`), which tells the call when it
/// passes: no timer of its own (a tokio timer's registration cost about 350 ns on the
/// development VM, where a small call takes 2 to 2.6 µs). Elsewhere (dialling, waiting for
/// room, a grant's transfer) the call sets a timer of its own, once.
pub(super) struct Bound {
    at: Instant,
    /// Set while the connection's timer watches the deadline.
    watched: AtomicBool,
}

impl Bound {
    fn watch(&self) -> Watched<'_> {
        self.watched.store(true, Ordering::Relaxed);
        Watched(&self.watched)
    }
}

/// The connection's timer watches a deadline until dropped.
struct Watched<'a>(&'a AtomicBool);

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// When a call starts, if anything needs it: its deadline, or its duration in the metrics. One
/// clock read serves both (a read costs about 40 ns on the development VM, a fiftieth of a
/// small call).
fn started(timeout: Option<Duration>) -> Option<Instant> {
    (timeout.is_some() || crate::observe::recording().is_some()).then(Instant::now)
}

/// A call's response message and bytes.
fn with_bytes(answer: Result<(Bytes, Received), Status>) -> Result<(Bytes, Bytes), Status> {
    match answer? {
        (message, Received::Bytes(bytes)) => Ok((message, bytes)),
        (_, Received::Into(_)) => Err(Status::internal("a result buffer nobody asked for")),
    }
}

/// A call's response message and the caller's buffer holding the result.
fn with_buffer<B: crate::memory::Buffer>(
    answer: Result<(Bytes, Received), Status>,
) -> Result<(Bytes, B), Status> {
    match answer? {
        (message, Received::Into(buf)) => Ok((message, crate::memory::from_registered(buf))),
        (_, Received::Bytes(_)) => Err(Status::internal("the result buffer was lost")),
    }
}

/// The general path of a typed call that did not go at once (see [`TypedCall`]): the call
/// built in a block of its thread's cache, `then` applied to its result.
fn general_call<'a, T: 'a, Then>(
    client: &'a Client,
    endpoint: &'a EndpointDef,
    prepared: Prepared,
    then: Then,
) -> CallBox<impl Future<Output = Result<T, Status>> + 'a>
where
    Then: FnOnce(Bytes, Bytes) -> Result<T, Status> + 'a,
{
    CallBox::new(move || async move {
        let (message, bytes) = with_bytes(client.call_prepared(endpoint, prepared).await)?;
        then(message, bytes)
    })
}

/// A call whose prologue ran (the interceptors, the metadata's check, its deadline), on its
/// way: at once (`sent`), or the general way ([`Client::call_prepared`]).
pub(super) struct Prepared {
    message: Encoded,
    payload: Payload,
    options: CallOptions,
    timeout: Option<Duration>,
    /// When the call started, if its deadline or the metrics need it (`None` for a bulk call,
    /// which `timed` times itself).
    started: Option<Instant>,
}

/// How a call started (see [`Client::start`]).
pub(super) enum Start<'a> {
    /// A small send, sent: it waits for its response.
    Sent(SentCall<'a>),
    /// Any other call, or one that found no room to go at once.
    Prepared(Prepared),
}

/// What the server answered a call with.
pub(super) enum Answer {
    Response(ResponseFrame),
    Grant(GrantFrame),
}

/// A call's event as the server's answer; the connection's end (`None`) and the call's passed
/// deadline as the status the call ends with.
pub(super) fn answer(
    inner: &Inner,
    endpoint: &EndpointDef,
    timeout: Option<Duration>,
    event: Option<ServerEvent>,
) -> Result<Answer, Status> {
    match event {
        Some(ServerEvent::Response(response)) => Ok(Answer::Response(response)),
        Some(ServerEvent::Grant(grant)) => Ok(Answer::Grant(grant)),
        Some(ServerEvent::DeadlinePassed) => {
            Err(past_timeout(endpoint, timeout.unwrap_or_default()))
        }
        None => Err(inner.closed_status()),
    }
}

/// The status of a call whose payload went in its request and that the server granted a
/// window for it anyway.
pub(super) fn granted_inline(endpoint: &EndpointDef) -> Status {
    call::violation(endpoint, "granted a window for a payload sent inline")
}

/// The caller's buffer for the result of a call of `endpoint`, which must return bytes.
fn result_buffer<B: crate::memory::Buffer>(
    endpoint: &EndpointDef,
    dst: B,
) -> Result<RegisteredBuf, Status> {
    let dst = crate::memory::into_registered(dst);
    if endpoint.op.is_inbound() {
        return Err(Status::invalid_argument(format!(
            "{} {} takes bytes, it returns none to land in a buffer",
            endpoint.op, endpoint.path
        )));
    }
    Ok(dst)
}

/// The status of a call still running when its timeout passed.
fn past_timeout(endpoint: &EndpointDef, limit: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "{} {} did not complete within {limit:?}",
        endpoint.op, endpoint.path
    ))
}

impl Client {
    /// Runs one call of `endpoint` with an encoded request message. Inbound endpoints (send,
    /// write) take `data`; outbound ones (receive, read) return the bytes. `options` is a
    /// [`CallOptions`], or just a deadline (`None`, `Some(duration)`). Returns the encoded
    /// response message and the bytes. Used by generated clients; see
    /// `codegen::call_inbound` and `codegen::call_outbound`.
    ///
    /// The call starts when the future is first polled; the future is two cache lines (see
    /// `call_encoded`).
    pub fn call_raw<'a>(
        &'a self,
        endpoint: &'a EndpointDef,
        message: Bytes,
        data: Option<Bytes>,
        options: impl Into<CallOptions>,
    ) -> impl Future<Output = Result<(Bytes, Bytes), Status>> + 'a {
        let options = options.into();
        self.call_encoded(endpoint, message.into(), data, options, |message, bytes| {
            Ok((message, bytes))
        })
    }

    /// [`call_raw`](Client::call_raw) of a message the typed client encoded (a small one in
    /// place: see `encoded`), with `then` (the typed client's decoding) applied to its result.
    ///
    /// The future returned is a [`TypedCall`]: a small send goes at once in its first poll and
    /// waits in a future of one cache line (see `sent`); any other call is built then in a
    /// block of its thread's cache (see `call_box`), so that the typed functions that return
    /// it, the generated methods around them and every caller's future that awaits one stay
    /// small. As `async fn`s the layers each kept their arguments and the future of the layer
    /// below: a generated method's future was 376 bytes, moved into its caller's state with
    /// every call, in memory that caller last touched a call earlier.
    pub(crate) fn call_encoded<'a, T: 'a, Then>(
        &'a self,
        endpoint: &'a EndpointDef,
        message: Encoded,
        data: Option<Bytes>,
        options: CallOptions,
        then: Then,
    ) -> TypedCall<'a, T, Then, impl Future<Output = Result<T, Status>> + 'a>
    where
        Then: FnOnce(Bytes, Bytes) -> Result<T, Status> + Unpin + 'a,
    {
        let call = Unstarted {
            client: self,
            endpoint,
            message,
            data,
            options,
        };
        TypedCall::new(call, then, general_call)
    }

    /// Runs one call of a receive or read `endpoint` whose result lands in `dst` (usually a
    /// lease of a [`MemoryRegion`](crate::MemoryRegion)): the server writes it there
    /// directly, with no staging buffer and no copy, and `dst` comes back holding it (its
    /// length is the result's). A result larger than `dst` fails with
    /// [`Code::OutOfRange`](crate::Code). Used by the generated `*_into` methods.
    ///
    /// `dst` is registered once, with its region: nothing is registered per call. Over DOCA
    /// the server writes into this connection's bounce memory and the result is copied into
    /// `dst` (the server never reaches `dst` itself), unless `dst` is a lease of a
    /// [`SharedRegion`](crate::SharedRegion) shared with this connection, which the server
    /// writes directly.
    pub async fn call_raw_into<B: crate::memory::Buffer>(
        &self,
        endpoint: &EndpointDef,
        message: Bytes,
        dst: B,
        options: impl Into<CallOptions>,
    ) -> Result<(Bytes, B), Status> {
        let dst = result_buffer(endpoint, dst)?;
        let options = options.into();
        let call = || self.call_timed(endpoint, message.into(), Payload::Into(dst), options);
        with_buffer(CallBox::new(call).await)
    }

    /// [`call_raw_into`](Client::call_raw_into) of a message the typed client encoded, built
    /// at once in a block of its thread's cache (see `call_box`): a call whose result lands in
    /// the caller's buffer never goes at once (see `sent`).
    pub(crate) fn call_encoded_into<'a, B: crate::memory::Buffer + 'a, T: 'a>(
        &'a self,
        endpoint: &'a EndpointDef,
        message: Encoded,
        dst: B,
        options: CallOptions,
        then: impl FnOnce(Bytes, B) -> Result<T, Status> + 'a,
    ) -> CallBox<impl Future<Output = Result<T, Status>> + 'a> {
        CallBox::new(move || async move {
            let payload = Payload::Into(result_buffer(endpoint, dst)?);
            let (message, dst) =
                with_buffer(self.call_timed(endpoint, message, payload, options).await)?;
            then(message, dst)
        })
    }

    /// What every call does first: the interceptors, the metadata's check; returns its
    /// deadline (its own, the endpoint's, or the client's default).
    pub(super) fn prologue(
        &self,
        endpoint: &EndpointDef,
        options: &mut CallOptions,
    ) -> Result<Option<Duration>, Status> {
        let shared = &*self.shared;
        if !shared.interceptors.is_empty() {
            shared.interceptors.run(&mut OutgoingCall {
                endpoint,
                metadata: &mut options.metadata,
            })?;
        }
        options.metadata.check()?;
        Ok(options
            .timeout
            .or(endpoint.timeout())
            .or(shared.default_timeout))
    }

    /// Runs `call` within `timeout`, and records its outcome in the metrics.
    pub(super) async fn timed<T>(
        &self,
        endpoint: &EndpointDef,
        timeout: Option<Duration>,
        call: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let started = started(timeout);
        let result = match timeout.zip(started) {
            Some((limit, at)) => tokio::time::timeout_at(at + limit, call)
                .await
                .unwrap_or_else(|_| Err(past_timeout(endpoint, limit))),
            None => call.await,
        };
        self.count(endpoint, started, &result);
        result
    }

    /// Counts a call that ended with `result`, if metrics are on.
    fn count<T>(
        &self,
        endpoint: &EndpointDef,
        started: Option<Instant>,
        result: &Result<T, Status>,
    ) {
        if let (Some(started), Some(now)) = (started, crate::observe::recording()) {
            let code = result
                .as_ref()
                .map_or_else(Status::code, |_| crate::Code::Ok);
            self.shared
                .metrics
                .called(now, endpoint, code, started.elapsed());
        }
    }

    /// A call's prologue: the interceptors, the metadata's check, its deadline and, if needed,
    /// when it started.
    fn prepare(
        &self,
        endpoint: &EndpointDef,
        message: Encoded,
        payload: Payload,
        mut options: CallOptions,
    ) -> Result<Prepared, Status> {
        let timeout = self.prologue(endpoint, &mut options)?;
        let started = (!endpoint.is_bulk()).then(|| started(timeout)).flatten();
        Ok(Prepared {
            message,
            payload,
            options,
            timeout,
            started,
        })
    }

    /// Starts a call in a poll of its caller (`waker`): its prologue, then a small send goes
    /// at once (see `sent`). An error of the send is counted in the metrics, one of the
    /// prologue is not (the call never started).
    pub(super) fn start<'a>(
        &self,
        endpoint: &'a EndpointDef,
        message: Encoded,
        payload: Payload,
        options: CallOptions,
        waker: &Waker,
    ) -> Result<Start<'a>, Status> {
        let mut call = self.prepare(endpoint, message, payload, options)?;
        let (timeout, started) = (call.timeout, call.started);
        if let Payload::Data(data) = &mut call.payload {
            if endpoint.op.is_inbound() && !endpoint.is_bulk() {
                let mut bytes = data.take().unwrap_or_default();
                let (message, metadata) = (&mut call.message, &mut call.options.metadata);
                let sent = self.send_at_once(
                    endpoint, message, &mut bytes, metadata, timeout, started, waker,
                );
                if sent.is_err() {
                    self.count(endpoint, started, &sent);
                }
                if let Some(sent) = sent? {
                    return Ok(Start::Sent(sent));
                }
                *data = Some(bytes);
            }
        }
        Ok(Start::Prepared(call))
    }

    /// Counts the outcome of a call sent at once in the metrics.
    pub(super) fn count_sent(&self, call: &SentCall<'_>, result: &Result<(Bytes, Bytes), Status>) {
        self.count(call.endpoint, call.started, result);
    }

    /// A call whose result lands in the caller's buffer (receive and read `_into`): never one
    /// that goes at once.
    async fn call_timed(
        &self,
        endpoint: &EndpointDef,
        message: Encoded,
        payload: Payload,
        options: CallOptions,
    ) -> Result<(Bytes, Received), Status> {
        let prepared = self.prepare(endpoint, message, payload, options)?;
        self.call_prepared(endpoint, prepared).await
    }

    /// A call whose prologue ran, the general way: a bulk stream whole, or a unary call that
    /// may wait for room, offer windows and answer grants, within its deadline.
    async fn call_prepared(
        &self,
        endpoint: &EndpointDef,
        prepared: Prepared,
    ) -> Result<(Bytes, Received), Status> {
        let Prepared {
            message,
            payload,
            options,
            timeout,
            started,
        } = prepared;
        if endpoint.is_bulk() {
            return Box::pin(self.timed(
                endpoint,
                timeout,
                self.bulk(endpoint, message, payload, timeout, options),
            ))
            .await;
        }
        let frames = options.metadata.into_frames();
        // The call is built where it is polled from (`pin!` of the async block itself) and
        // raced against its deadline here: handing it to `tokio::time::timeout`, or awaiting
        // it from a local, moved all of it (about 1 KB) on every call, into memory that with
        // 1,000 connections calling was cold. (This is `timed` written out: calling a helper
        // that takes the pinned call costs an await layer, 120 instructions per call.)
        let bound = timeout.zip(started).map(|(limit, at)| Bound {
            at: at + limit,
            watched: AtomicBool::new(false),
        });
        let mut call = std::pin::pin!(async {
            let inner = self.connection().await?;
            inner
                .call_inner(endpoint, message, payload, timeout, bound.as_ref(), frames)
                .await
        });
        // The call's own timer, set only while the connection's does not watch its deadline
        // (see `Bound`).
        let mut sleep = std::pin::pin!(None::<tokio::time::Sleep>);
        let result = std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = call.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            let (Some(bound), Some(limit)) = (&bound, timeout) else {
                return Poll::Pending;
            };
            if sleep.is_none() {
                if bound.watched.load(Ordering::Relaxed) {
                    return Poll::Pending;
                }
                sleep.set(Some(tokio::time::sleep_until(bound.at)));
            }
            let timer = sleep.as_mut().as_pin_mut().expect("set above");
            timer.poll(cx).map(|()| Err(past_timeout(endpoint, limit)))
        })
        .await;
        self.count(endpoint, started, &result);
        result
    }

    /// A call of a bulk stream endpoint, whole: the payload of any size up to `max_len`
    /// streamed through the endpoint's buffers, or the result collected (into `dst`).
    async fn bulk(
        &self,
        endpoint: &EndpointDef,
        message: Encoded,
        payload: Payload,
        timeout: Option<Duration>,
        options: CallOptions,
    ) -> Result<(Bytes, Received), Status> {
        if endpoint.op.is_inbound() {
            let Payload::Data(data) = payload else {
                return Err(Status::internal("a write stream without its bytes"));
            };
            let inner = self.connection().await?;
            let message = inner
                .bulk_write(
                    endpoint,
                    message.into_bytes(),
                    data.unwrap_or_default(),
                    timeout,
                    &options,
                )
                .await?;
            return Ok((message, Received::Bytes(Bytes::new())));
        }
        let stream = self
            .open_read_stream(endpoint, message.into_bytes(), timeout, &options)
            .await?;
        match payload {
            Payload::Into(dst) => {
                let (message, dst) = stream.into_buffer(dst).await?;
                Ok((message, Received::Into(dst)))
            }
            Payload::Data(_) => {
                let (message, data) = stream.collect().await?;
                Ok((message, Received::Bytes(data)))
            }
        }
    }
}

impl Inner {
    async fn call_inner(
        &self,
        endpoint: &EndpointDef,
        mut message: Encoded,
        payload: Payload,
        timeout: Option<Duration>,
        bound: Option<&Bound>,
        mut call_metadata: Vec<MetadataEntry>,
    ) -> Result<(Bytes, Received), Status> {
        let inner = self;
        let (mut data, dst) = match payload {
            Payload::Data(data) => (data.unwrap_or_default(), None),
            Payload::Into(dst) => (Bytes::new(), Some(dst)),
        };
        call::check_request(endpoint, message.len(), data.len())?;
        let into = dst.is_some();
        let inbound = endpoint.op.is_inbound();
        let negotiated = &inner.negotiated;
        let inline = call::inline(
            data.len(),
            message.len() + call::metadata_len(&call_metadata),
            negotiated,
            inner.session.peer_max_frame(),
        );
        let deadline = bound.map(|b| b.at.into_std());
        // A payload that travels in the request goes as the call opens, under one lock, when
        // the window has room now.
        let sent = match inbound && inline {
            true => {
                // The caller's waker, for the call to wait with (see `try_send_inline`).
                let waker = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
                let unsent = Unsent {
                    message: &mut message,
                    data: &mut data,
                    call_metadata: &mut call_metadata,
                };
                inner.try_send_inline(endpoint, deadline, timeout, unsent, waker)?
            }
            false => None,
        };
        let mut reader_elsewhere = sent.as_ref().is_some_and(|s| s.reader_elsewhere);
        let (mut guard, slot_write) = match sent {
            Some(Sent { id, .. }) => {
                let guard = CallGuard {
                    inner,
                    id,
                    done: false,
                    sent_inline: true,
                    windows: Vec::new(),
                };
                (guard, None)
            }
            None => {
                let slot_len = (inbound && !inline).then_some(data.len());
                let opened = inner.open(endpoint, slot_len, None, deadline).await?;
                let mut guard = CallGuard {
                    inner,
                    id: opened.id,
                    done: false,
                    sent_inline: false,
                    windows: Vec::new(),
                };
                // Built and sent in a plain function: its locals (the request frame above
                // all) are not kept in this future across the waits below.
                let sending = Sending {
                    message,
                    data: &mut data,
                    dst,
                    inline,
                    timeout,
                    call_metadata,
                };
                let slot_write = inner.post_request(endpoint, opened, sending, &mut guard)?;
                (guard, slot_write)
            }
        };
        let id = guard.id;
        if let Some(write) = slot_write {
            write
                .await
                .map_err(|e| Status::unavailable(format!("RDMA write failed: {e}")))?;
        }

        let response = loop {
            let event = {
                // The connection's timer watches the deadline while the call waits here.
                let _watched = bound.map(Bound::watch);
                inner.event(id, std::mem::take(&mut reader_elsewhere)).await
            };
            match answer(self, endpoint, timeout, event)? {
                Answer::Response(r) => break r,
                Answer::Grant(g) => {
                    if guard.sent_inline {
                        return Err(granted_inline(endpoint));
                    }
                    let given =
                        into.then(|| guard.windows.last().map_or(0, |w| w.descriptor().len));
                    let step = call::on_grant(endpoint, data.len(), given, g)?;
                    inner.counters.transfers.fetch_add(1, Ordering::Relaxed);
                    // Boxed: only grant mode transfers, and inline its future would make every
                    // call's future 80 bytes larger (see `future_sizes`).
                    let reply_to = Box::pin(self.transfer(step, &data, &mut guard)).await?;
                    let ack = call::ack(id, reply_to.as_ref());
                    inner.session.send(Kind::Ack(ack)).map_err(Status::from)?;
                }
            }
        };
        guard.done = true;
        inner.counters.completed.fetch_add(1, Ordering::Relaxed);
        // The last window offered for the result holds it; every window closes now. Of a
        // caller's buffer, only the pushed prefix is the result.
        let window = guard.windows.pop();
        let offered = window.as_ref().map(|w| w.descriptor().len);
        let reply = match window {
            Some(window) if into => {
                let written = call::written(&response, window.descriptor().len);
                window.revoke_written(written).await
            }
            Some(window) if !inbound => window.revoke().await,
            Some(window) => {
                window.release();
                None
            }
            None => None,
        };
        if !guard.windows.is_empty() {
            guard.windows.drain(..).for_each(Grant::release);
        }
        let window = match (&reply, offered) {
            (Some(buf), _) => Offered::Window(buf.capacity() as u64),
            (None, Some(_)) if !inbound => Offered::Lost,
            _ => Offered::None,
        };
        let (message, at) = call::on_response(endpoint, response, window)?;
        if into {
            let mut buf = reply.ok_or_else(|| {
                Status::unavailable("the connection ended with the result buffer")
            })?;
            match at {
                ResultAt::Inline(payload) if payload.len() <= buf.capacity() => {
                    // Small enough to ride in the response: one copy, into the caller's buffer
                    // (a raw copy: a shared region's lease is never borrowed).
                    buf.copy_in(0, &payload);
                    buf.set_len(payload.len());
                }
                ResultAt::Inline(_) => {
                    return Err(Status::internal(format!(
                        "protocol violation: the server announced a result outside the buffer \
                         given for {} {}",
                        endpoint.op, endpoint.path
                    )))
                }
                ResultAt::Window(len) => buf.set_len(len),
                ResultAt::Empty => buf.set_len(0),
            }
            return Ok((message, Received::Into(buf)));
        }
        if !inbound {
            let len = match &at {
                ResultAt::Inline(p) => p.len(),
                ResultAt::Window(len) => *len,
                ResultAt::Empty => 0,
            };
            inner.session.lock().proto.learn_reply_size(endpoint, len);
        }
        let received = match (at, reply) {
            (ResultAt::Inline(payload), _) => payload,
            (ResultAt::Window(len), Some(mut buf)) => {
                buf.set_len(len);
                match inner.session.transport().fencing() {
                    Fencing::Revocable => buf.freeze(),
                    // The server can still write the window (it outlives `revoke`): the
                    // caller gets a copy, never memory that may change under it.
                    _ => inner.copies.copy_out(&buf),
                }
            }
            _ => Bytes::new(),
        };
        Ok((message, Received::Bytes(received)))
    }

    /// Carries out what a grant asked: writes the payload into the server's window, or offers
    /// a window as large as the result the server has (its descriptor, for the ack).
    async fn transfer(
        &self,
        step: GrantStep,
        data: &Bytes,
        guard: &mut CallGuard<'_>,
    ) -> Result<Option<Descriptor>, Status> {
        match step {
            GrantStep::Write(window) => {
                // Awaited whole, although the ack that follows would tell the server the bytes
                // are in: posted (`write_posted`), 1 MiB writes over TCP answered a quarter
                // sooner one at a time, but 8 in flight moved 10 to 15% fewer bytes a second.
                self.session
                    .transport()
                    .write(SendData::Bytes(data.clone()), &window, None)
                    .await
                    .map_err(|e| Status::unavailable(format!("RDMA write failed: {e}")))?;
                Ok(None)
            }
            GrantStep::Offer(len) => {
                let window = reply_window(self, len)?;
                let offered = window.descriptor().clone();
                guard.windows.push(window);
                Ok(Some(offered))
            }
        }
    }
}

/// A write-only window over a staging buffer of at least `size` bytes, for a result.
pub(super) fn reply_window(inner: &Inner, size: usize) -> Result<Grant, Status> {
    let buf = inner.staging.acquire(size).map_err(Status::from)?;
    let capacity = buf.capacity();
    inner
        .session
        .transport()
        .grant(buf, 0, capacity, Access::REMOTE_WRITE)
        .map_err(Status::from)
}

#[cfg(test)]
mod future_sizes {
    //! A call's future is built and then moved (into its caller's future, into `.await`) with
    //! every call: its size is bytes copied per call and cache lines each call touches.

    use std::time::Duration;

    use bytes::Bytes;

    use super::{CallOptions, Client, Inner, Payload, Prepared};
    use crate::memory::RegisteredBuf;
    use crate::metadata::Metadata;
    use crate::service::EndpointDef;
    use crate::transport::{BoxFuture, Grant};

    /// The size of what `make` returns (never called).
    fn returned<A, F>(_make: &impl Fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Revoking a window is the transport's own future, not one wrapping it and the grant.
    #[test]
    fn revoking_a_window_awaits_the_transports_future_itself() {
        let boxed = std::mem::size_of::<BoxFuture<'static, Option<RegisteredBuf>>>();
        assert_eq!(returned(&|g: Grant| g.revoke()), boxed);
        assert_eq!(returned(&|g: Grant| g.revoke_written(1)), boxed);
        assert_eq!(returned(&|g: Grant| g.revoke_unconfirmed()), boxed);
    }

    /// A unary call's future stays within the sizes it had once its rare paths (a grant's
    /// transfer) were boxed, its request was built and sent in a plain function
    /// (`post_request`, whose locals are not kept across the waits) and its state was put in
    /// a block its thread reuses (`CallBox`): 952 bytes for `call_inner`, 1,488 for
    /// `call_timed` (in the block), 128 for `call_raw` on the toolchain of the time (1,320,
    /// 1,824 and 1,928 before). `call_timed` was 1,616 once a call's deadline was watched by
    /// its connection's timer (the deadline and its flag, and the guard in `call_inner`, in
    /// exchange for a timer's registration per call), and `call_inner` 1,040 once a call sent
    /// at once took its caller's waker first, to start waiting under the lock it is sent under
    /// (one more `.await`, which saves a lock and a look at the state per call).
    ///
    /// Since a small send goes at once and waits in a future of its own (`sent`), the general
    /// path is `call_prepared` (1,680 bytes, in the block; the call's prepared parts are its
    /// arguments), `call_timed` serves only calls whose result lands in the caller's buffer
    /// (1,832), and `call_raw`'s future is the typed call's (128). Growing past the bounds
    /// below means a new `.await` holds a large future or value on every call's path: box it,
    /// or keep it out of the loop.
    #[test]
    fn a_unary_calls_future_stays_small() {
        let raw = returned(
            &|(c, e, m): (&'static Client, &'static EndpointDef, Bytes)| {
                c.call_raw(e, m, None, None::<Duration>)
            },
        );
        let timed = returned(
            &|(c, e, m): (&'static Client, &'static EndpointDef, Bytes)| {
                c.call_timed(e, m.into(), Payload::Data(None), CallOptions::default())
            },
        );
        let prepared = returned(
            &|(c, e, p): (&'static Client, &'static EndpointDef, Prepared)| c.call_prepared(e, p),
        );
        let inner =
            returned(
                &|(i, e, m, md): (&'static Inner, &'static EndpointDef, Bytes, Metadata)| {
                    let md = md.into_frames();
                    i.call_inner(e, m.into(), Payload::Data(None), None, None, md)
                },
            );
        assert!(inner <= 1_056, "call_inner's future is {inner} bytes");
        assert!(
            prepared <= 1_680,
            "call_prepared's future is {prepared} bytes"
        );
        assert!(timed <= 1_832, "call_timed's future is {timed} bytes");
        assert!(raw <= 128, "call_raw's future is {raw} bytes");
    }

    /// A typed call's future is small: two cache lines (a [`TypedCall`](super::TypedCall):
    /// the call's parts until its first poll, then a small send's [`SentCall`](super::SentCall)
    /// or the general path's block), and a call into the caller's buffer is its block alone (a
    /// pointer and the block's class). The request is encoded when the future is made, and the
    /// response is decoded inside it. It was 376 bytes for a generated send method while each
    /// layer was an `async fn` holding its arguments and the layer below.
    #[test]
    fn a_typed_calls_future_is_small() {
        use crate::service::Request;
        use crate::typed::client::{call_inbound, call_outbound, call_outbound_into};
        let block = std::mem::size_of::<usize>() * 3;
        let inbound = returned(&|(c, e, r, d): (
            &'static Client,
            &'static EndpointDef,
            Request<()>,
            Bytes,
        )| { call_inbound::<(), ()>(c, e, r, d) });
        let outbound = returned(&|(c, e, r): (
            &'static Client,
            &'static EndpointDef,
            Request<()>,
        )| { call_outbound::<(), ()>(c, e, r) });
        let into = returned(&|(c, e, r, b): (
            &'static Client,
            &'static EndpointDef,
            Request<()>,
            RegisteredBuf,
        )| { call_outbound_into::<(), (), _>(c, e, r, b) });
        assert!(inbound <= 128, "call_inbound's future is {inbound} bytes");
        assert!(
            outbound <= 128,
            "call_outbound's future is {outbound} bytes"
        );
        assert_eq!(into, block, "call_outbound_into's future is its block");
    }
}
