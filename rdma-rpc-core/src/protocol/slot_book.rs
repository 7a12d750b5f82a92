//! The write slots of one connection as state without I/O: which slots the client may write
//! now (armed, each with its window) and which it used and is owed. `server/slots.rs` drives
//! it: it registers the memory, makes the windows and puts the descriptors into frames.
//!
//! Rules:
//! - every slot starts owed; they are armed in index order;
//! - a request that names a slot uses it, whatever else is wrong with the request: the slot
//!   is owed from then on and its old window is the caller's to revoke;
//! - a slot not armed (never announced, or used already) is refused, and nothing changes;
//! - owed slots are armed again most recently used first, as far as buffers and frame room
//!   go (the driver stops asking when either runs out).

use std::collections::HashMap;

/// Why a request's slot was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlotRefusal {
    /// The slot is not armed: never announced, or already used.
    NotArmed { index: u32 },
    /// The payload is larger than the slot (the slot was used all the same).
    TooSmall { index: u32, len: u64, size: u64 },
}

/// The slots of one connection; `W` is an armed slot's window.
#[derive(Debug)]
pub(crate) struct SlotBook<W> {
    armed: HashMap<u32, W>,
    /// Used slots, armed again from the end.
    owed: Vec<u32>,
}

impl<W> SlotBook<W> {
    /// `count` slots, all owed.
    pub(crate) fn new(count: u32) -> SlotBook<W> {
        SlotBook {
            armed: HashMap::new(),
            owed: (0..count).rev().collect(),
        }
    }

    /// A request names slot `index` for `len` bytes; `size` tells a window's size. Returns
    /// the slot's window, which the caller revokes before the bytes are read.
    pub(crate) fn take(
        &mut self,
        index: u32,
        len: u64,
        size: impl Fn(&W) -> u64,
    ) -> Result<W, (SlotRefusal, Option<W>)> {
        let Some(window) = self.armed.remove(&index) else {
            return Err((SlotRefusal::NotArmed { index }, None));
        };
        self.owed.push(index);
        let slot_size = size(&window);
        if slot_size < len {
            let refusal = SlotRefusal::TooSmall {
                index,
                len,
                size: slot_size,
            };
            return Err((refusal, Some(window)));
        }
        Ok(window)
    }

    /// The slot to arm next, if one is owed.
    pub(crate) fn next_owed(&self) -> Option<u32> {
        self.owed.last().copied()
    }

    /// Slot [`next_owed`](Self::next_owed) is armed with `window`.
    pub(crate) fn armed(&mut self, window: W) -> u32 {
        let index = self
            .owed
            .pop()
            .expect("armed only after next_owed named a slot");
        self.armed.insert(index, window);
        index
    }

    /// Slots armed now and slots owed.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.armed.len(), self.owed.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of `n` bytes, named by the test.
    #[derive(Debug, PartialEq)]
    struct W(&'static str, u64);

    fn size(w: &W) -> u64 {
        w.1
    }

    /// Arms as many owed slots as `windows` offers, like the driver with free buffers.
    fn arm_with(book: &mut SlotBook<W>, windows: Vec<W>) -> Vec<u32> {
        let mut armed = Vec::new();
        for w in windows {
            if book.next_owed().is_none() {
                break;
            }
            armed.push(book.armed(w));
        }
        armed
    }

    #[test]
    fn slots_start_owed_and_are_armed_in_index_order() {
        let mut book = SlotBook::new(3);
        assert_eq!(book.counts(), (0, 3));
        let armed = arm_with(
            &mut book,
            vec![W("a", 64), W("b", 64), W("c", 64), W("d", 64)],
        );
        assert_eq!(armed, [0, 1, 2], "no slot beyond the count");
        assert_eq!(book.counts(), (3, 0));
    }

    #[test]
    fn a_slot_is_used_once_per_arming() {
        let mut book = SlotBook::new(2);
        arm_with(&mut book, vec![W("a", 64), W("b", 64)]);
        assert_eq!(book.take(1, 10, size).unwrap(), W("b", 64));
        assert_eq!(
            book.take(1, 10, size).unwrap_err(),
            (SlotRefusal::NotArmed { index: 1 }, None),
            "used again before it was armed again"
        );
        assert_eq!(
            book.take(7, 10, size).unwrap_err(),
            (SlotRefusal::NotArmed { index: 7 }, None),
            "never announced"
        );
        assert_eq!(book.counts(), (1, 1), "refusals change nothing");
    }

    #[test]
    fn an_oversized_payload_uses_its_slot_all_the_same() {
        let mut book = SlotBook::new(1);
        arm_with(&mut book, vec![W("a", 64)]);
        let (refusal, window) = book.take(0, 65, size).unwrap_err();
        assert_eq!(
            refusal,
            SlotRefusal::TooSmall {
                index: 0,
                len: 65,
                size: 64
            }
        );
        assert_eq!(window, Some(W("a", 64)), "handed back to be revoked");
        assert_eq!(book.counts(), (0, 1), "owed: the client wrote into it");
    }

    /// Every slot used, buffers for only some of them: the rest stay owed and come back as
    /// buffers free up, the most recently used first.
    #[test]
    fn exhausted_slots_come_back_as_buffers_free_up() {
        let mut book = SlotBook::new(4);
        arm_with(&mut book, (0..4).map(|_| W("x", 64)).collect());
        for index in [2, 0, 3, 1] {
            book.take(index, 64, size).unwrap();
        }
        assert_eq!(book.counts(), (0, 4));
        assert_eq!(arm_with(&mut book, vec![W("p", 64), W("q", 64)]), [1, 3]);
        assert_eq!(book.counts(), (2, 2));
        assert!(book.take(0, 1, size).is_err(), "slot 0 is still owed");
        assert_eq!(arm_with(&mut book, vec![W("r", 64)]), [0]);
        assert_eq!(book.take(0, 1, size).unwrap(), W("r", 64));
    }
}
