//! Memory this side offers its peer: one buffer ([`Offer`], with its revocation handshake), a
//! region shared with the connection ([`Share`]), and all of a shared region in one handle
//! ([`RegionOffer`]).

use std::fmt;
use std::sync::Arc;

use super::{RemoteBuf, RemoteMemory, REVOKE_PATIENCE};
use crate::memory::{Access, Buffer, RegisteredBuf, SharedRegion};
use crate::session::Session;
use crate::status::Status;
use crate::transport::{Grant, ShareGuard};

/// Checks the rights of an offer or a share: remote rights only, within `registered`.
pub(super) fn check_remote(access: Access, registered: Access, what: &str) -> Result<(), Status> {
    let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    if access == Access::LOCAL_READ || !remote.contains(access) {
        return Err(Status::invalid_argument(format!(
            "an offer grants remote rights only (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC), \
             not {access:?}"
        )));
    }
    if !registered.contains(access) {
        return Err(Status::invalid_argument(format!(
            "{what} is registered with {registered:?}, which does not include {access:?}"
        )));
    }
    Ok(())
}

/// A [`SharedRegion`] shared with the peer of one connection ([`RemoteMemory::share`]):
/// registered and exported for it once. Dropping it ends the share (over DOCA the region's
/// registration for this connection goes once no offer of it is left).
pub struct Share {
    pub(super) _guard: ShareGuard,
    pub(super) region: SharedRegion,
    pub(super) memory: RemoteMemory,
    pub(super) access: Access,
}

impl fmt::Debug for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Share")
            .field("len", &self.region.len())
            .field("access", &self.access)
            .finish()
    }
}

impl Share {
    /// Offers the whole shared region to the peer with `access` (within the share's rights),
    /// for as long as the returned [`RegionOffer`] lives, while local code goes on leasing
    /// parts of the region: the peer then reaches any part by offset in one handle, sent once
    /// (NVIDIA's storage application sends its I/O memory's export at `init_storage`, and
    /// offsets in each I/O). Nothing is registered, exported or copied beyond the share
    /// itself, and no offer or revocation is needed per use.
    ///
    /// The peer may read (and, with [`Access::REMOTE_WRITE`], write) any byte of the region
    /// while the offer lasts, as the share already allowed it over DOCA: local code reaches
    /// the bytes through [`SharedBuf`](crate::SharedBuf) copies only.
    pub fn offer_all(&self, access: Access) -> Result<RegionOffer, Status> {
        if !self.access.contains(access) {
            return Err(Status::invalid_argument(format!(
                "offering the whole region with {access:?} needs a share with those rights \
                 (this one has {:?})",
                self.access
            )));
        }
        let whole = RegisteredBuf::view_of(self.region.region().clone());
        Ok(RegionOffer {
            offer: self.memory.offer(whole, access)?,
        })
    }
}

/// The whole of a shared region offered to the peer of one connection
/// ([`Share::offer_all`]): one handle for all of it. Revoke it (or drop it) before the share
/// ends.
pub struct RegionOffer {
    offer: Offer<RegisteredBuf>,
}

impl fmt::Debug for RegionOffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RegionOffer").field(&self.offer).finish()
    }
}

impl RegionOffer {
    /// The handle to send to the peer (in a `remote_buffer` field), once: its uses name parts
    /// of the region by offset.
    pub fn handle(&self) -> RemoteBuf {
        self.offer.handle()
    }

    /// Revokes the offer: the peer finishes its uses in flight and confirms (see
    /// [`Offer::revoke`]).
    pub async fn revoke(self) {
        drop(self.offer.revoke().await);
    }
}

/// Memory offered to the peer: a fenced window and the [`RemoteBuf`] that names it.
///
/// [`revoke`](Self::revoke) ends it cleanly; dropping it ends it at once (see
/// [`RemoteMemory`](crate::RemoteMemory)).
pub struct Offer<B: Buffer = RegisteredBuf> {
    pub(super) handle: RemoteBuf,
    pub(super) grant: Option<Grant>,
    pub(super) session: Arc<Session>,
    pub(super) kind: std::marker::PhantomData<fn() -> B>,
}

impl<B: Buffer> fmt::Debug for Offer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Offer")
            .field("offer", &self.handle.offer)
            .field("len", &self.handle.len)
            .field("access", &self.handle.access())
            .finish()
    }
}

impl<B: Buffer> Offer<B> {
    /// The handle to send to the peer (in a `remote_buffer` field).
    pub fn handle(&self) -> RemoteBuf {
        self.handle.clone()
    }

    /// Revokes the offer: the peer stops using the handle, finishes its uses in flight and
    /// confirms (or [`REVOKE_PATIENCE`] passes, or the connection ends); then the window is
    /// taken down and the buffer given back. `None` if the connection ended and dropped the
    /// buffer (a lease's range is then free again in its region).
    pub async fn revoke(mut self) -> Option<B> {
        let offer = self.handle.offer;
        let asked = self.session.lock().proto.revoke_offer(offer);
        // Whether the peer is known to be done with the window: it confirmed, or its
        // connection is gone.
        let mut done = true;
        if asked.is_ok() {
            let conn = self.session.transport().clone();
            let confirmed =
                std::future::poll_fn(|cx| self.session.lock().proto.poll_revoked(offer, cx));
            tokio::select! {
                () = confirmed => {}
                _ = conn.closed() => {}
                _ = tokio::time::sleep(REVOKE_PATIENCE) => {
                    done = false;
                    if let Some(line) = crate::observe::logs::line("revocation not confirmed", "") {
                        tracing::warn!(
                            peer = %conn.peer(),
                            offer,
                            suppressed = line.suppressed,
                            "the peer did not confirm a revocation within {REVOKE_PATIENCE:?}; \
                             taking the window down anyway"
                        );
                    }
                }
            }
        }
        self.session.lock().proto.forget_offer(offer);
        let grant = self.grant.take()?;
        let buf = if done {
            grant.revoke().await
        } else {
            grant.revoke_unconfirmed().await
        };
        buf.map(crate::memory::from_registered)
    }
}

impl<B: Buffer> Drop for Offer<B> {
    fn drop(&mut self) {
        let Some(grant) = self.grant.take() else {
            return;
        };
        // The fence goes up now; the peer hears of it as soon as a credit allows.
        drop(grant);
        self.session.lock().proto.drop_offer(self.handle.offer);
    }
}
