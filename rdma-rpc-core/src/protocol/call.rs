//! One unary call, both sides, as decisions without I/O: what the client puts in its request,
//! how the server gets the payload and returns the result, what each answers the other's
//! frames with, and which of the other's frames break the protocol. The runtime's call code
//! (`client/call.rs`, `server/call.rs`) carries the decisions out: it registers nothing, it
//! moves the bytes (RDMA writes and reads, windows), runs the handler, and waits.
//!
//! # What happens on an RDMA write, top to bottom
//!
//! 1. **Client, before the request.** [`check_request`] refuses what could never be served
//!    (a message or payload larger than the endpoint's buffer). The connection
//!    ([`Connection::poll_room`](super::connection::Connection::poll_room),
//!    [`open_call`](super::connection::Connection::open_call)) gives the call its place in
//!    the window the server allows and its id. [`route::fits_inline`] says whether the
//!    payload rides in the frame; if not, the connection hands out a free write slot that
//!    holds it ([`take_slot`](super::connection::Connection::take_slot)), and
//!    [`route::outgoing`] picks the way: inline, the slot (RDMA-written before the request,
//!    which the connection's ordering delivers first), a window the server pulls from (pull
//!    mode), or a grant. [`request`] makes the frame.
//! 2. **Server, on the request.** The connection admits it
//!    ([`ServerSide`](super::connection): the call id is not in flight, fewer than
//!    `max_in_flight` calls, not shutting down; the slot it names is taken first, whatever
//!    happens next, and must be armed and large enough). The endpoint checks it
//!    ([`route::incoming`]: size, one way only, what the handshake allows), and
//!    [`payload_step`] says how its bytes come: inline, from the slot (its window revoked
//!    first; copied where a window cannot be revoked), RDMA-read from the client's window, or
//!    through a grant ([`grant`]: a zeroed pool buffer exposed write-only for exactly the
//!    payload, revoked once the client acks).
//! 3. **Client, on a grant.** [`on_grant`] checks it (a window exactly as long as the
//!    payload, writable) and says to RDMA-write the payload there and ack ([`ack`]).
//! 4. **Server, the answer.** The handler runs on the bytes; its response
//!    ([`ok`], [`error_response`]) leaves through the connection
//!    ([`respond`](super::connection::Connection::respond)), which ends the call there and
//!    arms owed write slots with it.
//! 5. **Client, on the response.** [`on_response`] says where the result is and what to do
//!    with the windows the call offered; the connection frees the call's place in the window
//!    and keeps the slots the response armed.
//!
//! A read (or receive) differs in steps 1, 2 and 5: the client offers a window for the result
//! in its request ([`reply_window`]: the caller's buffer, or a staging buffer as large as the
//! endpoint's last result), the server runs the handler into a pool buffer and
//! [`result_step`] says how the result goes back (inline, RDMA-written into the offered
//! window before the response, or after asking for a larger one: [`ask`], answered by the
//! client's [`on_grant`] with a window that fits, checked by [`asked_window`]).

use std::time::Duration;

use bytes::Bytes;

use super::connection::Negotiated;
use super::frames::{
    AckFrame, DescriptorFrame, GrantFrame, MetadataEntry, RequestFrame, ResponseFrame, StatusFrame,
};
use super::route::{self, check_granted_window, check_result_window, Incoming};
use crate::memory::Access;
use crate::service::EndpointDef;
use crate::status::Status;
use crate::transport::{Descriptor, Fencing};

/// Results of outbound endpoints up to this size are offered a window of the endpoint's whole
/// buffer on their first call; larger endpoints learn the size from their first result.
pub(crate) const FIRST_REPLY_WINDOW: u64 = 64 << 10;

// The client's side.

/// Checks a call before anything is allocated for it: a request message that could not fit
/// the endpoint's buffer (send and receive endpoints carry it there), a payload larger than
/// the buffer (those need a bulk stream).
pub(crate) fn check_request(
    endpoint: &EndpointDef,
    message_len: usize,
    payload_len: usize,
) -> Result<(), Status> {
    if let Some(status) = super::oversized_message(endpoint, message_len) {
        return Err(status);
    }
    if endpoint.op.is_inbound() && payload_len as u64 > endpoint.buffer_size {
        return Err(Status::invalid_argument(format!(
            "{payload_len} bytes do not fit the {} byte buffer of {} {}: larger payloads need a \
             bulk stream (`stream: {{ max_len }}` in the spec)",
            endpoint.buffer_size, endpoint.op, endpoint.path
        )));
    }
    Ok(())
}

/// Bytes a request's call metadata adds to its frame, at most.
pub(crate) fn metadata_len(entries: &[MetadataEntry]) -> usize {
    // Each entry: its bytes, plus at most 18 of tags and lengths.
    entries
        .iter()
        .map(|e| e.key.len() + e.value.len() + 18)
        .sum()
}

/// Whether an inbound call's payload of `payload_len` bytes rides in its request, with
/// `frame_len` bytes of message and metadata besides.
pub(crate) fn inline(
    payload_len: usize,
    frame_len: usize,
    negotiated: &Negotiated,
    peer_max_frame: usize,
) -> bool {
    route::fits_inline(
        payload_len,
        frame_len,
        negotiated.inline_threshold as usize,
        peer_max_frame,
    )
}

/// The size of the window a receive or read call offers for its result: the endpoint's last
/// result (`learned`: `Some(0)` when results travelled inline), or on the first call the whole
/// buffer of an endpoint whose buffer is small enough; `None` offers nothing.
pub(crate) fn reply_window(
    endpoint: &EndpointDef,
    learned: Option<usize>,
    negotiated: &Negotiated,
) -> Option<usize> {
    match learned {
        Some(size) => (size > 0).then_some(size),
        None => {
            let size = endpoint.buffer_size;
            (size > u64::from(negotiated.inline_threshold) && size <= FIRST_REPLY_WINDOW)
                .then_some(size as usize)
        }
    }
}

/// The window size to remember for `endpoint` after a result of `len` bytes (0: results of
/// this size travel inline, offer nothing).
pub(crate) fn learned(len: usize, negotiated: &Negotiated) -> usize {
    if len > negotiated.inline_threshold as usize {
        len
    } else {
        0
    }
}

/// A call's request frame. `payload_len` is an inbound call's byte count, `inline_payload`
/// those bytes when they travel in the frame (moved in, not shared: the call no longer needs
/// them); windows and slots are added by the caller as it offers them.
pub(crate) fn request(
    id: u64,
    endpoint: &EndpointDef,
    message: Bytes,
    payload_len: usize,
    inline_payload: Option<Bytes>,
    timeout: Option<Duration>,
    call_metadata: Vec<MetadataEntry>,
) -> RequestFrame {
    RequestFrame {
        id,
        path: Bytes::from_static(endpoint.path.as_bytes()),
        op: endpoint.op.as_u32(),
        metadata: message,
        payload_len: payload_len as u64,
        inline_payload,
        timeout_us: timeout.map_or(0, |t| t.as_micros().max(1) as u64),
        call_metadata,
        ..Default::default()
    }
}

/// What the client does with a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GrantStep {
    /// RDMA-write the payload into this window, then ack.
    Write(Descriptor),
    /// Offer a window of this many bytes for the result in the ack.
    Offer(usize),
}

/// A protocol violation by the server about a call of `endpoint`: the call fails with it.
pub(crate) fn violation(endpoint: &EndpointDef, what: &str) -> Status {
    Status::internal(format!(
        "protocol violation: the server {what} for {} {}",
        endpoint.op, endpoint.path
    ))
}

/// Answers a grant for a call of `endpoint` with a payload of `payload_len` bytes; `into` is
/// the caller's own buffer for the result (of so many bytes), which cannot grow.
pub(crate) fn on_grant(
    endpoint: &EndpointDef,
    payload_len: usize,
    into: Option<u64>,
    grant: GrantFrame,
) -> Result<GrantStep, Status> {
    if endpoint.op.is_inbound() {
        let window = grant
            .window
            .ok_or_else(|| violation(endpoint, "granted no window"))?;
        let window = Descriptor::from(window);
        check_granted_window(
            payload_len,
            window.len,
            window.access.contains(Access::REMOTE_WRITE),
        )
        .map_err(|what| violation(endpoint, what))?;
        return Ok(GrantStep::Write(window));
    }
    if let Some(len) = into {
        return Err(Status::out_of_range(format!(
            "the result of {} {} has {} bytes, more than the {len} of the buffer given",
            endpoint.op, endpoint.path, grant.need_buffer
        )));
    }
    let len = grant.need_buffer;
    check_result_window(endpoint, len).map_err(|what| violation(endpoint, what))?;
    Ok(GrantStep::Offer(len as usize))
}

/// The ack of a grant: the transfer is done, or (`reply_to`) here is the result's window.
pub(crate) fn ack(id: u64, reply_to: Option<&Descriptor>) -> AckFrame {
    AckFrame {
        id,
        reply_to: reply_to.map(DescriptorFrame::from),
    }
}

/// Where a call's result is, by its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResultAt {
    /// In the response frame.
    Inline(Bytes),
    /// In the last window the call offered: its first `len` bytes.
    Window(usize),
    /// No bytes.
    Empty,
}

/// The last window a call offered for its result, as its response finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    /// None was offered.
    None,
    /// Back in the caller's hands, holding this many bytes at most.
    Window(u64),
    /// The connection ended with it.
    Lost,
}

/// What the response of a call says, checked against the last window the call offered for
/// its result: the response message and where the result is, or the call's error.
pub(crate) fn on_response(
    endpoint: &EndpointDef,
    response: ResponseFrame,
    window: Offered,
) -> Result<(Bytes, ResultAt), Status> {
    let ResponseFrame {
        status,
        metadata,
        inline_payload,
        pushed_len,
        ..
    } = response;
    if let Some(status) = status {
        return Err(Status::from(status));
    }
    let result = match (inline_payload, window) {
        (Some(payload), _) => ResultAt::Inline(payload),
        (None, _) if pushed_len == 0 => ResultAt::Empty,
        (None, Offered::Window(len)) if pushed_len <= len => ResultAt::Window(pushed_len as usize),
        (None, Offered::Lost) => {
            return Err(Status::unavailable(
                "the connection ended with the window of the result",
            ))
        }
        (None, _) => {
            return Err(violation(
                endpoint,
                &format!("announced {pushed_len} result bytes outside the window offered"),
            ))
        }
    };
    Ok((metadata, result))
}

/// How many bytes of the last window the server wrote, by its response (what a fenced
/// window copies back when it is taken down).
pub(crate) fn written(response: &ResponseFrame, window: u64) -> usize {
    if response.inline_payload.is_some() || response.status.is_some() {
        0
    } else {
        response.pushed_len.min(window) as usize
    }
}

// The server's side.

/// How the server gets an inbound call's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PayloadStep {
    /// No bytes (an empty send or write, a receive or read).
    Nothing,
    /// In the request frame.
    Inline,
    /// In the write slot the request named: its window is revoked before the bytes are read;
    /// where a revoked window stays reachable (`copy`), the handler gets a copy and never
    /// memory the client can still write.
    Slot { copy: bool },
    /// RDMA-read into a pool buffer from this part of the window the request offered.
    Pull(Descriptor),
    /// Through a grant: a pool buffer, zeroed first (one-sided writes cannot be observed: a
    /// client that acks without writing finds its own zeros, never an earlier call's bytes),
    /// exposed write-only for exactly `len` bytes until the client acks, then revoked.
    Grant { len: usize },
}

/// How an inbound call's payload comes, from its route and the window it offered.
pub(crate) fn payload_step(
    incoming: Incoming,
    payload_len: u64,
    source: Option<&Descriptor>,
    fencing: Fencing,
) -> Result<PayloadStep, Status> {
    Ok(match incoming {
        Incoming::Nothing => PayloadStep::Nothing,
        Incoming::Inline => PayloadStep::Inline,
        Incoming::Slot => PayloadStep::Slot {
            copy: fencing != Fencing::Revocable,
        },
        Incoming::Pull => {
            let source =
                source.ok_or_else(|| Status::internal("a pull call without its window"))?;
            PayloadStep::Pull(source.slice(0, payload_len).map_err(|_| {
                Status::invalid_argument(format!(
                    "the offered window of {} bytes is shorter than the {payload_len} byte \
                     payload",
                    source.len
                ))
            })?)
        }
        Incoming::Grant => PayloadStep::Grant {
            len: payload_len as usize,
        },
    })
}

/// The grant of a window for call `id`'s payload.
pub(crate) fn grant(id: u64, window: &Descriptor) -> GrantFrame {
    GrantFrame {
        id,
        window: Some(DescriptorFrame::from(window)),
        need_buffer: 0,
    }
}

/// How the server returns a result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ResultStep {
    /// In the response frame.
    Inline,
    /// RDMA-written into this window the request offered, before the response (which the
    /// connection delivers after the bytes).
    Push(Descriptor),
    /// The window offered is missing or too small: ask for one that fits with this grant.
    Ask(GrantFrame),
}

/// How call `id`'s result of `len` bytes goes back, with `message_len` bytes of response
/// message, when the request offered `reply_to`.
pub(crate) fn result_step(
    id: u64,
    len: usize,
    message_len: usize,
    negotiated: &Negotiated,
    peer_max_frame: usize,
    reply_to: Option<Descriptor>,
) -> ResultStep {
    let fits = route::fits_inline(
        len,
        message_len,
        negotiated.inline_threshold as usize,
        peer_max_frame,
    );
    match route::result_route(fits, len, reply_to.as_ref().map(|d| d.len)) {
        route::ResultRoute::Inline => ResultStep::Inline,
        route::ResultRoute::Push => ResultStep::Push(reply_to.expect("a push has its window")),
        route::ResultRoute::AskForWindow => ResultStep::Ask(ask(id, len)),
    }
}

/// Asks the client for a window of `len` bytes for call `id`'s result.
pub(crate) fn ask(id: u64, len: usize) -> GrantFrame {
    GrantFrame {
        id,
        window: None,
        need_buffer: len as u64,
    }
}

/// The window the client acked after being asked for one of `len` bytes: it must hold the
/// result.
pub(crate) fn asked_window(len: usize, acked: Option<Descriptor>) -> Result<Descriptor, Status> {
    match acked {
        Some(dst) if route::result_route(false, len, Some(dst.len)) == route::ResultRoute::Push => {
            Ok(dst)
        }
        _ => Err(Status::invalid_argument(format!(
            "the client offered no window of the {len} bytes the result needs"
        ))),
    }
}

/// A response with the handler's message (and a result small enough to ride with it).
pub(crate) fn ok(id: u64, metadata: Bytes, inline_payload: Option<Bytes>) -> ResponseFrame {
    ResponseFrame {
        id,
        metadata,
        inline_payload,
        ..Default::default()
    }
}

/// A response after the result's `len` bytes were pushed into the client's window.
pub(crate) fn pushed(id: u64, metadata: Bytes, len: usize) -> ResponseFrame {
    ResponseFrame {
        id,
        metadata,
        pushed_len: len as u64,
        ..Default::default()
    }
}

/// A response that fails the call with `status`.
pub(crate) fn error_response(id: u64, status: &Status) -> ResponseFrame {
    ResponseFrame {
        id,
        status: Some(StatusFrame::from(status)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::{OpKind, StreamKind};
    use crate::Code;

    const WRITE: EndpointDef = EndpointDef {
        path: "/w",
        op: OpKind::Write,
        buffer_size: 1 << 20,
        method: "w",
        timeout_ms: None,
        stream: StreamKind::Unary,
    };
    const READ: EndpointDef = EndpointDef {
        op: OpKind::Read,
        ..WRITE
    };
    const NEGOTIATED: Negotiated = Negotiated {
        max_in_flight: 8,
        inline_threshold: 8192,
        pull_writes: false,
        stream_window: 1 << 18,
        peer_stream_window: 1 << 18,
        peer_token: 1,
    };

    fn window(len: u64, access: Access) -> Descriptor {
        Descriptor {
            addr: 0x1000,
            len,
            rkey: 7,
            access,
            blob: Bytes::new(),
        }
    }

    #[test]
    fn a_request_that_could_never_be_served_is_refused_before_anything_is_allocated() {
        assert!(check_request(&WRITE, 10, 1 << 20).is_ok());
        let err = check_request(&WRITE, 10, (1 << 20) + 1).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("bulk stream"), "{err}");
    }

    #[test]
    fn a_write_grant_must_be_exactly_the_payload_and_writable() {
        let ok = GrantFrame {
            id: 1,
            window: Some(DescriptorFrame::from(&window(100, Access::REMOTE_WRITE))),
            need_buffer: 0,
        };
        assert_eq!(
            on_grant(&WRITE, 100, None, ok.clone()),
            Ok(GrantStep::Write(window(100, Access::REMOTE_WRITE)))
        );
        for bad in [
            window(99, Access::REMOTE_WRITE),
            window(101, Access::REMOTE_WRITE),
            window(100, Access::REMOTE_READ),
        ] {
            let grant = GrantFrame {
                window: Some(DescriptorFrame::from(&bad)),
                ..ok.clone()
            };
            let err = on_grant(&WRITE, 100, None, grant).unwrap_err();
            assert!(err.message().contains("protocol violation"), "{err}");
        }
        let none = GrantFrame { window: None, ..ok };
        assert!(on_grant(&WRITE, 100, None, none).is_err());
    }

    #[test]
    fn a_read_grant_asks_for_a_window_that_fits_the_endpoint_or_the_callers_buffer() {
        let asked = |need| GrantFrame {
            id: 1,
            window: None,
            need_buffer: need,
        };
        assert_eq!(
            on_grant(&READ, 0, None, asked(70_000)),
            Ok(GrantStep::Offer(70_000))
        );
        assert!(on_grant(&READ, 0, None, asked((1 << 20) + 1)).is_err());
        assert!(on_grant(&READ, 0, None, asked(0)).is_err());
        let err = on_grant(&READ, 0, Some(4096), asked(70_000)).unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange);
    }

    #[test]
    fn a_response_says_where_the_result_is_or_breaks_the_protocol() {
        let inline = ok(
            1,
            Bytes::from_static(b"m"),
            Some(Bytes::from_static(b"abc")),
        );
        assert_eq!(
            on_response(&READ, inline, Offered::None),
            Ok((
                Bytes::from_static(b"m"),
                ResultAt::Inline(Bytes::from_static(b"abc"))
            ))
        );
        let pushed_ok = pushed(1, Bytes::new(), 100);
        assert_eq!(written(&pushed_ok, 4096), 100);
        assert_eq!(
            on_response(&READ, pushed_ok, Offered::Window(4096)),
            Ok((Bytes::new(), ResultAt::Window(100)))
        );
        let outside = pushed(1, Bytes::new(), 5000);
        assert!(on_response(&READ, outside, Offered::Window(4096)).is_err());
        let failed = error_response(1, &Status::not_found("x"));
        assert_eq!(written(&failed, 4096), 0);
        assert_eq!(
            on_response(&READ, failed, Offered::Window(4096))
                .unwrap_err()
                .code(),
            Code::NotFound
        );
        assert_eq!(
            on_response(&WRITE, ok(1, Bytes::new(), None), Offered::None),
            Ok((Bytes::new(), ResultAt::Empty))
        );
    }

    #[test]
    fn the_server_takes_each_payload_its_way() {
        let src = window(100, Access::REMOTE_READ);
        assert_eq!(
            payload_step(Incoming::Pull, 60, Some(&src), Fencing::Revocable),
            Ok(PayloadStep::Pull(src.slice(0, 60).unwrap()))
        );
        assert!(payload_step(Incoming::Pull, 101, Some(&src), Fencing::Revocable).is_err());
        assert_eq!(
            payload_step(Incoming::Slot, 60, None, Fencing::Unfenced),
            Ok(PayloadStep::Slot { copy: true })
        );
        assert_eq!(
            payload_step(Incoming::Slot, 60, None, Fencing::Revocable),
            Ok(PayloadStep::Slot { copy: false })
        );
        assert_eq!(
            payload_step(Incoming::Grant, 60, None, Fencing::Revocable),
            Ok(PayloadStep::Grant { len: 60 })
        );
    }

    #[test]
    fn results_go_inline_pushed_or_after_asking_and_the_answer_must_fit() {
        let reply = window(70_000, Access::REMOTE_WRITE);
        assert_eq!(
            result_step(1, 10, 0, &NEGOTIATED, 16 << 10, None),
            ResultStep::Inline
        );
        assert_eq!(
            result_step(1, 70_000, 0, &NEGOTIATED, 16 << 10, Some(reply.clone())),
            ResultStep::Push(reply.clone())
        );
        assert_eq!(
            result_step(1, 70_001, 0, &NEGOTIATED, 16 << 10, Some(reply.clone())),
            ResultStep::Ask(ask(1, 70_001))
        );
        assert!(asked_window(70_000, Some(reply.clone())).is_ok());
        assert!(asked_window(70_001, Some(reply)).is_err());
        assert!(asked_window(1, None).is_err());
    }

    #[test]
    fn read_windows_start_at_the_whole_small_buffer_then_follow_the_results() {
        let small = EndpointDef {
            buffer_size: 32 << 10,
            ..READ
        };
        assert_eq!(reply_window(&small, None, &NEGOTIATED), Some(32 << 10));
        assert_eq!(
            reply_window(&READ, None, &NEGOTIATED),
            None,
            "1 MiB: learn first"
        );
        assert_eq!(learned(100, &NEGOTIATED), 0, "inline results offer nothing");
        assert_eq!(reply_window(&READ, Some(0), &NEGOTIATED), None);
        assert_eq!(learned(70_000, &NEGOTIATED), 70_000);
        assert_eq!(reply_window(&READ, Some(70_000), &NEGOTIATED), Some(70_000));
    }
}
