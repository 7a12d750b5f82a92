//! The streams of one call, without I/O: the flow control of message streams and the chunk
//! bookkeeping of bulk streams, on the side that sends and on the side that receives. The
//! runtime (`crate::stream`) keeps one of these per stream, fed by the task that reads the
//! connection and by the application that produces or consumes the stream.
//!
//! **Message streams** (many typed messages in one call, either way). Messages travel in
//! `Messages` frames, as many per frame as fit. Each side announces in its handshake how many
//! bytes of messages it buffers per stream (its window); a sender never has more than that
//! many bytes of a stream sent and not yet credited back, and a receiver credits bytes back
//! (`Credit` frames) once its application has taken half a window of them. A message costs
//! its length plus [`MESSAGE_COST`]: a flood of empty messages is bounded too.
//!
//! **Bulk streams** (a payload of any size through the endpoint's buffers). As for single
//! calls, the server never exposes its own memory: the client offers windows of its memory
//! (`Chunks.offers`, the first ones in the request), each with a number, and the server does
//! every RDMA operation. For a write stream the windows hold the client's bytes, in stream
//! order, and the server reads them piece by piece, a pool buffer at a time, as its handler
//! takes the chunks; for a read stream they are empty, and the server writes one chunk its
//! handler made into each. Either way the server tells the client which windows it is done
//! with (`Chunks.used`, for a read with the chunk's length and place in the stream), and the
//! client offers more as its memory frees: how many windows it offers at once bounds what is
//! in flight, and the server's pool bounds what it holds. Chunks come in stream order, a
//! window serves once, and nothing goes past the stream's length (declared in the request for
//! a write, the endpoint's `max_len` for a read). Whatever breaks these rules is a
//! [`Violation`]: the peer's connection ends with it.

use std::collections::VecDeque;

/// What a message costs in a stream's window besides its bytes (the room a receiver keeps
/// for it: its place in a queue, its handle).
pub(crate) const MESSAGE_COST: u64 = 16;

/// The window cost of a message of `len` bytes.
pub(crate) fn message_cost(len: usize) -> u64 {
    len as u64 + MESSAGE_COST
}

/// What one message adds to a `Messages` frame: its field's key, its length, its bytes.
pub(crate) fn message_wire_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// Room in a frame that a `Messages` frame keeps for what is not a message (the frame's own
/// fields, the call id, the end flag, credits).
pub(crate) const MESSAGES_FRAME_OVERHEAD: usize = 48;

/// The smallest window a side may announce for a frame size of `max_frame`: two frames'
/// worth, so that a sender blocked on its window always has a credit coming (the receiver
/// credits at half a window, and a message is never larger than a frame).
pub(crate) fn min_window(max_frame: usize) -> u64 {
    2 * (max_frame as u64 + MESSAGE_COST)
}

/// Most windows a bulk receiver may have offered and not yet seen written: bounds what a
/// sender keeps of a peer's offers.
pub(crate) const MAX_OFFERED_WINDOWS: usize = 64;

/// A peer broke a stream's rules. The connection ends with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation(pub(crate) String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn violation(what: impl Into<String>) -> Violation {
    Violation(what.into())
}

/// The sending side of a message stream: bytes it may still send before the receiver credits
/// some back.
#[derive(Debug, Clone)]
pub(crate) struct SendWindow {
    window: u64,
    /// Sent and not yet credited back.
    in_flight: u64,
}

impl SendWindow {
    /// A stream whose receiver announced `window` bytes.
    pub(crate) fn new(window: u64) -> SendWindow {
        SendWindow {
            window,
            in_flight: 0,
        }
    }

    /// Bytes of cost the sender may still send now.
    pub(crate) fn available(&self) -> u64 {
        self.window - self.in_flight
    }

    /// Spends `cost` if the window has it; whether it did.
    pub(crate) fn take(&mut self, cost: u64) -> bool {
        if cost > self.available() {
            return false;
        }
        self.in_flight += cost;
        true
    }

    /// The receiver credited `bytes` back. More than is in flight is a violation.
    pub(crate) fn credit(&mut self, bytes: u64) -> Result<(), Violation> {
        if bytes > self.in_flight {
            return Err(violation(format!(
                "the peer credited {bytes} bytes of a stream that has {} in flight",
                self.in_flight
            )));
        }
        self.in_flight -= bytes;
        Ok(())
    }
}

/// The receiving side of a message stream.
#[derive(Debug, Clone)]
pub(crate) struct RecvWindow {
    window: u64,
    /// Received and not yet credited back: what the sender counts as in flight.
    outstanding: u64,
    /// Of `outstanding`, what the application took.
    consumed: u64,
}

impl RecvWindow {
    /// A stream whose receiver announced `window` bytes.
    pub(crate) fn new(window: u64) -> RecvWindow {
        RecvWindow {
            window,
            outstanding: 0,
            consumed: 0,
        }
    }

    /// Messages of `cost` arrived. More than the window holds is a violation.
    pub(crate) fn receive(&mut self, cost: u64) -> Result<(), Violation> {
        if self.outstanding + cost > self.window {
            return Err(violation(format!(
                "the peer sent {} bytes of stream messages into a window of {}",
                self.outstanding + cost,
                self.window
            )));
        }
        self.outstanding += cost;
        Ok(())
    }

    /// The application took messages of `cost`: the credit to send back now, if one is due
    /// (half a window taken).
    pub(crate) fn consume(&mut self, cost: u64) -> Option<u64> {
        self.consumed = (self.consumed + cost).min(self.outstanding);
        (self.consumed >= self.window / 2).then(|| self.flush())
    }

    /// Credits everything taken so far (sent when the receiver wants more at once, or 0).
    fn flush(&mut self) -> u64 {
        let credit = self.consumed;
        self.outstanding -= credit;
        self.consumed = 0;
        credit
    }
}

/// Packs encoded messages into `Messages` frames of at most `room` bytes of messages.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    messages: Vec<bytes::Bytes>,
    wire: usize,
    cost: u64,
}

impl Batch {
    /// Whether a message of `len` bytes and window cost `cost` still fits a frame with `room`
    /// bytes for messages, in a batch that may spend at most `max_cost` of the window (half
    /// the peer's window: a sender blocked on it then always gets credit back).
    pub(crate) fn fits(&self, len: usize, room: usize, cost: u64, max_cost: u64) -> bool {
        self.wire + message_wire_len(len) <= room && self.cost + cost <= max_cost
    }

    pub(crate) fn push(&mut self, message: bytes::Bytes) {
        self.wire += message_wire_len(message.len());
        self.cost += message_cost(message.len());
        self.messages.push(message);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The window cost of the messages in the batch.
    pub(crate) fn cost(&self) -> u64 {
        self.cost
    }

    /// The messages, leaving the batch empty.
    pub(crate) fn take(&mut self) -> Vec<bytes::Bytes> {
        self.wire = 0;
        self.cost = 0;
        std::mem::take(&mut self.messages)
    }
}

/// Which way a bulk stream's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Write endpoints: the client's bytes, read by the server from windows the client offers.
    Write,
    /// Read endpoints: the server's bytes, written by the server into windows the client offers.
    Read,
}

/// One window the client offered: its number, where its bytes sit in the stream (write
/// streams; 0 for read streams) and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) id: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// A piece of a write stream the server reads next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The window it comes from.
    pub(crate) window: Window,
    /// Where in the window it starts.
    pub(crate) at: u64,
    /// Its length.
    pub(crate) len: u64,
    /// The window is read to its end with this piece: the client may have it back.
    pub(crate) window_done: bool,
    /// The stream's last piece.
    pub(crate) last: bool,
}

/// The server's side of a bulk stream: the windows the client offered and not yet used. The
/// server reads a write stream's bytes from them in order, piece by piece, and writes a read
/// stream's chunks into them one window per chunk; either way it tells the client which
/// windows it is done with.
#[derive(Debug, Clone)]
pub(crate) struct Offered {
    direction: Direction,
    windows: VecDeque<Window>,
    /// Write: where the next window offered must start. Read: bytes written so far.
    offset: u64,
    /// Write: where the next piece starts (in the stream).
    read: u64,
    /// Write: the declared length. Read: the endpoint's limit.
    limit: u64,
}

impl Offered {
    /// A stream of `direction` whose length is `limit` (write: declared in the request) or at
    /// most `limit` (read: the endpoint's `max_len`).
    pub(crate) fn new(direction: Direction, limit: u64) -> Offered {
        Offered {
            direction,
            windows: VecDeque::new(),
            offset: 0,
            read: 0,
            limit,
        }
    }

    /// The client offered `window`. Checks it against the stream: a known number again, more
    /// than [`MAX_OFFERED_WINDOWS`] at once, an empty window, and for a write stream a window
    /// that does not continue the last one or goes past the declared length.
    pub(crate) fn offer(&mut self, window: Window) -> Result<(), Violation> {
        let id = window.id;
        if window.len == 0 {
            return Err(violation(format!(
                "the client offered window {id} of 0 bytes"
            )));
        }
        if self.windows.iter().any(|w| w.id == id) {
            return Err(violation(format!(
                "the client offered window {id} again before the server was done with it"
            )));
        }
        if self.windows.len() >= MAX_OFFERED_WINDOWS {
            return Err(violation(format!(
                "the client offered more than {MAX_OFFERED_WINDOWS} windows at once"
            )));
        }
        if self.direction == Direction::Write {
            if window.offset != self.offset {
                return Err(violation(format!(
                    "the client offered stream bytes at {}, the next ones start at {}",
                    window.offset, self.offset
                )));
            }
            if window.len > self.limit - self.offset {
                return Err(violation(format!(
                    "the client offered bytes up to {} of a stream of {}",
                    window.offset + window.len,
                    self.limit
                )));
            }
            self.offset += window.len;
        }
        self.windows.push_back(window);
        Ok(())
    }

    /// Whether a window is offered and unused.
    pub(crate) fn has_window(&self) -> bool {
        !self.windows.is_empty()
    }

    /// Write streams: the next piece to read, of at most `max` bytes (a chunk: one pool
    /// buffer), or `None` while no window holds it.
    pub(crate) fn next_piece(&mut self, max: u64) -> Option<Piece> {
        let window = *self.windows.front()?;
        let at = self.read - window.offset;
        let len = (window.len - at).min(max);
        self.read += len;
        let window_done = at + len == window.len;
        if window_done {
            self.windows.pop_front();
        }
        Some(Piece {
            window,
            at,
            len,
            window_done,
            last: self.read == self.limit,
        })
    }

    /// Write streams: bytes the server has taken so far.
    #[cfg(test)]
    pub(crate) fn taken(&self) -> u64 {
        self.read
    }

    /// Read streams: a window for a chunk of `len` bytes, with the chunk's place in the
    /// stream; `None` while no window is offered. A chunk larger than the window it gets is
    /// an error of the side that made it (the server's handler), not of the client.
    pub(crate) fn window_for(&mut self, len: u64) -> Option<Result<(Window, u64), String>> {
        let window = self.windows.pop_front()?;
        if len > window.len {
            self.windows.push_front(window);
            return Some(Err(format!(
                "a chunk of {len} bytes is larger than the client's window of {}",
                window.len
            )));
        }
        if len > self.limit - self.offset {
            self.windows.push_front(window);
            return Some(Err(format!(
                "the stream would pass its max_len of {} bytes (at {})",
                self.limit,
                self.offset + len
            )));
        }
        let offset = self.offset;
        self.offset += len;
        Some(Ok((window, offset)))
    }

    /// Read streams: bytes written so far.
    #[cfg(test)]
    pub(crate) fn written(&self) -> u64 {
        self.offset
    }
}

/// What the server reported about a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub(crate) window: Window,
    /// Read streams: the chunk's bytes in the window (from its start), and where they sit in
    /// the stream. Write streams: the whole window.
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// The client's side of a bulk stream: the windows it offered and which report it expects.
#[derive(Debug, Clone)]
pub(crate) struct Offering {
    direction: Direction,
    /// Offered and not yet reported, oldest first.
    offered: VecDeque<Window>,
    next_id: u32,
    /// Write: where the next window starts. Read: bytes reported so far.
    offset: u64,
    /// Write: the declared length. Read: the endpoint's limit.
    limit: u64,
}

impl Offering {
    /// A stream of `direction` of `limit` bytes (write) or at most `limit` (read).
    pub(crate) fn new(direction: Direction, limit: u64) -> Offering {
        Offering {
            direction,
            offered: VecDeque::new(),
            next_id: 0,
            offset: 0,
            limit,
        }
    }

    /// Offers a window of `len` bytes (for a write stream, of the stream's next `len` bytes,
    /// which must not pass its length): the window, to describe to the server.
    pub(crate) fn offer(&mut self, len: u64) -> Window {
        let window = Window {
            id: self.next_id,
            offset: match self.direction {
                Direction::Write => self.offset,
                Direction::Read => 0,
            },
            len,
        };
        if self.direction == Direction::Write {
            debug_assert!(len <= self.limit - self.offset);
            self.offset += len;
        }
        self.next_id = self.next_id.wrapping_add(1);
        self.offered.push_back(window);
        window
    }

    /// Write streams: stream bytes not yet offered.
    #[cfg(test)]
    pub(crate) fn unoffered(&self) -> u64 {
        self.limit - self.offset
    }

    /// Windows offered and not yet reported.
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        self.offered.len()
    }

    /// The server reports window `id` done: for a write stream read to its end (`offset` and
    /// `len` name the whole window), for a read stream holding `len` bytes of the stream at
    /// `offset`. Checked against what was offered and, for a read, against the stream's order
    /// and limit.
    pub(crate) fn done(&mut self, id: u32, offset: u64, len: u64) -> Result<Done, Violation> {
        let at = self
            .offered
            .iter()
            .position(|w| w.id == id)
            .ok_or_else(|| {
                violation(format!(
                    "the server reported window {id}, which is not offered"
                ))
            })?;
        let window = self.offered[at];
        match self.direction {
            Direction::Write => {
                if at != 0 || offset != window.offset || len != window.len {
                    return Err(violation(format!(
                        "the server reported {len} bytes at {offset} of window {id}, which                          holds {} at {}{}",
                        window.len,
                        window.offset,
                        if at != 0 { ", before the windows ahead of it" } else { "" }
                    )));
                }
            }
            Direction::Read => {
                if offset != self.offset {
                    return Err(violation(format!(
                        "the server wrote stream bytes at {offset}, the next ones start at {}",
                        self.offset
                    )));
                }
                if len == 0 || len > window.len {
                    return Err(violation(format!(
                        "the server wrote {len} bytes into window {id} of {}",
                        window.len
                    )));
                }
                if len > self.limit - self.offset {
                    return Err(violation(format!(
                        "the server wrote past the stream's limit of {} bytes (to {})",
                        self.limit,
                        offset + len
                    )));
                }
                self.offset += len;
            }
        }
        self.offered.remove(at);
        Ok(Done {
            window,
            offset,
            len,
        })
    }

    /// Read streams: bytes reported so far.
    pub(crate) fn received(&self) -> u64 {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_never_has_more_than_the_window_in_flight() {
        let mut w = SendWindow::new(100);
        assert!(w.take(60));
        assert!(!w.take(41), "over the window");
        assert!(w.take(40));
        assert_eq!(w.available(), 0);
        w.credit(50).unwrap();
        assert_eq!(w.available(), 50);
        assert!(w.credit(51).is_err(), "more credit than in flight");
    }

    #[test]
    fn a_receiver_credits_at_half_a_window_and_refuses_overflow() {
        let mut r = RecvWindow::new(100);
        r.receive(60).unwrap();
        assert_eq!(r.consume(30), None);
        assert_eq!(r.consume(20), Some(50), "half a window taken");
        r.receive(80).unwrap(); // outstanding 10 + 80
        assert!(r.receive(11).is_err(), "the peer overran the window");
        // What the receiver never got cannot be credited.
        assert_eq!(r.consume(1_000), Some(90));
    }

    /// The liveness argument of `min_window`: a sender blocked on the window always gets a
    /// credit once the receiver takes what arrived.
    #[test]
    fn a_blocked_sender_is_always_credited() {
        let max_frame = 1000;
        let window = min_window(max_frame);
        for message in [0usize, 1, 100, 999, max_frame] {
            let mut s = SendWindow::new(window);
            let mut r = RecvWindow::new(window);
            let cost = message_cost(message);
            let mut sent = 0;
            while s.take(cost) {
                r.receive(cost).unwrap();
                sent += 1;
            }
            // Blocked: the receiver takes everything that arrived.
            let mut credited = None;
            for _ in 0..sent {
                if let Some(c) = r.consume(cost) {
                    credited = Some(c);
                }
            }
            let credit = credited.expect("a credit is due");
            s.credit(credit).unwrap();
            assert!(s.take(cost), "message of {message}: the sender goes on");
        }
    }

    #[test]
    fn batches_fit_their_frame() {
        let mut b = Batch::default();
        let room = 100;
        let m = bytes::Bytes::from(vec![7u8; 40]);
        let cost = message_cost(40);
        assert!(b.fits(40, room, cost, 1000));
        b.push(m.clone());
        assert!(b.fits(40, room, cost, 1000), "42 + 42 <= 100");
        assert!(
            !b.fits(40, room, cost, 2 * cost - 1),
            "over the window's half"
        );
        b.push(m.clone());
        assert!(!b.fits(40, room, cost, 1000));
        assert_eq!(b.cost(), 2 * message_cost(40));
        assert_eq!(b.take().len(), 2);
        assert!(b.is_empty());
        assert_eq!(b.cost(), 0);
    }

    fn w(id: u32, offset: u64, len: u64) -> Window {
        Window { id, offset, len }
    }

    #[test]
    fn a_write_stream_is_read_in_pieces_from_contiguous_windows() {
        let mut o = Offered::new(Direction::Write, 20);
        assert_eq!(o.next_piece(8), None, "nothing offered yet");
        assert!(o.offer(w(0, 4, 8)).is_err(), "does not start the stream");
        assert!(o.offer(w(0, 0, 0)).is_err(), "empty");
        o.offer(w(0, 0, 12)).unwrap();
        assert!(o.offer(w(0, 12, 4)).is_err(), "a number still in use");
        assert!(o.offer(w(1, 12, 9)).is_err(), "past the declared length");
        o.offer(w(1, 12, 8)).unwrap();
        let p = o.next_piece(8).unwrap();
        assert_eq!((p.at, p.len, p.window_done, p.last), (0, 8, false, false));
        let p = o.next_piece(8).unwrap();
        assert_eq!((p.window.id, p.at, p.len, p.window_done), (0, 8, 4, true));
        let p = o.next_piece(8).unwrap();
        assert_eq!(
            (p.window.id, p.at, p.len, p.window_done, p.last),
            (1, 0, 8, true, true)
        );
        assert_eq!(o.taken(), 20);
        assert_eq!(o.next_piece(8), None);
    }

    #[test]
    fn a_client_cannot_offer_too_many_windows() {
        let mut o = Offered::new(Direction::Read, u64::MAX);
        for i in 0..MAX_OFFERED_WINDOWS as u32 {
            o.offer(w(i, 0, 8)).unwrap();
        }
        assert!(o.offer(w(999, 0, 8)).is_err());
    }

    #[test]
    fn a_read_stream_gets_one_window_per_chunk_within_its_limit() {
        let mut o = Offered::new(Direction::Read, 10);
        assert!(o.window_for(4).is_none(), "no window yet");
        o.offer(w(0, 0, 8)).unwrap();
        o.offer(w(1, 0, 8)).unwrap();
        assert!(o.window_for(9).unwrap().is_err(), "larger than the window");
        assert_eq!(o.window_for(8).unwrap(), Ok((w(0, 0, 8), 0)));
        assert!(o.window_for(3).unwrap().is_err(), "past max_len");
        assert_eq!(o.window_for(2).unwrap(), Ok((w(1, 0, 8), 8)));
        assert_eq!(o.written(), 10);
    }

    #[test]
    fn the_client_checks_every_report() {
        let mut c = Offering::new(Direction::Write, 10);
        let a = c.offer(6);
        let b = c.offer(4);
        assert_eq!((a.offset, b.offset, c.unoffered()), (0, 6, 0));
        assert!(c.done(b.id, 6, 4).is_err(), "before the window ahead of it");
        assert!(c.done(a.id, 0, 5).is_err(), "not the whole window");
        assert!(c.done(7, 0, 6).is_err(), "never offered");
        c.done(a.id, 0, 6).unwrap();
        c.done(b.id, 6, 4).unwrap();
        assert_eq!(c.outstanding(), 0);

        let mut r = Offering::new(Direction::Read, 10);
        let a = r.offer(8);
        let b = r.offer(8);
        assert!(r.done(a.id, 3, 8).is_err(), "out of order");
        assert!(r.done(a.id, 0, 9).is_err(), "more than the window");
        assert!(r.done(a.id, 0, 0).is_err(), "empty");
        r.done(a.id, 0, 8).unwrap();
        assert!(r.done(a.id, 8, 1).is_err(), "a window serves once");
        assert!(r.done(b.id, 8, 3).is_err(), "past the limit");
        r.done(b.id, 8, 2).unwrap();
        assert_eq!(r.received(), 10);
    }
}
