//! Frames to bytes and back, without I/O.
//!
//! A frame is encoded once, when it is queued, into memory its side reuses (the sending half's
//! queue, borrowed from the thread while frames wait: no allocation and no reference count per
//! frame; see `protocol::connection::scratch`), followed by room for the credits it
//! returns, which are written when it leaves, since they are known only then (`Frame.credits`,
//! field 15, is a varint at the end, followed by `Frame.starved`, field 17, when set: protobuf
//! fields may come in any order). The transport copies it from there. A received frame is
//! copied into a block shared by consecutive frames (of every connection of the thread) before
//! it is decoded, so its byte fields (path, message, inline payload) are slices of that block
//! rather than an allocation each.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use super::frames::{Frame, Kind};
use super::hot::Hot;
use crate::error::{Error, Result};

/// Protobuf key of `Frame.credits` (field 15, varint).
const CREDITS_KEY: u8 = 15 << 3;

/// `Frame.starved = true`: the key of field 17 as a varint (17 << 3 = 136: two bytes), then 1.
const STARVED_FIELD: [u8; 3] = [0x88, 0x01, 0x01];

/// Room kept after each encoded frame for its credits (the key and a varint of a `u32`) and
/// its starved flag.
pub(crate) const CREDITS_ROOM: usize = 6 + STARVED_FIELD.len();

/// Received frames are copied into blocks of this size shared by consecutive frames. A block
/// is reused in place once every frame in it is dropped, or else a new one is taken; a slice a
/// handler keeps keeps its block (at most this size, or one larger frame) alive.
const BLOCK: usize = 1024;

/// Appends `kind` (a bare credit update when `None`), encoded, to `out`, followed by
/// [`CREDITS_ROOM`] bytes of room for the credits it will carry ([`put_credits`]). Returns the
/// frame's length (without the room). Refused, with `out` untouched, if the frame could not fit
/// the receives of a peer whose receives hold `peer_max_frame` bytes once its credits are
/// written.
pub(crate) fn encode_frame(
    kind: Option<&Kind>,
    peer_max_frame: usize,
    out: &mut Vec<u8>,
) -> Result<usize> {
    encode(kind.and_then(Hot::of), kind, peer_max_frame, out)
}

/// [`encode_frame`] for a request or a response, from where the caller keeps it (building a
/// `Kind` around it would move it).
pub(crate) fn encode_hot(hot: Hot<'_>, peer_max_frame: usize, out: &mut Vec<u8>) -> Result<usize> {
    encode(Some(hot), None, peer_max_frame, out)
}

/// A frame is its one `kind` field (the credits come at send time): encoded from the
/// caller's value, never moved into a `Frame` first; requests and responses in their fixed
/// layout (`hot`).
#[inline(always)]
fn encode(
    hot: Option<Hot<'_>>,
    kind: Option<&Kind>,
    peer_max_frame: usize,
    out: &mut Vec<u8>,
) -> Result<usize> {
    let len = match &hot {
        Some(hot) => hot.encoded_len(),
        None => kind.map_or(0, Kind::encoded_len),
    };
    // A receive is never larger than a `u32` (`Hello.max_frame`), nor then any length a
    // fixed frame writes.
    let max = peer_max_frame.min(u32::MAX as usize);
    if len + CREDITS_ROOM > max {
        return Err(Error::LimitExceeded {
            limit: "max_frame",
            max: max as u64,
            actual: (len + CREDITS_ROOM) as u64,
        });
    }
    // Written into a zeroed slice of exactly its length: a slice's writes are stores, where a
    // growing buffer's each check capacity.
    let start = out.len();
    out.resize(start + len + CREDITS_ROOM, 0);
    let frame = &mut out[start..start + len];
    match (&hot, kind) {
        (Some(hot), _) => hot.encode(frame),
        (None, Some(kind)) => {
            let mut slice: &mut [u8] = frame;
            kind.encode(&mut slice);
            debug_assert!(slice.is_empty(), "the encoded length was computed exactly");
        }
        (None, None) => {}
    }
    Ok(len)
}

/// Writes `credits` (nothing for 0) and `starved` (nothing for `false`) into `room`, the
/// [`CREDITS_ROOM`] bytes after an encoded frame: how many bytes it wrote.
pub(crate) fn put_credits(room: &mut [u8], credits: u32, starved: bool) -> usize {
    let total = room.len();
    let mut rest = room;
    if credits > 0 {
        rest.put_u8(CREDITS_KEY);
        prost::encoding::encode_varint(u64::from(credits), &mut rest);
    }
    if starved {
        rest.put_slice(&STARVED_FIELD);
    }
    total - rest.len()
}

/// `kind` as a whole frame carrying `credits` and `starved`, in bytes of its own (tests and
/// the simulation's hostile peer).
#[cfg(test)]
pub(crate) fn frame_bytes(kind: Option<&Kind>, credits: u32, starved: bool) -> Bytes {
    let mut out = Vec::new();
    let len = encode_frame(kind, usize::MAX, &mut out).expect("no limit");
    let written = put_credits(&mut out[len..], credits, starved);
    out.truncate(len + written);
    Bytes::from(out)
}

/// Copies received frames into shared blocks and decodes them.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    block: BytesMut,
}

impl Decoder {
    /// Decodes a received frame (copied first: see the module docs). `Err` is why the bytes
    /// are not a frame.
    #[cfg(test)]
    pub(crate) fn decode(&mut self, received: &[u8]) -> std::result::Result<Frame, String> {
        let mut frame = Frame::default();
        self.decode_into(received, &mut frame)?;
        Ok(frame)
    }

    /// Decodes a received frame into `frame`, in place (see [`super::hot::decode_into`]).
    pub(crate) fn decode_into(
        &mut self,
        received: &[u8],
        frame: &mut Frame,
    ) -> std::result::Result<(), String> {
        if self.block.capacity() < received.len() {
            self.block.reserve(BLOCK.max(received.len()));
        }
        self.block.extend_from_slice(received);
        let landed: Bytes = self.block.split().freeze();
        match super::hot::decode_into(landed, frame) {
            Ok(None) => Ok(()),
            Ok(Some(landed)) => {
                *frame = Frame::decode(landed).map_err(|e| format!("undecodable frame: {e}"))?;
                Ok(())
            }
            Err(e) => Err(format!("undecodable frame: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frames::{CallId, RequestFrame};

    #[test]
    fn credits_written_at_send_time_decode_with_the_frame() {
        let kind = Kind::Request(RequestFrame {
            id: 7,
            path: Bytes::from_static(b"/a"),
            metadata: Bytes::from_static(b"hello"),
            ..Default::default()
        });
        let bytes = frame_bytes(Some(&kind), 300, true);
        let frame = Decoder::default().decode(&bytes).unwrap();
        assert_eq!(frame.kind, Some(kind));
        assert_eq!(frame.credits, 300);
        assert!(frame.starved);
        let bare = frame_bytes(None, 0, false);
        assert_eq!(Decoder::default().decode(&bare).unwrap(), Frame::default());
    }

    #[test]
    fn a_frame_the_peer_could_not_receive_is_refused_before_anything_is_spent() {
        let big = Kind::Cancel(CallId { id: u64::MAX });
        let mut out = vec![1, 2, 3];
        let err = encode_frame(Some(&big), 8, &mut out)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_frame"), "{err}");
        assert_eq!(out, [1, 2, 3], "nothing written");
    }

    #[test]
    fn frames_are_appended_back_to_back_each_with_room_for_its_credits() {
        let mut out = Vec::new();
        let a = encode_frame(Some(&Kind::Cancel(CallId { id: 1 })), 1024, &mut out).unwrap();
        let b = encode_frame(Some(&Kind::Cancel(CallId { id: 2 })), 1024, &mut out).unwrap();
        assert_eq!(out.len(), a + CREDITS_ROOM + b + CREDITS_ROOM);
        // The largest credits and the starved flag fill the room exactly.
        assert_eq!(
            put_credits(&mut out[a..a + CREDITS_ROOM], u32::MAX, true),
            CREDITS_ROOM
        );
        let second = &out[a + CREDITS_ROOM..a + CREDITS_ROOM + b];
        let frame = Decoder::default().decode(second).unwrap();
        assert_eq!(frame.kind, Some(Kind::Cancel(CallId { id: 2 })));
    }

    #[test]
    fn a_frame_encoded_from_its_kind_is_the_frame_prost_encodes() {
        for starved in [false, true] {
            let kind = Kind::Cancel(CallId { id: 77 });
            let ours = frame_bytes(Some(&kind), 9, starved);
            let theirs = Frame {
                kind: Some(kind),
                credits: 9,
                starved,
            }
            .encode_to_vec();
            assert_eq!(&ours[..], &theirs[..]);
        }
    }

    #[test]
    fn a_request_or_response_encoded_where_it_is_is_the_frame_of_its_kind() {
        let request = RequestFrame {
            id: 9,
            path: Bytes::from_static(b"/echo"),
            metadata: Bytes::from_static(b"message"),
            inline_payload: Some(Bytes::from_static(b"payload")),
            timeout_us: 1_000,
            ..Default::default()
        };
        let response = crate::protocol::frames::ResponseFrame {
            id: 9,
            metadata: Bytes::from_static(b"answer"),
            pushed_len: 4096,
            ..Default::default()
        };
        let mut by_kind = Vec::new();
        let mut in_place = Vec::new();
        for (kind, hot) in [
            (Kind::Request(request.clone()), Hot::request(&request)),
            (Kind::Response(response.clone()), Hot::response(&response)),
        ] {
            let a = encode_frame(Some(&kind), 1024, &mut by_kind).unwrap();
            let b = encode_hot(hot, 1024, &mut in_place).unwrap();
            assert_eq!(a, b);
        }
        assert_eq!(by_kind, in_place);
        // And the peer reads it back as sent.
        let mut out = Vec::new();
        let len = encode_hot(Hot::request(&request), 1024, &mut out).unwrap();
        let frame = Decoder::default().decode(&out[..len]).unwrap();
        assert_eq!(frame.kind, Some(Kind::Request(request)));
        let err = encode_hot(Hot::response(&response), 8, &mut out).unwrap_err();
        assert!(err.to_string().contains("max_frame"), "{err}");
    }

    /// A request whose message is kept in place (`encoded::Small`) and handed beside its frame
    /// is the frame that carries the message in its `metadata`, and reads back as that frame.
    #[test]
    fn a_request_with_its_small_message_beside_it_is_the_frame_with_the_message_in_it() {
        #[derive(Clone, PartialEq, prost::Message)]
        struct Len {
            #[prost(uint64, tag = "1")]
            len: u64,
        }
        let message = Len { len: 64 };
        let (empty, small) = crate::encoded::Encoded::of(&message).split();
        let small = small.expect("a message of 2 bytes is kept in place");
        let framed = RequestFrame {
            id: 3,
            path: Bytes::from_static(b"/bench/send"),
            op: 1,
            metadata: Bytes::from(prost::Message::encode_to_vec(&message)),
            payload_len: 64,
            inline_payload: Some(Bytes::from(vec![0x5a; 64])),
            ..Default::default()
        };
        let beside = RequestFrame {
            metadata: empty,
            ..framed.clone()
        };
        let mut a = Vec::new();
        let mut b = Vec::new();
        let len = encode_hot(Hot::request(&framed), 1024, &mut a).unwrap();
        let len_beside =
            encode_hot(Hot::request_with(&beside, Some(&small)), 1024, &mut b).unwrap();
        assert_eq!((len, &a), (len_beside, &b));
        let frame = Decoder::default().decode(&b[..len]).unwrap();
        assert_eq!(frame.kind, Some(Kind::Request(framed)));
        // Without a small message the frame's own is encoded.
        let mut c = Vec::new();
        encode_hot(Hot::request_with(&beside, None), 1024, &mut c).unwrap();
        assert_ne!(c, b);
    }

    #[test]
    fn garbage_is_not_a_frame() {
        let err = Decoder::default().decode(&[0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.contains("undecodable"), "{err}");
    }
}
