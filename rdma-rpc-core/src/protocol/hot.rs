//! The two frames every call sends, a request and a response, encoded and decoded by hand:
//! the same bytes prost makes and takes (tests compare them field by field and byte by byte),
//! with the work prost's generic code does twice done once (each field's length is computed
//! once, not again for the frame's length prefix) and the frame decoded in place from the
//! received block (its byte fields are slices of it). Every other frame goes through prost.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{encoded_len_varint, WireType};
use prost::Message;

use super::frames::{
    Frame, Kind, MetadataEntry, RequestFrame, ResponseFrame, SlotFrame, WindowOffer,
};

/// Field numbers of `Frame`.
pub(crate) const REQUEST: u32 = 3;
pub(crate) const RESPONSE: u32 = 6;
pub(crate) const CREDITS: u32 = 15;
pub(crate) const STARVED: u32 = 17;

/// A varint, as prost writes it; a value under 128 (most tags, ids and small lengths) as its
/// one byte directly, without prost's generic loop.
#[inline(always)]
fn put_varint(value: u64, buf: &mut impl BufMut) {
    if value < 0x80 {
        buf.put_u8(value as u8);
    } else {
        prost::encoding::encode_varint(value, buf);
    }
}

fn key_len(tag: u32) -> usize {
    encoded_len_varint(u64::from(tag << 3))
}

fn put_key(tag: u32, wire: WireType, buf: &mut impl BufMut) {
    put_varint(u64::from(tag << 3 | wire as u32), buf);
}

fn varint_field_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(value)
    }
}

fn put_varint_field(tag: u32, value: u64, buf: &mut impl BufMut) {
    if value != 0 {
        put_key(tag, WireType::Varint, buf);
        put_varint(value, buf);
    }
}

fn bytes_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_bytes(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    put_key(tag, WireType::LengthDelimited, buf);
    put_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

fn message_len<M: Message>(tag: u32, m: &M) -> usize {
    bytes_len(tag, m.encoded_len())
}

fn put_message<M: Message>(tag: u32, m: &M, buf: &mut impl BufMut) {
    put_key(tag, WireType::LengthDelimited, buf);
    put_varint(m.encoded_len() as u64, buf);
    m.encode_raw(buf);
}

/// Length of a request's body (its fields, in prost's order and rules).
fn request_body_len(r: &RequestFrame) -> usize {
    let mut len = varint_field_len(1, r.id)
        + if r.path.is_empty() {
            0
        } else {
            bytes_len(2, r.path.len())
        }
        + varint_field_len(3, u64::from(r.op))
        + if r.metadata.is_empty() {
            0
        } else {
            bytes_len(4, r.metadata.len())
        }
        + varint_field_len(5, r.payload_len)
        + r.inline_payload
            .as_ref()
            .map_or(0, |p| bytes_len(6, p.len()))
        + varint_field_len(7, r.timeout_us)
        + r.slot
            .map_or(0, |s| key_len(8) + encoded_len_varint(u64::from(s)));
    if let Some(d) = &r.source {
        len += message_len(9, d);
    }
    if let Some(d) = &r.reply_to {
        len += message_len(10, d);
    }
    len += r
        .call_metadata
        .iter()
        .map(|e| message_len(11, e))
        .sum::<usize>();
    len += r.offers.iter().map(|o| message_len(12, o)).sum::<usize>();
    len
}

fn put_request_body(r: &RequestFrame, buf: &mut impl BufMut) {
    put_varint_field(1, r.id, buf);
    if !r.path.is_empty() {
        put_bytes(2, &r.path, buf);
    }
    put_varint_field(3, u64::from(r.op), buf);
    if !r.metadata.is_empty() {
        put_bytes(4, &r.metadata, buf);
    }
    put_varint_field(5, r.payload_len, buf);
    if let Some(p) = &r.inline_payload {
        put_bytes(6, p, buf);
    }
    put_varint_field(7, r.timeout_us, buf);
    if let Some(s) = r.slot {
        put_key(8, WireType::Varint, buf);
        put_varint(u64::from(s), buf);
    }
    if let Some(d) = &r.source {
        put_message(9, d, buf);
    }
    if let Some(d) = &r.reply_to {
        put_message(10, d, buf);
    }
    for e in &r.call_metadata {
        put_message(11, e, buf);
    }
    for o in &r.offers {
        put_message(12, o, buf);
    }
}

fn response_body_len(r: &ResponseFrame) -> usize {
    varint_field_len(1, r.id)
        + r.status.as_ref().map_or(0, |s| message_len(2, s))
        + if r.metadata.is_empty() {
            0
        } else {
            bytes_len(3, r.metadata.len())
        }
        + r.inline_payload
            .as_ref()
            .map_or(0, |p| bytes_len(4, p.len()))
        + varint_field_len(5, r.pushed_len)
        + r.slots.iter().map(|s| message_len(6, s)).sum::<usize>()
}

fn put_response_body(r: &ResponseFrame, buf: &mut impl BufMut) {
    put_varint_field(1, r.id, buf);
    if let Some(s) = &r.status {
        put_message(2, s, buf);
    }
    if !r.metadata.is_empty() {
        put_bytes(3, &r.metadata, buf);
    }
    if let Some(p) = &r.inline_payload {
        put_bytes(4, p, buf);
    }
    put_varint_field(5, r.pushed_len, buf);
    for s in &r.slots {
        put_message(6, s, buf);
    }
}

/// A frame's `kind` field, encoded: its length, and a writer. `None` for kinds prost encodes.
pub(crate) enum Hot<'a> {
    Request(&'a RequestFrame, usize),
    Response(&'a ResponseFrame, usize),
}

impl<'a> Hot<'a> {
    /// The hand encoding of `kind`, if it has one.
    pub(crate) fn of(kind: &'a Kind) -> Option<Hot<'a>> {
        match kind {
            Kind::Request(r) => Some(Hot::Request(r, request_body_len(r))),
            Kind::Response(r) => Some(Hot::Response(r, response_body_len(r))),
            _ => None,
        }
    }

    /// Bytes of the `kind` field: key, length, body.
    pub(crate) fn encoded_len(&self) -> usize {
        match *self {
            Hot::Request(_, body) => bytes_len(REQUEST, body),
            Hot::Response(_, body) => bytes_len(RESPONSE, body),
        }
    }

    pub(crate) fn encode(&self, buf: &mut impl BufMut) {
        match *self {
            Hot::Request(r, body) => {
                put_key(REQUEST, WireType::LengthDelimited, buf);
                put_varint(body as u64, buf);
                put_request_body(r, buf);
            }
            Hot::Response(r, body) => {
                put_key(RESPONSE, WireType::LengthDelimited, buf);
                put_varint(body as u64, buf);
                put_response_body(r, buf);
            }
        }
    }
}

// Decoding.

/// Why bytes are not the frame they claim to be. One word, so that the result of decoding one
/// field (a varint, a key) comes back in registers: with a `String` (three words) it was
/// returned through memory, about a tenth of a frame's decoding (and a `Box<str>`, two words,
/// cost 120 instructions per call more than this).
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

/// A cursor over part of a received block; byte fields come out as slices of the block.
struct Reader<'a> {
    block: &'a Bytes,
    pos: usize,
    end: usize,
}

impl Reader<'_> {
    fn more(&self) -> bool {
        self.pos < self.end
    }

    #[inline(always)]
    fn varint(&mut self) -> Result<u64, Malformed> {
        let bytes = &self.block[self.pos..self.end];
        // Most values (tags, ids, small lengths) fit one byte.
        if let Some(&b) = bytes.first() {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        let mut value = 0u64;
        for (i, &b) in bytes.iter().take(10).enumerate() {
            if i == 9 && b > 1 {
                break; // more than 64 bits
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.pos += i + 1;
                return Ok(value);
            }
        }
        Err("invalid varint".into())
    }

    /// A key: its field number and wire type.
    #[inline(always)]
    fn key(&mut self) -> Result<(u32, WireType), Malformed> {
        let key = self.varint()?;
        if key > u64::from(u32::MAX) {
            return Err(format!("invalid key value: {key}").into());
        }
        let wire = WireType::try_from(key & 0x7).map_err(|e| e.to_string())?;
        let tag = key as u32 >> 3;
        if tag == 0 {
            return Err("invalid tag value: 0".into());
        }
        Ok((tag, wire))
    }

    /// A length-delimited field's extent in the block.
    #[inline(always)]
    fn delimited(&mut self) -> Result<(usize, usize), Malformed> {
        let len = self.varint()?;
        if len > (self.end - self.pos) as u64 {
            return Err("buffer underflow: a field runs past the end of its frame".into());
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok((start, self.pos))
    }

    #[inline(always)]
    fn bytes(&mut self) -> Result<Bytes, Malformed> {
        let (start, end) = self.delimited()?;
        Ok(self.block.slice(start..end))
    }

    #[inline(always)]
    fn sub(&mut self) -> Result<Reader<'_>, Malformed> {
        let (pos, end) = self.delimited()?;
        Ok(Reader {
            block: self.block,
            pos,
            end,
        })
    }

    /// Skips a field this build does not know, as prost does.
    fn skip(&mut self, wire: WireType, tag: u32) -> Result<(), Malformed> {
        let mut rest = self.block.slice(self.pos..self.end);
        let before = rest.remaining();
        prost::encoding::skip_field(
            wire,
            tag,
            &mut rest,
            prost::encoding::DecodeContext::default(),
        )
        .map_err(|e| e.to_string())?;
        self.pos += before - rest.remaining();
        Ok(())
    }

    /// Merges a message field into `into` (a field that comes twice merges, as prost does).
    fn merge<M: Message>(&mut self, into: &mut M, wire: WireType) -> Result<(), Malformed> {
        expect(wire, WireType::LengthDelimited)?;
        let (start, end) = self.delimited()?;
        into.merge(self.block.slice(start..end))
            .map_err(|e| e.to_string().into())
    }

    fn message<M: Message + Default>(&mut self, wire: WireType) -> Result<M, Malformed> {
        let mut m = M::default();
        self.merge(&mut m, wire)?;
        Ok(m)
    }
}

#[inline(always)]
fn expect(wire: WireType, want: WireType) -> Result<(), Malformed> {
    if wire == want {
        Ok(())
    } else {
        Err(format!("invalid wire type: {wire:?} (expected {want:?})").into())
    }
}

fn merge_request(r: &mut RequestFrame, mut buf: Reader<'_>) -> Result<(), Malformed> {
    while buf.more() {
        let (tag, wire) = buf.key()?;
        match tag {
            1 | 3 | 5 | 7 | 8 => {
                expect(wire, WireType::Varint)?;
                let v = buf.varint()?;
                match tag {
                    1 => r.id = v,
                    3 => r.op = v as u32,
                    5 => r.payload_len = v,
                    7 => r.timeout_us = v,
                    _ => r.slot = Some(v as u32),
                }
            }
            2 | 4 | 6 => {
                expect(wire, WireType::LengthDelimited)?;
                let v = buf.bytes()?;
                match tag {
                    2 => r.path = v,
                    4 => r.metadata = v,
                    _ => r.inline_payload = Some(v),
                }
            }
            9 => buf.merge(r.source.get_or_insert_with(Default::default), wire)?,
            10 => buf.merge(r.reply_to.get_or_insert_with(Default::default), wire)?,
            11 => r.call_metadata.push(buf.message::<MetadataEntry>(wire)?),
            12 => r.offers.push(buf.message::<WindowOffer>(wire)?),
            _ => buf.skip(wire, tag)?,
        }
    }
    Ok(())
}

fn merge_response(r: &mut ResponseFrame, mut buf: Reader<'_>) -> Result<(), Malformed> {
    while buf.more() {
        let (tag, wire) = buf.key()?;
        match tag {
            1 | 5 => {
                expect(wire, WireType::Varint)?;
                let v = buf.varint()?;
                if tag == 1 {
                    r.id = v;
                } else {
                    r.pushed_len = v;
                }
            }
            2 => buf.merge(r.status.get_or_insert_with(Default::default), wire)?,
            3 | 4 => {
                expect(wire, WireType::LengthDelimited)?;
                let v = buf.bytes()?;
                if tag == 3 {
                    r.metadata = v;
                } else {
                    r.inline_payload = Some(v);
                }
            }
            6 => r.slots.push(buf.message::<SlotFrame>(wire)?),
            _ => buf.skip(wire, tag)?,
        }
    }
    Ok(())
}

/// A received frame whose fields are a request or a response (and credits), decoded by hand;
/// `None` when it holds anything else (then prost decodes it). `Err` if it is malformed.
#[cfg(test)]
pub(crate) fn decode(frame: &Bytes) -> Result<Option<(Option<Kind>, u32, bool)>, Malformed> {
    let mut out = Frame::default();
    Ok(decode_into(frame, &mut out)?.then_some((out.kind, out.credits, out.starved)))
}

/// Decodes a received frame into `out` in place, if it holds only a request or a response (and
/// credits): whether it did (otherwise prost decodes it). A request or response already in
/// `out` is cleared and refilled rather than made anew.
pub(crate) fn decode_into(frame: &Bytes, out: &mut Frame) -> Result<bool, Malformed> {
    let mut buf = Reader {
        block: frame,
        pos: 0,
        end: frame.len(),
    };
    let kind = &mut out.kind;
    let mut fresh = true;
    let mut credits = 0u32;
    let mut starved = false;
    while buf.more() {
        let (tag, wire) = buf.key()?;
        match tag {
            // A oneof field that comes twice: the same kind merges, another replaces (prost).
            REQUEST => {
                expect(wire, WireType::LengthDelimited)?;
                let body = buf.sub()?;
                match kind {
                    Some(Kind::Request(r)) if fresh => r.clear(),
                    Some(Kind::Request(_)) => {}
                    _ => *kind = Some(Kind::Request(RequestFrame::default())),
                }
                fresh = false;
                let Some(Kind::Request(r)) = kind else {
                    unreachable!("made a request above")
                };
                merge_request(r, body)?;
            }
            RESPONSE => {
                expect(wire, WireType::LengthDelimited)?;
                let body = buf.sub()?;
                match kind {
                    Some(Kind::Response(r)) if fresh => r.clear(),
                    Some(Kind::Response(_)) => {}
                    _ => *kind = Some(Kind::Response(ResponseFrame::default())),
                }
                fresh = false;
                let Some(Kind::Response(r)) = kind else {
                    unreachable!("made a response above")
                };
                merge_response(r, body)?;
            }
            CREDITS => {
                expect(wire, WireType::Varint)?;
                credits = buf.varint()? as u32;
            }
            STARVED => {
                expect(wire, WireType::Varint)?;
                starved = buf.varint()? != 0;
            }
            _ => return Ok(false),
        }
    }
    if fresh {
        *kind = None; // a bare credit update
    }
    out.credits = credits;
    out.starved = starved;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frames::{DescriptorFrame, StatusFrame};
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
            id in any::<u64>(), path in bytes(), op in 0u32..6, metadata in bytes(),
            payload_len in any::<u64>(), inline in prop::option::of(bytes()),
            timeout_us in any::<u64>(), slot in prop::option::of(any::<u32>()),
            source in prop::option::of(descriptor()), reply_to in prop::option::of(descriptor()),
            meta in prop::collection::vec(("[a-z]{0,8}", bytes()), 0..3),
        ) -> RequestFrame {
            RequestFrame {
                id, path, op, metadata, payload_len, inline_payload: inline, timeout_us, slot,
                source: source.map(Box::new), reply_to: reply_to.map(Box::new),
                call_metadata: meta
                    .into_iter()
                    .map(|(key, value)| MetadataEntry { key: key.into(), value })
                    .collect(),
                offers: Vec::new(),
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

    fn ours(kind: &Kind) -> Vec<u8> {
        let hot = Hot::of(kind).expect("a hot frame");
        let mut out = Vec::new();
        hot.encode(&mut out);
        assert_eq!(out.len(), hot.encoded_len());
        out
    }

    fn theirs(kind: &Kind) -> Vec<u8> {
        Frame {
            kind: Some(kind.clone()),
            credits: 0,
            starved: false,
        }
        .encode_to_vec()
    }

    proptest! {
        #[test]
        fn requests_encode_as_prost_encodes_them_and_decode_back(r in request(), credits in any::<u32>(), starved in any::<bool>()) {
            let kind = Kind::Request(r);
            prop_assert_eq!(ours(&kind), theirs(&kind));
            let wire = Bytes::from(Frame { kind: Some(kind.clone()), credits, starved }.encode_to_vec());
            prop_assert_eq!(decode(&wire), Ok(Some((Some(kind), credits, starved))));
        }

        #[test]
        fn responses_encode_as_prost_encodes_them_and_decode_back(r in response(), credits in any::<u32>(), starved in any::<bool>()) {
            let kind = Kind::Response(r);
            prop_assert_eq!(ours(&kind), theirs(&kind));
            let wire = Bytes::from(Frame { kind: Some(kind.clone()), credits, starved }.encode_to_vec());
            prop_assert_eq!(decode(&wire), Ok(Some((Some(kind), credits, starved))));
        }

        /// Whatever the bytes, the hand decoder agrees with prost: the same frame, or both
        /// refuse it (it may leave frames of other kinds to prost).
        #[test]
        fn arbitrary_bytes_decode_as_prost_decodes_them(raw in prop::collection::vec(any::<u8>(), 0..120)) {
            let wire = Bytes::from(raw);
            let prost = Frame::decode(wire.clone());
            match decode(&wire) {
                Ok(Some((kind, credits, starved))) => {
                    let prost = prost.expect("prost decodes what the hand decoder does");
                    prop_assert_eq!(Some(kind), Some(prost.kind));
                    prop_assert_eq!(credits, prost.credits);
                    prop_assert_eq!(starved, prost.starved);
                }
                Ok(None) => {}
                Err(_) => prop_assert!(prost.is_err(), "prost decoded what the hand decoder refused"),
            }
        }
    }
}
