//! The two frames every call sends, a request and a response, in a fixed layout (protocol
//! version 6): a header of fixed-width little-endian fields, then the frame's byte fields back
//! to back, then the rare fields as protobuf (`RequestExt`, `ResponseExt`), then the frame's
//! credits as protobuf fields 15 and 17 like every frame's. Encoding is a few stores and a
//! copy per byte field; decoding reads the header at fixed offsets and slices the byte fields
//! from the received block. Protobuf varints, keys and field-by-field length sums were most of
//! a small call's codec (about 2,400 instructions for its two frames, encoded and decoded).
//!
//! The first byte tells the layouts apart: [`REQUEST_MARK`] and [`RESPONSE_MARK`] would be
//! protobuf keys of field 0 with wire type 6 or 7, both invalid, so no protobuf frame starts
//! with them (a test checks that prost refuses every fixed frame). Every other frame, and a
//! request or response a peer sends as a protobuf field, is decoded by prost; bare credit
//! updates by hand, as prost would.
//!
//! Request header (52 bytes):
//!
//! | offset | field |
//! | --- | --- |
//! | 0 | `0x06` |
//! | 1 | flags: 1 the payload is inline, 2 a write slot is named |
//! | 2 | 2 bytes, zero |
//! | 4 | `op` (u32) |
//! | 8 | `id` (u64) |
//! | 16 | `payload_len` (u64) |
//! | 24 | `timeout_us` (u64) |
//! | 32 | `slot` (u32; 0 without flag 2) |
//! | 36 | lengths (u32 each) of the path, the message, the inline payload (0 without flag 1), the protobuf rest |
//!
//! Response header (32 bytes): `0x07`, flags (1: the payload is inline), 2 zero bytes, `id`
//! (u64, at 4), `pushed_len` (u64, at 12), and at 20 the lengths (u32 each) of the message, the
//! inline payload (0 without flag 1) and the protobuf rest. The parts follow the header in
//! that order in both frames.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{encoded_len_varint, WireType};
use prost::Message;

use crate::encoded::Small;

use super::frames::{
    DescriptorFrame, Frame, Kind, MetadataEntry, RequestFrame, ResponseFrame, SlotFrame,
    StatusFrame, WindowOffer,
};

/// First byte of a request frame.
pub(crate) const REQUEST_MARK: u8 = 0x06;
/// First byte of a response frame.
pub(crate) const RESPONSE_MARK: u8 = 0x07;

const REQUEST_HEADER: usize = 52;
const RESPONSE_HEADER: usize = 32;

/// Header flag: the payload travels in the frame.
const INLINE: u8 = 1;
/// Request header flag: the payload waits in the named write slot.
const SLOT: u8 = 2;

/// Field numbers of `Frame`'s credits.
const CREDITS: u64 = 15;
const STARVED: u64 = 17;

/// The fields of a request that most calls leave empty, encoded as protobuf after its byte
/// fields (the same field numbers as in `RequestFrame`).
#[derive(Clone, PartialEq, prost::Message)]
struct RequestExt {
    #[prost(message, optional, boxed, tag = "9")]
    source: Option<Box<DescriptorFrame>>,
    #[prost(message, optional, boxed, tag = "10")]
    reply_to: Option<Box<DescriptorFrame>>,
    #[prost(message, repeated, tag = "11")]
    call_metadata: Vec<MetadataEntry>,
    #[prost(message, repeated, tag = "12")]
    offers: Vec<WindowOffer>,
}

/// The fields of a response that most calls leave empty (see [`RequestExt`]).
#[derive(Clone, PartialEq, prost::Message)]
struct ResponseExt {
    #[prost(message, optional, tag = "2")]
    status: Option<StatusFrame>,
    #[prost(message, repeated, tag = "6")]
    slots: Vec<SlotFrame>,
}

fn message_len<M: Message>(tag: u32, m: &M) -> usize {
    let len = m.encoded_len();
    encoded_len_varint(u64::from(tag << 3)) + encoded_len_varint(len as u64) + len
}

fn put_message<M: Message>(tag: u32, m: &M, buf: &mut impl BufMut) {
    prost::encoding::encode_key(tag, WireType::LengthDelimited, buf);
    prost::encoding::encode_varint(m.encoded_len() as u64, buf);
    m.encode_raw(buf);
}

/// Length of a request's protobuf rest: what a `RequestExt` holding its rare fields encodes to.
fn request_ext_len(r: &RequestFrame) -> usize {
    let mut len = r.source.as_ref().map_or(0, |d| message_len(9, &**d));
    len += r.reply_to.as_ref().map_or(0, |d| message_len(10, &**d));
    len += r
        .call_metadata
        .iter()
        .map(|e| message_len(11, e))
        .sum::<usize>();
    len + r.offers.iter().map(|o| message_len(12, o)).sum::<usize>()
}

fn put_request_ext(r: &RequestFrame, buf: &mut impl BufMut) {
    if let Some(d) = &r.source {
        put_message(9, &**d, buf);
    }
    if let Some(d) = &r.reply_to {
        put_message(10, &**d, buf);
    }
    for e in &r.call_metadata {
        put_message(11, e, buf);
    }
    for o in &r.offers {
        put_message(12, o, buf);
    }
}

fn response_ext_len(r: &ResponseFrame) -> usize {
    r.status.as_ref().map_or(0, |s| message_len(2, s))
        + r.slots.iter().map(|s| message_len(6, s)).sum::<usize>()
}

fn put_response_ext(r: &ResponseFrame, buf: &mut impl BufMut) {
    if let Some(s) = &r.status {
        put_message(2, s, buf);
    }
    for s in &r.slots {
        put_message(6, s, buf);
    }
}

/// A request or a response, measured for encoding: the frame, its message (the frame's
/// `metadata`, or one written beside the frame: [`request_with`](Hot::request_with)) and the
/// length of its protobuf rest. `None` for the kinds prost encodes.
pub(crate) enum Hot<'a> {
    Request(&'a RequestFrame, &'a [u8], usize),
    Response(&'a ResponseFrame, &'a [u8], usize),
}

impl<'a> Hot<'a> {
    /// The fixed layout of `kind`, if it has one.
    #[inline]
    pub(crate) fn of(kind: &'a Kind) -> Option<Hot<'a>> {
        match kind {
            Kind::Request(r) => Some(Hot::request(r)),
            Kind::Response(r) => Some(Hot::response(r)),
            _ => None,
        }
    }

    /// A request, encoded from where it is (no `Kind` built around it: a move of it).
    #[inline]
    pub(crate) fn request(r: &'a RequestFrame) -> Hot<'a> {
        Hot::request_with(r, None)
    }

    /// A request whose message is `small` when there is one (its `metadata` is then empty):
    /// the frame `request` encodes with that message in `metadata`.
    #[inline]
    pub(crate) fn request_with(r: &'a RequestFrame, small: Option<&'a Small>) -> Hot<'a> {
        let message = small.map_or(&r.metadata[..], Small::as_slice);
        Hot::Request(r, message, request_ext_len(r))
    }

    /// A response, encoded from where it is.
    #[inline]
    pub(crate) fn response(r: &'a ResponseFrame) -> Hot<'a> {
        Hot::Response(r, &r.metadata, response_ext_len(r))
    }

    /// Bytes of the frame (without its credits).
    #[inline]
    pub(crate) fn encoded_len(&self) -> usize {
        match *self {
            Hot::Request(r, message, ext) => {
                REQUEST_HEADER
                    + r.path.len()
                    + message.len()
                    + r.inline_payload.as_ref().map_or(0, Bytes::len)
                    + ext
            }
            Hot::Response(r, message, ext) => {
                RESPONSE_HEADER
                    + message.len()
                    + r.inline_payload.as_ref().map_or(0, Bytes::len)
                    + ext
            }
        }
    }

    /// Writes the frame into `out`, exactly [`encoded_len`](Self::encoded_len) bytes, whose
    /// every length fits a `u32` (the caller checked the frame against the peer's
    /// `max_frame`, a `u32`).
    pub(crate) fn encode(&self, out: &mut [u8]) {
        match *self {
            Hot::Request(r, message, ext) => {
                let inline = r.inline_payload.as_deref();
                let (head, rest) = out.split_at_mut(REQUEST_HEADER);
                let head: &mut [u8; REQUEST_HEADER] = head.try_into().expect("split at its size");
                head[0] = REQUEST_MARK;
                head[1] =
                    (u8::from(inline.is_some()) * INLINE) | (u8::from(r.slot.is_some()) * SLOT);
                head[2..4].fill(0);
                head[4..8].copy_from_slice(&r.op.to_le_bytes());
                head[8..16].copy_from_slice(&r.id.to_le_bytes());
                head[16..24].copy_from_slice(&r.payload_len.to_le_bytes());
                head[24..32].copy_from_slice(&r.timeout_us.to_le_bytes());
                head[32..36].copy_from_slice(&r.slot.unwrap_or(0).to_le_bytes());
                let parts = [&r.path[..], message, inline.unwrap_or_default()];
                let rest = put_parts(&mut head[36..], &parts, ext, rest);
                if ext > 0 {
                    put_request_ext(r, &mut &mut rest[..]);
                }
            }
            Hot::Response(r, message, ext) => {
                let inline = r.inline_payload.as_deref();
                let (head, rest) = out.split_at_mut(RESPONSE_HEADER);
                let head: &mut [u8; RESPONSE_HEADER] = head.try_into().expect("split at its size");
                head[0] = RESPONSE_MARK;
                head[1] = u8::from(inline.is_some()) * INLINE;
                head[2..4].fill(0);
                head[4..12].copy_from_slice(&r.id.to_le_bytes());
                head[12..20].copy_from_slice(&r.pushed_len.to_le_bytes());
                let parts = [message, inline.unwrap_or_default()];
                let rest = put_parts(&mut head[20..], &parts, ext, rest);
                if ext > 0 {
                    put_response_ext(r, &mut &mut rest[..]);
                }
            }
        }
    }
}

fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("frames are checked against a u32 max_frame before they are encoded")
}

/// Writes the lengths of `parts` and then `ext` into `lengths` (4 bytes each, the header's
/// last), and the parts themselves back to back at the start of `out`: the rest of `out`,
/// for the protobuf rest of `ext` bytes.
#[inline(always)]
fn put_parts<'o, const N: usize>(
    lengths: &mut [u8],
    parts: &[&[u8]; N],
    ext: usize,
    out: &'o mut [u8],
) -> &'o mut [u8] {
    let mut lengths = lengths.chunks_exact_mut(4);
    let mut out = out;
    for part in parts {
        let len = lengths.next().expect("a length per part");
        len.copy_from_slice(&len32(part.len()).to_le_bytes());
        let (dst, rest) = std::mem::take(&mut out).split_at_mut(part.len());
        dst.copy_from_slice(part);
        out = rest;
    }
    let len = lengths.next().expect("a length for the rest");
    len.copy_from_slice(&len32(ext).to_le_bytes());
    out
}

// Decoding.

/// Why bytes are not the frame they claim to be. One word, so that a result comes back in
/// registers (with a `String`, three words, it was returned through memory).
#[derive(Debug, PartialEq)]
#[allow(clippy::box_collection)] // one word on purpose: see above
pub(crate) struct Malformed(Box<String>);

impl From<String> for Malformed {
    #[cold]
    fn from(reason: String) -> Self {
        Malformed(Box::new(reason))
    }
}

impl From<&str> for Malformed {
    #[cold]
    fn from(reason: &str) -> Self {
        Malformed::from(reason.to_owned())
    }
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

#[inline(always)]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

/// Cuts parts of these lengths, back to back from `at`, out of `block` into their fields: an
/// empty part is no slice at all, the last part that is not empty is `block` itself trimmed
/// to it, and the others are slices of it. So a frame's last byte field costs no reference
/// count, nor does the block handed in (two atomic operations per frame).
#[inline(always)]
fn cut<const N: usize>(block: Bytes, at: usize, mut parts: [(&mut Bytes, u32); N]) {
    let Some(last) = parts.iter().rposition(|(_, len)| *len > 0) else {
        for (field, _) in parts {
            *field = Bytes::new();
        }
        return;
    };
    let mut at = at;
    for (field, len) in &mut parts[..last] {
        let start = at;
        at += *len as usize;
        **field = if *len == 0 {
            Bytes::new()
        } else {
            block.slice(start..at)
        };
    }
    let mut own = block;
    own.truncate(at + parts[last].1 as usize);
    own.advance(at);
    *parts[last].0 = own;
    for (field, _) in &mut parts[last + 1..] {
        **field = Bytes::new();
    }
}

/// Checks that parts of these lengths after a header of `header` bytes fit `frame`: where
/// they end.
#[inline(always)]
fn parts_end(frame: &[u8], header: usize, lengths: &[u32]) -> Result<usize, Malformed> {
    let end = lengths
        .iter()
        .fold(header as u64, |sum, &len| sum + u64::from(len));
    if end > frame.len() as u64 {
        return Err(format!(
            "a frame of {} bytes announces {end} bytes of header and fields",
            frame.len()
        )
        .into());
    }
    Ok(end as usize)
}

#[cold]
fn bad_header(what: &str, flags: u8, spare: &[u8]) -> Malformed {
    format!("{what} frame with unknown flags or fields (flags {flags:#04x}, reserved {spare:?})")
        .into()
}

/// Decodes a fixed request from `block` into `r` (every field set): the credits after it.
fn request_into(block: Bytes, r: &mut RequestFrame) -> Result<(u32, bool), Malformed> {
    let Some(h) = block.get(..REQUEST_HEADER) else {
        return Err("a request frame shorter than its header".into());
    };
    let flags = h[1];
    let slot = u32_at(h, 32);
    let lengths = [u32_at(h, 36), u32_at(h, 40), u32_at(h, 44), u32_at(h, 48)];
    if flags & !(INLINE | SLOT) != 0
        || h[2..4] != [0, 0]
        || (flags & INLINE == 0 && lengths[2] != 0)
        || (flags & SLOT == 0 && slot != 0)
    {
        return Err(bad_header("a request", flags, &h[2..4]));
    }
    let end = parts_end(&block, REQUEST_HEADER, &lengths)?;
    let (credits, starved) = trailer(&block, end)?;
    r.op = u32_at(h, 4);
    r.id = u64_at(h, 8);
    r.payload_len = u64_at(h, 16);
    r.timeout_us = u64_at(h, 24);
    r.slot = (flags & SLOT != 0).then_some(slot);
    if lengths[3] == 0 {
        r.source = None;
        r.reply_to = None;
        r.call_metadata.clear();
        r.offers.clear();
    } else {
        let rest = block.slice(end - lengths[3] as usize..end);
        let ext = RequestExt::decode(rest).map_err(|e| e.to_string())?;
        r.source = ext.source;
        r.reply_to = ext.reply_to;
        r.call_metadata = ext.call_metadata;
        r.offers = ext.offers;
    }
    let inline = r.inline_payload.get_or_insert_default();
    let parts = [
        (&mut r.path, lengths[0]),
        (&mut r.metadata, lengths[1]),
        (inline, lengths[2]),
    ];
    cut(block, REQUEST_HEADER, parts);
    if flags & INLINE == 0 {
        r.inline_payload = None;
    }
    Ok((credits, starved))
}

/// Decodes a fixed response from `block` into `r` (every field set): the credits after it.
fn response_into(block: Bytes, r: &mut ResponseFrame) -> Result<(u32, bool), Malformed> {
    let Some(h) = block.get(..RESPONSE_HEADER) else {
        return Err("a response frame shorter than its header".into());
    };
    let flags = h[1];
    let lengths = [u32_at(h, 20), u32_at(h, 24), u32_at(h, 28)];
    if flags & !INLINE != 0 || h[2..4] != [0, 0] || (flags & INLINE == 0 && lengths[1] != 0) {
        return Err(bad_header("a response", flags, &h[2..4]));
    }
    let end = parts_end(&block, RESPONSE_HEADER, &lengths)?;
    let (credits, starved) = trailer(&block, end)?;
    r.id = u64_at(h, 4);
    r.pushed_len = u64_at(h, 12);
    if lengths[2] == 0 {
        r.status = None;
        r.slots.clear();
    } else {
        let rest = block.slice(end - lengths[2] as usize..end);
        let ext = ResponseExt::decode(rest).map_err(|e| e.to_string())?;
        r.status = ext.status;
        r.slots = ext.slots;
    }
    let inline = r.inline_payload.get_or_insert_default();
    cut(
        block,
        RESPONSE_HEADER,
        [(&mut r.metadata, lengths[0]), (inline, lengths[1])],
    );
    if flags & INLINE == 0 {
        r.inline_payload = None;
    }
    Ok((credits, starved))
}

/// The credits after a fixed frame's body, which end at `end`: nothing else may follow.
#[inline(always)]
fn trailer(frame: &[u8], end: usize) -> Result<(u32, bool), Malformed> {
    credits(frame, end)
        .ok_or_else(|| "a request or response followed by fields other than its credits".into())
}

/// A varint of protobuf at `*at` in `b` (at most 10 bytes, at most 64 bits), moving `at`.
#[inline(always)]
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at + i)?;
        if i == 9 && byte > 1 {
            return None; // more than 64 bits
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *at += i + 1;
            return Some(value);
        }
    }
    None
}

/// Reads protobuf fields 15 (credits) and 17 (starved), as varints, from `b[at..]` to its end,
/// as prost reads them (the last of a repeated field wins; credits are truncated to 32 bits).
/// `None` when anything else is there.
#[inline]
fn credits(b: &[u8], mut at: usize) -> Option<(u32, bool)> {
    let (mut credits, mut starved) = (0u32, false);
    while at < b.len() {
        match varint(b, &mut at)? {
            key if key == CREDITS << 3 => credits = varint(b, &mut at)? as u32,
            key if key == STARVED << 3 => starved = varint(b, &mut at)? != 0,
            _ => return None,
        }
    }
    Some((credits, starved))
}

/// Decodes a received frame into `out` in place, if it is a fixed request or response or a
/// bare credit update; otherwise gives it back, for prost. A request or response already in
/// `out` is refilled rather than made anew; the frame's byte fields are parts of `frame`.
/// `Err` if a fixed frame is malformed.
pub(crate) fn decode_into(frame: Bytes, out: &mut Frame) -> Result<Option<Bytes>, Malformed> {
    let (credits, starved) = match frame.first() {
        Some(&REQUEST_MARK) => {
            if !matches!(out.kind, Some(Kind::Request(_))) {
                out.kind = Some(Kind::Request(RequestFrame::default()));
            }
            let Some(Kind::Request(r)) = &mut out.kind else {
                unreachable!("made a request above")
            };
            request_into(frame, r)?
        }
        Some(&RESPONSE_MARK) => {
            if !matches!(out.kind, Some(Kind::Response(_))) {
                out.kind = Some(Kind::Response(ResponseFrame::default()));
            }
            let Some(Kind::Response(r)) = &mut out.kind else {
                unreachable!("made a response above")
            };
            response_into(frame, r)?
        }
        // A bare credit update, or a frame for prost.
        _ => match credits(&frame, 0) {
            Some(credits) => {
                out.kind = None;
                credits
            }
            None => return Ok(Some(frame)),
        },
    };
    out.credits = credits;
    out.starved = starved;
    Ok(None)
}

/// A received frame decoded by hand, with its credits; `None` when prost decodes it. `Err` if
/// it is malformed.
#[cfg(test)]
pub(crate) fn decode(frame: &Bytes) -> Result<Option<(Option<Kind>, u32, bool)>, Malformed> {
    let mut out = Frame::default();
    Ok(decode_into(frame.clone(), &mut out)?.is_none().then_some((
        out.kind,
        out.credits,
        out.starved,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::codec::{frame_bytes, CREDITS_ROOM};
    use proptest::prelude::*;

    fn bytes() -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
    }

    fn descriptor() -> impl Strategy<Value = DescriptorFrame> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            bytes(),
        )
            .prop_map(|(addr, len, rkey, access, blob)| DescriptorFrame {
                addr,
                len,
                rkey,
                access,
                blob,
            })
    }

    prop_compose! {
        fn request()(
            id in any::<u64>(), path in bytes(), op in any::<u32>(), metadata in bytes(),
            payload_len in any::<u64>(), inline in prop::option::of(bytes()),
            timeout_us in any::<u64>(), slot in prop::option::of(any::<u32>()),
            source in prop::option::of(descriptor()), reply_to in prop::option::of(descriptor()),
            meta in prop::collection::vec(("[a-z]{0,8}", bytes()), 0..3),
            offers in prop::collection::vec((any::<u32>(), any::<u64>(), prop::option::of(descriptor())), 0..2),
        ) -> RequestFrame {
            RequestFrame {
                id, path, op, metadata, payload_len, inline_payload: inline, timeout_us, slot,
                source: source.map(Box::new), reply_to: reply_to.map(Box::new),
                call_metadata: meta
                    .into_iter()
                    .map(|(key, value)| MetadataEntry { key: key.into(), value })
                    .collect(),
                offers: offers
                    .into_iter()
                    .map(|(window, offset, descriptor)| WindowOffer { window, offset, descriptor })
                    .collect(),
            }
        }
    }

    prop_compose! {
        fn response()(
            id in any::<u64>(), code in prop::option::of(0u32..17), message in "[ -~]{0,20}",
            metadata in bytes(), inline in prop::option::of(bytes()), pushed_len in any::<u64>(),
            slots in prop::collection::vec((any::<u32>(), prop::option::of(descriptor())), 0..3),
        ) -> ResponseFrame {
            ResponseFrame {
                id,
                status: code.map(|code| StatusFrame { code, message }),
                metadata,
                inline_payload: inline,
                pushed_len,
                slots: slots
                    .into_iter()
                    .map(|(index, window)| SlotFrame { index, window })
                    .collect(),
            }
        }
    }

    /// The frame's bytes without its credits.
    fn body(kind: &Kind) -> Bytes {
        let bytes = frame_bytes(Some(kind), 0, false);
        let hot = Hot::of(kind).expect("a fixed frame");
        assert_eq!(bytes.len(), hot.encoded_len());
        bytes
    }

    /// Decoding every frame into the same `Frame`, as a connection does, gives each back whole:
    /// nothing of the one before stays (a request after a request, a response after a
    /// response, either after the other).
    fn assert_round_trips(kinds: &[Kind], credits: u32, starved: bool) {
        let mut into = Frame::default();
        for kind in kinds {
            let wire = frame_bytes(Some(kind), credits, starved);
            assert_eq!(decode_into(wire, &mut into), Ok(None));
            assert_eq!(into.kind.as_ref(), Some(kind));
            assert_eq!((into.credits, into.starved), (credits, starved));
        }
    }

    proptest! {
        #[test]
        fn requests_and_responses_decode_back_into_a_reused_frame(
            a in request(), b in request(), c in response(), d in response(),
            credits in any::<u32>(), starved in any::<bool>(),
        ) {
            let kinds = [Kind::Request(a), Kind::Request(b), Kind::Response(c), Kind::Response(d)];
            assert_round_trips(&kinds, credits, starved);
            let reversed: Vec<Kind> = kinds.iter().rev().cloned().collect();
            assert_round_trips(&reversed, credits, starved);
        }

        /// Prost refuses every fixed frame, so the first byte tells the layouts apart.
        #[test]
        fn no_fixed_frame_is_a_protobuf_frame(r in request(), s in response(), credits in any::<u32>()) {
            for kind in [Kind::Request(r), Kind::Response(s)] {
                let wire = frame_bytes(Some(&kind), credits, true);
                prop_assert!(Frame::decode(wire).is_err());
            }
        }

        /// A fixed frame cut anywhere after its mark and before the end of its fields is
        /// refused.
        #[test]
        fn a_cut_fixed_frame_is_refused(r in request(), s in response(), cut in any::<prop::sample::Index>()) {
            for kind in [Kind::Request(r), Kind::Response(s)] {
                let whole = body(&kind);
                let at = 1 + cut.index(whole.len() - 1);
                prop_assert!(decode(&whole.slice(..at)).is_err(), "cut at {} of {}", at, whole.len());
            }
        }

        /// Bytes that do not start with a fixed frame's mark decode as prost decodes them, or
        /// are left to prost; bytes that do are decoded or refused, never a panic.
        #[test]
        fn arbitrary_bytes_decode_as_prost_decodes_them(raw in prop::collection::vec(any::<u8>(), 0..120), mark in prop::option::of(prop::sample::select(vec![REQUEST_MARK, RESPONSE_MARK]))) {
            let mut raw = raw;
            if let (Some(mark), Some(first)) = (mark, raw.first_mut()) {
                *first = mark;
            }
            let wire = Bytes::from(raw);
            let ours = decode(&wire);
            if matches!(wire.first(), Some(&(REQUEST_MARK | RESPONSE_MARK))) {
                return Ok(());
            }
            match ours {
                Ok(Some((kind, credits, starved))) => {
                    let prost = Frame::decode(wire).expect("prost decodes what the hand decoder does");
                    prop_assert_eq!(kind, prost.kind);
                    prop_assert_eq!(credits, prost.credits);
                    prop_assert_eq!(starved, prost.starved);
                }
                Ok(None) => {}
                Err(e) => prop_assert!(false, "only fixed frames are refused by hand: {}", e),
            }
        }
    }

    #[test]
    fn a_small_call_s_request_is_its_header_and_its_bytes() {
        let kind = Kind::Request(RequestFrame {
            id: 9,
            path: Bytes::from_static(b"/bench/send"),
            op: 1,
            metadata: Bytes::from_static(b"msg"),
            payload_len: 64,
            inline_payload: Some(Bytes::from(vec![7u8; 64])),
            ..Default::default()
        });
        let wire = body(&kind);
        assert_eq!(wire.len(), REQUEST_HEADER + 11 + 3 + 64);
        assert_eq!(wire[0], REQUEST_MARK);
        assert_eq!(wire[1], INLINE);
        assert_eq!(u64_at(&wire, 8), 9);
        assert_eq!(&wire[REQUEST_HEADER..REQUEST_HEADER + 11], b"/bench/send");
    }

    #[test]
    fn a_fixed_frame_with_unknown_flags_or_fields_after_it_is_refused() {
        let request = body(&Kind::Request(RequestFrame {
            id: 1,
            ..Default::default()
        }));
        let response = body(&Kind::Response(ResponseFrame {
            id: 1,
            ..Default::default()
        }));
        for (wire, at, value) in [
            (&request, 1, 4u8),   // an unknown flag
            (&request, 2, 1),     // a reserved byte
            (&request, 32, 1),    // a slot without its flag
            (&request, 44, 1),    // an inline length without its flag
            (&response, 1, 2),    // an unknown flag
            (&response, 3, 1),    // a reserved byte
            (&response, 24, 1),   // an inline length without its flag
            (&response, 28, 200), // a protobuf rest longer than the frame
        ] {
            let mut bad = wire.to_vec();
            bad[at] = value;
            let err = decode(&Bytes::from(bad)).unwrap_err().to_string();
            assert!(err.contains("frame"), "{err}");
        }
        // A field other than the credits after the frame's own.
        let mut extra = request.to_vec();
        extra.extend_from_slice(&[0x08, 0x01]); // field 1, varint 1
        let err = decode(&Bytes::from(extra)).unwrap_err().to_string();
        assert!(err.contains("other than its credits"), "{err}");
        // Its credits are not.
        let mut room = request.to_vec();
        room.resize(request.len() + CREDITS_ROOM, 0);
        let n = crate::protocol::codec::put_credits(&mut room[request.len()..], 5, true);
        room.truncate(request.len() + n);
        let (_, credits, starved) = decode(&Bytes::from(room)).unwrap().unwrap();
        assert_eq!((credits, starved), (5, true));
    }

    #[test]
    fn a_bare_credit_update_is_decoded_by_hand() {
        let wire = frame_bytes(None, 300, true);
        assert_eq!(decode(&wire), Ok(Some((None, 300, true))));
        assert_eq!(decode(&Bytes::new()), Ok(Some((None, 0, false))));
    }
}
