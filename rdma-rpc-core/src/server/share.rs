//! A connection's share of each path's buffer pool: one connection holds at most
//! `pool_share_percent` of a pool's buffers at once, so a greedy or hostile client that keeps
//! its transfers open until `transfer_timeout` cannot take a path's whole pool from everyone
//! else. Calls over the share wait for one of their own connection's buffers, within the same
//! bound as any wait for a buffer (`buffer_wait`, or the call's deadline).

use std::sync::{Arc, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::routes::Route;

/// The shares of one connection, one per path of the server (by the path's
/// [`Route::path_index`]), each made when a call of the connection first takes a buffer of
/// its path. Found without a lock and without a reference taken per call: only calls that
/// take a buffer look.
pub(super) struct PoolShares {
    percent: u32,
    paths: Box<[OnceLock<Share>]>,
}

impl PoolShares {
    /// The shares of a connection to a server of `paths` paths.
    pub(super) fn new(percent: u32, paths: usize) -> PoolShares {
        PoolShares {
            percent,
            paths: (0..paths).map(|_| OnceLock::new()).collect(),
        }
    }

    /// This connection's share of `route`'s pool (the pool of its path).
    pub(super) fn of(&self, route: &Route) -> &Share {
        let percent = self.percent;
        self.paths[route.path_index].get_or_init(|| {
            let count = route.pool.count();
            Share::new(share_of(count, percent), count)
        })
    }
}

/// Buffers one connection may hold out of a pool of `count`: `percent` of them, rounded up,
/// and at least one.
pub(super) fn share_of(count: usize, percent: u32) -> usize {
    (count * percent as usize)
        .div_ceil(100)
        .clamp(1, count.max(1))
}

/// One connection's share of one pool.
#[derive(Clone)]
pub(super) struct Share {
    permits: Arc<Semaphore>,
    limit: usize,
    pool: usize,
}

impl Share {
    fn new(limit: usize, pool: usize) -> Share {
        Share {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            pool,
        }
    }

    /// Waits for room in the share; the buffer taken with it counts until the permit drops.
    pub(super) async fn enter(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        self.permits
            .clone()
            .acquire_owned()
            .await
            .expect("share semaphores are never closed")
    }

    /// Room in the share now, without waiting.
    pub(super) fn try_enter(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// How many of the pool's buffers one connection may hold.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// Buffers in the pool.
    pub(super) fn pool(&self) -> usize {
        self.pool
    }
}

#[cfg(test)]
mod tests {
    use super::share_of;

    #[test]
    fn a_share_is_a_rounded_up_fraction_and_never_zero() {
        assert_eq!(share_of(16, 50), 8);
        assert_eq!(share_of(3, 50), 2);
        assert_eq!(share_of(1, 1), 1);
        assert_eq!(share_of(256, 100), 256);
        assert_eq!(share_of(10, 25), 3);
    }
}
