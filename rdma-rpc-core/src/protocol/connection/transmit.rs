//! What one side sends, in order: frames queued (encoded when queued), sent as the peer's
//! receives allow ([`Credits`]), each carrying the credits this side owes and whether a frame
//! waited for a credit since the last one (`starved`: the peer then grows its receives); a
//! bare credit update when one is due and no frame carries them; and at the end, the last
//! frame (a goaway), if a credit allows it. A graceful end drains: what is queued still goes
//! as the peer's credits come back, and the last frame after it.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::error::Result;
use crate::protocol::codec::{with_credits, Encoder};
use crate::protocol::credits::{Credits, Need};
use crate::protocol::frames::Kind;

/// A frame ready to go to the transport.
#[derive(Debug)]
pub(crate) struct Transmit {
    pub(crate) bytes: Bytes,
    /// The connection's last frame: send it signaled, wait until the peer has it (and so every
    /// frame before it), then close.
    pub(crate) last: bool,
}

#[derive(Debug)]
struct Queued {
    frame: BytesMut,
    need: Need,
}

/// The sending half of one side. See the module docs.
#[derive(Debug)]
pub(crate) struct Transmits {
    pub(super) credits: Credits,
    queue: VecDeque<Queued>,
    encoder: Encoder,
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
    /// The last frame, sent after the queue if a credit allows it.
    last: Option<BytesMut>,
}

impl Transmits {
    pub(super) fn new(credits: Credits) -> Transmits {
        Transmits {
            credits,
            queue: VecDeque::new(),
            encoder: Encoder::default(),
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
        let frame = self.encoder.encode(Some(kind), peer_max_frame)?;
        self.queue.push_back(Queued { frame, need });
        Ok(())
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
        self.last = last.and_then(|kind| self.encoder.encode(Some(&kind), peer_max_frame).ok());
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
    pub(super) fn poll(&mut self, peer_max_frame: usize) -> Option<Transmit> {
        if let Some(head) = self.queue.front() {
            if self.credits.try_take(head.need) {
                let head = self.queue.pop_front().expect("a head was seen");
                return Some(self.send(head.frame, false));
            }
            self.starved = true;
            if self.closing && !self.draining {
                // What cannot go now never will: the connection is ending.
                self.queue.clear();
            }
        }
        if self.closing && self.queue.is_empty() {
            if self.last.is_some() && self.credits.try_take(Need::Priority) {
                let last = self.last.take().expect("a last frame was seen");
                return Some(self.send(last, true));
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
            let bare = self.encoder.encode(None, peer_max_frame).ok()?;
            return Some(self.send(bare, false));
        }
        None
    }

    fn send(&mut self, frame: BytesMut, last: bool) -> Transmit {
        let owed = self.credits.take_owed();
        self.update_due = false;
        Transmit {
            bytes: with_credits(frame, owed, std::mem::take(&mut self.starved)),
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
