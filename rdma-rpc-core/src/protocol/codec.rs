//! Frames to bytes and back, without I/O.
//!
//! A frame is encoded once, when it is queued, into a block shared with the frames queued
//! before and after it (no allocation per frame); the credits it returns are appended when it
//! leaves, since they are known only then (`Frame.credits`, field 15, is a varint at the end,
//! followed by `Frame.starved`, field 17, when set: protobuf fields may come in any order). A received frame is copied into a block of the same
//! kind before it is decoded, so its byte fields (path, message, inline payload) are slices of
//! that block rather than an allocation each.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use super::frames::{Frame, Kind};
use crate::error::{Error, Result};

/// Protobuf key of `Frame.credits` (field 15, varint).
const CREDITS_KEY: u8 = 15 << 3;

/// `Frame.starved = true`: the key of field 17 as a varint (17 << 3 = 136: two bytes), then 1.
const STARVED_FIELD: [u8; 3] = [0x88, 0x01, 0x01];

/// Room kept after each encoded frame for its credits (the key and a varint of a `u32`) and
/// its starved flag.
pub(crate) const CREDITS_ROOM: usize = 6 + STARVED_FIELD.len();

/// Frames are encoded into, and received frames copied into, blocks of this size shared by
/// consecutive frames. A block is reused in place once every frame in it is dropped, or else a
/// new one is taken; a slice a handler keeps keeps its block (at most this size, or one larger
/// frame) alive.
const BLOCK: usize = 1024;

/// Encodes frames into shared blocks.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    block: BytesMut,
}

impl Encoder {
    /// Encodes `kind` (a bare credit update when `None`) for a peer whose receives hold
    /// `peer_max_frame` bytes, refusing it if it could not fit them once its credits are
    /// appended. The frame keeps [`CREDITS_ROOM`] spare bytes of capacity for them.
    pub(crate) fn encode(
        &mut self,
        kind: Option<&Kind>,
        peer_max_frame: usize,
    ) -> Result<BytesMut> {
        // A frame is its one `kind` field (the credits come at send time): encoded from the
        // caller's value, never moved into a `Frame` first; requests and responses by hand.
        let hot = kind.and_then(super::hot::Hot::of);
        let len = match &hot {
            Some(hot) => hot.encoded_len(),
            None => kind.map_or(0, Kind::encoded_len),
        };
        if len + CREDITS_ROOM > peer_max_frame {
            return Err(Error::LimitExceeded {
                limit: "max_frame",
                max: peer_max_frame as u64,
                actual: (len + CREDITS_ROOM) as u64,
            });
        }
        let need = len + CREDITS_ROOM;
        if self.block.capacity() < need {
            self.block.reserve(BLOCK.max(need));
        }
        // The frame is written into a zeroed slice of the block of exactly its length: a
        // slice's one-byte writes are stores, where `BytesMut`'s each check capacity and call
        // `memcpy` (about 30 calls per small call's two frames). The spare bytes after it stay
        // in this frame's capacity: appending the credits never reallocates.
        self.block.put_bytes(0, need);
        let mut out = self.block.split();
        let mut slice: &mut [u8] = &mut out[..len];
        match (&hot, kind) {
            (Some(hot), _) => hot.encode(&mut slice),
            (None, Some(kind)) => kind.encode(&mut slice),
            (None, None) => {}
        }
        debug_assert!(slice.is_empty(), "the encoded length was computed exactly");
        out.truncate(len);
        Ok(out)
    }
}

/// Appends `credits` (nothing for 0) and `starved` (nothing for `false`) to an encoded frame
/// and freezes it.
pub(crate) fn with_credits(mut frame: BytesMut, credits: u32, starved: bool) -> Bytes {
    // Written on the stack, then appended with one copy (see `Encoder::encode`).
    let mut tail = [0u8; CREDITS_ROOM];
    let mut rest: &mut [u8] = &mut tail;
    if credits > 0 {
        rest.put_u8(CREDITS_KEY);
        prost::encoding::encode_varint(u64::from(credits), &mut rest);
    }
    if starved {
        rest.put_slice(&STARVED_FIELD);
    }
    let written = CREDITS_ROOM - rest.len();
    frame.extend_from_slice(&tail[..written]);
    frame.freeze()
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
        match super::hot::decode_into(&landed, frame) {
            Ok(true) => Ok(()),
            Ok(false) => {
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
    fn credits_appended_at_send_time_decode_with_the_frame() {
        let mut enc = Encoder::default();
        let kind = Kind::Request(RequestFrame {
            id: 7,
            path: Bytes::from_static(b"/a"),
            metadata: Bytes::from_static(b"hello"),
            ..Default::default()
        });
        let bytes = with_credits(enc.encode(Some(&kind), 1024).unwrap(), 300, true);
        let frame = Decoder::default().decode(&bytes).unwrap();
        assert_eq!(frame.kind, Some(kind));
        assert_eq!(frame.credits, 300);
        assert!(frame.starved);
        let bare = with_credits(enc.encode(None, 1024).unwrap(), 0, false);
        assert_eq!(Decoder::default().decode(&bare).unwrap(), Frame::default());
    }

    #[test]
    fn a_frame_the_peer_could_not_receive_is_refused_before_anything_is_spent() {
        let mut enc = Encoder::default();
        let big = Kind::Cancel(CallId { id: u64::MAX });
        let err = enc.encode(Some(&big), 8).unwrap_err().to_string();
        assert!(err.contains("max_frame"), "{err}");
    }

    #[test]
    fn consecutive_frames_share_a_block() {
        let mut enc = Encoder::default();
        let a = enc
            .encode(Some(&Kind::Cancel(CallId { id: 1 })), 1024)
            .unwrap();
        let b = enc
            .encode(Some(&Kind::Cancel(CallId { id: 2 })), 1024)
            .unwrap();
        let gap = b.as_ptr() as usize - a.as_ptr() as usize;
        assert_eq!(gap, a.len() + CREDITS_ROOM, "one block, back to back");
    }

    #[test]
    fn a_frame_encoded_from_its_kind_is_the_frame_prost_encodes() {
        for starved in [false, true] {
            let kind = Kind::Cancel(CallId { id: 77 });
            let ours = with_credits(
                Encoder::default().encode(Some(&kind), 1024).unwrap(),
                9,
                starved,
            );
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
    fn garbage_is_not_a_frame() {
        let err = Decoder::default().decode(&[0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.contains("undecodable"), "{err}");
    }
}
