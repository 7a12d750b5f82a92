//! What one side sends, in order: frames queued (encoded when queued), sent as the peer's
//! receives allow ([`Credits`]), each carrying the credits this side owes and whether a frame
//! waited for a credit since the last one (`starved`: the peer then grows its receives); a
//! bare credit update when one is due and no frame carries them; and at the end, the last
//! frame (a goaway), if a credit allows it. A graceful end drains: what is queued still goes
//! as the peer's credits come back, and the last frame after it.

use std::collections::VecDeque;

use crate::error::Result;
use crate::protocol::codec::{encode_frame, encode_hot, put_credits, CREDITS_ROOM};
use crate::protocol::credits::{Credits, Need};
use crate::protocol::frames::Kind;
use crate::protocol::hot::Hot;

/// A frame ready to go to the transport (which copies it).
#[derive(Debug)]
pub(crate) struct Transmit<'a> {
    pub(crate) frame: &'a [u8],
    /// The connection's last frame: send it signaled, wait until the peer has it (and so every
    /// frame before it), then close.
    pub(crate) last: bool,
}

/// A frame waiting in [`Transmits::frames`]: where it starts, and its length without the room
/// for its credits after it.
#[derive(Debug)]
struct Queued {
    start: usize,
    len: usize,
    need: Need,
}

/// Sent frames at the front of the buffer are given back once they are this many bytes and
/// at least half of it (a queue that never empties, short of credits, does not grow forever).
const RECLAIM: usize = 4096;

/// Memory the buffer keeps once nothing waits in it: a burst of large frames does not stay
/// allocated for the connection's life.
const KEEP: usize = 16 * 1024;

/// The sending half of one side. See the module docs.
#[derive(Debug)]
pub(crate) struct Transmits {
    pub(super) credits: Credits,
    /// Frames encoded, each followed by [`CREDITS_ROOM`] bytes for its credits.
    frames: Vec<u8>,
    queue: VecDeque<Queued>,
    /// Receives re-posted here make a credit update due (no frame carried their credits).
    update_due: bool,
    /// A frame waited for a credit since the last frame went: the next one says so.
    starved: bool,
    /// The connection is ending: nothing more is queued.
    closing: bool,
    /// The end drains (a server's last answers, short of credits when it decided to end):
    /// what is queued still goes as the peer's credits come back, then the last frame.
    /// Otherwise what cannot go at once never goes.
    draining: bool,
    /// The last frame (with its room) and its length, sent after the queue if a credit allows
    /// it.
    last: Option<(Vec<u8>, usize)>,
}

impl Transmits {
    pub(super) fn new(credits: Credits) -> Transmits {
        Transmits {
            credits,
            frames: Vec::new(),
            queue: VecDeque::new(),
            update_due: false,
            starved: false,
            closing: false,
            draining: false,
            last: None,
        }
    }

    /// Queues `kind` for a peer whose receives hold `peer_max_frame` bytes. A frame the peer
    /// could not receive is refused here, before anything is spent on it.
    pub(super) fn queue(&mut self, kind: &Kind, need: Need, peer_max_frame: usize) -> Result<()> {
        self.push(need, |frames| {
            encode_frame(Some(kind), peer_max_frame, frames)
        })
    }

    /// [`queue`](Self::queue) for a request or a response, encoded from where it is.
    pub(super) fn queue_hot(&mut self, hot: Hot<'_>, peer_max_frame: usize) -> Result<()> {
        self.push(Need::Ordinary, |frames| {
            encode_hot(hot, peer_max_frame, frames)
        })
    }

    /// Appends the frame `encode` writes (its length without the credits' room).
    #[inline(always)]
    fn push(
        &mut self,
        need: Need,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<usize>,
    ) -> Result<()> {
        self.reclaim();
        let start = self.frames.len();
        let len = encode(&mut self.frames)?;
        self.queue.push_back(Queued { start, len, need });
        Ok(())
    }

    /// Gives back the memory of frames already sent: all of it when none waits (keeping at
    /// most [`KEEP`] bytes allocated), or the sent front once it is large (see [`RECLAIM`]).
    /// No frame handed out is borrowed any more when this runs (`poll` and `queue` take
    /// `&mut self`).
    #[inline(always)]
    fn reclaim(&mut self) {
        match self.queue.front() {
            None => {
                self.frames.clear();
                if self.frames.capacity() > KEEP {
                    self.shrink();
                }
            }
            Some(head) if head.start >= RECLAIM && head.start * 2 >= self.frames.len() => {
                self.compact();
            }
            Some(_) => {}
        }
    }

    #[cold]
    fn shrink(&mut self) {
        self.frames.shrink_to(KEEP);
    }

    /// Drops the sent front of the buffer (the bytes before the first frame waiting).
    #[cold]
    fn compact(&mut self) {
        let sent = self.queue.front().map_or(0, |head| head.start);
        self.frames.drain(..sent);
        for q in &mut self.queue {
            q.start -= sent;
        }
    }

    /// Starts the end: the queue still goes while credits allow (as they come back, when
    /// `drain`), then `last` (if any, once a credit is left for it); nothing else is queued
    /// from now on.
    pub(super) fn close(&mut self, last: Option<Kind>, peer_max_frame: usize, drain: bool) {
        if self.closing {
            return;
        }
        self.closing = true;
        self.draining = drain;
        self.last = last.and_then(|kind| {
            let mut frame = Vec::new();
            let len = encode_frame(Some(&kind), peer_max_frame, &mut frame).ok()?;
            Some((frame, len))
        });
    }

    pub(super) fn is_closing(&self) -> bool {
        self.closing
    }

    /// Whether a draining end still has frames to send (the peer's credits still matter).
    pub(super) fn is_draining(&self) -> bool {
        self.draining && (!self.queue.is_empty() || self.last.is_some())
    }

    /// A receive was re-posted: the peer is owed a credit for it.
    pub(super) fn reposted(&mut self) {
        if self.credits.reposted() {
            self.update_due = true;
        }
    }

    /// The peer said it was starved: what this side owes it (the receive just re-posted, and
    /// those added for it) goes now, with the next frame or in an update of its own.
    pub(super) fn peer_starved(&mut self) {
        self.update_due = true;
    }

    /// The next frame that may go now.
    pub(super) fn poll(&mut self, peer_max_frame: usize) -> Option<Transmit<'_>> {
        self.reclaim();
        if let Some(head) = self.queue.front() {
            if self.credits.try_take(head.need) {
                let head = self.queue.pop_front().expect("a head was seen");
                return Some(self.send(head.start, head.len, false));
            }
            self.starved = true;
            if self.closing && !self.draining {
                // What cannot go now never will: the connection is ending.
                self.queue.clear();
            }
        }
        if self.closing && self.queue.is_empty() {
            if self.last.is_some() && self.credits.try_take(Need::Priority) {
                let (frame, len) = self.last.take().expect("a last frame was seen");
                let start = self.frames.len();
                self.frames.extend_from_slice(&frame);
                return Some(self.send(start, len, true));
            }
            if !self.draining {
                // No credit for the last frame: the end goes without it.
                self.last = None;
            }
            // Nothing follows the last frame (and a last frame waiting for a credit has the
            // same need as an update: neither could go).
            return None;
        }
        // A side short of credits (a draining end too) still returns the peer's: the peer may
        // be waiting for them to send what this side waits for.
        if self.update_due && self.credits.try_take(Need::Priority) {
            // After the frames still queued, if any: given back with them.
            let start = self.frames.len();
            let len = encode_frame(None, peer_max_frame, &mut self.frames).ok()?;
            return Some(self.send(start, len, false));
        }
        None
    }

    /// The frame at `start` (`len` bytes), with the credits owed written after it.
    fn send(&mut self, start: usize, len: usize, last: bool) -> Transmit<'_> {
        let owed = self.credits.take_owed();
        self.update_due = false;
        let end = start + len;
        let starved = std::mem::take(&mut self.starved);
        let written = put_credits(&mut self.frames[end..end + CREDITS_ROOM], owed, starved);
        Transmit {
            frame: &self.frames[start..end + written],
            last,
        }
    }

    /// Frames waiting for a credit.
    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether [`poll`](Self::poll) may have something to give.
    pub(super) fn has_output(&self) -> bool {
        !self.queue.is_empty() || self.update_due || self.last.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::codec::Decoder;
    use crate::protocol::frames::{CallId, Frame};

    fn cancel(id: u64) -> Kind {
        Kind::Cancel(CallId { id })
    }

    /// A side whose peer granted it `n` credits (one of them the reserve).
    fn with_credits(n: u32) -> Transmits {
        let mut credits = Credits::new(4, 4, false);
        credits.handshake(n, 64);
        Transmits::new(credits)
    }

    fn decoded(t: Transmit<'_>) -> Frame {
        Decoder::default().decode(t.frame).unwrap()
    }

    /// Frames go in order, each with the credits owed when it leaves; once none waits, the
    /// next one is written where the first was (the memory is reused, not grown).
    #[test]
    fn frames_go_in_order_and_the_memory_is_reused() {
        let mut tx = with_credits(8);
        tx.queue(&cancel(1), Need::Ordinary, 1024).unwrap();
        tx.queue(&cancel(2), Need::Ordinary, 1024).unwrap();
        tx.credits.reposted();
        let first = decoded(tx.poll(1024).unwrap());
        assert_eq!((first.kind, first.credits), (Some(cancel(1)), 1));
        let second = decoded(tx.poll(1024).unwrap());
        assert_eq!((second.kind, second.credits), (Some(cancel(2)), 0));
        assert!(tx.poll(1024).is_none());
        let used = tx.frames.capacity();
        for id in 3..1000 {
            tx.queue(&cancel(id), Need::Ordinary, 1024).unwrap();
            let frame = decoded(tx.poll(1024).unwrap());
            assert_eq!(frame.kind, Some(cancel(id)));
            tx.credits.returned(1);
        }
        assert_eq!(
            tx.frames.capacity(),
            used,
            "the same memory, frame after frame"
        );
    }

    /// A burst of large frames, once sent, leaves no more than `KEEP` bytes allocated.
    #[test]
    fn a_burst_of_large_frames_does_not_stay_allocated() {
        let mut tx = with_credits(64);
        let large = Kind::Response(crate::protocol::frames::ResponseFrame {
            id: 1,
            inline_payload: Some(bytes::Bytes::from(vec![7u8; 8 * 1024])),
            ..Default::default()
        });
        for _ in 0..20 {
            tx.queue(&large, Need::Ordinary, 1 << 20).unwrap();
        }
        assert!(tx.frames.capacity() >= 20 * 8 * 1024);
        while tx.poll(1 << 20).is_some() {}
        tx.queue(&cancel(2), Need::Ordinary, 1 << 20).unwrap();
        assert!(
            tx.frames.capacity() <= KEEP,
            "{} bytes kept",
            tx.frames.capacity()
        );
    }

    /// A queue that never empties (a frame always waits for a credit) gives back the memory
    /// of what it sent: it stays within a bound, and what waits is intact.
    #[test]
    fn a_queue_that_never_empties_gives_back_what_it_sent() {
        let mut tx = with_credits(2);
        tx.queue(&cancel(0), Need::Ordinary, 1024).unwrap();
        for id in 1..10_000 {
            tx.queue(&cancel(id), Need::Ordinary, 1024).unwrap();
            let frame = decoded(tx.poll(1024).expect("a credit was returned"));
            assert_eq!(frame.kind, Some(cancel(id - 1)));
            assert!(tx.poll(1024).is_none(), "one credit, one frame");
            tx.credits.returned(1);
            assert!(
                tx.frames.len() <= 2 * RECLAIM + 64,
                "{} bytes",
                tx.frames.len()
            );
        }
        assert_eq!(tx.queued(), 1);
    }
}
