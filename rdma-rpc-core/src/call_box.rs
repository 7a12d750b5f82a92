//! A call's state on the heap, in memory its thread reuses call after call.
//!
//! A unary call's state (its future) is about 1.5 KB. Held inline, it made every future
//! around it as large, and each `.await` of a new call moved all of it into the caller's
//! state, memory the caller last touched a whole call earlier: with 1,000 connections each
//! calling, cold memory on every call. Boxed with the global allocator it was no better: glibc
//! keeps freed blocks of this size in first-in, first-out bins (its per-thread cache stops at
//! 1,032 bytes), so each call's box was the one freed longest ago.
//!
//! [`CallBox`] keeps the state in a block from a small per-thread cache instead: a call that
//! ends (or is dropped) gives its block back, and the next call on that thread takes the block
//! given back last, still in the processor's cache. The state is dropped where it is when the
//! call ends or is dropped, as a `Box`'s would be; only the memory is kept. No allocation per
//! call once the cache holds a block.
//!
//! Measured (callgrind, `mem://`, 64 B sends): `call_raw`'s future is 128 bytes instead of
//! 1,560; taking and giving back a block costs about 160 instructions per call (16,016 ->
//! 16,172 with 8 calls in flight on one connection), which building the call in place
//! (`call_timed`) more than recovered.
//!
//! A small send never takes a block: it goes at once and waits in a future of one cache line
//! (`client::sent`); the block holds the general path's calls.
//!
//! The server's calls that answer inline run in `server::spare::Spare` instead (the memory of
//! the last finished call per thread): there the compiler builds the next call's state in
//! place, where a block of this cache cost one more copy of it.

use std::alloc::Layout;
use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// Blocks are kept in classes of this many bytes, up to [`LARGEST`].
const CLASS: usize = 256;
/// The largest block kept; a larger future is boxed and freed as any other.
const LARGEST: usize = 4096;
/// Blocks kept per class and thread: as many as a thread's calls usually end at once before
/// the next ones start (a batch of responses), with room to spare.
const KEPT: usize = 64;
/// The alignment every kept block has; a future that needs more is boxed as any other.
const ALIGN: usize = 16;

/// Free blocks, by class: `free[i]` holds blocks of `(i + 1) * CLASS` bytes.
struct Cache {
    free: [Vec<NonNull<u8>>; LARGEST / CLASS],
}

impl Drop for Cache {
    fn drop(&mut self) {
        for (i, blocks) in self.free.iter_mut().enumerate() {
            let layout = class_layout(i);
            for block in blocks.drain(..) {
                // SAFETY: every kept block was allocated with its class's layout (`alloc_block`)
                // and is owned by the cache alone once given back.
                unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
            }
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache { free: Default::default() });
}

/// The layout of class `i`'s blocks.
fn class_layout(i: usize) -> Layout {
    Layout::from_size_align((i + 1) * CLASS, ALIGN).expect("class sizes are small multiples of 16")
}

/// The class a future of `layout` is kept in, if it is kept at all.
fn class_of(layout: Layout) -> Option<usize> {
    (layout.size() > 0 && layout.size() <= LARGEST && layout.align() <= ALIGN)
        .then(|| (layout.size() - 1) / CLASS)
}

/// A block for class `i`: the one given back last on this thread, or a new one.
fn alloc_block(i: usize) -> NonNull<u8> {
    let kept = CACHE
        .try_with(|cache| cache.borrow_mut().free[i].pop())
        .ok()
        .flatten();
    kept.unwrap_or_else(|| {
        let layout = class_layout(i);
        // SAFETY: the layout's size is not zero (classes start at `CLASS` bytes).
        let block = unsafe { std::alloc::alloc(layout) };
        NonNull::new(block).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
    })
}

/// Gives a block of class `i` back: kept for the next call, or freed when the class is full
/// (or the thread's cache is gone, while the thread ends).
fn free_block(i: usize, block: NonNull<u8>) {
    let kept = CACHE.try_with(|cache| {
        let mut cache = cache.borrow_mut();
        let blocks = &mut cache.free[i];
        if blocks.len() < KEPT {
            blocks.push(block);
            true
        } else {
            false
        }
    });
    if kept != Ok(true) {
        // SAFETY: the block was allocated with its class's layout (`alloc_block`), and its
        // future was dropped: nothing refers to it.
        unsafe { std::alloc::dealloc(block.as_ptr(), class_layout(i)) };
    }
}

/// A future on the heap, in a block of its thread's cache: see the module's documentation.
/// Polls and drops as `Pin<Box<F>>` does.
pub(crate) struct CallBox<F> {
    /// A live `F`, pinned where it is: never moved until it is dropped in place.
    state: NonNull<F>,
    /// The block's class, or `None` when the future is boxed as any other.
    class: Option<usize>,
    /// `CallBox<F>` owns an `F` (for auto traits and drop check).
    owns: PhantomData<F>,
}

// SAFETY: `CallBox<F>` owns its `F` as `Box<F>` does; moving it to another thread moves that
// ownership, and the block may be given back to any thread's cache (they all allocate from the
// global allocator with the same layouts).
unsafe impl<F: Send> Send for CallBox<F> {}
// SAFETY: `&CallBox<F>` gives no access to the `F` at all.
unsafe impl<F> Sync for CallBox<F> {}

impl<F> Unpin for CallBox<F> {}

impl<F: Future> CallBox<F> {
    /// The future `make` returns, in a block of this thread's cache (or a new box). `make`
    /// runs with the block ready, so the compiler can build the future there rather than build
    /// it elsewhere and copy it in.
    pub(crate) fn new(make: impl FnOnce() -> F) -> Self {
        let layout = Layout::new::<F>();
        let class = class_of(layout);
        let state = match class {
            Some(i) => {
                let block = alloc_block(i).cast::<F>();
                // SAFETY: the block is at least `layout.size()` bytes, aligned to `ALIGN` (no
                // less than `layout.align()`), and unused: nothing else refers to it.
                unsafe { block.as_ptr().write(make()) };
                block
            }
            None => NonNull::from(Box::leak(Box::new(make()))),
        };
        CallBox {
            state,
            class,
            owns: PhantomData,
        }
    }
}

impl<F: Future> Future for CallBox<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `state` is a live `F` that this `CallBox` owns and never moves (it is
        // dropped in place), so pinning it is sound; `&mut self` makes the borrow unique.
        let future = unsafe { Pin::new_unchecked(&mut *self.get_mut().state.as_ptr()) };
        future.poll(cx)
    }
}

impl<F> Drop for CallBox<F> {
    fn drop(&mut self) {
        match self.class {
            Some(i) => {
                // SAFETY: `state` is a live `F` owned by this `CallBox`; it is dropped once,
                // here, where it is, and its block is given back only after.
                unsafe { std::ptr::drop_in_place(self.state.as_ptr()) };
                free_block(i, self.state.cast());
            }
            // SAFETY: `state` came from `Box::leak` in `new` and is reclaimed once, here.
            None => drop(unsafe { Box::from_raw(self.state.as_ptr()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A future of `N` bytes that is ready at once and counts its drops.
    struct Ready<const N: usize> {
        _room: [u8; N],
        drops: Arc<AtomicUsize>,
    }

    impl<const N: usize> Future for Ready<N> {
        type Output = usize;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<usize> {
            Poll::Ready(N)
        }
    }

    impl<const N: usize> Drop for Ready<N> {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn ready<const N: usize>(drops: &Arc<AtomicUsize>) -> Ready<N> {
        Ready {
            _room: [0; N],
            drops: drops.clone(),
        }
    }

    fn run<F: Future>(f: F) -> F::Output {
        let waker = std::task::Waker::noop();
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(waker)) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("the test futures are ready at once"),
        }
    }

    #[test]
    fn the_next_call_takes_the_block_the_last_one_gave_back() {
        let drops = Arc::new(AtomicUsize::new(0));
        let first = CallBox::new(|| ready::<1400>(&drops));
        let block = first.state.as_ptr() as usize;
        assert_eq!(run(first), 1400);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "dropped when its call ended"
        );
        // Another type of the same class takes the same block.
        let second = CallBox::new(|| ready::<1300>(&drops));
        assert_eq!(second.state.as_ptr() as usize, block);
        // One dropped before it ran is dropped there and then, and its block kept too.
        drop(second);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        let third = CallBox::new(|| ready::<1400>(&drops));
        assert_eq!(third.state.as_ptr() as usize, block);
        assert_eq!(run(third), 1400);
        assert_eq!(drops.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn blocks_given_back_together_are_taken_last_first() {
        let drops = Arc::new(AtomicUsize::new(0));
        let a = CallBox::new(|| ready::<600>(&drops));
        let b = CallBox::new(|| ready::<600>(&drops));
        let (pa, pb) = (a.state.as_ptr() as usize, b.state.as_ptr() as usize);
        assert_ne!(pa, pb);
        drop(a);
        drop(b);
        assert_eq!(
            CallBox::new(|| ready::<600>(&drops)).state.as_ptr() as usize,
            pb
        );
    }

    #[test]
    fn futures_too_large_or_empty_are_boxed_as_any_other() {
        let drops = Arc::new(AtomicUsize::new(0));
        let large = CallBox::new(|| ready::<{ LARGEST + 1 }>(&drops));
        assert_eq!(large.class, None);
        assert_eq!(run(large), LARGEST + 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        let empty = CallBox::new(|| std::future::poll_fn(|_| Poll::Ready(7)));
        assert_eq!(empty.class, None);
        assert_eq!(run(empty), 7);
    }

    #[test]
    fn a_full_class_frees_what_it_cannot_keep() {
        let drops = Arc::new(AtomicUsize::new(0));
        let many: Vec<_> = (0..KEPT + 8)
            .map(|_| CallBox::new(|| ready::<3000>(&drops)))
            .collect();
        drop(many);
        assert_eq!(drops.load(Ordering::SeqCst), KEPT + 8);
        let class = class_of(Layout::new::<Ready<3000>>()).unwrap();
        let kept = CACHE.with(|c| c.borrow().free[class].len());
        assert_eq!(kept, KEPT);
    }

    #[test]
    fn a_box_moved_to_another_thread_gives_its_block_back_there() {
        let drops = Arc::new(AtomicUsize::new(0));
        let boxed = CallBox::new(|| ready::<2000>(&drops));
        let class = class_of(Layout::new::<Ready<2000>>()).unwrap();
        let there = std::thread::spawn(move || {
            assert_eq!(run(boxed), 2000);
            CACHE.with(|c| c.borrow().free[class].len())
        })
        .join()
        .unwrap();
        assert_eq!(there, 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
