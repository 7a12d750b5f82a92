//! Per-thread working space, reused from block to block so that coding a block allocates
//! nothing once a thread has coded one of the largest size.

use std::cell::RefCell;

/// What coding a block needs besides the caller's buffers. Every buffer only grows (to the
/// largest block size the thread has coded); all of it is freed when the thread exits.
#[derive(Default)]
pub(super) struct Scratch {
    /// The LZ4 output when encoding; an LZ4 payload that spans both data shards, made
    /// contiguous, when decoding.
    pub(super) lz4: Vec<u8>,
    /// The data shard a recovery read rebuilds from the other one and the parity.
    pub(super) rebuilt: Vec<u8>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            lz4: Vec::new(),
            rebuilt: Vec::new(),
        }
    }

    /// The first `len` bytes of `buf`, which grows (zeroed) to `len` first if it is shorter.
    pub(super) fn grown(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
        if buf.len() < len {
            buf.resize(len, 0);
        }
        &mut buf[..len]
    }

    /// Runs `f` with this thread's scratch. Should `f` ever run while the thread's scratch is
    /// in use (a codec called from inside a codec) or while the thread is exiting, it gets a
    /// fresh one, which allocates.
    pub(super) fn with<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
        thread_local! {
            static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
        }
        let mut f = Some(f);
        let ran = SCRATCH.try_with(|cell| {
            let mut scratch = cell.try_borrow_mut().ok()?;
            f.take().map(|f| f(&mut scratch))
        });
        if let Ok(Some(result)) = ran {
            return result;
        }
        match f {
            Some(f) => f(&mut Scratch::default()),
            None => unreachable!("the scratch closure ran but gave no result"),
        }
    }
}
