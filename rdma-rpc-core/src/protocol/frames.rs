//! Control frames, encoded with prost, apart from requests and responses, which travel in a
//! fixed layout (`hot.rs`) and decode into the same types. One frame per two-sided send.

use bytes::Bytes;

/// A control frame: one message kind plus the credits it returns to the peer.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Frame {
    #[prost(
        oneof = "Kind",
        tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16"
    )]
    pub(crate) kind: Option<Kind>,
    /// Receives the sender re-posted since its last frame (flow control).
    #[prost(uint32, tag = "15")]
    pub(crate) credits: u32,
    /// Since its last frame the sender had a frame waiting for a credit: it wants the receiver
    /// to post more receives (receives grow only on the peer's demand).
    #[prost(bool, tag = "17")]
    pub(crate) starved: bool,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Kind {
    /// Client → server, first frame.
    #[prost(message, tag = "1")]
    Hello(Hello),
    /// Server → client, answer to `Hello`.
    #[prost(message, tag = "2")]
    HelloAck(Hello),
    /// Client → server: start a call.
    #[prost(message, tag = "3")]
    Request(RequestFrame),
    /// Server → client: where to write or read the call's bytes.
    #[prost(message, tag = "4")]
    Grant(GrantFrame),
    /// Client → server: the transfer of a call is done (or, after a `Grant` that asks for a
    /// buffer, where to put the result).
    #[prost(message, tag = "5")]
    Ack(AckFrame),
    /// Server → client: the outcome of a call.
    #[prost(message, tag = "6")]
    Response(ResponseFrame),
    /// Client → server: the client gave up on a call.
    #[prost(message, tag = "7")]
    Cancel(CallId),
    /// Either way: the connection ends (error or shutdown), with why.
    #[prost(message, tag = "8")]
    Goaway(StatusFrame),
    /// Either way: the sender revokes some of its offers (remote buffers); the receiver
    /// stops using them and confirms with `Revoked` once its uses in flight are done.
    #[prost(message, tag = "9")]
    Revoke(Offers),
    /// Either way: answer to `Revoke`, for any number of offers at once.
    #[prost(message, tag = "10")]
    Revoked(Offers),
    /// Client → server: a liveness probe; the server answers `Pong` with the same id at once.
    #[prost(message, tag = "11")]
    Ping(CallId),
    /// Server → client: answer to `Ping`.
    #[prost(message, tag = "12")]
    Pong(CallId),
    /// Either way: messages of a call's message stream, and (client → server) whether the
    /// client's stream ends with them. A server's stream ends with the call's response.
    #[prost(message, tag = "13")]
    Messages(MessagesFrame),
    /// Either way: the receiver of a message stream took this many bytes of it; the sender
    /// may send as many more (`protocol::stream`).
    #[prost(message, tag = "14")]
    Credit(CreditFrame),
    /// Client → server: windows of a bulk stream offered; server → client: windows the server
    /// is done with.
    #[prost(message, tag = "16")]
    Chunks(ChunksFrame),
}

/// Messages of one call's stream.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MessagesFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    /// Encoded messages, in order.
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub(crate) messages: Vec<Bytes>,
    /// The sender's stream ends after these (client → server).
    #[prost(bool, tag = "3")]
    pub(crate) end: bool,
}

/// Bytes of a message stream the receiver took.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CreditFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) bytes: u64,
}

/// A window of a bulk stream, offered by the client.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WindowOffer {
    /// The client's number for it.
    #[prost(uint32, tag = "1")]
    pub(crate) window: u32,
    /// Write streams: where the window's bytes sit in the stream.
    #[prost(uint64, tag = "2")]
    pub(crate) offset: u64,
    #[prost(message, optional, tag = "3")]
    pub(crate) descriptor: Option<DescriptorFrame>,
}

/// A window of a bulk stream the server is done with: for a write stream read to its end,
/// for a read stream holding a chunk the server wrote there before this frame.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct UsedWindow {
    #[prost(uint32, tag = "1")]
    pub(crate) window: u32,
    /// Where its bytes sit in the stream.
    #[prost(uint64, tag = "2")]
    pub(crate) offset: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) len: u64,
}

/// Windows of one call's bulk stream: offered (client → server), or used (server → client).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ChunksFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(message, repeated, tag = "2")]
    pub(crate) offers: Vec<WindowOffer>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) used: Vec<UsedWindow>,
}

/// Names offers of the connection (ids are the offerer's).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Offers {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) offers: Vec<u64>,
}

/// Limits each side announces in the handshake.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Hello {
    #[prost(uint32, tag = "1")]
    pub(crate) version: u32,
    /// Size of each receive the sender posted: the largest frame it accepts.
    #[prost(uint32, tag = "2")]
    pub(crate) max_frame: u32,
    /// Number of receives the sender posted (initial credits for the peer).
    #[prost(uint32, tag = "3")]
    pub(crate) credits: u32,
    /// Most receives the sender posts as the connection gets busy (it starts with `credits`
    /// and returns a credit for each one it adds); 0 means `credits`.
    #[prost(uint32, tag = "8")]
    pub(crate) max_credits: u32,
    /// Client: calls it wants in flight; server: calls it allows in flight.
    #[prost(uint32, tag = "4")]
    pub(crate) max_in_flight: u32,
    /// Payloads up to this many bytes travel inside frames (eager).
    #[prost(uint32, tag = "5")]
    pub(crate) inline_threshold: u32,
    /// Server: write slots of this connection, ready for the client's first writes.
    #[prost(message, repeated, tag = "6")]
    pub(crate) slots: Vec<SlotFrame>,
    /// Server: large send/write payloads are pulled by the server from a window the client
    /// offers in the request (`RequestFrame::source`), instead of written by the client into
    /// a window the server grants.
    #[prost(bool, tag = "7")]
    pub(crate) pull_writes: bool,
    /// A random token naming the sender's end of this connection: the remote buffers it
    /// offers carry it, so that the peer refuses a handle used on another connection.
    #[prost(uint64, tag = "9")]
    pub(crate) token: u64,
    /// Bytes of stream messages the sender buffers per stream before it credits some back
    /// (`protocol::stream`); at least `protocol::stream::min_window(max_frame)`.
    #[prost(uint64, tag = "10")]
    pub(crate) stream_window: u64,
}

/// Where one side may reach a window of the other.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DescriptorFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) addr: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) len: u64,
    #[prost(uint32, tag = "3")]
    pub(crate) rkey: u32,
    #[prost(uint32, tag = "4")]
    pub(crate) access: u32,
    #[prost(bytes = "bytes", tag = "5")]
    pub(crate) blob: Bytes,
}

/// A per-connection write slot: a server buffer the client may RDMA-write once, then name
/// in a request. The server arms a new one (same index, new window) when it is used.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SlotFrame {
    #[prost(uint32, tag = "1")]
    pub(crate) index: u32,
    #[prost(message, optional, tag = "2")]
    pub(crate) window: Option<DescriptorFrame>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RequestFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    /// The endpoint's path, UTF-8 (a protobuf `string` on the wire; kept as bytes so that a
    /// client sends its static path without copying it).
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) path: Bytes,
    #[prost(uint32, tag = "3")]
    pub(crate) op: u32,
    /// Encoded request message.
    #[prost(bytes = "bytes", tag = "4")]
    pub(crate) metadata: Bytes,
    /// Bytes the client will move (send, write).
    #[prost(uint64, tag = "5")]
    pub(crate) payload_len: u64,
    /// The payload itself, when small enough to travel in the frame.
    #[prost(bytes = "bytes", optional, tag = "6")]
    pub(crate) inline_payload: Option<Bytes>,
    /// Time the client has left, in microseconds (0: no deadline).
    #[prost(uint64, tag = "7")]
    pub(crate) timeout_us: u64,
    /// The payload is already in this write slot (written before the request was sent).
    #[prost(uint32, optional, tag = "8")]
    pub(crate) slot: Option<u32>,
    /// The payload waits in this client window: the server reads it (pull mode). Boxed, as
    /// `reply_to`: most requests have neither, and every request moves a few times between
    /// its frame and its call.
    #[prost(message, optional, boxed, tag = "9")]
    pub(crate) source: Option<Box<DescriptorFrame>>,
    /// The server may write the result (receive, read) into this client window.
    #[prost(message, optional, boxed, tag = "10")]
    pub(crate) reply_to: Option<Box<DescriptorFrame>>,
    /// The call's metadata (key, value pairs the application sets: tokens, trace ids).
    #[prost(message, repeated, tag = "11")]
    pub(crate) call_metadata: Vec<MetadataEntry>,
    /// Bulk streams: the first windows the client offers (`protocol::stream`).
    #[prost(message, repeated, tag = "12")]
    pub(crate) offers: Vec<WindowOffer>,
}

/// One metadata entry of a request.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct MetadataEntry {
    /// A string on the wire (protobuf's `string` and `bytes` are encoded alike), held as
    /// bytes: a received key is a slice of its frame and a sent one is not copied. Every key
    /// is UTF-8: a sender's came from a `String`, a received one passed `check_key`.
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) value: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AckFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    /// Answer to a `Grant` that asked for a buffer: where to write the result.
    #[prost(message, optional, tag = "2")]
    pub(crate) reply_to: Option<DescriptorFrame>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CallId {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
}

/// Server → client, during a call.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct GrantFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    /// Send/write: the window to RDMA-write the payload into.
    #[prost(message, optional, tag = "2")]
    pub(crate) window: Option<DescriptorFrame>,
    /// Receive/read: the result has this many bytes and did not fit the request's
    /// `reply_to`; the client answers with an `Ack` naming a window that large.
    #[prost(uint64, tag = "3")]
    pub(crate) need_buffer: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResponseFrame {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(message, optional, tag = "2")]
    pub(crate) status: Option<StatusFrame>,
    /// Encoded response message.
    #[prost(bytes = "bytes", tag = "3")]
    pub(crate) metadata: Bytes,
    /// Receive/read bytes small enough to travel in the frame.
    #[prost(bytes = "bytes", optional, tag = "4")]
    pub(crate) inline_payload: Option<Bytes>,
    /// Receive/read bytes the server wrote into the client's `reply_to` window before this
    /// frame (connections deliver in order, so they are in place when it arrives).
    #[prost(uint64, tag = "5")]
    pub(crate) pushed_len: u64,
    /// Write slots armed again since the last frame.
    #[prost(message, repeated, tag = "6")]
    pub(crate) slots: Vec<SlotFrame>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusFrame {
    #[prost(uint32, tag = "1")]
    pub(crate) code: u32,
    #[prost(string, tag = "2")]
    pub(crate) message: String,
}

impl From<&crate::transport::Descriptor> for DescriptorFrame {
    fn from(d: &crate::transport::Descriptor) -> Self {
        DescriptorFrame {
            addr: d.addr,
            len: d.len,
            rkey: d.rkey,
            access: d.access.bits(),
            blob: d.blob.clone(),
        }
    }
}

impl From<&crate::transport::Descriptor> for Box<DescriptorFrame> {
    fn from(d: &crate::transport::Descriptor) -> Self {
        Box::new(DescriptorFrame::from(d))
    }
}

impl From<Box<DescriptorFrame>> for crate::transport::Descriptor {
    fn from(d: Box<DescriptorFrame>) -> Self {
        crate::transport::Descriptor::from(*d)
    }
}

impl From<DescriptorFrame> for crate::transport::Descriptor {
    fn from(d: DescriptorFrame) -> Self {
        crate::transport::Descriptor {
            addr: d.addr,
            len: d.len,
            rkey: d.rkey,
            access: crate::memory::Access::from_bits_truncate(d.access),
            blob: d.blob,
        }
    }
}

impl From<&crate::Status> for StatusFrame {
    fn from(s: &crate::Status) -> Self {
        StatusFrame {
            code: s.code() as u32,
            message: s.message().to_owned(),
        }
    }
}

impl From<StatusFrame> for crate::Status {
    fn from(s: StatusFrame) -> Self {
        crate::Status::new(crate::Code::from_u32(s.code), s.message)
    }
}
