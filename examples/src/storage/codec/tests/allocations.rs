//! Heap allocations per block through [`CpuCodec`], counted on the test's own thread by a
//! global allocator (so tests on other threads do not disturb the count): none once the
//! thread's scratch has grown.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use super::*;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations per thread.
struct Counting;

// SAFETY: every call is passed on to the system allocator unchanged; the count is a
// const-initialised thread local without a destructor, so keeping it allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` and `layout` come from this allocator, which is `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` come from this allocator, which is `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn count() {
    // Fails only while the thread exits; those allocations are not the codec's.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn coding_a_block_allocates_nothing_once_warm() {
    const BLOCK: usize = 64 * 1024;
    let codec = CpuCodec::new(BLOCK).unwrap();
    let blocks = [
        compressible(BLOCK),
        incompressible(BLOCK, 41),
        compressible(BLOCK / 3),
        vec![0u8; BLOCK],
    ];
    let mut halves = [(); 3].map(|()| vec![0u8; codec.half_size()]);
    let mut out = vec![0u8; BLOCK];
    let mut run = |rounds: u64| {
        for index in 0..rounds {
            for block in &blocks {
                let [d1, d2, p] = &mut halves;
                codec.encode_into(index, block, [d1, d2, p]).unwrap();
                let [d1, d2, p] = &halves;
                assert_eq!(codec.decode_into(index, d1, d2, &mut out), Ok(block.len()));
                for (surviving, surviving_is) in [(d1, Half::Data1), (d2, Half::Data2)] {
                    let n = codec.recover_into(index, surviving, surviving_is, p, &mut out);
                    assert_eq!(n, Ok(block.len()));
                }
            }
        }
    };
    run(1);
    let before = allocations();
    drop(std::hint::black_box(Vec::<u8>::with_capacity(1)));
    assert_eq!(allocations(), before + 1, "the counter counts");
    let before = allocations();
    run(5);
    assert_eq!(
        allocations() - before,
        0,
        "heap allocations while coding 20 blocks on a warm thread"
    );
}
