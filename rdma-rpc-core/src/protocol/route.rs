//! The payload route of a call, decided without I/O: which way a send/write payload and a
//! receive/read result travel (inline in a frame, through a write slot, pulled by the
//! server, written into a granted window, pushed into an offered window), and which requests
//! and answers contradict the endpoint or the handshake. The client and server drivers
//! (`client/call.rs`, `server/conn.rs`, `server/call.rs`) act on these decisions.

use super::FRAME_OVERHEAD;
use crate::service::EndpointDef;
use crate::status::Status;

/// Whether `len` payload bytes with `metadata_len` bytes of metadata travel inside one frame:
/// at most the inline threshold, and the frame fits the peer's receives.
pub(crate) fn fits_inline(
    len: usize,
    metadata_len: usize,
    inline_threshold: usize,
    peer_max_frame: usize,
) -> bool {
    len <= inline_threshold && len + metadata_len + FRAME_OVERHEAD <= peer_max_frame
}

/// How the client sends a send/write payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outgoing {
    /// Inside the request frame.
    Inline,
    /// RDMA-written into a free write slot before the request that names it.
    Slot,
    /// Offered in a read-only window the server pulls from (pull mode).
    Pull,
    /// Written into a window the server grants for the call (grant mode; two round trips).
    Grant,
}

/// The client's choice for a payload of `len` bytes.
pub(crate) fn outgoing(fits_inline: bool, slot_free: bool, pull_writes: bool) -> Outgoing {
    match (fits_inline, slot_free, pull_writes) {
        (true, _, _) => Outgoing::Inline,
        (false, true, _) => Outgoing::Slot,
        (false, false, true) => Outgoing::Pull,
        (false, false, false) => Outgoing::Grant,
    }
}

/// What the server got of a request's payload, as far as the route goes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestShape {
    /// Announced payload length.
    pub(crate) payload_len: u64,
    /// Length of the inline payload, if the request carries one.
    pub(crate) inline_len: Option<usize>,
    /// The request names a write slot.
    pub(crate) slot: bool,
    /// The request offers a window to pull from.
    pub(crate) source: bool,
    /// The request offers a window for the result.
    pub(crate) reply_to: bool,
    /// Windows of a bulk stream the request offers.
    pub(crate) offers: usize,
}

/// How the server gets a request's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// No payload: an empty send/write, or a receive/read.
    Nothing,
    /// Inside the request.
    Inline,
    /// In the named write slot.
    Slot,
    /// Read from the offered window.
    Pull,
    /// Written by the client into a window the server grants.
    Grant,
}

/// Checks a request against its endpoint and the handshake (`pull_writes`), and says how the
/// payload comes: every contradiction is a status naming it.
pub(crate) fn incoming(
    ep: &EndpointDef,
    req: &RequestShape,
    pull_writes: bool,
) -> Result<Incoming, Status> {
    if req.payload_len > ep.buffer_size {
        return Err(Status::resource_exhausted(format!(
            "request of {} bytes exceeds the {} byte buffer of {} {}",
            req.payload_len, ep.buffer_size, ep.op, ep.path
        )));
    }
    if req.offers > 0 {
        return Err(Status::invalid_argument(format!(
            "{} {} does not stream: its requests offer no stream windows",
            ep.op, ep.path
        )));
    }
    let ways = [req.inline_len.is_some(), req.slot, req.source];
    if ways.iter().filter(|&&w| w).count() > 1 {
        return Err(Status::invalid_argument(
            "a request carries its payload one way: inline, in a write slot, or in a window",
        ));
    }
    if !pull_writes && req.source {
        // The handshake said this server does not pull: a window offered anyway is never
        // read (an RDMA read of a client's window would hold a pool buffer on its behalf).
        return Err(Status::invalid_argument(format!(
            "{} {}: this server does not pull payloads (pull_writes is off in its handshake); \
             send the payload inline, in a write slot, or ask for a grant",
            ep.op, ep.path
        )));
    }
    let inbound = ep.op.is_inbound();
    if !inbound {
        if req.payload_len != 0 || ways.contains(&true) {
            return Err(Status::invalid_argument(format!(
                "{} {} takes no payload from the client",
                ep.op, ep.path
            )));
        }
        return Ok(Incoming::Nothing);
    }
    if let Some(inline) = req.inline_len {
        if inline as u64 != req.payload_len {
            return Err(Status::invalid_argument(format!(
                "inline payload of {inline} bytes announced as {}",
                req.payload_len
            )));
        }
        return Ok(Incoming::Inline);
    }
    if req.slot {
        return Ok(Incoming::Slot);
    }
    if req.source {
        return Ok(Incoming::Pull);
    }
    if req.payload_len == 0 {
        return Ok(Incoming::Nothing);
    }
    if pull_writes {
        // In pull mode the server never exposes a pool buffer to a client.
        return Err(Status::invalid_argument(format!(
            "{} {}: this server pulls payloads larger than the inline threshold; offer a \
             window in the request or use a write slot",
            ep.op, ep.path
        )));
    }
    Ok(Incoming::Grant)
}

/// Checks the request of a streaming endpoint: a message stream's request carries no payload
/// and offers no window; a bulk stream's payload comes only through the windows it offers
/// (a write declares its length, at most the endpoint's `max_len`, checked before anything is
/// allocated for it), and a read's request moves no bytes itself.
pub(crate) fn streaming(ep: &EndpointDef, req: &RequestShape) -> Result<(), Status> {
    let other_ways = req.inline_len.is_some() || req.slot || req.source || req.reply_to;
    let what = format!("{} {}", ep.op, ep.path);
    if !ep.is_bulk() {
        if req.payload_len != 0 || other_ways || req.offers > 0 {
            return Err(Status::invalid_argument(format!(
                "{what} streams messages: its request carries no payload and offers no window"
            )));
        }
        return Ok(());
    }
    if other_ways {
        return Err(Status::invalid_argument(format!(
            "{what} is a bulk stream: its bytes move only through the windows the request offers"
        )));
    }
    if ep.op.is_inbound() {
        let max = ep.max_payload();
        if req.payload_len > max {
            return Err(Status::resource_exhausted(format!(
                "a stream of {} bytes is more than the {max} bytes {what} takes (max_len)",
                req.payload_len
            )));
        }
    } else if req.payload_len != 0 {
        return Err(Status::invalid_argument(format!(
            "{what} takes no payload from the client"
        )));
    }
    Ok(())
}

/// How the server returns a receive/read result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResultRoute {
    /// Inside the response frame.
    Inline,
    /// RDMA-written into the window the request offered, before the response.
    Push,
    /// The offered window is missing or too small: a grant frame asks for one that fits.
    AskForWindow,
}

/// The server's choice for a result of `len` bytes; `offered` is the length of the window the
/// client offered, if any.
pub(crate) fn result_route(fits_inline: bool, len: usize, offered: Option<u64>) -> ResultRoute {
    if len == 0 || fits_inline {
        ResultRoute::Inline
    } else if offered.is_some_and(|o| o >= len as u64) {
        ResultRoute::Push
    } else {
        ResultRoute::AskForWindow
    }
}

/// Client side: a window the server granted for a payload of `payload_len` bytes must be
/// exactly that long and writable. `Err` names the violation.
pub(crate) fn check_granted_window(
    payload_len: usize,
    window_len: u64,
    writable: bool,
) -> Result<(), &'static str> {
    if window_len != payload_len as u64 || !writable {
        return Err("granted a window that does not fit the payload");
    }
    Ok(())
}

/// Client side: the window a server asks for a result must hold something and no more than
/// the endpoint's buffer (checked before anything is allocated for it).
pub(crate) fn check_result_window(ep: &EndpointDef, need: u64) -> Result<(), &'static str> {
    if need == 0 || need > ep.buffer_size {
        return Err("asked for a buffer larger than the endpoint's");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::OpKind;
    use crate::Code;

    const WRITE: EndpointDef = EndpointDef {
        path: "/w",
        op: OpKind::Write,
        buffer_size: 1 << 20,
        method: "w",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    };
    const READ: EndpointDef = EndpointDef {
        op: OpKind::Read,
        ..WRITE
    };

    fn shape(payload_len: u64) -> RequestShape {
        RequestShape {
            payload_len,
            ..Default::default()
        }
    }

    #[test]
    fn inline_needs_the_threshold_and_room_in_the_peers_frame() {
        assert!(fits_inline(8192, 0, 8192, 16384));
        assert!(!fits_inline(8193, 0, 8192, 16384));
        assert!(!fits_inline(8192, 8192 - FRAME_OVERHEAD + 1, 8192, 16384));
        assert!(fits_inline(0, 0, 0, 2 * FRAME_OVERHEAD));
    }

    #[test]
    fn the_client_prefers_inline_then_a_slot_then_pull_then_a_grant() {
        assert_eq!(outgoing(true, true, true), Outgoing::Inline);
        assert_eq!(outgoing(false, true, false), Outgoing::Slot);
        assert_eq!(outgoing(false, false, true), Outgoing::Pull);
        assert_eq!(outgoing(false, false, false), Outgoing::Grant);
    }

    #[test]
    fn the_server_accepts_each_route_the_handshake_allows() {
        let inline = RequestShape {
            inline_len: Some(10),
            ..shape(10)
        };
        assert_eq!(incoming(&WRITE, &inline, false), Ok(Incoming::Inline));
        let slot = RequestShape {
            slot: true,
            ..shape(70_000)
        };
        assert_eq!(incoming(&WRITE, &slot, true), Ok(Incoming::Slot));
        let pull = RequestShape {
            source: true,
            ..shape(70_000)
        };
        assert_eq!(incoming(&WRITE, &pull, true), Ok(Incoming::Pull));
        assert_eq!(incoming(&WRITE, &shape(70_000), false), Ok(Incoming::Grant));
        assert_eq!(incoming(&WRITE, &shape(0), true), Ok(Incoming::Nothing));
        assert_eq!(incoming(&READ, &shape(0), true), Ok(Incoming::Nothing));
    }

    #[test]
    fn requests_that_contradict_the_endpoint_or_the_handshake_get_statuses() {
        let code = |ep: &EndpointDef, s: RequestShape, pull: bool| {
            incoming(ep, &s, pull).unwrap_err().code()
        };
        assert_eq!(code(&WRITE, shape(2 << 20), true), Code::ResourceExhausted);
        let two_ways = RequestShape {
            inline_len: Some(5),
            slot: true,
            ..shape(5)
        };
        assert_eq!(code(&WRITE, two_ways, true), Code::InvalidArgument);
        let pull_when_off = RequestShape {
            source: true,
            ..shape(70_000)
        };
        assert_eq!(code(&WRITE, pull_when_off, false), Code::InvalidArgument);
        // Pull mode never grants a pool buffer.
        assert_eq!(code(&WRITE, shape(70_000), true), Code::InvalidArgument);
        let lying_inline = RequestShape {
            inline_len: Some(5),
            ..shape(6)
        };
        assert_eq!(code(&WRITE, lying_inline, true), Code::InvalidArgument);
        assert_eq!(code(&READ, shape(1), true), Code::InvalidArgument);
        let read_with_slot = RequestShape {
            slot: true,
            ..shape(0)
        };
        assert_eq!(code(&READ, read_with_slot, true), Code::InvalidArgument);
    }

    #[test]
    fn results_go_inline_pushed_or_after_asking_for_a_window() {
        assert_eq!(result_route(true, 100, None), ResultRoute::Inline);
        assert_eq!(result_route(false, 0, None), ResultRoute::Inline);
        assert_eq!(result_route(false, 70_000, Some(70_000)), ResultRoute::Push);
        assert_eq!(
            result_route(false, 70_000, Some(69_999)),
            ResultRoute::AskForWindow
        );
        assert_eq!(result_route(false, 70_000, None), ResultRoute::AskForWindow);
    }

    #[test]
    fn the_client_checks_what_a_server_asks_of_it() {
        assert!(check_granted_window(100, 100, true).is_ok());
        assert!(check_granted_window(100, 99, true).is_err());
        assert!(check_granted_window(100, 101, true).is_err());
        assert!(check_granted_window(100, 100, false).is_err());
        assert!(check_result_window(&READ, 1 << 20).is_ok());
        assert!(check_result_window(&READ, (1 << 20) + 1).is_err());
        assert!(check_result_window(&READ, 0).is_err());
    }
}
