//! A waker for tests: it counts its wakes, and a test can await the next one (a wake that
//! comes before the wait is kept, not lost).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

pub(crate) struct Wakes {
    count: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Wakes {
    /// The counter and a waker that counts into it.
    pub(crate) fn new() -> (Arc<Wakes>, Waker) {
        let wakes = Arc::new(Wakes {
            count: AtomicUsize::new(0),
            notify: tokio::sync::Notify::new(),
        });
        (wakes.clone(), Waker::from(wakes))
    }

    /// Wakes so far.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Resolves at the next wake (or at once for one not yet awaited).
    pub(crate) async fn next(&self) {
        self.notify.notified().await;
    }
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_one();
    }
}
