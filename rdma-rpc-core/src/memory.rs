//! Registered memory: owned, aligned buffers that transports can move bytes into and out of
//! without copies, and pools of them registered once.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Semaphore;

use crate::error::{Error, Result};

mod region;
mod shared;

pub(crate) use region::frozen_view;
pub use region::MemoryRegion;
pub(crate) use shared::{from_registered, into_registered};
pub use shared::{Buffer, SharedBuf, SharedRegion};

/// Alignment of every registered buffer (a page, as RDMA registrations like).
pub const BUFFER_ALIGN: usize = 4096;

/// Access rights of memory: what the local side and remote peers may do with it.
///
/// Mirrors DOCA's access flags (`DOCA_ACCESS_FLAG_*`) and verbs' `IBV_ACCESS_*`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// Local read only (no flags).
    pub const LOCAL_READ: Access = Access(0);
    /// Local read and write (receives write into local memory).
    pub const LOCAL_WRITE: Access = Access(1 << 0);
    /// Remote peers may RDMA-read.
    pub const REMOTE_READ: Access = Access(1 << 1);
    /// Remote peers may RDMA-write.
    pub const REMOTE_WRITE: Access = Access(1 << 2);
    /// Remote peers may run atomics.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Every right.
    pub const ALL: Access = Access(0b1111);

    /// The raw bits (the same values as DOCA's access flags).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Access from raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & Self::ALL.0)
    }

    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let mut first = true;
        for (flag, name) in names {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("LOCAL_READ")?;
        }
        Ok(())
    }
}

/// One registration: an owned, page-aligned, zero-initialised allocation.
///
/// Its bytes are only ever touched through raw pointers: by the owner of the
/// [`RegisteredBuf`] that holds it, or by a transport while it owns the buffer for an operation
/// or holds a window guard over it. That ownership discipline is what makes concurrent access
/// by local code impossible.
///
/// A peer is the exception: over a transport that cannot revoke a window (DOCA), a peer that
/// was given the region's key can write its bytes at any time until the registration ends.
/// Such a region is **exposed** ([`Region::expose`]); from then on no reference to its bytes
/// is ever formed: they are read and written by [`RegisteredBuf::copy_out`] and
/// [`RegisteredBuf::copy_in`] only (raw copies), the slice accessors refuse it, and users only
/// ever hold exposed memory as a [`SharedBuf`], which has no slice accessors.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    capacity: usize,
    access: Access,
    /// A peer may write these bytes behind our back (see the type's documentation). Only ever
    /// set, never cleared: the region lives no longer than its registrations.
    exposed: AtomicBool,
    /// A transport's registration of this memory (DOCA: its mmap), made on first use and
    /// kept for the region's life, so nothing is registered per request.
    registration: OnceLock<Box<dyn Any + Send + Sync>>,
}

// SAFETY: `Region` is a plain heap allocation of bytes with no thread affinity. Who may touch
// the bytes at a given time is decided by ownership of `RegisteredBuf` (exclusive) and by window
// guards in the transports, never by which thread holds the `Arc<Region>`; bytes a peer may
// write (an exposed region) are only copied through raw pointers, never borrowed.
unsafe impl Send for Region {}
// SAFETY: see `Send`: shared references to `Region` only read `ptr`/`capacity`/`access` and
// the atomic `exposed` flag; the bytes are reached through raw pointers under the discipline
// described above.
unsafe impl Sync for Region {}

impl Region {
    fn layout(capacity: usize) -> Layout {
        // `capacity.max(1)`: a zero-sized allocation is not allowed; the extra byte is never
        // exposed. The size was checked against `MAX_BUFFER` by the caller, so this fits.
        Layout::from_size_align(capacity.max(1), BUFFER_ALIGN).expect("checked buffer size")
    }

    pub(crate) fn new(capacity: usize, access: Access) -> Result<Arc<Region>> {
        if capacity > MAX_BUFFER {
            return Err(Error::LimitExceeded {
                limit: "buffer_size",
                max: MAX_BUFFER as u64,
                actual: capacity as u64,
            });
        }
        let layout = Self::layout(capacity);
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            return Err(Error::LimitExceeded {
                limit: "memory",
                max: 0,
                actual: capacity as u64,
            });
        };
        Ok(Arc::new(Region {
            ptr,
            capacity,
            access,
            exposed: AtomicBool::new(false),
            registration: OnceLock::new(),
        }))
    }

    /// The address of the first byte (what a descriptor advertises).
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Size of the whole allocation (every view of it included).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Marks the region as reachable by a peer that may write it at any time from now on
    /// (a transport gave out a key to it that it cannot revoke). See the type's docs.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn expose(&self) {
        self.exposed.store(true, Ordering::Release);
    }

    /// Whether a peer may write the region's bytes behind our back.
    #[inline]
    pub(crate) fn is_exposed(&self) -> bool {
        self.exposed.load(Ordering::Acquire)
    }

    /// The transport registration of this region, made by `init` on first use.
    ///
    /// A region is registered with at most one transport kind; `init` runs at most once.
    // Only the DOCA transport registers memory so far.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn registration<T: Any + Send + Sync>(
        &self,
        init: impl FnOnce() -> Result<T>,
    ) -> Result<&T> {
        if self.registration.get().is_none() {
            let value = init()?;
            // Another thread may have won the race: its value is kept, ours dropped.
            let _ = self.registration.set(Box::new(value));
        }
        self.registration
            .get()
            .and_then(|r| r.downcast_ref::<T>())
            .ok_or_else(|| {
                Error::InvalidArgument("this buffer is registered with another transport".into())
            })
    }

    /// Raw pointer to byte `offset`.
    ///
    /// # Safety
    /// `offset <= capacity`. The caller must have the right to access the bytes it touches
    /// through the pointer (see the type's documentation).
    pub(crate) unsafe fn ptr_at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.capacity);
        // SAFETY: the caller keeps `offset` within the allocation (or one past its end).
        unsafe { self.ptr.as_ptr().add(offset) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // The registration (a DOCA mmap over these bytes) must go before the bytes do.
        drop(self.registration.take());
        // SAFETY: allocated in `Region::new` with this same layout; dropped exactly once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("capacity", &self.capacity)
            .field("access", &self.access)
            .finish()
    }
}

/// The largest buffer that can be registered (1 GiB).
pub const MAX_BUFFER: usize = 1 << 30;

/// An owned, registered buffer: a fixed capacity and a data length.
///
/// Transports take it by value for an operation and give it back on completion, so nothing
/// else can touch its bytes while a peer or the transport does. A buffer taken from a
/// [`BufferPool`] returns to it when dropped; a lease of a [`MemoryRegion`] (a view of part of
/// the region) returns its range to the region.
pub struct RegisteredBuf {
    region: Arc<Region>,
    /// Offset of the first byte of this buffer in its region (0 but for region leases).
    start: usize,
    capacity: usize,
    len: usize,
    /// A view of frozen bytes (`frozen_view`): live `Bytes` share them, so nothing may write
    /// them; its access carries no write right and its mutable accessors refuse it.
    read_only: bool,
    pool: Option<Arc<dyn Recycle>>,
}

/// Where a pooled buffer, or a leased range, goes when dropped.
trait Recycle: Send + Sync {
    fn give_back(&self, region: Arc<Region>, start: usize, capacity: usize);

    /// The buffer is not coming back (it must never be reused): the pool may make another.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    fn discard(&self) {}
}

impl RegisteredBuf {
    /// Registers a new buffer of `capacity` bytes with the given access rights.
    ///
    /// Prefer [`BufferPool`] on hot paths: registration is expensive on RDMA hardware.
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
    fn whole(region: Arc<Region>, pool: Option<Arc<dyn Recycle>>) -> RegisteredBuf {
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

    /// The data, copied into a new `Vec` with [`copy_out`](Self::copy_out).
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        self.copy_out(0, &mut out);
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

struct PoolInner {
    /// Free buffers: a slab and the offset of the buffer in it.
    free: Mutex<Vec<(Arc<Region>, usize)>>,
    available: Semaphore,
    buf_size: usize,
    count: usize,
    /// The allocations the buffers are views of (one unless the pool is over 1 GiB).
    slabs: Vec<Arc<Region>>,
    /// The metrics gauge of the buffers in use, for a server's pool: set as each buffer is
    /// taken and given back.
    gauge: OnceLock<crate::observe::PoolGauge>,
}

impl PoolInner {
    /// Sets the gauge, if the pool has one, to the buffers taken now.
    fn report(&self) {
        if let Some(gauge) = self.gauge.get() {
            gauge.update(|| {
                self.count
                    .saturating_sub(self.available.available_permits())
            });
        }
    }
}

impl Recycle for PoolInner {
    fn give_back(&self, region: Arc<Region>, start: usize, _: usize) {
        match self.free.lock() {
            Ok(mut free) => free.push((region, start)),
            // A poisoned pool lost a buffer; never panic in Drop.
            Err(_) => return,
        }
        self.available.add_permits(1);
        self.report();
    }
}

/// A fixed set of buffers of one size, registered once when the pool is made.
///
/// The buffers are views of one allocation (several for pools over 1 GiB), so a transport
/// registers the whole pool once. Cheap to clone. [`acquire`](Self::acquire) waits for a free
/// buffer; dropping the buffer returns it.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

impl BufferPool {
    /// Allocates `count` buffers of `buf_size` bytes each.
    pub fn new(buf_size: usize, count: usize, access: Access) -> Result<BufferPool> {
        let per_slab = (MAX_BUFFER / buf_size.max(1)).max(1);
        let mut free = Vec::with_capacity(count);
        let mut slabs = Vec::new();
        let mut left = count;
        while left > 0 {
            let n = left.min(per_slab);
            let bytes = n.checked_mul(buf_size).ok_or(Error::LimitExceeded {
                limit: "buffer_size",
                max: MAX_BUFFER as u64,
                actual: buf_size as u64,
            })?;
            let slab = Region::new(bytes, access)?;
            // Handed out from the front: the buffers used first are the first of the slab.
            free.extend((0..n).rev().map(|i| (slab.clone(), i * buf_size)));
            slabs.push(slab);
            left -= n;
        }
        Ok(BufferPool {
            inner: Arc::new(PoolInner {
                free: Mutex::new(free),
                available: Semaphore::new(count),
                buf_size,
                count,
                slabs,
                gauge: OnceLock::new(),
            }),
        })
    }

    /// Reports the buffers in use as the `pool_buffers_in_use` gauge of `path` (feature
    /// `metrics`), from now on: a server's pools. Once per pool; later calls change nothing.
    pub(crate) fn observe(&self, path: &'static str) {
        let _ = self.inner.gauge.set(crate::observe::PoolGauge::new(path));
        self.inner.report();
    }

    /// The allocations the buffers are views of, for a transport to register up front.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn slabs(&self) -> &[Arc<Region>] {
        &self.inner.slabs
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }

    /// Whether both are clones of one pool.
    pub(crate) fn same_pool(&self, other: &BufferPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Number of buffers in the pool.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Number of buffers free right now.
    pub fn available(&self) -> usize {
        self.inner.available.available_permits()
    }

    /// Waits for a free buffer (data length 0).
    pub async fn acquire(&self) -> RegisteredBuf {
        let permit = self
            .inner
            .available
            .acquire()
            .await
            .expect("pool semaphores are never closed");
        permit.forget();
        self.take_after_permit()
    }

    /// A free buffer if there is one now.
    pub fn try_acquire(&self) -> Option<RegisteredBuf> {
        let permit = self.inner.available.try_acquire().ok()?;
        permit.forget();
        Some(self.take_after_permit())
    }

    fn take_after_permit(&self) -> RegisteredBuf {
        let (region, start) = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("a permit guarantees a free buffer");
        self.inner.report();
        RegisteredBuf {
            region,
            start,
            capacity: self.inner.buf_size,
            len: 0,
            read_only: false,
            pool: Some(self.inner.clone() as Arc<dyn Recycle>),
        }
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("buf_size", &self.inner.buf_size)
            .field("count", &self.inner.count)
            .field("available", &self.available())
            .finish()
    }
}

/// Registered buffers for bytes of unknown size, by power-of-two size class.
///
/// A class grows in slabs: one allocation (so one registration, on its first use) holding
/// several buffers, each slab as large as all the class's earlier ones together, so a class
/// that ends up with `n` buffers was registered about `log2(n)` times. Each class keeps up to
/// `budget / class size` buffers (at least 2), so in steady state nothing is registered.
/// Beyond that, [`acquire`](Self::acquire) registers a one-off buffer (so a caller that keeps
/// many results never waits), which is counted and logged once: a registration per call on
/// RDMA hardware, the sign of a budget set too low; [`try_acquire`](Self::try_acquire) refuses
/// instead. [`reserve`](Self::reserve) makes a class's first slab up front. A class with no
/// free buffer takes a free one of a larger class (up to 16 times its size) before it grows:
/// memory already pinned beats a new registration.
pub(crate) struct StagingPools {
    budget: usize,
    classes: Mutex<Vec<Arc<StagingClass>>>,
    /// Buffers handed out so far (a copy each, for whoever counts copies).
    acquired: std::sync::atomic::AtomicU64,
    /// One-off buffers registered beyond the budget.
    one_offs: std::sync::atomic::AtomicU64,
}

/// A free staging buffer: its slab and its offset in it.
type FreeBuf = (Arc<Region>, usize);

struct StagingClass {
    size: usize,
    /// Most buffers the class makes (budget / size, at least 2).
    max: usize,
    state: Mutex<ClassState>,
}

#[derive(Default)]
struct ClassState {
    /// Buffers made so far (handed out, free, or discarded and not yet replaced).
    created: usize,
    /// Free buffers: a slab and the offset of the buffer in it.
    free: Vec<(Arc<Region>, usize)>,
}

impl StagingClass {
    fn state(&self) -> std::sync::MutexGuard<'_, ClassState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new slab of `count` buffers (within the class's maximum): all but the first go to the
    /// free list, the first is returned.
    fn grow(&self, state: &mut ClassState, count: usize) -> Result<Option<(Arc<Region>, usize)>> {
        let count = count
            .min(self.max - state.created)
            .min(MAX_BUFFER / self.size)
            .max(usize::from(state.created < self.max));
        if count == 0 {
            return Ok(None);
        }
        let slab = Region::new(count * self.size, STAGING_ACCESS)?;
        state.created += count;
        state
            .free
            .extend((1..count).rev().map(|i| (slab.clone(), i * self.size)));
        Ok(Some((slab, 0)))
    }
}

impl Recycle for StagingClass {
    fn give_back(&self, region: Arc<Region>, start: usize, _: usize) {
        self.state().free.push((region, start));
    }

    fn discard(&self) {
        // The buffer's bytes stay in their slab, never handed out again; the class may make
        // another in its place.
        let mut state = self.state();
        state.created = state.created.saturating_sub(1);
    }
}

/// Rights of staging buffers: filled locally, and exposed to the peer of one call (the server
/// pulls a payload from one, or pushes a result into one).
const STAGING_ACCESS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

/// Smallest staging class.
const MIN_STAGING: usize = 4096;

/// How much larger a free staging buffer may be than the class asked for and still serve
/// (instead of the class registering a new slab).
const FALL_UPWARD: usize = 16;

impl StagingPools {
    /// The budget of each size class.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    pub(crate) fn new(budget: usize) -> StagingPools {
        StagingPools {
            budget,
            classes: Mutex::new(Vec::new()),
            acquired: std::sync::atomic::AtomicU64::new(0),
            one_offs: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// One-off buffers registered beyond the budget so far.
    #[allow(dead_code)]
    pub(crate) fn one_offs(&self) -> u64 {
        self.one_offs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Buffers handed out so far.
    #[cfg_attr(not(all(test, feature = "doca")), allow(dead_code))]
    pub(crate) fn acquired(&self) -> u64 {
        self.acquired.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A buffer with capacity of at least `len` bytes and data length 0: a pooled one, or
    /// past the budget a one-off registration (counted, and logged the first time).
    pub(crate) fn acquire(&self, len: usize) -> Result<RegisteredBuf> {
        match self.try_acquire(len)? {
            Some(buf) => Ok(buf),
            None => {
                let size = Self::class_size(len).unwrap_or(len);
                let n = self
                    .one_offs
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n == 0 {
                    tracing::warn!(
                        size,
                        budget = self.budget,
                        "staging buffers in use exceed the staging budget: registering a buffer \
                         per call from now on (costly on RDMA hardware); raise staging_budget"
                    );
                }
                RegisteredBuf::new(size, STAGING_ACCESS)
            }
        }
    }

    /// The class of a request for `len` bytes (`None`: larger than any buffer).
    fn class_size(len: usize) -> Option<usize> {
        len.max(MIN_STAGING)
            .checked_next_power_of_two()
            .filter(|&size| size <= MAX_BUFFER)
    }

    fn class(&self, len: usize) -> Result<Arc<StagingClass>> {
        let Some(size) = Self::class_size(len) else {
            return Err(Error::LimitExceeded {
                limit: "buffer_size",
                max: MAX_BUFFER as u64,
                actual: len as u64,
            });
        };
        let mut classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        Ok(match classes.iter().find(|c| c.size == size) {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(StagingClass {
                    size,
                    max: (self.budget / size).max(2),
                    state: Mutex::new(ClassState::default()),
                });
                classes.push(c.clone());
                c
            }
        })
    }

    /// Makes sure requests of `len` bytes have `count` buffers (within the budget), making a
    /// slab of the missing ones now so that they need no registration later: the new slab,
    /// for the caller to register (`None`: there were enough).
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn reserve(&self, len: usize, count: usize) -> Result<Option<Arc<Region>>> {
        let class = self.class(len)?;
        let mut state = class.state();
        let missing = count.saturating_sub(state.created);
        if missing == 0 {
            return Ok(None);
        }
        let slab = class.grow(&mut state, missing)?;
        Ok(slab.map(|(slab, start)| {
            state.free.push((slab.clone(), start));
            slab
        }))
    }

    /// A free buffer of a class larger than `size` (by at most [`FALL_UPWARD`] times), the
    /// smallest first.
    fn larger_free(&self, size: usize) -> Option<(Arc<StagingClass>, FreeBuf)> {
        let mut larger: Vec<Arc<StagingClass>> = self
            .classes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|c| c.size > size && c.size <= size * FALL_UPWARD)
            .cloned()
            .collect();
        larger.sort_by_key(|c| c.size);
        larger.into_iter().find_map(|c| {
            let free = c.state().free.pop()?;
            Some((c, free))
        })
    }

    /// A pooled buffer with capacity of at least `len` bytes and data length 0, or `None` when
    /// its class already has every buffer the budget allows out.
    pub(crate) fn try_acquire(&self, len: usize) -> Result<Option<RegisteredBuf>> {
        self.acquired
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let class = self.class(len)?;
        let free = class.state().free.pop();
        let (class, found) = match free {
            Some(free) => (class, Some(free)),
            // Memory already pinned beats a new registration: a free buffer of a larger
            // class (up to `FALL_UPWARD` times the size) serves before the class grows.
            None => match self.larger_free(class.size) {
                Some((larger, free)) => (larger, Some(free)),
                None => {
                    let mut state = class.state();
                    let count = state.created.max(1);
                    let grown = class.grow(&mut state, count)?;
                    drop(state);
                    (class, grown)
                }
            },
        };
        Ok(found.map(|(region, start)| RegisteredBuf {
            region,
            start,
            capacity: class.size,
            len: 0,
            read_only: false,
            pool: Some(class.clone() as Arc<dyn Recycle>),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pool_recycles_buffers() {
        let pool = BufferPool::new(4096, 2, Access::LOCAL_WRITE).unwrap();
        let mut a = pool.acquire().await;
        let b = pool.acquire().await;
        assert!(pool.try_acquire().is_none());
        a.fill_from(b"hello").unwrap();
        let addr = a.addr();
        assert!(
            Arc::ptr_eq(a.region(), b.region()),
            "one allocation for the pool"
        );
        drop(a);
        assert_eq!(pool.available(), 1);
        let c = pool.acquire().await;
        assert_eq!(c.addr(), addr, "the same buffer is reused");
        assert_eq!(c.as_slice().len(), 0);
        assert_eq!(pool.slabs().len(), 1);
        assert_eq!(c.len(), 0);
        drop((b, c));
        assert_eq!(pool.available(), 2);
    }

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        let mut buf = RegisteredBuf::new(10_000, Access::ALL).unwrap();
        assert_eq!(buf.region().addr() % BUFFER_ALIGN as u64, 0);
        assert!(buf.as_mut_capacity().iter().all(|b| *b == 0));
        assert!(buf.fill_from(&[1; 10_001]).is_err());
    }

    #[test]
    fn oversized_buffers_are_refused_before_allocating() {
        let err = RegisteredBuf::new(MAX_BUFFER + 1, Access::ALL).unwrap_err();
        assert!(err.to_string().contains("buffer_size"), "{err}");
    }

    #[test]
    fn staging_classes_grow_in_slabs() {
        let staging = StagingPools::new(64 * 4096);
        let bufs: Vec<_> = (0..8).map(|_| staging.acquire(4096).unwrap()).collect();
        let mut slabs: Vec<u64> = bufs.iter().map(|b| b.region().addr()).collect();
        slabs.dedup();
        assert_eq!(slabs.len(), 4, "slabs of 1, 1, 2 and 4 buffers");
        let mut addrs: Vec<u64> = bufs.iter().map(|b| b.addr()).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 8, "no two buffers share bytes");
        drop(bufs);
        let again: Vec<_> = (0..8).map(|_| staging.acquire(4096).unwrap()).collect();
        assert!(
            again.iter().all(|b| slabs.contains(&b.region().addr())),
            "reused, no new slab"
        );
        drop(again);
        let reserved = StagingPools::new(64 * 4096);
        let slab = reserved.reserve(100, 16).unwrap().expect("room");
        assert_eq!(slab.capacity(), 16 * 4096);
        let held: Vec<_> = (0..16).map(|_| reserved.acquire(4096).unwrap()).collect();
        assert!(held.iter().all(|b| Arc::ptr_eq(b.region(), &slab)));
    }

    #[test]
    fn staging_reuses_per_class_and_never_blocks() {
        let staging = StagingPools::new(8192);
        let a = staging.acquire(100).unwrap();
        assert_eq!(a.capacity(), 4096);
        let addr = a.addr();
        drop(a);
        let b = staging.acquire(4000).unwrap();
        assert_eq!(b.addr(), addr, "reused");
        let c = staging.acquire(4096).unwrap();
        assert!(
            staging.try_acquire(4096).unwrap().is_none(),
            "the class is out"
        );
        let d = staging.acquire(4096).unwrap(); // past the class budget: one-off
        assert_eq!(d.capacity(), 4096);
        assert_eq!(staging.one_offs(), 1, "counted");
        drop((b, c, d));
        // Held to the end: a free 8 KiB buffer would serve 4 KiB requests (see
        // `staging_falls_upward_before_it_registers`).
        let big = staging.acquire(5000).unwrap();
        assert_eq!(big.capacity(), 8192);
        // A discarded exposed buffer is not reused, and its class may make another.
        let e = staging.acquire(4096).unwrap();
        let f = staging.acquire(4096).unwrap();
        let gone = e.addr();
        // Kept alive, so that its address cannot come back as a new allocation.
        let _slab = e.region().clone();
        e.region().expose();
        e.discard();
        let g = staging
            .try_acquire(4096)
            .unwrap()
            .expect("room for a new one");
        assert_ne!(g.addr(), gone);
        assert!(
            staging.try_acquire(4096).unwrap().is_none(),
            "f and g are out"
        );
        drop((f, g, big));
    }

    #[test]
    fn staging_falls_upward_before_it_registers() {
        let staging = StagingPools::new(1 << 20);
        let slab = staging.reserve(16 << 10, 4).unwrap().expect("room");
        // The 8 KiB class has nothing: free 16 KiB buffers serve it, no slab is made.
        let small: Vec<_> = (0..4).map(|_| staging.acquire(5000).unwrap()).collect();
        assert!(small.iter().all(|b| Arc::ptr_eq(b.region(), &slab)));
        assert!(small.iter().all(|b| b.capacity() == 16 << 10));
        // Those are out: the 8 KiB class grows now, with buffers of its own size.
        let grown = staging.acquire(5000).unwrap();
        assert!(!Arc::ptr_eq(grown.region(), &slab));
        assert_eq!(grown.capacity(), 8 << 10);
        drop(small);
        // Given back to their own class, and served again.
        let again = staging.acquire(16 << 10).unwrap();
        assert!(Arc::ptr_eq(again.region(), &slab));
        // Never more than FALL_UPWARD times larger.
        let far = StagingPools::new(1 << 20);
        let big = far.reserve(128 << 10, 1).unwrap().expect("room");
        let other = far.acquire(4096).unwrap();
        assert!(
            !Arc::ptr_eq(other.region(), &big),
            "32 times larger: not used"
        );
        drop((grown, again, other));
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
