//! [`BufferPool`]: a fixed set of buffers of one size, registered once when the pool is made,
//! that [`acquire`](BufferPool::acquire) hands out and dropping gives back.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Semaphore;

use super::{Access, Recycle, Region, RegisteredBuf, MAX_BUFFER};
use crate::error::{Error, Result};

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
}
