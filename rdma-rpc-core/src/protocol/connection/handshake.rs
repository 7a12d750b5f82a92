//! The handshake: what each side announces (`Hello`, `HelloAck`) and what the connection
//! settles on. The client speaks first, with the one credit every side starts with; the server
//! answers once it has posted its receives, or says why not (a goaway) and closes.

use crate::error::Error;
use crate::protocol::frames::Hello;
use crate::protocol::{unusable_hello, PROTOCOL_VERSION};

/// What the handshake settled for the connection's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Negotiated {
    /// Calls the client may have in flight.
    pub(crate) max_in_flight: u32,
    /// Payloads up to this many bytes travel inside frames.
    pub(crate) inline_threshold: u32,
    /// Large send/write payloads are pulled by the server from a window the request offers.
    pub(crate) pull_writes: bool,
    /// Bytes of stream messages this side buffers per call.
    pub(crate) stream_window: u64,
    /// Bytes of stream messages the peer buffers per call.
    pub(crate) peer_stream_window: u64,
    /// The peer's token for this connection (in the handles it offers).
    pub(crate) peer_token: u64,
}

/// The stream window a side announces: what it asked for, and at least two frames' worth.
pub(crate) fn stream_window(wanted: u64, max_frame: usize) -> u64 {
    wanted.max(crate::protocol::stream::min_window(max_frame))
}

/// What the peer's receives look like after its handshake.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerReceives {
    /// Credits this side may use now.
    pub(crate) usable: u32,
    /// Receives the peer announced as its ceiling.
    pub(crate) announced: u32,
    /// Size of each.
    pub(crate) max_frame: usize,
}

impl PeerReceives {
    /// From the peer's Hello; `spent` credits of it were used already (the client's Hello
    /// used the one it started with).
    pub(crate) fn of(hello: &Hello, spent: u32) -> PeerReceives {
        PeerReceives {
            usable: hello.credits.saturating_sub(spent),
            announced: hello.credits.max(hello.max_credits),
            max_frame: hello.max_frame as usize,
        }
    }
}

/// Checks the server's answer on the client: `Err` ends the connection.
pub(crate) fn check_ack(ack: &Hello, peer: &str) -> Result<(), Error> {
    if ack.version != PROTOCOL_VERSION {
        return Err(Error::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: ack.version,
        });
    }
    if let Some(reason) = unusable_hello(ack) {
        return Err(Error::Protocol {
            peer: peer.to_owned(),
            reason,
        });
    }
    Ok(())
}

/// Checks a client's Hello on the server: `Err` ends the connection (after a goaway saying
/// why). A peer of another version is told so, whatever else its Hello says.
pub(crate) fn check_hello(hello: &Hello, peer: &str) -> Result<(), Error> {
    if hello.version != PROTOCOL_VERSION {
        return Err(Error::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: hello.version,
        });
    }
    if let Some(reason) = unusable_hello(hello) {
        return Err(Error::Protocol {
            peer: peer.to_owned(),
            reason,
        });
    }
    Ok(())
}
