//! The server side of one call, for every operation. Read this file to see what happens on
//! a send, receive, write or read request.
//!
//! - send / write (inbound): small payloads arrive inside the request frame. A payload the
//!   client wrote into one of this connection's write slots (`slots.rs`) is taken from there:
//!   the slot's window is revoked first, so the handler sees bytes nobody can change; over a
//!   transport that cannot revoke windows (`Fencing::Unfenced`, DOCA) the handler gets a copy
//!   (slots are at most 64 KiB there). With pull mode the server RDMA-reads the payload from
//!   the window the client offered in the request (all of it, or the call fails). Otherwise
//!   the server takes a buffer of the endpoint's pool, zeroes the announced length, grants the
//!   client a write-only window of exactly that length, sends the descriptor, waits for the
//!   client's ack and revokes the window. One-sided writes cannot be observed (on RDMA
//!   hardware either), so a client that acks without writing every byte makes its handler see
//!   zeros there: its own loss, never another call's bytes.
//! - receive / read (outbound): the server takes a pool buffer and runs the handler to fill
//!   it. Small results go back inside the response frame. Larger ones are RDMA-written into
//!   the window the client offered in the request (`reply_to`), and the response follows on
//!   the same connection, so the bytes are in place when it arrives. A result too large for
//!   that window makes the server ask for a larger one (a `Grant` with `need_buffer`) first.
//!   The server never exposes its own memory for a result.
//!
//! Every call ends with exactly one response frame (also when the client cancelled), so both
//! sides agree on what is in flight.
//!
//! This file holds a call's life (its state, how it ends, its response and what is recorded of
//! it); how its bytes move is in `transfer.rs`, its pool buffer in `buffers.rs`, the decisions
//! in `protocol::call`.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use super::conn::ConnCtx;
use super::transfer::{inbound, outbound};
use crate::observe::logs;
use crate::protocol::frames::ResponseFrame;
use crate::protocol::mailbox::{CallLimits, EndReason, Mailbox};
use crate::protocol::route::Incoming;
use crate::service::{EndpointDef, OpKind, RawRequest, StreamKind};
use crate::session::now;
use crate::status::{Code, Status};
use crate::stream::StreamCell;
use crate::transport::{BoxFuture, Descriptor, Grant};

/// What the client says about a call after the request (its cancel is the mailbox's end).
#[derive(Debug)]
pub(crate) enum ClientEvent {
    /// The transfer is done, or (answer to a request for a buffer) here is the window.
    Ack(Option<Descriptor>),
}

/// Everything one call needs.
pub(super) struct Call {
    pub(super) id: u64,
    /// What the connection's calls share (its session, slots, settings).
    pub(super) conn: Arc<ConnCtx>,
    /// The endpoint's route: its service, buffer pool, pool holders and metrics (one
    /// reference for them all).
    pub(super) route: Arc<super::routes::Route>,
    /// This call's place among the calls holding one of the pool's buffers.
    pub(super) holding: Option<super::Holding>,
    /// Held while the call holds a buffer of `pool`.
    pub(super) share_permit: Option<OwnedSemaphorePermit>,
    /// The request, until the handler takes it.
    pub(super) request: Option<RawRequest>,
    /// How the payload comes (decided by `protocol::route::incoming`).
    pub(super) incoming: Incoming,
    pub(super) payload_len: u64,
    pub(super) inline_payload: Option<Bytes>,
    /// The write slot holding the payload, taken from the connection's slots.
    pub(super) slot: Option<Grant>,
    /// The client window to pull the payload from.
    pub(super) source: Option<Descriptor>,
    /// The client window to push the result into.
    pub(super) reply_to: Option<Descriptor>,
    /// Grants sent: each one costs the call a round trip more.
    pub(super) grants: u8,
    /// A streaming call's streams.
    pub(super) stream: Option<Arc<StreamCell>>,
    /// When the connection handled the request's frame: the call's duration runs from here
    /// (the clock read then, not a second one).
    pub(super) arrived: std::time::Instant,
}

/// A transfer still under way when the response is sent (a pushed result); awaited after.
pub(super) type Pending = BoxFuture<'static, crate::error::Result<()>>;

/// Runs the call to its response frame. (A plain function around an `async move` block: an
/// `async fn` would store the 500-byte `Call` twice in its future.)
#[allow(clippy::manual_async_fn)]
pub(super) fn run(mut call: Call, events: Mailbox<ClientEvent>) -> impl Future<Output = ()> + Send {
    // Everything the call logs carries what it is (a span nobody listens to costs a check).
    // Its last fields are known at the end: the status, the bytes moved and the round trips.
    let span = tracing::info_span!(
        "call",
        service = call.route.service.name(),
        method = call.route.endpoint.method,
        path = call.route.endpoint.path,
        op = %call.route.endpoint.op,
        peer = %call.conn.info.peer,
        id = call.id,
        status = tracing::field::Empty,
        bytes = tracing::field::Empty,
        round_trips = tracing::field::Empty,
    );
    let watched = span.clone();
    tracing::Instrument::instrument(
        async move {
            // The call runs until it answers, or until the client cancels it, its deadline
            // passes or its connection ends: then the handler's future (with everything the
            // call holds) is dropped here, and the call answers with why.
            let answered = {
                // The answer first: a call that answers at once never looks at its end. Its
                // deadline is the connection's timer's (`protocol::connection`): a call that
                // waits sets no timer of its own; its events end when the deadline passes.
                let mut answering = std::pin::pin!(answer(&mut call, &events));
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(answered) = answering.as_mut().poll(cx) {
                        return Poll::Ready(Ok(answered));
                    }
                    events.poll_ended(cx).map(|reason| {
                        Err(match reason {
                            EndReason::DeadlinePassed => Ended::Deadline,
                            reason => Ended::Early(reason),
                        })
                    })
                })
                .await
            };
            let (mut response, pending) = answered.unwrap_or_else(|ended| {
                let status = ended.status(events.limits(), &call.route.endpoint);
                (error_response(call.id, &status), None)
            });
            let max = call.conn.session.peer_max_frame();
            let max_message = events.limits().max_response_len;
            if prost::Message::encoded_len(&response) + FRAME_MARGIN > max
                || (response.status.is_none() && response.metadata.len() > max_message)
            {
                response = fitted(&call, &events, response, max);
            }
            // At most one clock read, for both the call's duration and the state's time, and
            // none when neither wants it (no metrics recorder, no span, no idle timeout).
            let mut answered_at = None;
            let mut clock = || *answered_at.get_or_insert_with(now);
            finished(&call, &response, &mut clock, &watched);
            // Slots freed by this call (or earlier ones) go back to the client with the
            // response; the call is over for the connection from here.
            let conn = &call.conn;
            let sent = conn
                .session
                .lock()
                .proto
                .respond(response, clock, || conn.slot_window());
            if let Err(e) = sent {
                tracing::debug!(call = call.id, error = %e, "response not sent: connection gone");
            }
            if let Some(pending) = pending {
                Box::pin(await_push(&call, pending)).await;
            }
        },
        span,
    )
}

/// Records how the call ended: in its span, in a `DEBUG` event, and in metrics (nothing, and
/// no clock read, when nobody listens). Its duration runs from the request's arrival to the
/// instant `clock` gives.
fn finished(
    call: &Call,
    response: &ResponseFrame,
    clock: impl FnOnce() -> std::time::Instant,
    span: &tracing::Span,
) {
    let spanned = !span.is_disabled();
    let recorder = crate::observe::recording();
    if !spanned && recorder.is_none() {
        return;
    }
    let elapsed = clock().saturating_duration_since(call.arrived);
    let code = response
        .status
        .as_ref()
        .map_or(Code::Ok, |s| Code::from_u32(s.code));
    let bytes = if code != Code::Ok {
        0
    } else if call.route.endpoint.op.is_inbound() {
        call.payload_len
    } else {
        response
            .inline_payload
            .as_ref()
            .map_or(response.pushed_len, |p| p.len() as u64)
    };
    if spanned {
        span.record("status", code.as_str());
        span.record("bytes", bytes);
        span.record("round_trips", 1 + u32::from(call.grants));
    }
    tracing::debug!(elapsed_us = elapsed.as_micros() as u64, "call answered");
    if let Some(now) = recorder {
        call.route.metrics.answered(now, code, bytes, elapsed);
    }
}

/// Room kept in a frame for what wraps the response (the frame's own fields, credits, slots).
const FRAME_MARGIN: usize = 64;

/// What a response frame takes besides its message: the call id, the message's tag and length.
const RESPONSE_ENVELOPE: usize = 16;

/// The most bytes a response message of `ep` may encode to on a connection whose peer takes
/// frames of `peer_max_frame` bytes: what a frame holds besides the response's envelope, and
/// on `send` and `receive` endpoints no more than the endpoint's buffer (docs/spec.md).
pub(super) fn max_response_len(ep: &EndpointDef, peer_max_frame: usize) -> usize {
    let frame = peer_max_frame.saturating_sub(FRAME_MARGIN + RESPONSE_ENVELOPE);
    match ep.op {
        OpKind::Send | OpKind::Receive => frame.min(ep.buffer_size as usize),
        OpKind::Write | OpKind::Read => frame,
    }
}

/// Why a call stopped before its answer.
enum Ended {
    /// The client cancelled it, or its connection ended.
    Early(EndReason),
    /// Its deadline passed.
    Deadline,
}

impl Ended {
    /// The call's answer.
    fn status(&self, limits: &CallLimits, endpoint: &EndpointDef) -> Status {
        match (self, limits.deadline) {
            (Ended::Deadline, Some(d)) => d.passed(endpoint),
            (&Ended::Early(reason), _) => crate::protocol::deadline::ended(reason, endpoint),
            (Ended::Deadline, None) => Status::internal("a call without a deadline timed out"),
        }
    }
}

/// A response too large for one frame, made to fit: an error keeps its code with its message
/// cut short; a result message is refused with `RESOURCE_EXHAUSTED` naming the limit. Either
/// way the caller gets an answer at once, and the log says why.
fn fitted(
    call: &Call,
    events: &Mailbox<ClientEvent>,
    response: ResponseFrame,
    max: usize,
) -> ResponseFrame {
    let size = prost::Message::encoded_len(&response);
    let ep = call.route.endpoint;
    if let Some(status) = response.status {
        let keep = max.saturating_sub(FRAME_MARGIN + 128);
        let mut cut = keep.min(status.message.len());
        while !status.message.is_char_boundary(cut) {
            cut -= 1;
        }
        let message = format!(
            "{} … (cut from {} bytes to fit max_frame)",
            &status.message[..cut],
            status.message.len()
        );
        if let Some(line) = logs::line("an error message was cut", "") {
            tracing::warn!(
                call = call.id,
                path = ep.path,
                op = %ep.op,
                suppressed = line.suppressed,
                "an error message of {} bytes was cut to fit max_frame ({max})",
                status.message.len()
            );
        }
        return error_response(call.id, &Status::new(Code::from_u32(status.code), message));
    }
    let message = response.metadata.len();
    let limit = events.limits().max_response_len;
    let status = Status::resource_exhausted(format!(
        "the response message of {} {} encodes to {message} bytes, more than the {} it may \
         have ({}): messages travel in control frames, and on send and receive endpoints in \
         the endpoint's buffer; large results belong in the buffer of a receive or read \
         endpoint. A handler learns the limit before it acts from `Request::max_response_len`",
        ep.op,
        ep.path,
        limit,
        if message > limit && size + FRAME_MARGIN <= max {
            format!("the endpoint's buffer of {} bytes", ep.buffer_size)
        } else {
            format!("the connection's max_frame of {max}")
        }
    ));
    if let Some(line) = logs::line("response refused", "") {
        tracing::warn!(call = call.id, path = ep.path, op = %ep.op, %status, suppressed = line.suppressed, "response refused");
    }
    error_response(call.id, &status)
}

/// The call's response frame, and the push still under way, if any.
async fn answer(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
) -> (ResponseFrame, Option<Pending>) {
    let result = match call.route.endpoint.stream {
        StreamKind::Unary if call.route.endpoint.op.is_inbound() => {
            inbound(call, events).await.map(|r| (r, None))
        }
        StreamKind::Unary => outbound(call, events).await,
        // Streams live in futures of their own: a unary call's future stays small.
        StreamKind::Messages { .. } => Box::pin(super::stream::messages(call))
            .await
            .map(|r| (r, None)),
        StreamKind::Bulk { .. } => {
            let deadline = events.limits().deadline.map(|d| d.at);
            Box::pin(super::stream::bulk(call, deadline))
                .await
                .map(|r| (r, None))
        }
    };
    result.unwrap_or_else(|status| (error_response(call.id, &status), None))
}

/// Waits until a pushed result has left. The pushed bytes hold a pool buffer until the
/// client's side acknowledges them: a client that never does loses its connection after
/// `transfer_timeout`, which returns the buffer.
async fn await_push(call: &Call, pending: Pending) {
    match tokio::time::timeout(call.conn.transfer_timeout, pending).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(call = call.id, error = %e, "pushing the result failed"),
        Err(_) => {
            if let Some(line) = logs::line("connection dropped", "transfer_timeout") {
                tracing::warn!(
                    peer = %call.conn.info.peer,
                    suppressed = line.suppressed,
                    "a pushed result was not acknowledged within {:?} (transfer_timeout); \
                     connection dropped",
                    call.conn.transfer_timeout
                );
            }
            call.conn.session.transport().close();
        }
    }
}

pub(super) use crate::protocol::call::{error_response, ok};

/// The request, for the handler (which runs once).
pub(super) fn take_request(call: &mut Call) -> Result<RawRequest, Status> {
    call.request
        .take()
        .ok_or_else(|| Status::internal("the call's request was already handed out"))
}

/// A handler's result that did not fit its buffer (`Error::DoesNotFit`, through
/// `fill_from`), said as what it is: the handler's error on this endpoint, with the way out.
pub(super) fn handlers_overflow(ep: &EndpointDef, status: Status) -> Status {
    let overflow = status.code() == Code::Internal
        && status.message().contains(" bytes do not fit a buffer of ")
        && !status.message().contains(ep.path);
    if !overflow {
        return status;
    }
    let way_out = if ep.is_bulk() {
        "send it in chunks of at most the buffer size"
    } else {
        "larger results need a bulk stream (`stream: { max_len }` in the spec)"
    };
    Status::internal(format!(
        "the handler of {} {} made a result that does not fit the endpoint's buffer: {}; {way_out}",
        ep.op,
        ep.path,
        status.message()
    ))
}
