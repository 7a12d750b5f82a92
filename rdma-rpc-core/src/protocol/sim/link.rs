//! The simulated link between two protocol states, and the handles the simulation gives them.
//!
//! Side 0 is the client, side 1 the server. Frames travel in order per direction, each into a
//! receive its receiver posted beforehand; the link can fail; a side that closes its end lets
//! the frames it sent arrive, then the peer sees the connection end.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;

use crate::error::Error;
use crate::protocol::connection::{CallEvents, Connection, Handles, Incoming, StreamRoute};
use crate::protocol::frames::{MessagesFrame, ResponseFrame, UsedWindow, WindowOffer};
use crate::protocol::mailbox::EndReason;
use crate::protocol::stream::Violation;
use crate::status::Status;
use crate::transport::Descriptor;

/// What the simulation saw happen, shared with the handles it gave the protocol (they report
/// into it when they are dropped or fed).
#[derive(Debug, Default)]
pub(crate) struct Journal {
    /// Calls the server answered (their response was queued).
    pub(crate) answered: HashSet<u64>,
    /// The connection ended (windows may go whenever).
    pub(crate) over: bool,
    /// Rule breaks found, with what happened.
    pub(crate) broken: Vec<String>,
}

/// The journal, shared.
pub(crate) type Shared = Arc<Mutex<Journal>>;

pub(crate) fn journal(shared: &Shared) -> MutexGuard<'_, Journal> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// The simulation's handles.
#[derive(Debug)]
pub(crate) struct Sim;

/// A window of memory exposed to the peer: a write slot (server), or a window a call offered
/// (client). Dropping it takes it down, which is checked against what the peer may still do.
#[derive(Debug)]
pub(crate) struct SimWindow {
    pub(crate) len: u64,
    /// The call whose window it is (client), if any.
    pub(crate) call: Option<u64>,
    pub(crate) journal: Shared,
}

impl Drop for SimWindow {
    fn drop(&mut self) {
        let Some(call) = self.call else { return };
        let mut j = journal(&self.journal);
        if !j.over && !j.answered.contains(&call) {
            j.broken.push(format!(
                "call {call}'s window taken down before the server answered it"
            ));
        }
    }
}

/// What the client sent the server about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallEvent {
    Ack(Option<Descriptor>),
    End(EndReason),
}

/// Where the client's frames about one server call go.
#[derive(Debug, Clone, Default)]
pub(crate) struct SimCall(pub(crate) Arc<Mutex<VecDeque<CallEvent>>>);

impl SimCall {
    pub(crate) fn take(&self) -> Option<CallEvent> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }
}

impl CallEvents for SimCall {
    fn ack(&self, window: Option<Descriptor>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(CallEvent::Ack(window));
    }

    fn end(&self, reason: EndReason) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(CallEvent::End(reason));
    }
}

/// A streaming call's streams: the simulated calls do not stream, so any stream frame for one
/// is a rule broken (and ends the connection, as the runtime's streams would).
#[derive(Debug)]
pub(crate) struct SimStream;

impl StreamRoute for SimStream {
    fn messages(&self, _: MessagesFrame) -> Result<(), Violation> {
        Err(Violation(
            "stream messages for a call that streams none".into(),
        ))
    }
    fn credit(&self, _: u64) -> Result<(), Violation> {
        Err(Violation(
            "stream credit for a call that streams none".into(),
        ))
    }
    fn offers(&self, _: Vec<WindowOffer>) -> Result<(), Violation> {
        Err(Violation(
            "stream windows for a call that streams none".into(),
        ))
    }
    fn used(&self, _: Vec<UsedWindow>) -> Result<(), Violation> {
        Err(Violation(
            "stream windows for a call that streams none".into(),
        ))
    }
    fn respond(&self, _: ResponseFrame) {}
    fn end(&self, _: Status) {}
}

impl Handles for Sim {
    type Window = SimWindow;
    type Stream = SimStream;
    type ServerCall = SimCall;

    fn window_len(window: &SimWindow) -> u64 {
        window.len
    }
}

/// The two directions of the link.
#[derive(Debug, Default)]
pub(crate) struct Link {
    /// Frames on their way to side `i`, in the order they were sent.
    pub(crate) in_flight: [VecDeque<Bytes>; 2],
    /// Receives side `i` posted and nothing filled.
    pub(crate) posted: [u32; 2],
    /// Side `i` closed its end.
    pub(crate) closed_by: [bool; 2],
    /// The link failed: nothing more arrives.
    pub(crate) failed: bool,
    /// Side `i` has seen the connection end.
    pub(crate) seen_end: [bool; 2],
    /// Frames delivered, both ways.
    pub(crate) delivered: u64,
    /// Times side `i` asked the time to handle a frame (a client never needs it).
    pub(crate) clock_reads: [u64; 2],
}

impl Link {
    /// Moves what side `side` has to do towards the link: receives to add, frames to send,
    /// closing its end. Returns whether it closed its end now.
    pub(crate) fn flush(&mut self, side: usize, conn: &mut Connection<Sim>) -> bool {
        conn.take_woken().wake();
        if self.closed_by[side] || self.failed {
            // A closed end sends nothing.
            while conn.poll_transmit().is_some() {}
            return false;
        }
        for _ in 0..conn.take_receives() {
            self.posted[side] += 1;
            conn.grew();
        }
        while let Some(t) = conn.poll_transmit() {
            self.in_flight[1 - side].push_back(Bytes::copy_from_slice(t.frame));
        }
        if conn.should_close() {
            self.closed_by[side] = true;
            conn.closed();
            return true;
        }
        false
    }

    /// Delivers the next frame on its way to side `to`, if any: the receive it lands in is
    /// posted again at once. `Err` if it found no receive posted.
    pub(crate) fn deliver(
        &mut self,
        to: usize,
        conn: &mut Connection<Sim>,
        now: Instant,
    ) -> Result<Option<Incoming<Sim>>, String> {
        if self.failed {
            return Ok(None);
        }
        let Some(bytes) = self.in_flight[to].pop_front() else {
            return Ok(None);
        };
        if self.posted[to] == 0 {
            return Err(format!(
                "a frame reached side {to} with no receive posted (receiver not ready)"
            ));
        }
        self.posted[to] -= 1;
        self.delivered += 1;
        let reads = &mut self.clock_reads[to];
        let incoming = conn.handle_datagram(&bytes, || {
            *reads += 1;
            now
        });
        if !self.closed_by[to] {
            self.posted[to] += 1;
            conn.reposted();
        }
        Ok(incoming)
    }

    /// Whether side `side` should learn now that the connection is over: the link failed, or
    /// the peer closed its end and every frame it sent has arrived.
    pub(crate) fn ended_for(&self, side: usize) -> Option<Error> {
        if self.seen_end[side] {
            return None;
        }
        if self.failed {
            return Some(Error::ConnectionClosed {
                peer: "sim".into(),
                reason: "the link failed".into(),
            });
        }
        if self.closed_by[side] {
            return Some(Error::ConnectionClosed {
                peer: "sim".into(),
                reason: "closed locally".into(),
            });
        }
        if self.closed_by[1 - side] && self.in_flight[side].is_empty() {
            return Some(Error::ConnectionClosed {
                peer: "sim".into(),
                reason: "closed by the peer".into(),
            });
        }
        None
    }
}
