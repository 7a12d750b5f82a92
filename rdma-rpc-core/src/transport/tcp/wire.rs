//! The software transport's packet header: a fixed 56-byte little-endian record in front of
//! every packet, followed by `len` payload bytes for the kinds that carry data.

use crate::error::AccessViolation;

/// Sent by both sides right after the TCP connection is made.
pub(super) const MAGIC: [u8; 8] = *b"RDRPCt01";

pub(super) const HEADER_LEN: usize = 56;

/// Why `theirs`, the first bytes a peer sent (fewer than [`MAGIC`] if it then closed), is not
/// the preamble: a peer that speaks TLS is named, since that is the likely mistake (a
/// `tls://` client of a `tcp://` server sends a handshake record; a `tls://` server answers a
/// `tcp://` client with an alert record and closes).
pub(super) fn not_a_preamble(theirs: &[u8]) -> &'static str {
    match theirs {
        [0x16, 0x03, ..] => {
            "the peer speaks TLS, this side does not: serve tls:// for a tls:// client \
             (the peer is not an rdma-rpc software transport over plain TCP)"
        }
        [0x15, 0x03, ..] => {
            "the peer answered with a TLS alert: it serves tls://, connect with tls:// \
             (the peer is not an rdma-rpc software transport over plain TCP)"
        }
        _ => "the peer is not an rdma-rpc software transport (bad preamble)",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Two-sided send; payload follows.
    Send = 1,
    /// One-sided write; payload follows.
    Write = 2,
    /// Read request.
    ReadReq = 3,
    /// Read response; payload follows.
    ReadResp = 4,
    /// Atomic compare-and-swap (`arg0` expected, `arg1` new).
    Cas = 5,
    /// Atomic fetch-and-add (`arg0` addend).
    Faa = 6,
    /// Atomic response (`arg0` previous value).
    AtomicResp = 7,
    /// Positive acknowledgement of a send or write.
    Ack = 8,
    /// Negative acknowledgement (`status`); the connection is in error after it.
    Nak = 9,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Send,
            2 => Kind::Write,
            3 => Kind::ReadReq,
            4 => Kind::ReadResp,
            5 => Kind::Cas,
            6 => Kind::Faa,
            7 => Kind::AtomicResp,
            8 => Kind::Ack,
            9 => Kind::Nak,
            _ => return None,
        })
    }

    pub(super) fn carries_payload(self) -> bool {
        matches!(self, Kind::Send | Kind::Write | Kind::ReadResp)
    }
}

/// NAK status values (beyond the access-violation codes 1..=4).
pub(super) mod status {
    pub(crate) const RECEIVER_NOT_READY: u32 = 16;
    pub(crate) const RECEIVE_TOO_SMALL: u32 = 17;
    pub(crate) const INVALID_REQUEST: u32 = 18;
}

/// Why a NAK was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NakReason {
    Access(AccessViolation),
    ReceiverNotReady,
    ReceiveTooSmall,
    InvalidRequest,
}

impl NakReason {
    pub(super) fn code(self) -> u32 {
        match self {
            NakReason::Access(v) => v.code(),
            NakReason::ReceiverNotReady => status::RECEIVER_NOT_READY,
            NakReason::ReceiveTooSmall => status::RECEIVE_TOO_SMALL,
            NakReason::InvalidRequest => status::INVALID_REQUEST,
        }
    }

    pub(super) fn from_code(code: u32) -> NakReason {
        match code {
            status::RECEIVER_NOT_READY => NakReason::ReceiverNotReady,
            status::RECEIVE_TOO_SMALL => NakReason::ReceiveTooSmall,
            c => AccessViolation::from_code(c)
                .map(NakReason::Access)
                .unwrap_or(NakReason::InvalidRequest),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) kind: Kind,
    pub(super) imm: Option<u32>,
    /// A send, or a write without immediate, whose sender wants no completion: the receiver
    /// sends no ACK (errors are still NAKed, and end the connection).
    pub(super) unsignaled: bool,
    pub(super) op_id: u64,
    pub(super) rkey: u32,
    pub(super) status: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) arg0: u64,
    pub(super) arg1: u64,
}

impl Header {
    pub(super) fn new(kind: Kind, op_id: u64) -> Header {
        Header {
            kind,
            imm: None,
            unsignaled: false,
            op_id,
            rkey: 0,
            status: 0,
            addr: 0,
            len: 0,
            arg0: 0,
            arg1: 0,
        }
    }

    pub(super) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.kind as u8;
        out[1] = u8::from(self.imm.is_some()) | (u8::from(self.unsignaled) << 1);
        out[4..8].copy_from_slice(&self.imm.unwrap_or(0).to_le_bytes());
        out[8..16].copy_from_slice(&self.op_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        out[20..24].copy_from_slice(&self.status.to_le_bytes());
        out[24..32].copy_from_slice(&self.addr.to_le_bytes());
        out[32..40].copy_from_slice(&self.len.to_le_bytes());
        out[40..48].copy_from_slice(&self.arg0.to_le_bytes());
        out[48..56].copy_from_slice(&self.arg1.to_le_bytes());
        out
    }

    /// Parses a header; `Err` names what is malformed.
    pub(super) fn decode(raw: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let kind =
            Kind::from_u8(raw[0]).ok_or_else(|| format!("unknown packet kind {}", raw[0]))?;
        let flags = raw[1];
        if flags > 0b11 || raw[2] != 0 || raw[3] != 0 {
            return Err(format!("reserved header bits set ({flags:#x})"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().expect("8 bytes"));
        let unsignaled = flags & 0b10 != 0;
        let imm = flags & 1 == 1;
        if unsignaled && !(kind == Kind::Send || kind == Kind::Write && !imm) {
            let with = if imm { " with an immediate" } else { "" };
            return Err(format!("{kind:?} packet{with} marked unsignaled"));
        }
        let header = Header {
            kind,
            imm: imm.then(|| u32_at(4)),
            unsignaled,
            op_id: u64_at(8),
            rkey: u32_at(16),
            status: u32_at(20),
            addr: u64_at(24),
            len: u64_at(32),
            arg0: u64_at(40),
            arg1: u64_at(48),
        };
        if !kind.carries_payload() && kind != Kind::ReadReq && header.len != 0 {
            return Err(format!("{kind:?} packet with a length of {}", header.len));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let mut h = Header::new(Kind::Write, 42);
        h.imm = Some(0xdead_beef);
        h.unsignaled = false;
        h.rkey = 7;
        h.addr = 0x1000;
        h.len = 99;
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn malformed_headers_are_rejected() {
        let mut raw = Header::new(Kind::Ack, 1).encode();
        raw[0] = 200;
        assert!(Header::decode(&raw)
            .unwrap_err()
            .contains("unknown packet kind"));
        let mut raw = Header::new(Kind::Ack, 1).encode();
        raw[32] = 1;
        assert!(Header::decode(&raw).unwrap_err().contains("length"));
        let mut raw = Header::new(Kind::Ack, 1).encode();
        raw[1] = 0b10;
        assert!(Header::decode(&raw).unwrap_err().contains("unsignaled"));
        let mut write = Header::new(Kind::Write, 1);
        write.unsignaled = true;
        assert_eq!(Header::decode(&write.encode()).unwrap(), write);
        write.imm = Some(5);
        assert!(Header::decode(&write.encode())
            .unwrap_err()
            .contains("immediate marked unsignaled"));
        let mut raw = Header::new(Kind::Ack, 1).encode();
        raw[2] = 1;
        assert!(Header::decode(&raw).unwrap_err().contains("reserved"));
    }
}
