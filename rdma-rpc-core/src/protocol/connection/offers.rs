//! Remote buffers on one connection, both ways: the offers this side made (their ids, and the
//! revocations waiting for the peer's confirmation) and the peer's offers this side uses
//! ([`Holder`]: which uses are in flight, which revocations to confirm once they end).
//!
//! Revocation is a handshake: the offerer sends `Revoke`; the holder refuses new uses of that
//! offer at once, lets the uses in flight finish and answers `Revoked` (many offers per frame);
//! only then does the offerer take its window down. Confirmations owed wait here, at most
//! [`REMEMBERED_REVOCATIONS`] of them, and leave after the frames queued before them: a peer
//! that revokes faster than it reads loses the excess (it then waits its own patience out).

use std::collections::HashMap;
use std::task::{Context, Poll, Waker};

use super::Woken;

use crate::protocol::frames::{Kind, Offers as OfferList};
use crate::protocol::handles::{AccessKind, HandleView, Holder, Refusal, REMEMBERED_REVOCATIONS};
use crate::transport::Descriptor;

/// A revocation of one of this side's offers, waiting for the peer.
#[derive(Debug, Default)]
struct Revoking {
    confirmed: bool,
    waker: Option<Waker>,
}

/// See the module docs.
///
/// In this order (`repr(C)`): the confirmations owed, which every release of the state
/// checks, first; the tables of offers both ways (some 230 bytes, used only by calls on
/// remote buffers) boxed, so that the state that follows this in a connection is not pushed
/// lines away.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct RemoteBuffers {
    /// Confirmations of the peer's revocations, to send.
    owed: Vec<u64>,
    /// This side's token of the connection, in the handles it offers.
    token: u64,
    last_offer: u64,
    /// The peer was warned about revoking faster than it reads.
    warned: bool,
    tables: Box<Tables>,
}

/// The offers of both sides: the peer's this side holds, and this side's being revoked.
#[derive(Debug)]
struct Tables {
    holder: Holder,
    revoking: HashMap<u64, Revoking>,
}

impl RemoteBuffers {
    /// This side's offers carry `token`; the peer's token comes with its handshake
    /// ([`handshake`](Self::handshake)).
    pub(crate) fn new(token: u64) -> RemoteBuffers {
        RemoteBuffers {
            token,
            tables: Box::new(Tables {
                holder: Holder::new(0),
                revoking: HashMap::new(),
            }),
            last_offer: 0,
            owed: Vec::new(),
            warned: false,
        }
    }

    /// The peer announced `peer_token` for this connection: the handles it offers carry it.
    pub(crate) fn handshake(&mut self, peer_token: u64) {
        self.tables.holder = Holder::new(peer_token);
    }

    /// This side's token of the connection.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// Whether a handle carrying `connection` was offered by this connection's peer.
    pub(crate) fn offered_here(&self, connection: u64) -> bool {
        self.tables.holder.offered_here(connection)
    }

    /// The id of a new offer of this side.
    pub(crate) fn next_offer(&mut self) -> u64 {
        self.last_offer += 1;
        self.last_offer
    }

    /// Starts revoking `offer`: the frame to send.
    pub(crate) fn revoke(&mut self, offer: u64) -> Kind {
        self.tables.revoking.insert(offer, Revoking::default());
        Kind::Revoke(OfferList {
            offers: vec![offer],
        })
    }

    /// Whether the peer confirmed the revocation of `offer` (`Pending` registers `cx`).
    pub(crate) fn poll_revoked(&mut self, offer: u64, cx: &Context<'_>) -> Poll<()> {
        match self.tables.revoking.get_mut(&offer) {
            Some(r) if r.confirmed => Poll::Ready(()),
            Some(r) => {
                match &r.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => r.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            // Not revoking (forgotten): nothing to wait for.
            None => Poll::Ready(()),
        }
    }

    /// The revoker stopped waiting for `offer` (confirmed, gave up, or the connection ended).
    pub(crate) fn forget(&mut self, offer: u64) {
        self.tables.revoking.remove(&offer);
    }

    /// The peer confirmed revocations of ours. Confirmations of offers that are not being
    /// revoked (a confused or lying peer) change nothing. Returns whom to wake.
    pub(crate) fn on_revoked(&mut self, offers: Vec<u64>, woken: &mut Woken) {
        for offer in offers {
            if let Some(r) = self.tables.revoking.get_mut(&offer) {
                r.confirmed = true;
                woken.extend(r.waker.take());
            }
        }
    }

    /// The connection ended: every revocation is as done as it will get.
    pub(crate) fn end(&mut self, woken: &mut Woken) {
        for r in self.tables.revoking.values_mut() {
            r.confirmed = true;
            woken.extend(r.waker.take());
        }
    }

    /// The peer revokes some of its offers: each is confirmed once no use of it is in flight.
    pub(crate) fn on_revoke(&mut self, offers: Vec<u64>, peer: &str) {
        for offer in offers {
            if self.tables.holder.revoke(offer) {
                self.owe(offer, peer);
            }
        }
    }

    /// Checks a use of the peer's offer and counts it in flight: the descriptor to use. Every
    /// accepted use must be [`end_use`](Self::end_use)d.
    pub(crate) fn begin_use(
        &mut self,
        handle: &HandleView,
        offset: u64,
        len: u64,
        kind: AccessKind,
    ) -> Result<Descriptor, Refusal> {
        self.tables.holder.begin(handle, offset, len, kind)
    }

    /// A use of the peer's `offer` ended: a confirmation may be owed now.
    pub(crate) fn end_use(&mut self, offer: u64, peer: &str) {
        if self.tables.holder.end(offer) {
            self.owe(offer, peer);
        }
    }

    fn owe(&mut self, offer: u64, peer: &str) {
        if self.owed.len() >= REMEMBERED_REVOCATIONS {
            if !self.warned {
                self.warned = true;
                tracing::warn!(
                    peer,
                    "the peer revokes offers faster than it reads the confirmations; dropping \
                     confirmations beyond {REMEMBERED_REVOCATIONS}"
                );
            }
            return;
        }
        self.owed.push(offer);
    }

    /// Whether confirmations are owed.
    pub(crate) fn owes(&self) -> bool {
        !self.owed.is_empty()
    }

    /// A frame of the confirmations owed that fit a frame of `peer_max_frame` bytes, if any.
    pub(crate) fn confirmations(&mut self, peer_max_frame: usize) -> Option<Kind> {
        if self.owed.is_empty() {
            return None;
        }
        // A varint id takes at most 10 bytes; leave room for the frame around them.
        let per_frame = (peer_max_frame.saturating_sub(64) / 10).max(1);
        let n = self.owed.len().min(per_frame);
        Some(Kind::Revoked(OfferList {
            offers: self.owed.drain(..n).collect(),
        }))
    }
}

impl<H: super::Handles> super::Connection<H> {
    /// The id of a new offer of this side's memory, and the token its handle carries.
    pub(crate) fn new_offer(&mut self) -> (u64, u64) {
        let remote = &mut self.core.remote;
        (remote.next_offer(), remote.token())
    }

    /// Starts revoking `offer`: the peer is asked to stop using it (see
    /// [`poll_revoked`](Self::poll_revoked)).
    pub(crate) fn revoke_offer(&mut self, offer: u64) -> crate::Result<()> {
        let kind = self.core.remote.revoke(offer);
        self.core.send(kind)
    }

    /// Whether the peer confirmed the revocation of `offer`, or the connection ended.
    pub(crate) fn poll_revoked(&mut self, offer: u64, cx: &Context<'_>) -> Poll<()> {
        if self.end().is_some() {
            return Poll::Ready(());
        }
        self.core.remote.poll_revoked(offer, cx)
    }

    /// The revoker of `offer` stopped waiting.
    pub(crate) fn forget_offer(&mut self, offer: u64) {
        self.core.remote.forget(offer);
    }

    /// Tells the peer that `offer` is gone (its window was taken down without waiting), if
    /// the connection is still open.
    pub(crate) fn drop_offer(&mut self, offer: u64) {
        self.core.remote.forget(offer);
        if self.end().is_none() {
            let _ = self.core.send(Kind::Revoke(OfferList {
                offers: vec![offer],
            }));
        }
    }

    /// Checks a use of the peer's offer and counts it in flight (see
    /// [`RemoteBuffers::begin_use`]).
    pub(crate) fn begin_use(
        &mut self,
        handle: &HandleView,
        offset: u64,
        len: u64,
        kind: AccessKind,
    ) -> Result<Descriptor, Refusal> {
        self.core.remote.begin_use(handle, offset, len, kind)
    }

    /// A use of the peer's `offer` ended.
    pub(crate) fn end_use(&mut self, offer: u64) {
        let core = &mut self.core;
        core.remote.end_use(offer, &core.peer);
    }

    /// Whether a handle carrying `connection` was offered by this connection's peer.
    pub(crate) fn offered_here(&self, connection: u64) -> bool {
        self.core.remote.offered_here(connection)
    }
}
