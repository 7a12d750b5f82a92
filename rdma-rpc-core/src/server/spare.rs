//! The memory of the last call that ran to completion on this thread, reused by the next call
//! that starts here, on any connection.
//!
//! A call that answers at once (run to completion on its connection's task) costs no allocation
//! for its state, and the memory it writes its state into was written by the call before it, so
//! it is still in the cache. (Memory kept per connection, as before, meant that with 1,000
//! connections calling, each call wrote its state into memory last touched 1,000 calls earlier:
//! about 19 of the 190 cache misses per call in `mem://` measurements.)
//!
//! Only memory is kept: a finished call's state is dropped where it is as soon as the call ends.
//! Keeping the finished future itself until the next call replaced it (as an earlier version
//! did) held its tracing span open until then, and when the thread ended it dropped that future
//! in a thread-local's destructor, where entering the span reached a subscriber's own
//! thread-locals after they were gone: with `tracing_subscriber`'s registry installed, the
//! process aborted ("thread local panicked on drop") as the runtime's threads exited.

use std::alloc::Layout;
use std::cell::Cell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;

/// An allocation of the global allocator with `layout` (never zero-sized), holding no value.
pub(super) struct Spare {
    memory: NonNull<u8>,
    layout: Layout,
}

impl Drop for Spare {
    fn drop(&mut self) {
        // SAFETY: `memory` came from a `Box` of a type with `layout` (`Spare::keep`), which the
        // global allocator allocated with that layout since it is not zero-sized; the value
        // in it was dropped and nothing else refers to it.
        unsafe { std::alloc::dealloc(self.memory.as_ptr(), self.layout) };
    }
}

/// Spare memory with room for an `F`, for [`Room::put`].
pub(super) struct Room<F> {
    spare: Spare,
    of: PhantomData<F>,
}

impl<F: Future> Room<F> {
    /// `future`, boxed in this memory (as `Box::pin` would box it in new memory).
    #[inline(always)]
    pub(super) fn put(self, future: F) -> Pin<Box<F>> {
        let at = self.spare.memory.as_ptr().cast::<F>();
        std::mem::forget(self.spare);
        // SAFETY: `at` is an allocation of the global allocator with `F`'s layout (checked by
        // `Spare::take`) that holds no value and that nothing else owns now: writing an `F`
        // there and owning it as a `Box<F>` is what `Box::new` does.
        unsafe {
            at.write(future);
            Box::into_pin(Box::from_raw(at))
        }
    }
}

thread_local! {
    static SPARE: Cell<Option<Spare>> = const { Cell::new(None) };
}

impl Spare {
    /// This thread's spare memory, if it has the layout of an `F` (a spare of another layout is
    /// freed).
    #[inline(always)]
    pub(super) fn take<F: Future>() -> Option<Room<F>> {
        let spare = SPARE.try_with(Cell::take).ok().flatten()?;
        (spare.layout == Layout::new::<F>()).then_some(Room {
            spare,
            of: PhantomData,
        })
    }

    /// Drops a call's finished future where it is and keeps its memory as this thread's
    /// spare (freed instead while the thread's locals are being torn down).
    pub(super) fn keep<F: Future>(done: Pin<Box<F>>) {
        let layout = Layout::new::<F>();
        if layout.size() == 0 {
            // A zero-sized box has no memory to keep.
            return;
        }
        // SAFETY: the future is not moved out of the box: it is dropped in place below and only
        // its memory is reused.
        let at = Box::into_raw(unsafe { Pin::into_inner_unchecked(done) });
        // SAFETY: `Box::into_raw` never returns null.
        let memory = unsafe { NonNull::new_unchecked(at.cast::<u8>()) };
        let spare = Spare { memory, layout };
        // SAFETY: `at` holds a live `F` that nothing else owns; it is dropped once, here, where
        // it is (as a pinned value must be). Its memory belongs to `spare`, which frees it even
        // if the drop panics.
        unsafe { at.drop_in_place() };
        // A spare already kept (of another layout) is freed by `set`.
        let _ = SPARE.try_with(move |kept| kept.set(Some(spare)));
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::Layout;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use super::Spare;

    /// A call's future that counts its drops.
    struct Counted(Arc<AtomicUsize>, u64);

    impl Future for Counted {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Ready(())
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A finished call's future is dropped as it is kept; the next call of that layout on the
    /// thread runs in its memory, and one of another layout gets a new box.
    #[test]
    fn the_next_call_runs_in_the_last_ones_memory() {
        let drops = Arc::new(AtomicUsize::new(0));
        let first = boxed(Counted(drops.clone(), 1));
        let at = &*first as *const Counted;
        Spare::keep(first);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "dropped when kept");
        let second = boxed(Counted(drops.clone(), 2));
        assert_eq!(&*second as *const Counted, at, "the same allocation");
        assert_eq!(second.1, 2);
        let third = boxed(Counted(drops.clone(), 3));
        assert_ne!(&*third as *const Counted, at, "taken once");
        drop(third);
        Spare::keep(second);
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        assert_eq!(kept(), Some(Layout::new::<Counted>()));
        // Another layout finds no spare: the kept memory is freed.
        let other = boxed(std::future::ready([0u64; 4]));
        assert_eq!(kept(), None);
        Spare::keep(other);
        assert_eq!(kept(), Some(Layout::new::<std::future::Ready<[u64; 4]>>()));
    }

    /// `future` in this thread's spare memory if it fits, else in a new box (as the server runs
    /// a call).
    fn boxed<F: Future>(future: F) -> Pin<Box<F>> {
        match Spare::take::<F>() {
            Some(room) => room.put(future),
            None => Box::pin(future),
        }
    }

    /// The layout of the memory this thread keeps.
    fn kept() -> Option<Layout> {
        super::SPARE.with(|kept| {
            let spare = kept.take();
            let layout = spare.as_ref().map(|s| s.layout);
            kept.set(spare);
            layout
        })
    }

    /// A kept call runs nothing when its thread ends: its span closed when it finished. (The
    /// finished future kept until then entered its span in a thread-local's destructor, after
    /// the subscriber's registry lost its own thread-locals: the process aborted.)
    #[test]
    fn a_thread_with_a_kept_call_ends_quietly_under_a_subscriber() {
        let thread = std::thread::spawn(|| {
            // The spare's thread-local first, so that it is torn down after the registry's.
            drop(boxed(std::future::ready(())));
            let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry());
            let span = tracing::info_span!("call");
            assert!(!span.is_disabled(), "the registry enables every span");
            let mut call = boxed(tracing::Instrument::instrument(async {}, span));
            let polled = call.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_ready());
            Spare::keep(call);
        });
        thread.join().expect("the thread ends without a panic");
    }
}
