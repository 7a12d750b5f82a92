//! [`RegisteredBuf`], the owned buffer every transport operation takes and gives back: a view
//! of a [`Region`] with a data length, the accessors that refuse memory a peer may write, the
//! raw copies that do not, and where it goes when dropped ([`Recycle`]).

use std::fmt;
use std::sync::Arc;

use super::{Access, Region};
use crate::error::{Error, Result};

/// An owned, registered buffer: a fixed capacity and a data length.
///
/// Transports take it by value for an operation and give it back on completion, so nothing
/// else can touch its bytes while a peer or the transport does. A buffer taken from a
/// [`BufferPool`] returns to it when dropped; a lease of a [`MemoryRegion`] (a view of part of
/// the region) returns its range to the region.
///
/// [`BufferPool`]: super::BufferPool
/// [`MemoryRegion`]: super::MemoryRegion
pub struct RegisteredBuf {
    pub(super) region: Arc<Region>,
    /// Offset of the first byte of this buffer in its region (0 but for region leases).
    pub(super) start: usize,
    pub(super) capacity: usize,
    pub(super) len: usize,
    /// A view of frozen bytes (`frozen_view`): live `Bytes` share them, so nothing may write
    /// them; its access carries no write right and its mutable accessors refuse it.
    pub(super) read_only: bool,
    pub(super) pool: Option<Arc<dyn Recycle>>,
}

/// Where a pooled buffer, or a leased range, goes when dropped.
pub(super) trait Recycle: Send + Sync {
    fn give_back(&self, region: Arc<Region>, start: usize, capacity: usize);

    /// The buffer is not coming back (it must never be reused): the pool may make another.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    fn discard(&self) {}
}

impl RegisteredBuf {
    /// Registers a new buffer of `capacity` bytes with the given access rights.
    ///
    /// Prefer [`BufferPool`] on hot paths: registration is expensive on RDMA hardware.
    ///
    /// [`BufferPool`]: super::BufferPool
    pub fn new(capacity: usize, access: Access) -> Result<RegisteredBuf> {
        Ok(RegisteredBuf::whole(Region::new(capacity, access)?, None))
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8], access: Access) -> Result<RegisteredBuf> {
        let mut buf = RegisteredBuf::new(data.len(), access)?;
        buf.set_len(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        Ok(buf)
    }

    /// A view of all of `region`, returned to nothing when dropped: what an offer of a whole
    /// shared region ([`Share::offer_all`](crate::Share::offer_all)) holds, while local code
    /// keeps leasing parts of the region.
    pub(crate) fn view_of(region: Arc<Region>) -> RegisteredBuf {
        RegisteredBuf::whole(region, None)
    }

    /// A buffer over all of `region`, empty.
    pub(super) fn whole(region: Arc<Region>, pool: Option<Arc<dyn Recycle>>) -> RegisteredBuf {
        RegisteredBuf {
            capacity: region.capacity,
            region,
            start: 0,
            len: 0,
            read_only: false,
            pool,
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Length of the data in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the data is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access rights the buffer was registered with (no write right for a read-only view).
    pub fn access(&self) -> Access {
        if self.read_only {
            Access::from_bits_truncate(self.region.access.bits() & Access::REMOTE_READ.bits())
        } else {
            self.region.access
        }
    }

    /// Sets the data length. Panics if `len` exceeds the capacity (a programming error).
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "set_len({len}) beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }

    /// Panics unless references to the bytes may be formed: never for memory a peer may
    /// still write. Users cannot reach such a buffer (exposed memory is only ever theirs as a
    /// [`SharedBuf`]); the runtime copies it with `copy_in` / `copy_out`. A failure here is a
    /// bug of this crate.
    ///
    /// [`SharedBuf`]: super::SharedBuf
    #[track_caller]
    fn assert_borrowable(&self) {
        assert!(
            !self.region.is_exposed(),
            "rdma-rpc bug: a reference to memory a peer may still write (use copy_in/copy_out)"
        );
    }

    /// Panics for a read-only view (frozen bytes that live `Bytes` share).
    #[track_caller]
    fn assert_writable(&self) {
        assert!(
            !self.read_only,
            "rdma-rpc bug: writing into frozen bytes that live `Bytes` share"
        );
        self.assert_borrowable();
    }

    /// The data.
    pub fn as_slice(&self) -> &[u8] {
        self.assert_borrowable();
        // SAFETY: no peer can write the region (checked just above: it was never exposed), and
        // local code reaches these bytes only through this buffer, which we own (see
        // `Region`); shared access through `&self` is read-only. `len <= capacity`.
        unsafe { std::slice::from_raw_parts(self.ptr_at(0), self.len) }
    }

    /// The data, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.assert_writable();
        // SAFETY: as `as_slice`, and `&mut self` makes this the only access; the buffer is not
        // a read-only view of frozen bytes (checked above). `len <= capacity`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr_at(0), self.len) }
    }

    /// The whole capacity, mutable (to fill before [`set_len`](Self::set_len)).
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        self.assert_writable();
        // SAFETY: as `as_mut_slice`, over the whole allocation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr_at(0), self.capacity) }
    }

    /// Copies `data` in and sets the length. Fails with [`Error::DoesNotFit`] when it does
    /// not fit (in a handler, answered as the handler's error, naming the endpoint).
    pub fn fill_from(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > self.capacity() {
            return Err(Error::DoesNotFit {
                len: data.len() as u64,
                capacity: self.capacity() as u64,
            });
        }
        self.assert_writable();
        self.copy_in(0, data);
        self.set_len(data.len());
        Ok(())
    }

    /// Copies `data` to byte `offset` of the buffer with a raw copy, never forming a
    /// reference to the buffer's bytes: valid also for memory a peer may still write. Does
    /// not change the data length. Panics if the range leaves the capacity, or for a
    /// read-only view.
    pub(crate) fn copy_in(&mut self, offset: usize, data: &[u8]) {
        assert!(!self.read_only, "rdma-rpc bug: writing into frozen bytes");
        let end = offset.checked_add(data.len());
        assert!(
            end.is_some_and(|end| end <= self.capacity),
            "copy_in out of range"
        );
        // SAFETY: the range lies within the buffer (checked above), which we own (`&mut
        // self`); the source is a separate slice. Nothing borrows the destination: a peer
        // writing it concurrently (exposed memory) can only change which bytes land.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr_at(offset), data.len()) }
    }

    /// Copies bytes `offset..offset + dst.len()` of the buffer into `dst` with a raw copy,
    /// never forming a reference to the buffer's bytes: valid also for memory a peer may
    /// still write (the copy then holds whatever the bytes were). Panics if the range leaves
    /// the capacity.
    pub(crate) fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        let end = offset.checked_add(dst.len());
        assert!(
            end.is_some_and(|end| end <= self.capacity),
            "copy_out out of range"
        );
        // SAFETY: the range lies within the buffer (checked above); no local code writes it
        // while we hold `&self`, and the destination is a separate slice.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr_at(offset), dst.as_mut_ptr(), dst.len()) }
    }

    /// Appends the data to `out` as [`copy_out`](Self::copy_out) copies it, into `out`'s
    /// spare capacity: no zeroing first (a memset as large as the copy in release builds, a
    /// loop over every byte in debug ones).
    pub(crate) fn append_to(&self, out: &mut Vec<u8>) {
        out.reserve(self.len);
        let at = out.len();
        // SAFETY: `reserve` made room for `self.len` bytes past `at`; the source lies within
        // the buffer (`len <= capacity`), which no local code writes while we hold `&self`,
        // and the destination is `out`'s own allocation. Those bytes are initialized by the
        // copy before `set_len` covers them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr_at(0), out.as_mut_ptr().add(at), self.len);
            out.set_len(at + self.len);
        }
    }

    /// The data, copied into a new `Vec` as [`copy_out`](Self::copy_out) copies.
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_to(&mut out);
        out
    }

    /// Whether a peer may write this buffer's bytes behind our back (see [`Region`]).
    #[inline]
    pub(crate) fn is_exposed(&self) -> bool {
        self.region.is_exposed()
    }

    /// Turns the buffer into [`bytes::Bytes`] without copying; the buffer returns to its pool
    /// when the last `Bytes` referring to it is dropped.
    pub fn freeze(self) -> bytes::Bytes {
        self.assert_borrowable();
        bytes::Bytes::from_owner(FrozenBuf(self))
    }

    /// Whether the buffer goes back to a pool when dropped.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn is_pooled(&self) -> bool {
        self.pool.is_some()
    }

    /// The registered allocation this buffer is part of (transports register it whole).
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Drops the buffer without returning it to its pool: memory a peer may still reach by a
    /// window that was not confirmed done is never handed out again. A region lease goes back
    /// to its region all the same (the peer never reached the lease itself).
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn discard(mut self) {
        if let Some(pool) = self.pool.take() {
            if self.region.is_exposed() {
                pool.discard();
            } else {
                pool.give_back(self.region.clone(), self.start, self.capacity);
            }
        }
    }

    /// The address of the buffer's region record (for a prefetch: the record is what a copy
    /// into the buffer reads first).
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn region_addr(&self) -> usize {
        Arc::as_ptr(&self.region) as usize
    }

    /// The address of the buffer's first byte (what a descriptor of it advertises).
    pub(crate) fn addr(&self) -> u64 {
        self.region.addr() + self.start as u64
    }

    /// Raw pointer to byte `offset` of this buffer.
    ///
    /// # Safety
    /// `offset <= capacity`, and the caller must have the right to touch the bytes it reaches
    /// through the pointer (it owns the buffer, or holds a window guard over it).
    pub(crate) unsafe fn ptr_at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.capacity);
        // SAFETY: `start + capacity <= region.capacity` (checked when the view was made), so
        // `start + offset` stays within the region as the caller keeps `offset <= capacity`.
        unsafe { self.region.ptr_at(self.start + offset) }
    }
}

/// Copies `len` bytes from `src[src_offset..]` to `dst[dst_offset..]` with a raw copy, never
/// forming a reference to either buffer's bytes: valid also when a peer may write one of them.
/// Panics if a range leaves its buffer's capacity, or for a read-only destination.
#[cfg_attr(not(feature = "doca"), allow(dead_code))]
pub(crate) fn copy_between(
    src: &RegisteredBuf,
    src_offset: usize,
    dst: &mut RegisteredBuf,
    dst_offset: usize,
    len: usize,
) {
    let fits =
        |offset: usize, capacity: usize| offset.checked_add(len).is_some_and(|e| e <= capacity);
    assert!(
        fits(src_offset, src.capacity) && fits(dst_offset, dst.capacity),
        "copy_between out of range"
    );
    assert!(!dst.read_only, "rdma-rpc bug: writing into frozen bytes");
    // SAFETY: both ranges lie within their buffers (checked above). `dst` is ours (`&mut`);
    // `src` is not written by local code while we hold `&src`. Two buffers never overlap:
    // pooled buffers are separate allocations, and leases of one region never overlap (a
    // region refuses overlapping leases), so `copy_nonoverlapping` holds.
    unsafe { std::ptr::copy_nonoverlapping(src.ptr_at(src_offset), dst.ptr_at(dst_offset), len) }
}

struct FrozenBuf(RegisteredBuf);

impl AsRef<[u8]> for FrozenBuf {
    fn as_ref(&self) -> &[u8] {
        // Checked at `freeze`: the region was not exposed then. It cannot become exposed
        // later: the runtime exposes only its own staging, bounce and slot memory and
        // `SharedRegion`s, none of which it freezes.
        self.0.as_slice()
    }
}

impl fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("access", &self.region.access)
            .field("pooled", &self.pool.is_some())
            .finish()
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(self.region.clone(), self.start, self.capacity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{BufferPool, BUFFER_ALIGN, MAX_BUFFER};

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        let mut buf = RegisteredBuf::new(10_000, Access::ALL).unwrap();
        assert_eq!(buf.region().addr() % BUFFER_ALIGN as u64, 0);
        assert!(buf.as_mut_capacity().iter().all(|b| *b == 0));
        assert!(buf.fill_from(&[1; 10_001]).is_err());
    }

    /// Small regions come from the heap and large ones from the kernel (on Unix): both are
    /// aligned, zeroed and writable to their last byte, also when made again in the memory a
    /// dropped one, written all over, left behind.
    #[test]
    fn heap_and_mapped_buffers_are_aligned_zeroed_and_writable() {
        for len in [1, 4096, (1 << 20) - 1, 1 << 20, (3 << 20) + 5] {
            for round in 0..3 {
                let mut buf = RegisteredBuf::new(len, Access::ALL).unwrap();
                assert_eq!(buf.region().addr() % BUFFER_ALIGN as u64, 0, "{len}");
                let bytes = buf.as_mut_capacity();
                assert_eq!(bytes.len(), len);
                assert!(bytes.iter().all(|b| *b == 0), "{len} bytes, round {round}");
                bytes.fill(0xa5);
            }
        }
    }

    #[test]
    fn oversized_buffers_are_refused_before_allocating() {
        let err = RegisteredBuf::new(MAX_BUFFER + 1, Access::ALL).unwrap_err();
        assert!(err.to_string().contains("buffer_size"), "{err}");
    }

    #[test]
    fn frozen_buffers_return_to_the_pool() {
        let pool = BufferPool::new(16, 1, Access::LOCAL_WRITE).unwrap();
        let mut buf = pool.try_acquire().unwrap();
        buf.fill_from(b"abc").unwrap();
        let bytes = buf.freeze();
        assert_eq!(&bytes[..], b"abc");
        assert_eq!(pool.available(), 0);
        drop(bytes);
        assert_eq!(pool.available(), 1);
    }
}
