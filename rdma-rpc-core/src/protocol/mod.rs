//! The wire protocol: what the control frames mean and how they flow.
//!
//! Control frames (prost, `frames.rs`; requests and responses in a fixed layout, `hot.rs`)
//! travel as two-sided sends into receives each side posted in advance; credits returned in
//! every frame keep a side from ever sending into a peer with no receive posted. Bulk bytes
//! move by one-sided RDMA write and read: into the connection's write slots (announced with a
//! response once the connection needs them), from and into windows the client offers in its
//! request, or, in grant mode, into a window the server grants for one call.
//! The per-operation sequences are in the README ("Protocol") and in `server/call.rs`
//! (server side) and `client/call.rs` (client side).

pub(crate) mod call;
mod call_map;
#[cfg(test)]
pub(crate) mod channel;
pub(crate) mod codec;
pub(crate) mod connection;
pub(crate) mod credits;
pub(crate) mod deadline;
pub(crate) mod frames;
pub(crate) mod handles;
mod hot;
pub(crate) mod mailbox;
pub(crate) mod rate;
pub(crate) mod route;
#[cfg(test)]
pub(crate) mod sim;
pub(crate) mod slot_book;
pub(crate) mod stream;
pub(crate) mod wait;

/// Calls in flight by id, the first inline (see [`call_map`]). Beyond it, call ids are
/// sequential (a client's own) or bounded in number (a server holds at most `max_in_flight`
/// per connection), so one multiplication spreads them well enough, and a client that picks
/// colliding ids slows only its own connection's map, which holds at most `max_in_flight`
/// entries; SipHash's per-operation cost buys nothing here (see [`crate::ids`]).
pub(crate) use call_map::CallMap;

/// Maps keyed by a path the server chose itself (its endpoints' paths, as bytes), looked up
/// with bytes a client sent: the table never grows from a lookup, so a client choosing keys
/// gains nothing from a weak hash, and SipHash's cost per lookup buys nothing here either.
pub(crate) type PathMap<V> =
    std::collections::HashMap<&'static [u8], V, std::hash::BuildHasherDefault<PathHasher>>;

/// See [`PathMap`]: eight bytes at a time, one multiplication each.
#[derive(Default)]
pub(crate) struct PathHasher(u64);

impl std::hash::Hasher for PathHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        let mut last = [0u8; 8];
        let rest = chunks.remainder();
        last[..rest.len()].copy_from_slice(rest);
        let word = u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56);
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The protocol version this build speaks (2: write slots, pushed results, pulled payloads;
/// 3: remote buffers and their revocation, call metadata, pings; 4: message and bulk
/// streams; 5: receives grow on the peer's demand, `Frame.starved`; 6: requests and responses
/// in a fixed layout, `protocol/hot.rs`). Peers of different
/// versions refuse each other in the handshake: a version 2 server would drop a call's
/// metadata (an auth token) without a word.
pub const PROTOCOL_VERSION: u32 = 6;

/// Sizes of control frames apart from their metadata and inline payload (generous upper
/// bound of the prost overhead of a request or response frame).
pub(crate) const FRAME_OVERHEAD: usize = 512;

/// Receives each side posts for control frames when a connection opens (by default: see
/// `initial_receives`); it doubles them when the peer says it waited for a credit, up to its
/// `recv_credits`, so an idle connection holds `INITIAL_RECEIVES * max_frame` bytes of receives
/// and a pipelining one what its depth needs.
pub(crate) const INITIAL_RECEIVES: u32 = 4;

/// Most receives a peer's handshake may announce: what it claims beyond this is not believed.
/// Bounds the frames one side may have in flight towards a peer that never reads (at most
/// `MAX_PEER_CREDITS * max_frame` bytes queued per connection).
pub(crate) const MAX_PEER_CREDITS: u32 = 1024;

/// Checks the parts of a peer's Hello (or HelloAck) this side could not work with: a peer
/// that posted no receive could never be sent a frame, and frames smaller than
/// `2 * FRAME_OVERHEAD` cannot hold a request or a response. `Some` is the reason.
pub(crate) fn unusable_hello(hello: &frames::Hello) -> Option<String> {
    if hello.credits == 0 {
        return Some(
            "the handshake announces no receives (credits = 0): no frame could ever be sent".into(),
        );
    }
    let window = stream::min_window(hello.max_frame as usize);
    if hello.stream_window < window {
        return Some(format!(
            "the handshake announces a stream window of {} bytes; frames of {} bytes need at \
             least {window}",
            hello.stream_window, hello.max_frame
        ));
    }
    if (hello.max_frame as usize) < 2 * FRAME_OVERHEAD {
        return Some(format!(
            "the handshake announces frames of {} bytes (max_frame); at least {} are needed",
            hello.max_frame,
            2 * FRAME_OVERHEAD
        ));
    }
    None
}

/// Whether a request message of `len` encoded bytes is too large for `endpoint`: on send and
/// receive endpoints messages travel in the endpoint's buffer (docs/spec.md), so they must fit
/// it. Both sides check: the client before sending, the server before running the handler.
pub(crate) fn oversized_message(
    endpoint: &crate::service::EndpointDef,
    len: usize,
) -> Option<crate::status::Status> {
    use crate::service::OpKind;
    let carried = matches!(endpoint.op, OpKind::Send | OpKind::Receive);
    (carried && len as u64 > endpoint.buffer_size).then(|| {
        crate::status::Status::resource_exhausted(format!(
            "the request message is {len} bytes, more than the {} byte buffer of {} {}",
            endpoint.buffer_size, endpoint.op, endpoint.path
        ))
    })
}
