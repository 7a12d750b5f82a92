//! Remote buffer handles, decided without I/O: whether a use of a peer's offer may go to the
//! wire, which offers have uses in flight, and when a revocation may be confirmed.
//!
//! An offer is a window of the offerer's memory, granted fenced on one connection and named
//! by a handle (`RemoteBuf`) the peer receives inside a message. Revocation is a handshake:
//! the offerer sends `Revoke`; the holder refuses new uses of that offer from then on, waits
//! for the uses in flight, and answers `Revoked`; only then does the offerer take the window
//! down. So an honest holder never has an access fail under it (on RDMA that failure would
//! end the connection), and a dishonest one is cut off by the fence anyway.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::memory::Access;
use crate::transport::Descriptor;

/// Revoked offers a holder remembers, to refuse their late uses cleanly (about 40 KiB). An
/// older revoked handle still fails, at the offerer's fence instead, which ends the
/// connection as RDMA would.
pub(crate) const REMEMBERED_REVOCATIONS: usize = 4096;

/// What a handle says about the window it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandleView {
    /// The offerer's id of the offer (per connection, from 1).
    pub(crate) offer: u64,
    /// The token of the connection the offer was made on (the offerer's side of it).
    pub(crate) connection: u64,
    pub(crate) descriptor: Descriptor,
}

/// Why a use of a handle was refused before anything was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The handle was offered on another connection.
    OtherConnection,
    /// The offerer revoked the offer.
    Revoked,
    /// The range leaves the window.
    OutOfRange { offset: u64, len: u64, window: u64 },
    /// The offer does not grant this access.
    NotPermitted { need: Access, granted: Access },
    /// An atomic operation on an address that is not 8-byte aligned.
    Misaligned,
}

/// The kind of access a use makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessKind {
    Read,
    Write,
    Atomic,
}

impl AccessKind {
    fn right(self) -> Access {
        match self {
            AccessKind::Read => Access::REMOTE_READ,
            AccessKind::Write => Access::REMOTE_WRITE,
            AccessKind::Atomic => Access::REMOTE_ATOMIC,
        }
    }
}

/// The holder's side of one connection: the peer's offers this end uses.
#[derive(Debug)]
pub(crate) struct Holder {
    /// The token the peer announced for this connection.
    peer_token: u64,
    /// Recently revoked offers, oldest first, and the same as a set.
    revoked_order: VecDeque<u64>,
    revoked: HashSet<u64>,
    /// Uses in flight per offer.
    in_flight: HashMap<u64, u32>,
    /// Offers revoked while uses were in flight: `Revoked` is owed when the last one ends.
    owed: HashSet<u64>,
}

impl Holder {
    pub(crate) fn new(peer_token: u64) -> Holder {
        Holder {
            peer_token,
            revoked_order: VecDeque::new(),
            revoked: HashSet::new(),
            in_flight: HashMap::new(),
            owed: HashSet::new(),
        }
    }

    /// Whether a handle with this connection token was offered by this connection's peer.
    pub(crate) fn offered_here(&self, connection: u64) -> bool {
        connection == self.peer_token
    }

    /// Checks a use of `len` bytes at `offset` of the handle's window and, if it may go,
    /// counts it in flight: the descriptor to use. Every accepted use must be [`end`]ed.
    ///
    /// [`end`]: Self::end
    pub(crate) fn begin(
        &mut self,
        handle: &HandleView,
        offset: u64,
        len: u64,
        kind: AccessKind,
    ) -> Result<Descriptor, Refusal> {
        if handle.connection != self.peer_token {
            return Err(Refusal::OtherConnection);
        }
        if self.revoked.contains(&handle.offer) {
            return Err(Refusal::Revoked);
        }
        let window = handle.descriptor.len;
        let in_range = offset.checked_add(len).is_some_and(|end| end <= window);
        if !in_range {
            return Err(Refusal::OutOfRange {
                offset,
                len,
                window,
            });
        }
        let granted = handle.descriptor.access;
        if !granted.contains(kind.right()) {
            return Err(Refusal::NotPermitted {
                need: kind.right(),
                granted,
            });
        }
        let addr = handle.descriptor.addr.wrapping_add(offset);
        if kind == AccessKind::Atomic && !addr.is_multiple_of(8) {
            return Err(Refusal::Misaligned);
        }
        *self.in_flight.entry(handle.offer).or_default() += 1;
        Ok(Descriptor {
            addr,
            len,
            ..handle.descriptor.clone()
        })
    }

    /// A use of `offer` ended: whether `Revoked` is owed for it now.
    pub(crate) fn end(&mut self, offer: u64) -> bool {
        let Some(n) = self.in_flight.get_mut(&offer) else {
            return false;
        };
        *n -= 1;
        if *n > 0 {
            return false;
        }
        self.in_flight.remove(&offer);
        self.owed.remove(&offer)
    }

    /// The peer revokes `offer`: new uses are refused from now on. Whether to answer
    /// `Revoked` at once (no use in flight); otherwise the last use to end owes it.
    pub(crate) fn revoke(&mut self, offer: u64) -> bool {
        if self.revoked.insert(offer) {
            self.revoked_order.push_back(offer);
            if self.revoked_order.len() > REMEMBERED_REVOCATIONS {
                if let Some(old) = self.revoked_order.pop_front() {
                    self.revoked.remove(&old);
                }
            }
        }
        if self.in_flight.contains_key(&offer) {
            self.owed.insert(offer);
            false
        } else {
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const PEER: u64 = 0x5eed;

    fn handle(offer: u64, addr: u64, len: u64, access: Access) -> HandleView {
        HandleView {
            offer,
            connection: PEER,
            descriptor: Descriptor {
                addr,
                len,
                rkey: 7,
                access,
                blob: Bytes::new(),
            },
        }
    }

    #[test]
    fn a_use_gets_the_narrowed_window() {
        let mut h = Holder::new(PEER);
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let d = h
            .begin(&handle(1, 0x1000, 4096, rw), 100, 50, AccessKind::Write)
            .unwrap();
        assert_eq!((d.addr, d.len, d.rkey, d.access), (0x1000 + 100, 50, 7, rw));
    }

    #[test]
    fn refusals_name_their_cause_and_count_nothing() {
        let mut h = Holder::new(PEER);
        let read = handle(1, 0x1000, 64, Access::REMOTE_READ);
        let mut elsewhere = read.clone();
        elsewhere.connection = PEER + 1;
        assert_eq!(
            h.begin(&elsewhere, 0, 8, AccessKind::Read),
            Err(Refusal::OtherConnection)
        );
        for (offset, len) in [(60, 8), (65, 0), (u64::MAX, 2)] {
            assert!(matches!(
                h.begin(&read, offset, len, AccessKind::Read),
                Err(Refusal::OutOfRange { window: 64, .. })
            ));
        }
        assert!(matches!(
            h.begin(&read, 0, 8, AccessKind::Write),
            Err(Refusal::NotPermitted { .. })
        ));
        let atomic = handle(2, 0x1004, 64, Access::REMOTE_ATOMIC);
        assert_eq!(
            h.begin(&atomic, 0, 8, AccessKind::Atomic),
            Err(Refusal::Misaligned)
        );
        assert!(h.begin(&atomic, 4, 8, AccessKind::Atomic).is_ok());
        assert_eq!(h.in_flight.get(&1), None, "refused uses are not in flight");
    }

    #[test]
    fn revocation_waits_for_the_uses_in_flight() {
        let mut h = Holder::new(PEER);
        let w = handle(3, 0, 64, Access::REMOTE_WRITE);
        h.begin(&w, 0, 8, AccessKind::Write).unwrap();
        h.begin(&w, 8, 8, AccessKind::Write).unwrap();
        assert!(!h.revoke(3), "two uses in flight: not yet");
        assert_eq!(
            h.begin(&w, 16, 8, AccessKind::Write),
            Err(Refusal::Revoked),
            "no new use once revoked"
        );
        assert!(!h.end(3));
        assert!(h.end(3), "the last use owes the confirmation");
        assert!(!h.end(3), "and only once");
        assert!(h.revoke(4), "nothing in flight: confirm at once");
    }

    #[test]
    fn remembered_revocations_are_bounded() {
        let mut h = Holder::new(PEER);
        for offer in 1..=(REMEMBERED_REVOCATIONS as u64 + 10) {
            assert!(h.revoke(offer));
        }
        assert_eq!(h.revoked.len(), REMEMBERED_REVOCATIONS);
        assert_eq!(h.revoked_order.len(), REMEMBERED_REVOCATIONS);
        // The newest are remembered, the oldest forgotten.
        let newest = handle(
            REMEMBERED_REVOCATIONS as u64 + 10,
            0,
            8,
            Access::REMOTE_READ,
        );
        assert_eq!(
            h.begin(&newest, 0, 8, AccessKind::Read),
            Err(Refusal::Revoked)
        );
        assert!(h
            .begin(
                &handle(1, 0, 8, Access::REMOTE_READ),
                0,
                8,
                AccessKind::Read
            )
            .is_ok());
        // The same offer revoked twice is remembered once.
        assert!(h.revoke(REMEMBERED_REVOCATIONS as u64 + 10));
        assert_eq!(h.revoked_order.len(), REMEMBERED_REVOCATIONS);
    }
}
