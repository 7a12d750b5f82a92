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

use super::scratch;

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
/// allocated for the thread's life.
const KEEP: usize = 16 * 1024;

/// Entries the queue keeps once nothing waits in it.
const KEEP_QUEUED: usize = 64;

/// Where frames wait to leave: their bytes, and where each starts.
#[derive(Debug, Default)]
pub(super) struct Buffers {
    /// Frames encoded, each followed by [`CREDITS_ROOM`] bytes for its credits.
    frames: Vec<u8>,
    /// The frames in `frames`, in order.
    queue: VecDeque<Queued>,
}

impl Buffers {
    /// Empties them (no frame waits: only the sent ones' bytes remain) for the next
    /// connection, trimmed to [`KEEP`] and [`KEEP_QUEUED`].
    #[inline(always)]
    pub(super) fn reset(&mut self) {
        debug_assert!(self.queue.is_empty(), "lent with frames waiting");
        self.frames.clear();
        if self.frames.capacity() > KEEP || self.queue.capacity() > KEEP_QUEUED {
            self.trim();
        }
    }

    #[cold]
    fn trim(&mut self) {
        self.frames.shrink_to(KEEP);
        self.queue.shrink_to(KEEP_QUEUED);
    }

    /// Bytes allocated for frames.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.frames.capacity()
    }
}

/// The sending half of one side. See the module docs.
///
/// `repr(C)`, the start of a connection's hot state (see `Core`): the credits and flags every
/// frame reads, and the last frame, boxed (it exists only once the connection ends).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Transmits {
    pub(super) credits: Credits,
    /// Where frames wait: the thread's, borrowed while frames wait in them and given back
    /// once they have all gone ([`super::scratch`]), `None` in between.
    bufs: Option<Box<Buffers>>,
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
    last: Option<Box<(Vec<u8>, usize)>>,
}

impl Transmits {
    pub(super) fn new(credits: Credits) -> Transmits {
        Transmits {
            credits,
            bufs: None,
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
        let bufs = self.bufs();
        bufs.reclaim();
        let start = bufs.frames.len();
        let len = encode(&mut bufs.frames)?;
        bufs.queue.push_back(Queued { start, len, need });
        Ok(())
    }

    /// The buffers, the thread's taken if this side holds none.
    #[inline(always)]
    fn bufs(&mut self) -> &mut Buffers {
        self.bufs.get_or_insert_with(scratch::take_transmit)
    }

    /// Gives the buffers back to the thread once no frame waits in them (the last one handed
    /// out has been sent: `poll` takes `&mut self`).
    #[inline(always)]
    fn lend(&mut self) {
        if self.bufs.as_ref().is_some_and(|b| b.queue.is_empty()) {
            if let Some(bufs) = self.bufs.take() {
                scratch::give_transmit(bufs);
            }
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
            Some(Box::new((frame, len)))
        });
    }

    pub(super) fn is_closing(&self) -> bool {
        self.closing
    }

    /// Whether a draining end still has frames to send (the peer's credits still matter).
    pub(super) fn is_draining(&self) -> bool {
        self.draining && (self.queued() > 0 || self.last.is_some())
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
        if let Some(bufs) = &mut self.bufs {
            bufs.reclaim();
            if let Some(head) = bufs.queue.front() {
                if self.credits.try_take(head.need) {
                    let head = bufs.queue.pop_front().expect("a head was seen");
                    return Some(self.send(head.start, head.len, false));
                }
                self.starved = true;
                if self.closing && !self.draining {
                    // What cannot go now never will: the connection is ending.
                    bufs.queue.clear();
                }
            }
        }
        if self.closing && self.queued() == 0 {
            if self.last.is_some() && self.credits.try_take(Need::Priority) {
                let (frame, len) = *self.last.take().expect("a last frame was seen");
                let bufs = self.bufs();
                let start = bufs.frames.len();
                bufs.frames.extend_from_slice(&frame);
                return Some(self.send(start, len, true));
            }
            if !self.draining {
                // No credit for the last frame: the end goes without it.
                self.last = None;
            }
            // Nothing follows the last frame (and a last frame waiting for a credit has the
            // same need as an update: neither could go).
            self.lend();
            return None;
        }
        // A side short of credits (a draining end too) still returns the peer's: the peer may
        // be waiting for them to send what this side waits for.
        if self.update_due && self.credits.try_take(Need::Priority) {
            // After the frames still queued, if any: given back with them.
            let frames = &mut self.bufs().frames;
            let start = frames.len();
            let len = encode_frame(None, peer_max_frame, frames).ok()?;
            return Some(self.send(start, len, false));
        }
        self.lend();
        None
    }

    /// The frame at `start` (`len` bytes), with the credits owed written after it.
    fn send(&mut self, start: usize, len: usize, last: bool) -> Transmit<'_> {
        let owed = self.credits.take_owed();
        self.update_due = false;
        let end = start + len;
        let starved = std::mem::take(&mut self.starved);
        let frames = &mut self
            .bufs
            .as_mut()
            .expect("a frame is in the buffers")
            .frames;
        let written = put_credits(&mut frames[end..end + CREDITS_ROOM], owed, starved);
        Transmit {
            frame: &frames[start..end + written],
            last,
        }
    }

    /// Frames waiting for a credit.
    pub(super) fn queued(&self) -> usize {
        self.bufs.as_ref().map_or(0, |b| b.queue.len())
    }

    /// Whether [`poll`](Self::poll) may have something to give.
    pub(super) fn has_output(&self) -> bool {
        self.queued() > 0 || self.update_due || self.last.is_some()
    }
}

impl Buffers {
    /// Gives back the memory of frames already sent: all of it when none waits, or the sent
    /// front once it is large (see [`RECLAIM`]). No frame handed out is borrowed any more
    /// when this runs (`poll` and `queue` take `&mut self`).
    #[inline(always)]
    fn reclaim(&mut self) {
        match self.queue.front() {
            None => self.frames.clear(),
            Some(head) if head.start >= RECLAIM && head.start * 2 >= self.frames.len() => {
                self.compact();
            }
            Some(_) => {}
        }
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

    /// The bytes of the frames waiting, or 0 when this side holds no buffers.
    fn held(tx: &Transmits) -> Option<usize> {
        tx.bufs.as_ref().map(|b| b.frames.len())
    }

    /// Frames go in order, each with the credits owed when it leaves; once none waits, the
    /// buffers go back to the thread, and the next frame is written into the same memory
    /// (reused, not grown), whichever side of the thread queues it.
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
        assert_eq!(held(&tx), None, "given back once none waits");
        let used = scratch::spare_capacity().expect("the thread has them");
        let mut other = with_credits(8);
        for id in 3..1000 {
            let side = if id % 2 == 0 { &mut tx } else { &mut other };
            side.queue(&cancel(id), Need::Ordinary, 1024).unwrap();
            let frame = decoded(side.poll(1024).unwrap());
            assert_eq!(frame.kind, Some(cancel(id)));
            assert!(side.poll(1024).is_none());
            side.credits.returned(1);
        }
        assert_eq!(
            scratch::spare_capacity(),
            Some(used),
            "the same memory, frame after frame"
        );
    }

    /// A side whose frame waits for a credit keeps its buffers; another side of the thread
    /// queues into buffers of its own meanwhile, and the frame that waited is intact.
    #[test]
    fn a_side_whose_frame_waits_keeps_its_buffers() {
        let mut waiting = with_credits(1); // the one credit is the reserve
        waiting.queue(&cancel(1), Need::Ordinary, 1024).unwrap();
        assert!(waiting.poll(1024).is_none(), "no credit for it");
        assert!(held(&waiting).is_some_and(|len| len > 0));
        let mut other = with_credits(8);
        other.queue(&cancel(2), Need::Ordinary, 1024).unwrap();
        let frame = decoded(other.poll(1024).unwrap());
        assert_eq!(frame.kind, Some(cancel(2)));
        waiting.credits.returned(1);
        let frame = decoded(waiting.poll(1024).expect("a credit came back"));
        assert_eq!(frame.kind, Some(cancel(1)));
        assert!(waiting.poll(1024).is_none());
        assert_eq!(held(&waiting), None);
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
        assert!(held(&tx).is_some_and(|len| len >= 20 * 8 * 1024));
        while tx.poll(1 << 20).is_some() {}
        assert_eq!(held(&tx), None);
        let kept = scratch::spare_capacity().expect("given back");
        assert!(kept <= KEEP, "{kept} bytes kept");
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
            let len = held(&tx).expect("frames wait");
            assert!(len <= 2 * RECLAIM + 64, "{len} bytes");
        }
        assert_eq!(tx.queued(), 1);
    }
}
