//! Memory every connection on a thread shares for the moment it uses it: the block a received
//! frame is copied into and the frame it is decoded into, and the buffer and queue a frame is
//! encoded into until it leaves.
//!
//! Each connection used to keep its own. With one connection or a few that costs nothing,
//! but a server of 1,000 connections, each with a call at a time, finds every connection's
//! own copy where the previous round of 1,000 calls left it: out of the cache. Kept once per
//! thread, the same lines serve every connection's frames, and stay in the cache (eRPC keeps
//! its message buffers in one pool per thread for the same reason).
//!
//! Nothing here is I/O: a connection borrows the thread's scratch for one step and returns it
//! before the step ends ([`with_decode`]), or holds the transmit buffers while frames wait in
//! them and gives them back once its queue is empty ([`take_transmit`], [`give_transmit`]).
//! A connection that finds the scratch already borrowed (a step nested in another's, which
//! the runtime never does) or gone (a thread ending) uses memory of its own, so nothing
//! depends on the scratch being there.

use std::cell::{Cell, RefCell};

use super::super::codec::Decoder;
use super::super::frames::Frame;
use super::transmit::Buffers;

/// What decoding a received frame needs.
#[derive(Debug, Default)]
pub(super) struct Decode {
    pub(super) decoder: Decoder,
    /// The last frame a client decoded (mostly responses): the next one is decoded in its
    /// place, reusing what it holds.
    pub(super) client: Frame,
    /// The same for servers (mostly requests). Two, so that a thread that runs both sides
    /// does not make a request of the response each time, and back.
    pub(super) server: Frame,
}

thread_local! {
    static DECODE: RefCell<Decode> = RefCell::new(Decode::default());
}

/// Runs `f` with the thread's [`Decode`] (or a new one, if it is borrowed or gone).
#[inline]
pub(super) fn with_decode<R>(f: impl FnOnce(&mut Decode) -> R) -> R {
    let mut f = Some(f);
    let shared = DECODE.try_with(|cell| {
        cell.try_borrow_mut().ok().map(|mut decode| {
            let f = f.take().expect("called once");
            f(&mut decode)
        })
    });
    match shared {
        Ok(Some(r)) => r,
        _ => {
            let f = f.take().expect("not called yet");
            f(&mut Decode::default())
        }
    }
}

thread_local! {
    static SPARE: Cell<Option<Box<Buffers>>> = const { Cell::new(None) };
}

/// The thread's transmit buffers, empty, for a connection about to queue a frame (new ones,
/// unallocated, when another connection holds them or the thread is ending).
#[inline]
pub(super) fn take_transmit() -> Box<Buffers> {
    SPARE
        .try_with(Cell::take)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives a connection's transmit buffers, whose frames have all left, back to the thread
/// (dropped if the thread already has some, or is ending).
#[inline]
pub(super) fn give_transmit(mut buffers: Box<Buffers>) {
    buffers.reset();
    let _ = SPARE.try_with(|spare| {
        if let Some(other) = spare.replace(Some(buffers)) {
            spare.set(Some(other));
        }
    });
}

/// The capacity of the thread's spare frame buffer, if it has one.
#[cfg(test)]
pub(super) fn spare_capacity() -> Option<usize> {
    SPARE.with(|spare| {
        let held = spare.take();
        let capacity = held.as_ref().map(|b| b.capacity());
        spare.set(held);
        capacity
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of a thread's connections decode with the same memory (which is the point), and a
    /// step nested in another's gets memory of its own instead of a panic.
    #[test]
    fn steps_share_the_thread_decode_and_a_nested_one_gets_its_own() {
        let first = with_decode(|d| d as *const Decode);
        let second = with_decode(|d| d as *const Decode);
        assert_eq!(first, second, "one per thread");
        with_decode(|outer| {
            let outer = outer as *const Decode;
            let inner = with_decode(|d| d as *const Decode);
            assert_ne!(
                inner, outer,
                "a nested step must not share the borrowed one"
            );
        });
        let other_thread = std::thread::spawn(|| with_decode(|d| d as *const Decode as usize))
            .join()
            .unwrap();
        assert_ne!(other_thread, first as usize, "each thread has its own");
    }

    /// Transmit buffers lent by one connection are the next one's; a second borrower while
    /// they are out gets new ones, and of two given back the thread keeps one.
    #[test]
    fn transmit_buffers_pass_from_connection_to_connection() {
        let first = take_transmit();
        let address = &*first as *const Buffers;
        give_transmit(first);
        let again = take_transmit();
        assert_eq!(&*again as *const Buffers, address, "the same buffers");
        let other = take_transmit();
        assert_ne!(
            &*other as *const Buffers, address,
            "new ones while they are out"
        );
        give_transmit(again);
        give_transmit(other);
        assert_eq!(
            &*take_transmit() as *const Buffers,
            address,
            "the first kept"
        );
    }
}
