//! Warm buffers for the copies of results a peer could still write.
//!
//! Over a transport that cannot revoke a window (`Fencing::Unfenced`, DOCA) a pushed result is
//! copied out of the window before the caller gets it. Copying into fresh allocations is
//! dominated by page faults for large results, so the copies go into plain heap buffers
//! (never registered, never exposed to a peer) that return here when the caller drops its
//! `Bytes`, up to a budget.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

pub(super) struct CopyPool {
    /// Free buffers, and the bytes of capacity they hold.
    free: Mutex<(Vec<Vec<u8>>, usize)>,
    budget: usize,
}

/// A copy the caller holds; its buffer goes back to the pool when the last `Bytes` is dropped.
struct Copy {
    data: Vec<u8>,
    pool: Weak<CopyPool>,
}

impl AsRef<[u8]> for Copy {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.data));
        }
    }
}

impl CopyPool {
    /// Keeps at most `budget` bytes of free buffers.
    pub(super) fn new(budget: usize) -> Arc<CopyPool> {
        Arc::new(CopyPool {
            free: Mutex::new((Vec::new(), 0)),
            budget,
        })
    }

    /// The data of `buf`, which a peer may still write, copied (never borrowed) into a buffer
    /// that no peer can reach.
    pub(super) fn copy_out(self: &Arc<Self>, buf: &crate::memory::RegisteredBuf) -> Bytes {
        let mut data = self.take(buf.len());
        data.clear();
        buf.append_to(&mut data);
        Bytes::from_owner(Copy {
            data,
            pool: Arc::downgrade(self),
        })
    }

    /// A free buffer of at least `len` bytes and not more than twice that, or a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let fit = free
            .0
            .iter()
            .position(|b| b.capacity() >= len && b.capacity() <= len.saturating_mul(2).max(4096));
        match fit {
            Some(at) => {
                let buf = free.0.swap_remove(at);
                free.1 -= buf.capacity();
                buf
            }
            None => Vec::with_capacity(len),
        }
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.1 + buf.capacity() <= self.budget {
            free.1 += buf.capacity();
            free.0.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(data: &[u8]) -> crate::memory::RegisteredBuf {
        crate::memory::RegisteredBuf::from_slice(data, crate::memory::Access::LOCAL_WRITE).unwrap()
    }

    #[test]
    fn copies_are_exact_and_their_buffers_come_back() {
        let pool = CopyPool::new(1 << 20);
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let first = pool.copy_out(&registered(&data));
        assert_eq!(&first[..], &data[..]);
        let addr = first.as_ptr();
        drop(first);
        let second = pool.copy_out(&registered(&data[..90_000]));
        assert_eq!(&second[..], &data[..90_000]);
        assert_eq!(second.as_ptr(), addr, "the warm buffer was reused");
        drop(second);
        // Past the budget, buffers are freed instead of kept.
        let big = pool.copy_out(&registered(&vec![1u8; 2 << 20]));
        drop(big);
        assert!(pool.free.lock().unwrap().1 <= 1 << 20);
    }
}
