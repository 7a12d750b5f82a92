//! Calls whose handler waited: where they run after their first poll.
//!
//! A call first runs on its connection's task (`ServerConfig::inline_handlers`); most answer
//! there. One that waits (for a transfer, a buffer, another service) needs polling again when
//! it is woken, from one of two places:
//!
//! - **On a multi-threaded runtime, a task of its own** ([`Waited`]): the runtime spreads one
//!   connection's calls over its threads. The task is detached; its handler's panic is
//!   answered where it happens, so the connection keeps no table of its tasks.
//! - **On a current-thread runtime, the connection's own task** ([`LocalCalls`]): every task
//!   runs on that one thread anyway, so a task per call would buy nothing and costs a spawn
//!   (tokio's task cells are 128-byte aligned: glibc serves them on its slow `memalign` path,
//!   about 1,000 instructions per call). Each waiting call has a slot with a waker of its own;
//!   a wake queues the slot and wakes the connection's task, which polls the queued calls
//!   after reading its frames. This is the thread-per-core layout of NVIDIA's storage
//!   applications and of the storage example: each core's runtime serves its connections and
//!   their calls.
//!
//! Either way a call that finished leaves its memory as the thread's spare for the next call
//! (see [`Spare`]), and a handler's panic ends its call with `INTERNAL`. When the connection
//! loop ends, its calls see the end and the ones still waiting on its task go on, each on a
//! task of its own, to answer how they ended; a connection task dropped before that (its
//! runtime shutting down) drops them with it, as the runtime drops its tasks.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use super::conn::{answer_panic, ConnCtx};
use super::spare::Spare;
use crate::service::EndpointDef;

/// How far a poll of a call got.
pub(super) enum Inline {
    /// Answered: nothing left to run.
    Done,
    /// Waiting for something.
    Waiting,
    /// The handler panicked; the call never answered.
    Panicked,
}

/// Polls a call once, catching its handler's panic.
pub(super) fn poll_call(
    mut call: Pin<&mut (impl Future<Output = ()> + ?Sized)>,
    cx: &mut Context<'_>,
) -> Inline {
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(cx)));
    match polled {
        Ok(Poll::Ready(())) => Inline::Done,
        Ok(Poll::Pending) => Inline::Waiting,
        Err(_) => Inline::Panicked,
    }
}

/// A call that waited, and what answering its panic takes.
pub(super) struct Entry<F> {
    pub(super) call: Pin<Box<F>>,
    pub(super) id: u64,
    pub(super) ep: EndpointDef,
}

impl<F: Future<Output = ()>> Entry<F> {
    /// Polls the call; `Some` of how it ended once it is over (then see [`finish`](Self::finish)).
    fn poll(&mut self, cx: &mut Context<'_>) -> Option<Inline> {
        match poll_call(self.call.as_mut(), cx) {
            Inline::Waiting => None,
            over => Some(over),
        }
    }

    /// The end of a call found over (`Done` or `Panicked`): its memory kept as the thread's
    /// spare, or after a panic freed and `on_panic` told.
    pub(super) fn finish(self, over: Inline, on_panic: impl FnOnce(u64, &EndpointDef)) {
        match over {
            Inline::Panicked => {
                let Entry { call, id, ep } = self;
                // A panic of the drop as well is caught: the connection goes on.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(call)));
                on_panic(id, &ep);
            }
            _ => Spare::keep(self.call),
        }
    }
}

/// A waiting call on a task of its own. See the module docs.
pub(super) struct Waited<F> {
    /// `None` once over.
    entry: Option<Entry<F>>,
    ctx: Arc<ConnCtx>,
}

impl<F> Waited<F> {
    pub(super) fn new(entry: Entry<F>, ctx: Arc<ConnCtx>) -> Waited<F> {
        Waited {
            entry: Some(entry),
            ctx,
        }
    }
}

impl<F: Future<Output = ()>> Future for Waited<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // `Waited` is `Unpin`: the call is pinned in its own box.
        let this = &mut *self;
        let Some(entry) = this.entry.as_mut() else {
            return Poll::Ready(());
        };
        let Some(over) = entry.poll(cx) else {
            return Poll::Pending;
        };
        let entry = this.entry.take().expect("taken once, here");
        entry.finish(over, |id, ep| answer_panic(&this.ctx, id, ep));
        Poll::Ready(())
    }
}

/// The waiting calls of one connection, polled by its own task. See the module docs.
pub(super) struct LocalCalls<F> {
    /// Each slot's call, `None` while the slot is free.
    calls: Vec<Option<Entry<F>>>,
    /// Each slot's waker, made with the slot and kept for the connection's life.
    wakers: Vec<(Arc<SlotWaker>, Waker)>,
    /// Free slots.
    free: Vec<usize>,
    queue: Arc<Queue>,
    /// The slots being polled (swapped with the queue's, so that neither allocates per wake).
    polling: Vec<usize>,
}

impl<F> Drop for LocalCalls<F> {
    fn drop(&mut self) {
        // A waker a call left with a resource outlives the connection's task: it must not
        // keep that task's memory.
        self.queue
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .task = None;
    }
}

/// The slots woken since the connection's task last polled them, and that task's waker.
#[derive(Default)]
struct Queue(Mutex<Queued>);

#[derive(Default)]
struct Queued {
    slots: Vec<usize>,
    task: Option<Waker>,
}

/// The waker of one slot: queues it (once until it is polled) and wakes the connection's task.
/// A wake left over from a call that ended polls the slot's next call once for nothing, which
/// a future allows.
struct SlotWaker {
    slot: usize,
    queued: AtomicBool,
    queue: Arc<Queue>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut queued = self.queue.0.lock().unwrap_or_else(PoisonError::into_inner);
        queued.slots.push(self.slot);
        if let Some(task) = &queued.task {
            task.wake_by_ref();
        }
    }
}

impl<F: Future<Output = ()>> LocalCalls<F> {
    pub(super) fn new() -> LocalCalls<F> {
        LocalCalls {
            calls: Vec::new(),
            wakers: Vec::new(),
            free: Vec::new(),
            queue: Arc::default(),
            polling: Vec::new(),
        }
    }

    /// Takes a call that waited after its first poll (on the connection's task, with that
    /// task's waker): it is polled again with its own waker at the next [`poll`](Self::poll).
    pub(super) fn insert(&mut self, entry: Entry<F>) {
        let slot = self.free.pop().unwrap_or_else(|| {
            let slot = self.calls.len();
            self.calls.push(None);
            let waker = Arc::new(SlotWaker {
                slot,
                queued: AtomicBool::new(false),
                queue: self.queue.clone(),
            });
            self.wakers.push((waker.clone(), Waker::from(waker)));
            slot
        });
        self.calls[slot] = Some(entry);
        // A wake of the slot's last call may still be queued (then the new call is polled
        // twice, which a future allows); the new call is queued either way.
        let (flag, waker) = &self.wakers[slot];
        flag.queued.store(false, Ordering::Release);
        waker.wake_by_ref();
    }

    /// Polls the calls woken since the last time, each once and with its own waker;
    /// `on_panic` answers for a call whose handler panicked. A call woken meanwhile (or
    /// woken by its own poll) waits for the next time: its wake wakes the connection's task,
    /// which `cx` is the waker of. (Polling on until none is queued would never return for a
    /// call that wakes itself as it waits, as a tokio resource does once the task's budget is
    /// spent: the budget is only renewed when the task is polled again.)
    pub(super) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        mut on_panic: impl FnMut(u64, &EndpointDef),
    ) {
        if self.calls.len() == self.free.len() {
            return; // none waits: nothing can be queued but leftovers
        }
        {
            let mut queued = self.queue.0.lock().unwrap_or_else(PoisonError::into_inner);
            match &queued.task {
                Some(task) if task.will_wake(cx.waker()) => {}
                _ => queued.task = Some(cx.waker().clone()),
            }
            std::mem::swap(&mut queued.slots, &mut self.polling);
        }
        for i in 0..self.polling.len() {
            let slot = self.polling[i];
            let (flag, waker) = &self.wakers[slot];
            // Cleared before the poll: a wake during it queues the slot again.
            flag.queued.store(false, Ordering::Release);
            let Some(entry) = self.calls[slot].as_mut() else {
                continue; // a leftover wake of a slot now free
            };
            let Some(over) = entry.poll(&mut Context::from_waker(waker)) else {
                continue;
            };
            let entry = self.calls[slot].take().expect("polled just now");
            self.free.push(slot);
            entry.finish(over, &mut on_panic);
        }
        self.polling.clear();
    }

    /// The calls still waiting, taken out (when the connection's task ends: they go on
    /// elsewhere to their end).
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Entry<F>> + '_ {
        self.free.clear();
        self.calls.iter_mut().filter_map(Option::take)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use tokio::sync::oneshot;

    use super::*;

    fn ep() -> EndpointDef {
        crate::tests::ENDPOINTS[0]
    }

    fn entry<F: Future<Output = ()>>(id: u64, call: F) -> Entry<F> {
        Entry {
            call: Box::pin(call),
            id,
            ep: ep(),
        }
    }

    /// A task's waker that counts its wakes.
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The connection's task, as a waker that counts its wakes.
    fn connection_task() -> (Arc<Counting>, Waker) {
        let task = Arc::new(Counting(AtomicUsize::new(0)));
        (task.clone(), Waker::from(task))
    }

    /// A call that waits on `rx`: it ends when told `false` (or when the sender goes), and
    /// panics when told `true`; it counts its polls.
    fn waiting(
        mut rx: oneshot::Receiver<bool>,
        polls: Arc<AtomicUsize>,
    ) -> impl Future<Output = ()> {
        std::future::poll_fn(move |cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            match Pin::new(&mut rx).poll(cx) {
                Poll::Ready(Ok(true)) => panic!("the handler panics on purpose"),
                Poll::Ready(_) => Poll::Ready(()),
                Poll::Pending => Poll::Pending,
            }
        })
    }

    /// Calls are polled only once woken, each with a waker of its own that wakes the
    /// connection's task; a call that ends frees its slot for the next one, and a panic is
    /// answered with the call's id.
    #[test]
    fn woken_calls_are_polled_with_their_own_waker_and_their_slots_reused() {
        let (task, waker) = connection_task();
        let mut cx = Context::from_waker(&waker);
        let polls = Arc::new(AtomicUsize::new(0));
        let mut calls = LocalCalls::new();
        let (tx1, rx1) = oneshot::channel();
        let (tx2, rx2) = oneshot::channel();
        calls.insert(entry(1, waiting(rx1, polls.clone())));
        calls.insert(entry(2, waiting(rx2, polls.clone())));
        let mut panicked = Vec::new();
        // Inserted calls are polled once with their own wakers.
        calls.poll(&mut cx, |id, _| panicked.push(id));
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        // Nothing woke them: nothing is polled.
        calls.poll(&mut cx, |id, _| panicked.push(id));
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "no wake yet");
        // Call 1 is told to finish: its waker wakes the connection's task once, and only it
        // is polled.
        tx1.send(false).unwrap();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        calls.poll(&mut cx, |id, _| panicked.push(id));
        assert_eq!(polls.load(Ordering::SeqCst), 3);
        assert_eq!(calls.free, [0], "its slot is free");
        // The next call takes that slot, and call 2's panic is answered with its id.
        let (tx3, rx3) = oneshot::channel();
        calls.insert(entry(3, waiting(rx3, polls.clone())));
        assert!(calls.free.is_empty());
        tx2.send(true).unwrap();
        calls.poll(&mut cx, |id, _| panicked.push(id));
        assert_eq!(panicked, [2]);
        assert_eq!(
            polls.load(Ordering::SeqCst),
            5,
            "call 3's first poll and call 2's"
        );
        // What still waits is taken out when the connection ends.
        let left: Vec<u64> = calls.drain().map(|e| e.id).collect();
        assert_eq!(left, [3]);
        drop(tx3);
    }

    /// A call that wakes itself each time it is polled (as a tokio resource does once the
    /// task's budget is spent) is polled once per `poll`, and the connection's task is woken
    /// to come back to it: `poll` returns, so the runtime renews the budget and runs the rest.
    #[test]
    fn a_call_that_wakes_itself_is_polled_once_per_poll() {
        let (task, waker) = connection_task();
        let mut cx = Context::from_waker(&waker);
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        let mut calls = LocalCalls::new();
        calls.insert(entry(
            1,
            std::future::poll_fn(move |cx| {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(n <= 3, "polled {n} times in two polls");
                cx.waker().wake_by_ref();
                Poll::Pending
            }),
        ));
        calls.poll(&mut cx, |_, _| unreachable!("no panic"));
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "the task is woken to come back"
        );
        calls.poll(&mut cx, |_, _| unreachable!("no panic"));
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert_eq!(task.0.load(Ordering::SeqCst), 2);
    }

    /// Calls woken from another thread while the connection's task polls: whenever `poll`
    /// returns with a call left that was woken, the task was woken again after that poll
    /// began, so no wake is lost.
    #[test]
    fn a_wake_from_another_thread_is_never_lost() {
        let (task, waker) = connection_task();
        let mut cx = Context::from_waker(&waker);
        let mut calls = LocalCalls::new();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut senders = Vec::new();
        for id in 0..256 {
            let (tx, rx) = oneshot::channel();
            senders.push(tx);
            calls.insert(entry(id, waiting(rx, polls.clone())));
        }
        calls.poll(&mut cx, |_, _| unreachable!("no panic"));
        let waker_thread = std::thread::spawn(move || {
            for tx in senders {
                tx.send(false).unwrap();
            }
        });
        // Polled as its runtime would (here at once, again and again), until every call is
        // done.
        while calls.free.len() < 256 {
            let finished = waker_thread.is_finished();
            let wakes = task.0.load(Ordering::SeqCst);
            calls.poll(&mut cx, |_, _| unreachable!("no panic"));
            assert!(
                calls.free.len() == 256 || !finished || task.0.load(Ordering::SeqCst) > wakes,
                "calls left waiting with no wake to come"
            );
        }
        waker_thread.join().unwrap();
    }
}
