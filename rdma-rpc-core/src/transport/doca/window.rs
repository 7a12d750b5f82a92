//! The windows a DOCA connection grants its peer, and how fenced windows are served with no
//! registration per call.
//!
//! DOCA cannot revoke an export per request: an exported mmap stays reachable by whoever has
//! its blob until the mmap is destroyed, and registering (`doca_mmap_start`) and destroying an
//! mmap per window is what makes RDMA slow on hardware (it pins pages and creates a key: tens
//! to hundreds of microseconds). So a fenced window (`Connection::grant_fenced`) is served one
//! of two ways, neither of which registers per call:
//!
//! - **bounce**: from this connection's bounce memory: power-of-two buffers in slabs, one set
//!   per set of rights, each slab registered and exported once on first use and reused, whose
//!   exports only this connection's peer ever gets (and a key for one set of rights reaches
//!   only windows offered with those rights). The buffer's bytes are copied in when the window is granted (unless it is
//!   a result window) and the peer's writes copied back when it is revoked. The peer never
//!   reaches the caller's buffer; after revocation it can still reach the bounce buffer, which
//!   only ever holds bytes exchanged with this same peer. A window revoked before the peer said
//!   it is done (or dropped) discards its bounce buffer instead of reusing it.
//! - **shared**: for a lease of a [`SharedRegion`](crate::SharedRegion) the application shared
//!   with this connection (`Connection::share`), from the region's own mmap, registered and
//!   exported once when the share was made: no copy. The peer reaches the whole region with
//!   the shared rights until the share ends; the holder's runtime keeps an honest peer within
//!   each window.
//!
//! Plain grants (`Connection::grant`) use the region's cached mmap for exactly the granted
//! rights: the runtime grants them only over memory of one connection (write slots, the
//! client's staging buffers).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::reg::{mmap_for, mmap_of};
use super::sys::{Device, Mmap};
use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf, SharedRegion, StagingPools};
use crate::transport::{BoxFuture, Descriptor, Grant, Revoke, ShareGuard, WindowHandle};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The local write right of `buf`, which a remote write or atomic right needs alongside it.
pub(super) fn local_bits(buf: &RegisteredBuf) -> Access {
    Access::from_bits_truncate(buf.access().bits() & Access::LOCAL_WRITE.bits())
}

/// One region shared with this connection's peer.
struct Share {
    id: u64,
    /// The region's first byte and length.
    addr: u64,
    len: u64,
    access: Access,
    mmap: Arc<Mmap>,
}

/// What one connection's fenced windows are served from.
pub(super) struct Windows {
    dev: Arc<Device>,
    budget: usize,
    /// Bounce memory per set of rights: the peer's key to a slab reaches, with those rights,
    /// only memory of windows it was offered with the same rights.
    bounce: Mutex<Vec<(Access, Arc<StagingPools>)>>,
    shares: Arc<Mutex<Vec<Share>>>,
    next_share: Mutex<u64>,
}

impl Windows {
    pub(super) fn new(dev: Arc<Device>, bounce_budget: usize) -> Windows {
        Windows {
            dev,
            budget: bounce_budget,
            bounce: Mutex::new(Vec::new()),
            shares: Arc::new(Mutex::new(Vec::new())),
            next_share: Mutex::new(0),
        }
    }

    /// The bounce memory of windows with `access`.
    fn bounce(&self, access: Access) -> Arc<StagingPools> {
        let mut pools = lock(&self.bounce);
        if let Some((_, pool)) = pools.iter().find(|(a, _)| *a == access) {
            return pool.clone();
        }
        let pool = Arc::new(StagingPools::new(self.budget));
        pools.push((access, pool.clone()));
        pool
    }

    /// Registers and exports all of `region` for this connection's peer with `access`.
    pub(super) fn share(&self, region: &SharedRegion, access: Access) -> Result<ShareGuard> {
        let region = region.region();
        // The region's own mmap for this connection: destroying it when the share ends fences
        // every window of it at once, and no other connection's export is involved.
        // SAFETY: the mmap covers the region's allocation (at least one byte), which the guard
        // keeps alive (it holds the region) for longer than the mmap, which it drops first.
        let mmap = unsafe {
            Mmap::local(
                &self.dev,
                region.ptr_at(0),
                region.capacity().max(1),
                (access | Access::LOCAL_WRITE).bits(),
            )
        }?;
        region.expose();
        let id = {
            let mut next = lock(&self.next_share);
            *next += 1;
            *next
        };
        lock(&self.shares).push(Share {
            id,
            addr: region.addr(),
            len: region.capacity() as u64,
            access,
            mmap: Arc::new(mmap),
        });
        Ok(ShareGuard::new(Box::new(Unshare {
            shares: Arc::downgrade(&self.shares),
            id,
            _region: region.clone(),
        })))
    }

    /// Registers (and exports) bounce memory for `count` windows of `len` bytes with `access`
    /// held at once.
    pub(super) fn reserve(&self, len: usize, count: usize, access: Access) -> Result<()> {
        if let Some(slab) = self.bounce(access).reserve(len, count)? {
            mmap_of(&self.dev, &slab, access | Access::LOCAL_WRITE)?;
        }
        Ok(())
    }

    /// The mmap of a share on this connection that covers `buf[offset..offset + len]` with
    /// `access`, if any.
    fn shared(
        &self,
        buf: &RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Option<Arc<Mmap>> {
        let start = buf.addr() + offset as u64;
        let end = start + len as u64;
        lock(&self.shares)
            .iter()
            .find(|s| s.addr <= start && end <= s.addr + s.len && s.access.contains(access))
            .map(|s| s.mmap.clone())
    }

    /// A fenced window of `buf[offset..offset + len]`: from a share of the region, or through
    /// a bounce buffer. `keep`: the window starts with the buffer's bytes and bytes the peer
    /// does not write keep their values (`false`: a result window).
    pub(super) fn fenced(
        &self,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
        keep: bool,
        descriptor: impl FnOnce(u64, &Mmap) -> Descriptor,
    ) -> Result<Grant> {
        if let Some(mmap) = self.shared(&buf, offset, len, access) {
            let d = descriptor(buf.addr() + offset as u64, &mmap);
            return Ok(Grant::new(
                d,
                Box::new(DocaWindow {
                    buf: Mutex::new(Some(buf)),
                    mmap: Some(mmap),
                }),
            ));
        }
        let Some(mut bounce) = self.bounce(access).try_acquire(len)? else {
            return Err(Error::Exhausted {
                what: "bounce_budget",
                detail: format!(
                    "every bounce buffer for a {access:?} window of {len} bytes on this \
                     connection is in use (DocaConfig::bounce_budget = {} bytes per set of \
                     rights); wait for offers to be revoked, raise bounce_budget, or share the \
                     region with the connection (RemoteMemory::share)",
                    self.budget
                ),
            });
        };
        // The peer gets exactly the rights asked for, over the bounce buffer only.
        let mmap = mmap_for(&self.dev, &bounce, access | Access::LOCAL_WRITE)?;
        if keep {
            crate::memory::copy_between(&buf, offset, &mut bounce, 0, len);
        }
        let d = descriptor(bounce.addr(), &mmap);
        let copy_back =
            access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        Ok(Grant::new(
            d,
            Box::new(BounceWindow {
                state: Mutex::new(Some(Bounce {
                    buf,
                    bounce,
                    offset,
                    len,
                    copy_back,
                })),
            }),
        ))
    }
}

/// Ends a share when dropped: its mmap goes once no window of it is left.
struct Unshare {
    shares: Weak<Mutex<Vec<Share>>>,
    id: u64,
    /// Keeps the region's memory alive for as long as its mmap may be.
    _region: Arc<crate::memory::Region>,
}

impl Drop for Unshare {
    fn drop(&mut self) {
        if let Some(shares) = self.shares.upgrade() {
            lock(&shares).retain(|s| s.id != self.id);
        }
    }
}

/// A window over an mmap the peer keeps reaching after revocation: a region's cached mmap
/// (plain grants: DOCA cannot revoke it, so revoking gives the buffer back at once and a peer
/// that kept the descriptor can still reach the region with the granted rights), or a shared
/// region's mmap, which it keeps alive while the share or any such window lives.
pub(super) struct DocaWindow {
    pub(super) buf: Mutex<Option<RegisteredBuf>>,
    /// A shared region's mmap (a region's cached mmap lives with the region).
    pub(super) mmap: Option<Arc<Mmap>>,
}

impl fmt::Debug for DocaWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocaWindow")
            .field("shared", &self.mmap.is_some())
            .finish_non_exhaustive()
    }
}

impl WindowHandle for DocaWindow {
    fn revoke(self: Box<Self>, _: Revoke) -> BoxFuture<'static, Option<RegisteredBuf>> {
        let buf = lock(&self.buf).take();
        Box::pin(async move { buf })
    }
}

struct Bounce {
    /// The caller's buffer, which the peer never reaches.
    buf: RegisteredBuf,
    /// The memory the peer reaches instead.
    bounce: RegisteredBuf,
    offset: usize,
    len: usize,
    /// The peer may have written the window: copy it back at revocation.
    copy_back: bool,
}

/// A fenced window served by a bounce buffer.
struct BounceWindow {
    state: Mutex<Option<Bounce>>,
}

impl fmt::Debug for BounceWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BounceWindow").finish_non_exhaustive()
    }
}

impl BounceWindow {
    fn end(&self, how: Option<Revoke>) -> Option<RegisteredBuf> {
        let Bounce {
            mut buf,
            bounce,
            offset,
            len,
            copy_back,
        } = lock(&self.state).take()?;
        let peer_done = match how {
            Some(how) => {
                let n = how.written.unwrap_or(len).min(len);
                if copy_back && n > 0 {
                    crate::memory::copy_between(&bounce, 0, &mut buf, offset, n);
                }
                how.peer_done
            }
            None => false,
        };
        if peer_done {
            drop(bounce);
        } else {
            // The peer may still write it: never hand it out again.
            bounce.discard();
        }
        how.map(|_| buf)
    }
}

impl Drop for BounceWindow {
    fn drop(&mut self) {
        drop(self.end(None));
    }
}

impl WindowHandle for BounceWindow {
    fn revoke(self: Box<Self>, how: Revoke) -> BoxFuture<'static, Option<RegisteredBuf>> {
        let buf = self.end(Some(how));
        Box::pin(async move { buf })
    }

    fn release(self: Box<Self>) {
        // The peer is done: the bounce buffer may serve again; nobody wants the bytes.
        if let Some(Bounce { bounce, .. }) = lock(&self.state).take() {
            drop(bounce);
        }
    }
}
