//! Registered memory: owned, aligned buffers that transports can move bytes into and out of
//! without copies, and pools of them registered once.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Semaphore;

use crate::error::{Error, Result};

mod region;

pub(crate) use region::frozen_view;
pub use region::MemoryRegion;

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
/// impossible.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    capacity: usize,
    access: Access,
    /// A transport's registration of this memory (DOCA: its mmap), made on first use and
    /// kept for the region's life, so nothing is registered per request.
    registration: OnceLock<Box<dyn Any + Send + Sync>>,
}

// SAFETY: `Region` is a plain heap allocation of bytes with no thread affinity. Who may touch
// the bytes at a given time is decided by ownership of `RegisteredBuf` (exclusive) and by window
// guards in the transports, never by which thread holds the `Arc<Region>`.
unsafe impl Send for Region {}
// SAFETY: see `Send`: shared references to `Region` only read `ptr`/`capacity`/`access`; the
// bytes are reached through raw pointers under the ownership discipline described above.
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
    pool: Option<Arc<dyn Recycle>>,
}

/// Where a pooled buffer, or a leased range, goes when dropped.
trait Recycle: Send + Sync {
    fn give_back(&self, region: Arc<Region>, start: usize, capacity: usize);
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

    /// A buffer over all of `region`, empty.
    fn whole(region: Arc<Region>, pool: Option<Arc<dyn Recycle>>) -> RegisteredBuf {
        RegisteredBuf {
            capacity: region.capacity,
            region,
            start: 0,
            len: 0,
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

    /// Access rights the buffer was registered with.
    pub fn access(&self) -> Access {
        self.region.access
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

    /// The data.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: we own the buffer exclusively (see `Region`); `len <= capacity`.
        unsafe { std::slice::from_raw_parts(self.ptr_at(0), self.len) }
    }

    /// The data, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: we own the buffer exclusively and hold `&mut self`; `len <= capacity`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr_at(0), self.len) }
    }

    /// The whole capacity, mutable (to fill before [`set_len`](Self::set_len)).
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        // SAFETY: as `as_mut_slice`, over the whole allocation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr_at(0), self.capacity) }
    }

    /// Copies `data` in and sets the length. Fails when it does not fit.
    pub fn fill_from(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > self.capacity() {
            return Err(Error::InvalidArgument(format!(
                "{} bytes do not fit a buffer of {} bytes",
                data.len(),
                self.capacity()
            )));
        }
        self.set_len(data.len());
        self.as_mut_slice().copy_from_slice(data);
        Ok(())
    }

    /// Turns the buffer into [`bytes::Bytes`] without copying; the buffer returns to its pool
    /// when the last `Bytes` referring to it is dropped.
    pub fn freeze(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(FrozenBuf(self))
    }

    /// The registered allocation this buffer is part of (transports register it whole).
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
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

struct FrozenBuf(RegisteredBuf);

impl AsRef<[u8]> for FrozenBuf {
    fn as_ref(&self) -> &[u8] {
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
    free: Mutex<Vec<Arc<Region>>>,
    available: Semaphore,
    buf_size: usize,
    count: usize,
}

impl Recycle for PoolInner {
    fn give_back(&self, region: Arc<Region>, _: usize, _: usize) {
        match self.free.lock() {
            Ok(mut free) => free.push(region),
            // A poisoned pool lost a buffer; never panic in Drop.
            Err(_) => return,
        }
        self.available.add_permits(1);
    }
}

/// A fixed set of buffers of one size, registered once when the pool is made.
///
/// Cheap to clone. [`acquire`](Self::acquire) waits for a free buffer; dropping the buffer
/// returns it.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

impl BufferPool {
    /// Registers `count` buffers of `buf_size` bytes each.
    pub fn new(buf_size: usize, count: usize, access: Access) -> Result<BufferPool> {
        let mut free = Vec::with_capacity(count);
        for _ in 0..count {
            free.push(Region::new(buf_size, access)?);
        }
        Ok(BufferPool {
            inner: Arc::new(PoolInner {
                free: Mutex::new(free),
                available: Semaphore::new(count),
                buf_size,
                count,
            }),
        })
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
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
        let region = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("a permit guarantees a free buffer");
        RegisteredBuf::whole(region, Some(self.inner.clone() as Arc<dyn Recycle>))
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

/// Registered buffers for receiving bytes of unknown size, by power-of-two size class.
///
/// Each class keeps up to `budget / class size` buffers (at least 2) registered for reuse;
/// beyond that a one-off buffer is registered, so a caller that keeps many results never
/// waits.
pub(crate) struct StagingPools {
    budget: usize,
    classes: Mutex<Vec<Arc<StagingClass>>>,
    /// Buffers handed out so far (a copy each, for whoever counts copies).
    acquired: std::sync::atomic::AtomicU64,
}

struct StagingClass {
    size: usize,
    max: usize,
    created: Mutex<usize>,
    free: Mutex<Vec<Arc<Region>>>,
}

impl Recycle for StagingClass {
    fn give_back(&self, region: Arc<Region>, _: usize, _: usize) {
        if let Ok(mut free) = self.free.lock() {
            free.push(region);
        }
    }
}

/// Rights of staging buffers: filled locally, and exposed to the peer of one call (the server
/// pulls a payload from one, or pushes a result into one).
const STAGING_ACCESS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

/// Smallest staging class.
const MIN_STAGING: usize = 4096;

impl StagingPools {
    pub(crate) fn new(budget: usize) -> StagingPools {
        StagingPools {
            budget,
            classes: Mutex::new(Vec::new()),
            acquired: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Buffers handed out so far.
    #[cfg_attr(not(all(test, feature = "doca")), allow(dead_code))]
    pub(crate) fn acquired(&self) -> u64 {
        self.acquired.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A buffer with capacity of at least `len` bytes and data length 0.
    pub(crate) fn acquire(&self, len: usize) -> Result<RegisteredBuf> {
        self.acquired
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let size = len
            .max(MIN_STAGING)
            .checked_next_power_of_two()
            .unwrap_or(len);
        if size > MAX_BUFFER {
            return RegisteredBuf::new(len, STAGING_ACCESS);
        }
        let class = {
            let mut classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
            match classes.iter().find(|c| c.size == size) {
                Some(c) => c.clone(),
                None => {
                    let c = Arc::new(StagingClass {
                        size,
                        max: (self.budget / size).max(2),
                        created: Mutex::new(0),
                        free: Mutex::new(Vec::new()),
                    });
                    classes.push(c.clone());
                    c
                }
            }
        };
        let reused = class.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let region = match reused {
            Some(region) => region,
            None => {
                let mut created = class.created.lock().unwrap_or_else(|e| e.into_inner());
                if *created >= class.max {
                    return RegisteredBuf::new(size, STAGING_ACCESS);
                }
                *created += 1;
                Region::new(size, STAGING_ACCESS)?
            }
        };
        Ok(RegisteredBuf::whole(
            region,
            Some(class as Arc<dyn Recycle>),
        ))
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
        let addr = a.region().addr();
        drop(a);
        assert_eq!(pool.available(), 1);
        let c = pool.acquire().await;
        assert_eq!(c.region().addr(), addr, "the same registration is reused");
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
    fn staging_reuses_per_class_and_never_blocks() {
        let staging = StagingPools::new(8192);
        let a = staging.acquire(100).unwrap();
        assert_eq!(a.capacity(), 4096);
        let addr = a.region().addr();
        drop(a);
        let b = staging.acquire(4000).unwrap();
        assert_eq!(b.region().addr(), addr, "reused");
        let c = staging.acquire(4096).unwrap();
        let d = staging.acquire(4096).unwrap(); // past the class budget: one-off
        assert_eq!(d.capacity(), 4096);
        drop((b, c, d));
        assert_eq!(staging.acquire(5000).unwrap().capacity(), 8192);
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
