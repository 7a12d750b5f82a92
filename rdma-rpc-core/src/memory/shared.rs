//! Memory shared with peers: a [`SharedRegion`] is registered and exported once per connection
//! it is shared with, so a peer can read and write its leases with no registration per call
//! and no copy. In exchange, a peer it is shared with may write its bytes at any time while the
//! share lasts, so local code reaches them through copies only ([`SharedBuf`]).

use std::fmt;
use std::sync::Arc;

use super::region::Leases;
use super::{Access, Region, RegisteredBuf};
use crate::error::Result;

/// Memory an application shares with chosen peers once, and then lends in parts with no
/// registration per call: the seed's storage memory, exported at start-up.
///
/// [`RemoteMemory::share`](crate::RemoteMemory::share) registers and exports the whole region
/// to one connection (one registration per region and connection, at start-up). Offers of its
/// leases on that connection ([`RemoteMemory::offer`](crate::RemoteMemory::offer),
/// [`lend`](crate::RemoteMemory::lend)), results landed in them (`call_raw_into`) and
/// one-sided reads into them then register and copy nothing. On a connection the region is
/// not shared with they work too, through the connection's bounce memory (a copy each way,
/// still no registration).
///
/// The price is trust: over DOCA, which cannot fence a window per request, the peer reaches the
/// whole region with the shared rights until the share ends, whatever the holder's runtime
/// allows (it refuses uses outside each offer before they reach the wire, but a peer that does
/// not run it is bound by the device only). So leases of a shared region are [`SharedBuf`]s:
/// their bytes are copied in and out, never borrowed. Share a region with peers you trust with
/// all of it, or give each peer a region of its own. See `docs/security.md`.
///
/// Cheap to clone: clones share the memory.
#[derive(Clone)]
pub struct SharedRegion {
    leases: Arc<Leases>,
}

impl SharedRegion {
    /// Allocates `len` zeroed bytes (at most [`MAX_BUFFER`](super::MAX_BUFFER)), with every
    /// right: which of them a peer gets is decided per share and per offer.
    pub fn new(len: usize) -> Result<SharedRegion> {
        Ok(SharedRegion {
            leases: Leases::new(Region::new(len, Access::ALL)?),
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.leases.region().capacity()
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes currently leased.
    pub fn leased(&self) -> usize {
        self.leases.leased()
    }

    /// Leases `len` bytes at `offset`, as [`MemoryRegion::lease`](super::MemoryRegion::lease)
    /// does: the range is this lease's until it is dropped.
    pub fn lease(&self, offset: usize, len: usize) -> Result<SharedBuf> {
        Ok(SharedBuf {
            inner: self.leases.lease(offset, len, "shared region")?,
        })
    }

    pub(crate) fn region(&self) -> &Arc<Region> {
        self.leases.region()
    }
}

impl fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRegion")
            .field("addr", &format_args!("{:#x}", self.region().addr()))
            .field("len", &self.len())
            .field("leased", &self.leased())
            .finish()
    }
}

/// A lease of a [`SharedRegion`]: bytes a peer the region is shared with may write at any
/// time, so they are copied in and out, never borrowed (no `&[u8]` is ever formed over them).
///
/// Use it where a [`RegisteredBuf`] goes (offers, `call_raw_into`, one-sided reads): both are
/// [`Buffer`]s.
pub struct SharedBuf {
    inner: RegisteredBuf,
}

impl SharedBuf {
    /// Capacity in bytes (the leased range).
    pub fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// Length of the data in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the data is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Sets the data length. Panics if `len` exceeds the capacity (a programming error).
    pub fn set_len(&mut self, len: usize) {
        self.inner.set_len(len);
    }

    /// Copies `data` in at the start and sets the length to it. Fails when it does not fit.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.write_at(0, data)?;
        self.inner.set_len(data.len());
        Ok(())
    }

    /// Copies `data` in at byte `offset` of the lease (the length is unchanged). Fails when
    /// the range leaves the capacity.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        self.inner.copy_in(offset, data);
        Ok(())
    }

    /// Copies bytes `offset..offset + dst.len()` of the lease into `dst`. Fails when the range
    /// leaves the capacity.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        self.inner.copy_out(offset, dst);
        Ok(())
    }

    /// The data (`len` bytes), copied.
    pub fn to_vec(&self) -> Vec<u8> {
        self.inner.to_vec()
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity() => Ok(()),
            _ => Err(crate::Error::InvalidArgument(format!(
                "bytes {offset}+{len} outside a shared lease of {} bytes",
                self.capacity()
            ))),
        }
    }
}

impl fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuf")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

mod sealed {
    /// Conversions only this crate can call: a [`SharedBuf`](super::SharedBuf) must never
    /// become a `RegisteredBuf` in a user's hands (its slice accessors would borrow bytes a
    /// peer may write).
    pub trait Sealed: Sized {
        fn into_registered(self) -> super::RegisteredBuf;
        fn from_registered(buf: super::RegisteredBuf) -> Self;
    }
}

/// Registered memory the runtime moves bytes into and out of without copying:
/// [`RegisteredBuf`] (pool buffers, leases of a [`MemoryRegion`](super::MemoryRegion): local
/// memory, borrowed as slices) or [`SharedBuf`] (leases of a [`SharedRegion`], copied in and
/// out). Sealed.
pub trait Buffer: sealed::Sealed + Send + fmt::Debug + 'static {}

impl sealed::Sealed for RegisteredBuf {
    fn into_registered(self) -> RegisteredBuf {
        self
    }

    fn from_registered(buf: RegisteredBuf) -> Self {
        buf
    }
}

impl Buffer for RegisteredBuf {}

impl sealed::Sealed for SharedBuf {
    fn into_registered(self) -> RegisteredBuf {
        self.inner
    }

    fn from_registered(inner: RegisteredBuf) -> Self {
        SharedBuf { inner }
    }
}

impl Buffer for SharedBuf {}

/// The runtime's view of any [`Buffer`].
pub(crate) fn into_registered<B: Buffer>(buf: B) -> RegisteredBuf {
    sealed::Sealed::into_registered(buf)
}

/// Back to the caller's type.
pub(crate) fn from_registered<B: Buffer>(buf: RegisteredBuf) -> B {
    sealed::Sealed::from_registered(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_leases_copy_in_and_out() {
        let region = SharedRegion::new(8192).unwrap();
        let mut a = region.lease(4096, 100).unwrap();
        a.write(b"hello").unwrap();
        assert_eq!(a.len(), 5);
        a.write_at(95, b"world").unwrap();
        assert!(a.write_at(96, b"world").is_err(), "past the lease");
        let mut out = [0u8; 5];
        a.read_at(95, &mut out).unwrap();
        assert_eq!(&out, b"world");
        assert_eq!(a.to_vec(), b"hello");
        assert!(region.lease(4000, 200).is_err(), "overlaps a live lease");
        drop(a);
        assert_eq!(region.leased(), 0);
        let b = region.lease(4096, 5).unwrap();
        assert_eq!(b.capacity(), 5);
        let mut kept = [0u8; 5];
        b.read_at(0, &mut kept).unwrap();
        assert_eq!(&kept, b"hello", "the bytes outlive the lease");
    }

    #[test]
    fn exposed_memory_is_copied_never_borrowed() {
        let region = SharedRegion::new(4096).unwrap();
        region.region().expose();
        let mut lease = region.lease(0, 16).unwrap();
        lease.write(&[3; 16]).unwrap();
        assert_eq!(lease.to_vec(), [3; 16]);
        let raw = into_registered(lease);
        let borrowed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raw.as_slice().len()));
        assert!(borrowed.is_err(), "no slice of bytes a peer may write");
    }
}
