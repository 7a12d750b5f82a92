//! One registration: [`Region`], an owned, page-aligned, zero-initialised allocation that a
//! transport registers whole, and the rule of who may touch its bytes (and how, once a peer
//! may write them).

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::{Access, BUFFER_ALIGN, MAX_BUFFER};
use crate::error::{Error, Result};

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
///
/// [`RegisteredBuf`]: super::RegisteredBuf
/// [`RegisteredBuf::copy_in`]: super::RegisteredBuf::copy_in
/// [`RegisteredBuf::copy_out`]: super::RegisteredBuf::copy_out
/// [`SharedBuf`]: super::SharedBuf
pub(crate) struct Region {
    ptr: NonNull<u8>,
    pub(super) capacity: usize,
    pub(super) access: Access,
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

/// Regions of at least this many bytes are mapped from the kernel (anonymous private pages,
/// made zeroed when the region is) rather than allocated and cleared: with page alignment,
/// `alloc_zeroed` writes every byte after the allocator hands them out, so making a pool
/// faulted in each of its pages one at a time and cleared them twice. Smaller regions
/// (receives, a call's buffer) stay on the heap, cheaper than a map and an unmap for them.
#[cfg(unix)]
const MAP_AT: usize = 1 << 20;

/// A mapped region's pages are made when the region is (Linux: `MAP_POPULATE`), as its
/// registration makes them on hardware: memory is paid for where a pool is made, never on a
/// call's path as page faults. Left to fault in on first touch instead, they cost a
/// `storage-demo` run over `mem://` 15 to 20% of its write throughput, measured side by side.
#[cfg(any(target_os = "linux", target_os = "android"))]
const POPULATE: libc::c_int = libc::MAP_POPULATE;
#[cfg(all(unix, not(any(target_os = "linux", target_os = "android"))))]
const POPULATE: libc::c_int = 0;

/// Whether a region of `capacity` bytes is mapped (see [`MAP_AT`]) or on the heap (always,
/// off Unix).
#[cfg(unix)]
fn mapped(capacity: usize) -> bool {
    capacity >= MAP_AT
}

/// `capacity` zeroed bytes, page-aligned: mapped or on the heap, as `mapped` says; `None`
/// when there is no memory for them.
fn allocate(capacity: usize) -> Option<NonNull<u8>> {
    #[cfg(unix)]
    if mapped(capacity) {
        // SAFETY: a new anonymous private mapping (no address hint, no file): it aliases no
        // memory of the process, and its pages read as zero.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | POPULATE,
                -1,
                0,
            )
        };
        return (raw != libc::MAP_FAILED)
            .then(|| NonNull::new(raw.cast::<u8>()))
            .flatten();
    }
    // SAFETY: the layout has a non-zero size.
    NonNull::new(unsafe { alloc::alloc_zeroed(Region::layout(capacity)) })
}

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
        let Some(ptr) = allocate(capacity) else {
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
        #[cfg(unix)]
        if mapped(self.capacity) {
            // SAFETY: mapped by `allocate` with this length; unmapped exactly once, after the
            // registration over it ended, and no `RegisteredBuf` (which holds the `Arc`) is
            // left to reach it.
            if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.capacity) } != 0 {
                // Never panic in drop: the pages stay mapped (leaked).
                tracing::error!(
                    capacity = self.capacity,
                    error = %std::io::Error::last_os_error(),
                    "munmap of a memory region failed; its pages are leaked"
                );
            }
            return;
        }
        // SAFETY: allocated by `allocate` on the heap with this same layout; dropped exactly
        // once.
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
