//! A call's mailbox: the few frames the peer sends about one call after its request (a grant
//! or an ack, a cancel, the response), handed over by the task that reads the connection.
//!
//! One small allocation per call. A channel (`tokio::sync::mpsc`) allocates a block of 32
//! slots on its first message; at one channel per call that block was most of the memory
//! traffic of a small call. The first event waits in the box itself: most calls get one (the
//! response), and a queue would allocate for it.
//!
//! The box also says whether the call ended early, and why ([`Sender::end`]: the peer
//! cancelled it, or its connection ended): a latch any number of tasks can wait on through an
//! [`EndSignal`] (the call itself, and work a handler spawned), apart from the events.

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
    /// Why the call ended early, once it did.
    ended: Option<EndReason>,
    /// Tasks waiting for the end: the first in place, more (rare) in a list.
    end_waker: Option<Waker>,
    more_end_wakers: Vec<Waker>,
}

/// Why a call ended before its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReason {
    /// The peer cancelled it (it gave up, or its deadline passed).
    Cancelled,
    /// Its connection ended.
    ConnectionLost,
    /// Its deadline passed (the connection's timer, `protocol::connection`).
    DeadlinePassed,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// What the call may take, set when it is made (server side).
    limits: CallLimits,
}

/// What a call may take, decided when it is made and shared through its mailbox: the call's
/// task, its handler's context and its remote memory read them from there, so none of them
/// carries a copy.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallLimits {
    /// When the call must be done, if it must.
    pub(crate) deadline: Option<super::deadline::Deadline>,
    /// The most bytes its response message may encode to (0: not a server call).
    pub(crate) max_response_len: usize,
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending side, held by whoever routes frames to the call. Dropping it closes the box.
pub(crate) struct Sender<T>(Arc<Shared<T>>);

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// The receiving side, held by the call.
pub(crate) struct Mailbox<T>(Arc<Shared<T>>);

/// A new mailbox and its sender.
#[cfg(test)]
pub(crate) fn mailbox<T>() -> (Sender<T>, Mailbox<T>) {
    call_mailbox(CallLimits::default())
}

/// A new mailbox for a call with `limits`, and its sender.
pub(crate) fn call_mailbox<T>(limits: CallLimits) -> (Sender<T>, Mailbox<T>) {
    let shared = Arc::new(Shared {
        limits,
        state: Mutex::new(State {
            queue: Queue {
                first: None,
                rest: VecDeque::new(),
            },
            waker: None,
            closed: false,
            abandoned: false,
            ended: None,
            end_waker: None,
            more_end_wakers: Vec::new(),
        }),
    });
    (Sender(shared.clone()), Mailbox(shared))
}

/// Waits for a call's end: see [`Sender::end`]. Cheap to clone (it shares the mailbox).
pub(crate) struct EndSignal<T>(Arc<Shared<T>>);

impl<T> Clone for EndSignal<T> {
    fn clone(&self) -> Self {
        EndSignal(self.0.clone())
    }
}

impl<T> std::fmt::Debug for EndSignal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EndSignal").field(&self.ended()).finish()
    }
}

impl<T> EndSignal<T> {
    /// What the call may take.
    pub(crate) fn limits(&self) -> &CallLimits {
        &self.0.limits
    }

    /// Why the call ended early, if it did.
    pub(crate) fn ended(&self) -> Option<EndReason> {
        self.0.state().ended
    }

    /// Ready once the call ended early, with the reason.
    pub(crate) fn poll_ended(&self, cx: &mut std::task::Context<'_>) -> Poll<EndReason> {
        let mut state = self.0.state();
        if let Some(reason) = state.ended {
            return Poll::Ready(reason);
        }
        let waker = cx.waker();
        let known = state.end_waker.as_ref().is_some_and(|w| w.will_wake(waker))
            || state.more_end_wakers.iter().any(|w| w.will_wake(waker));
        if !known {
            match state.end_waker {
                None => state.end_waker = Some(waker.clone()),
                Some(_) => state.more_end_wakers.push(waker.clone()),
            }
        }
        Poll::Pending
    }

    /// Resolves once the call ended early, with the reason.
    pub(crate) async fn wait(&self) -> EndReason {
        poll_fn(|cx| self.poll_ended(cx)).await
    }
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

impl<T> Sender<T> {
    /// Ends the call early: every task waiting on its [`EndSignal`] wakes. The first reason
    /// stays.
    pub(crate) fn end(&self, reason: EndReason) {
        let wake = {
            let mut state = self.0.state();
            if state.ended.is_some() {
                return;
            }
            state.ended = Some(reason);
            let mut wake: Vec<Waker> = std::mem::take(&mut state.more_end_wakers);
            wake.extend(state.end_waker.take());
            // The receiver's own task may wait on `Mailbox::ended`.
            wake.extend(state.waker.take());
            wake
        };
        wake.into_iter().for_each(Waker::wake);
    }
}

/// Whether `shared` has no other holder: then nobody is left to tell anything, and a drop
/// skips the lock (two atomic read-modify-writes). A count of one cannot be stale: a new
/// holder is only ever cloned from a live one. The drop touches nothing then, so the load
/// needs no ordering (freeing is the `Arc`'s own, synchronized, business).
fn alone<T>(shared: &Arc<Shared<T>>) -> bool {
    Arc::strong_count(shared) == 1
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if alone(&self.0) {
            return;
        }
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
    /// What the call may take.
    pub(crate) fn limits(&self) -> &CallLimits {
        &self.0.limits
    }

    /// Ready once the call ended early, with the reason. For the receiver's own task: it
    /// shares the waker of [`recv`](Self::recv).
    pub(crate) fn poll_ended(&self, cx: &mut std::task::Context<'_>) -> Poll<EndReason> {
        let mut state = self.0.state();
        if let Some(reason) = state.ended {
            return Poll::Ready(reason);
        }
        match &mut state.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// What waits for this call's end (see [`Sender::end`]).
    pub(crate) fn end_signal(&self) -> EndSignal<T> {
        EndSignal(self.0.clone())
    }

    /// The next event; `None` once the sender is gone and every event was taken.
    pub(crate) async fn recv(&self) -> Option<T> {
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
        if alone(&self.0) {
            return;
        }
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
    use std::task::Context;

    use crate::tests::wakes::Wakes;

    #[test]
    fn events_arrive_in_order_then_none_after_the_sender_is_gone() {
        let (tx, rx) = mailbox();
        let (count, waker) = Wakes::new();
        let mut cx = Context::from_waker(&waker);
        {
            let mut first = pin!(rx.recv());
            assert!(first.as_mut().poll(&mut cx).is_pending());
            tx.send(1);
            assert_eq!(count.count(), 1, "a waiting call is woken");
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
        let (tx, rx) = mailbox();
        let (_, waker) = Wakes::new();
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
        let (tx, rx) = mailbox::<u8>();
        let (count, waker) = Wakes::new();
        let mut cx = Context::from_waker(&waker);
        let mut next = pin!(rx.recv());
        assert!(next.as_mut().poll(&mut cx).is_pending());
        drop(tx);
        assert_eq!(count.count(), 1);
        assert_eq!(next.as_mut().poll(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn the_end_wakes_every_waiter_once_and_keeps_its_first_reason() {
        let (tx, rx) = mailbox::<u8>();
        let signal = rx.end_signal();
        let other = signal.clone();
        let ((a, wa), (b, wb)) = (Wakes::new(), Wakes::new());
        assert!(signal
            .poll_ended(&mut Context::from_waker(&wa))
            .is_pending());
        assert!(signal
            .poll_ended(&mut Context::from_waker(&wa))
            .is_pending());
        assert!(other.poll_ended(&mut Context::from_waker(&wb)).is_pending());
        assert_eq!(signal.ended(), None);
        tx.end(EndReason::Cancelled);
        tx.end(EndReason::ConnectionLost);
        assert_eq!(a.count(), 1, "once, though polled twice");
        assert_eq!(b.count(), 1, "every waiting task");
        assert_eq!(
            other.poll_ended(&mut Context::from_waker(&wb)),
            Poll::Ready(EndReason::Cancelled),
            "the first reason stays"
        );
        drop(tx);
        assert_eq!(
            signal.ended(),
            Some(EndReason::Cancelled),
            "and outlives the sender"
        );
        drop(rx);
        assert_eq!(
            signal.ended(),
            Some(EndReason::Cancelled),
            "and the receiver"
        );
    }

    #[test]
    fn a_call_that_answers_is_not_ended() {
        let (tx, rx) = mailbox::<u8>();
        let signal = rx.end_signal();
        drop(tx);
        assert_eq!(signal.ended(), None, "a finished call was not cancelled");
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
