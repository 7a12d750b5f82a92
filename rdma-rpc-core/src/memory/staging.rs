//! [`StagingPools`]: registered buffers for bytes of unknown size, by power-of-two size class,
//! grown in slabs within a budget, for the copies the runtime makes (payloads pulled, results
//! pushed).

use std::sync::{Arc, Mutex};

use super::{Access, Recycle, Region, RegisteredBuf, MAX_BUFFER};
use crate::error::{Error, Result};

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
}
