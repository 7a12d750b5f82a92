//! The wire protocol: what the control frames mean and how they flow.
//!
//! Control frames (prost, `frames.rs`) travel as two-sided sends into receives each side
//! posted in advance; credits returned in every frame keep a side from ever sending into a
//! peer with no receive posted. Bulk bytes move by one-sided RDMA write and read: into the
//! connection's write slots (announced in the handshake), from and into windows the client
//! offers in its request, or, in grant mode, into a window the server grants for one call.
//! The per-operation sequences are in the README ("Protocol") and in `server/call.rs`
//! (server side) and `client/call.rs` (client side).

pub(crate) mod channel;
pub(crate) mod frames;

/// The protocol version this build speaks (2: write slots, pushed results, pulled payloads).
pub const PROTOCOL_VERSION: u32 = 2;

/// Sizes of control frames apart from their metadata and inline payload (generous upper
/// bound of the prost overhead of a request or response frame).
pub(crate) const FRAME_OVERHEAD: usize = 512;

/// Most receives a peer's handshake may announce: what it claims beyond this is not believed.
/// Bounds the frames one side may have in flight towards a peer that never reads (at most
/// `MAX_PEER_CREDITS * max_frame` bytes queued per connection).
pub(crate) const MAX_PEER_CREDITS: u32 = 1024;
