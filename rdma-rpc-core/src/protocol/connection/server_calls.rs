//! What a server's application asks of a connection: start an admitted call, answer it (or
//! refuse a request), arm the write slots with the windows it gives, and shut down.

use std::time::Instant;

use super::server::{ServerCall, ServerSettings, ServerSide};
use super::{Core, End, Handles, Phase, StreamRoute};
use crate::error::Result;
use crate::protocol::frames::{DescriptorFrame, Kind, ResponseFrame, StatusFrame};
use crate::status::Status;

/// Room kept in a frame besides the response for what wraps it (the frame's own fields,
/// credits).
const FRAME_MARGIN: usize = 64;

impl<H: Handles> super::Connection<H> {
    /// A server's side of a new connection, its receives posted: it waits for the client's
    /// Hello (or, with `settings.refusal`, only to tell the client why it is turned away).
    pub(crate) fn server(
        settings: ServerSettings,
        peer: std::sync::Arc<str>,
        now: Instant,
    ) -> Self {
        let initial = settings.initial_receives.min(settings.recv_credits);
        let credits = crate::protocol::credits::Credits::new(initial, settings.recv_credits, false);
        let core = Core::new(peer, credits, settings.token);
        super::Connection {
            core,
            side: super::Side::Server(ServerSide::new(settings, now)),
        }
    }

    fn server_side(&mut self) -> (&mut Core, &mut ServerSide<H>) {
        match &mut self.side {
            super::Side::Server(s) => (&mut self.core, s),
            super::Side::Client(_) => unreachable!("a server operation on a client connection"),
        }
    }

    fn server_ref(&self) -> &ServerSide<H> {
        match &self.side {
            super::Side::Server(s) => s,
            super::Side::Client(_) => unreachable!("a server operation on a client connection"),
        }
    }

    /// Starts call `id` (an admitted request the application accepted): the client's frames
    /// about it go to `events` and `stream`. Past `deadline`, the connection's timer ends its
    /// events with [`EndReason::DeadlinePassed`](crate::protocol::mailbox::EndReason).
    pub(crate) fn start_call(
        &mut self,
        id: u64,
        events: H::ServerCall,
        stream: Option<H::Stream>,
        deadline: Option<Instant>,
    ) {
        let (core, s) = self.server_side();
        s.calls.insert(
            id,
            ServerCall {
                events,
                stream,
                deadline,
                expired: false,
            },
        );
        if deadline.is_some_and(|d| s.deadlines.add(d)) {
            core.timer_moved = true;
        }
    }

    /// The request's payload is larger than the inline threshold: the connection's write slots
    /// (registered now if they were not) would have saved it a round trip, so they are armed
    /// with the next response.
    pub(crate) fn want_slots(&mut self) {
        let (_, s) = self.server_side();
        s.slots_wanted = true;
    }

    /// Whether call `id` is in flight (started and not answered).
    pub(crate) fn in_flight(&self, id: u64) -> bool {
        self.server_ref().calls.contains_key(&id)
    }

    /// Calls answered so far.
    pub(crate) fn answered(&self) -> u64 {
        self.server_ref().answered
    }

    /// Answers call `id` with `response` (arming owed write slots with the windows `make`
    /// gives), and ends the call here: frames the client still sends about it change nothing.
    /// The connection ends after it if the server is shutting down and it was the last call.
    /// `now` is asked only when the connection has an idle timeout and no call is left (the
    /// idle time starts then).
    pub(crate) fn respond(
        &mut self,
        mut response: ResponseFrame,
        now: impl FnOnce() -> Instant,
        make: impl FnMut() -> Option<(H::Window, DescriptorFrame)>,
    ) -> Result<()> {
        let (core, s) = self.server_side();
        if let Some(call) = s.calls.remove(&response.id) {
            s.answered += 1;
            if let Some(stream) = &call.stream {
                // Whatever still reads or writes the call's streams (work its handler spawned)
                // stops.
                stream.end(Status::cancelled("the call is over"));
            }
        }
        let room = core
            .peer_max_frame
            .saturating_sub(prost::Message::encoded_len(&response) + FRAME_MARGIN);
        response.slots = s.arm_slots(room, make);
        let sent = core.send_hot(crate::protocol::hot::Hot::response(&response));
        if s.calls.is_empty() {
            if s.settings.idle_timeout.is_some() {
                s.quiet_since = now();
            }
            if s.stopping {
                // The answers queued behind credits still go.
                let status = Status::unavailable("the server is shutting down");
                core.close_draining(
                    End {
                        error: None,
                        status: status.clone(),
                    },
                    status,
                );
            }
        }
        sent
    }

    /// Answers request `id`, which was never started, with `status`.
    pub(crate) fn refuse(
        &mut self,
        id: u64,
        status: &Status,
        make: impl FnMut() -> Option<(H::Window, DescriptorFrame)>,
    ) -> Result<()> {
        let (core, s) = self.server_side();
        let mut response = ResponseFrame {
            id,
            status: Some(StatusFrame::from(status)),
            ..Default::default()
        };
        // A refused request may still have used a slot.
        let room = core
            .peer_max_frame
            .saturating_sub(prost::Message::encoded_len(&response) + FRAME_MARGIN);
        response.slots = s.arm_slots(room, make);
        core.send(Kind::Response(response))
    }

    /// The server shuts down: new requests are refused; the client is told at once (a goaway
    /// while the calls in flight drain, so it sends its next calls elsewhere), and the
    /// connection ends once they are answered.
    pub(crate) fn shutdown(&mut self) {
        let (core, s) = self.server_side();
        if s.stopping || core.end.is_some() {
            return;
        }
        s.stopping = true;
        core.notice = true;
        let status = Status::unavailable("the server is shutting down");
        if s.calls.is_empty() || core.phase != Phase::Open {
            core.close_draining(
                End {
                    error: None,
                    status: status.clone(),
                },
                status,
            );
        } else {
            // After what is queued, like any answer: a goaway that took the peer's last receive
            // would leave the answers before it waiting behind the reserve.
            let _ = core.send(Kind::Goaway(StatusFrame::from(&status)));
        }
    }
}
