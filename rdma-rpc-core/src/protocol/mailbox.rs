//! A call's mailbox: the few frames the peer sends about one call after its request (a grant
//! or an ack, a cancel, the response), handed over by the task that reads the connection.
//!
//! One small allocation per call. A channel (`tokio::sync::mpsc`) allocates a block of 32
//! slots on its first message; at one channel per call that block was most of the memory
//! traffic of a small call. The first event waits in the box itself: most calls get one (the
//! response), and a queue would allocate for it.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

/// Events in arrival order: the oldest in `first` when only one waits, the others behind it.
struct Queue<T> {
    first: Option<T>,
    /// Allocates only when a second event arrives before the first was taken.
    rest: VecDeque<T>,
}

impl<T> Queue<T> {
    fn push(&mut self, event: T) {
        if self.first.is_none() && self.rest.is_empty() {
            self.first = Some(event);
        } else {
            self.rest.push_back(event);
        }
    }

    fn pop(&mut self) -> Option<T> {
        self.first.take().or_else(|| self.rest.pop_front())
    }

    fn clear(&mut self) {
        self.first = None;
        self.rest.clear();
    }
}

struct State<T> {
    queue: Queue<T>,
    waker: Option<Waker>,
    /// The sender is gone: after the queue, `recv` returns `None`.
    closed: bool,
    /// The receiver is gone: events are dropped.
    abandoned: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending side, held by whoever routes frames to the call. Dropping it closes the box.
pub(crate) struct Sender<T>(Arc<Shared<T>>);

/// The receiving side, held by the call.
pub(crate) struct Mailbox<T>(Arc<Shared<T>>);

/// A new mailbox and its sender.
pub(crate) fn mailbox<T>() -> (Sender<T>, Mailbox<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: Queue {
                first: None,
                rest: VecDeque::new(),
            },
            waker: None,
            closed: false,
            abandoned: false,
        }),
    });
    (Sender(shared.clone()), Mailbox(shared))
}

impl<T> Sender<T> {
    /// Delivers `event`; dropped if the call no longer listens.
    pub(crate) fn send(&self, event: T) {
        let waker = {
            let mut state = self.0.state();
            if state.abandoned {
                return;
            }
            state.queue.push(event);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.0.state();
            state.closed = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Mailbox<T> {
    /// The next event; `None` once the sender is gone and every event was taken.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| {
            let mut state = self.0.state();
            if let Some(event) = state.queue.pop() {
                return Poll::Ready(Some(event));
            }
            if state.closed {
                return Poll::Ready(None);
            }
            match &mut state.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

impl<T> Drop for Mailbox<T> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.abandoned = true;
        state.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Wake};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn events_arrive_in_order_then_none_after_the_sender_is_gone() {
        let (tx, mut rx) = mailbox();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        {
            let mut first = pin!(rx.recv());
            assert!(first.as_mut().poll(&mut cx).is_pending());
            tx.send(1);
            assert_eq!(count.0.load(Ordering::SeqCst), 1, "a waiting call is woken");
            assert_eq!(first.as_mut().poll(&mut cx), Poll::Ready(Some(1)));
        }
        tx.send(2);
        tx.send(3);
        drop(tx);
        for want in [Some(2), Some(3), None, None] {
            let mut next = pin!(rx.recv());
            assert_eq!(next.as_mut().poll(&mut cx), Poll::Ready(want));
        }
    }

    #[test]
    fn events_taken_between_arrivals_keep_their_order() {
        let (tx, mut rx) = mailbox();
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        let mut take = || {
            let mut next = pin!(rx.recv());
            match next.as_mut().poll(&mut cx) {
                Poll::Ready(event) => event,
                Poll::Pending => panic!("an event was queued"),
            }
        };
        tx.send(1);
        tx.send(2);
        assert_eq!(take(), Some(1));
        tx.send(3);
        assert_eq!(take(), Some(2));
        tx.send(4);
        assert_eq!(take(), Some(3));
        assert_eq!(take(), Some(4));
    }

    #[test]
    fn dropping_the_sender_wakes_a_waiting_call() {
        let (tx, mut rx) = mailbox::<u8>();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut next = pin!(rx.recv());
        assert!(next.as_mut().poll(&mut cx).is_pending());
        drop(tx);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(next.as_mut().poll(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn events_for_a_call_that_stopped_listening_are_dropped() {
        let (tx, rx) = mailbox();
        let event = Arc::new(());
        drop(rx);
        tx.send(event.clone());
        assert_eq!(Arc::strong_count(&event), 1, "nothing kept for nobody");
    }
}
