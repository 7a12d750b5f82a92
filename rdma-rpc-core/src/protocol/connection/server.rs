//! The server's side of a connection, as the client's frames move it: the handshake it answers (or a refusal in its place),
//! the admission of each request (a call id is not reused while in flight, at most
//! `max_in_flight` calls, none once shutting down; a request's write slot is taken first,
//! whatever happens to it), the calls in flight and where the client's frames about them go,
//! the write slots, pings within their rate, the idle timeout, draining on shutdown, and the
//! end of the connection over any frame a client must not send.

use std::time::{Duration, Instant};

use super::handshake::{check_hello, stream_window, Negotiated};
use super::{CallEvents, Core, End, Handles, Phase, StreamRoute};
use crate::error::Error;
use crate::protocol::credits::Need;
use crate::protocol::frames::{DescriptorFrame, Hello, Kind, RequestFrame, SlotFrame};
use crate::protocol::mailbox::EndReason;
use crate::protocol::rate::{Rate, Verdict};
use crate::protocol::slot_book::{SlotBook, SlotRefusal};
use crate::protocol::{CallMap, PROTOCOL_VERSION};
use crate::status::Status;

/// What a server announces and enforces on one connection. `repr(C)`: what every request
/// reads first (see `ServerSide`).
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct ServerSettings {
    /// Closes the connection when no call is in flight and no frame came for this long.
    pub(crate) idle_timeout: Option<Duration>,
    /// Most calls in flight it allows.
    pub(crate) max_in_flight: u32,
    /// Payloads up to this size travel inside frames (the client may lower it).
    pub(crate) inline_threshold: u32,
    /// Size of each receive it posts.
    pub(crate) max_frame: usize,
    /// Receives it posts at first.
    pub(crate) initial_receives: u32,
    /// Most receives it posts as the connection gets busy.
    pub(crate) recv_credits: u32,
    /// It pulls large send/write payloads from a window the request offers.
    pub(crate) pull_writes: bool,
    /// Bytes of stream messages it buffers per call (raised to two frames' worth).
    pub(crate) stream_window: u64,
    /// Its token for this connection.
    pub(crate) token: u64,
    /// Write slots of the connection (armed once a payload too large to travel inline came).
    pub(crate) write_slots: u32,
    /// Longest wait for the client's Hello.
    pub(crate) handshake_timeout: Duration,
    /// Most pings per second (0: no limit).
    pub(crate) max_pings_per_second: u32,
    /// A connection a limit turned away: the client's Hello is answered with a goaway saying
    /// this, and the connection closes.
    pub(crate) refusal: Option<Status>,
}

/// A request that passed the connection's checks.
#[derive(Debug)]
pub(crate) struct Admitted<H: Handles> {
    pub(crate) request: RequestFrame,
    /// The write slot the request named (its window, to revoke before the bytes are read).
    pub(crate) slot: Option<H::Window>,
    /// When the request's frame was handled: the instant its deadline counts from (the clock
    /// reading of the frames read with it: see `Session::poll_frames`).
    pub(crate) arrived: Instant,
}

/// What a received frame asks of the server's application.
// Moved once per request, from the state to the connection loop: boxing the request would
// cost an allocation per call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Incoming<H: Handles> {
    /// A request to check against its endpoint, then start
    /// ([`start_call`](super::Connection::start_call)) or refuse
    /// ([`refuse`](super::Connection::refuse)).
    Request(Admitted<H>),
    /// A request the connection's own limits refused (shutting down, too many calls in
    /// flight, a write slot it may not use): answer it with
    /// [`refuse`](super::Connection::refuse).
    Refused { id: u64, status: Status },
}

/// One call in flight.
#[derive(Debug)]
pub(super) struct ServerCall<H: Handles> {
    pub(super) events: H::ServerCall,
    pub(super) stream: Option<H::Stream>,
    /// When the call must be done, if it must.
    pub(super) deadline: Option<Instant>,
    /// The call was told its deadline passed.
    pub(super) expired: bool,
}

/// See the module docs.
///
/// In this order (`repr(C)`): what every request reads and writes (the calls, the clock of
/// its idle timer, the deadlines, what the handshake settled, the settings, whose first
/// fields are the idle timeout and the limits a request is checked against) first, right after
/// the connection's shared state (`Core`); then what only some calls or the handshake use.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct ServerSide<H: Handles> {
    pub(super) calls: CallMap<ServerCall<H>>,
    /// Calls answered so far.
    pub(super) answered: u64,
    /// Since when nothing happened: no frame came and no call was in flight.
    pub(super) quiet_since: Instant,
    pub(super) deadlines: super::DeadlineTimer,
    pub(super) negotiated: Option<Negotiated>,
    /// Shutting down: new requests are refused, the connection ends once its calls are done.
    pub(super) stopping: bool,
    /// A payload too large to travel inline came: slots would have saved a round trip.
    pub(super) slots_wanted: bool,
    pub(super) settings: ServerSettings,
    pub(super) slots: SlotBook<H::Window>,
    /// Until when the client may take to say Hello.
    pub(super) handshake_deadline: Instant,
    pub(super) pings: Rate,
}

impl<H: Handles> ServerSide<H> {
    pub(super) fn new(settings: ServerSettings, now: Instant) -> Self {
        ServerSide {
            slots: SlotBook::new(settings.write_slots),
            pings: Rate::new(settings.max_pings_per_second, Duration::from_secs(1)),
            handshake_deadline: now + settings.handshake_timeout,
            settings,
            negotiated: None,
            calls: CallMap::default(),
            answered: 0,
            slots_wanted: false,
            stopping: false,
            quiet_since: now,
            deadlines: super::DeadlineTimer::default(),
        }
    }

    /// Time passed: calls whose deadline passed are told so (their events end with
    /// [`EndReason::DeadlinePassed`]: the application stops them and answers), and the timer is
    /// set to the earliest deadline left.
    pub(super) fn expire(&mut self, now: Instant) {
        self.deadlines.expire(
            now,
            self.calls.values_mut(),
            |call| call.deadline.filter(|_| !call.expired),
            |call| {
                call.expired = true;
                call.events.end(EndReason::DeadlinePassed);
            },
        );
    }

    pub(super) fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    pub(super) fn in_flight(&self) -> usize {
        self.calls.len()
    }

    pub(super) fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// The client's frame.
    pub(super) fn handle(
        &mut self,
        core: &mut Core,
        kind: Kind,
        now: Instant,
    ) -> Option<Incoming<H>> {
        if core.phase == Phase::Handshake {
            self.handshake(core, kind, now);
            return None;
        }
        self.quiet_since = now;
        match kind {
            Kind::Request(mut request) => {
                let mut incoming = None;
                self.admit(core, &mut request, now, &mut incoming);
                return incoming;
            }
            Kind::Ack(ack) => {
                if let Some(call) = self.calls.get(&ack.id) {
                    call.events.ack(ack.reply_to.map(Into::into));
                }
            }
            Kind::Cancel(c) => {
                if let Some(call) = self.calls.get(&c.id) {
                    call.events.end(EndReason::Cancelled);
                }
            }
            Kind::Messages(m) => {
                let checked = self.stream(m.id).map(|s| s.messages(m));
                self.checked(core, checked);
            }
            Kind::Credit(c) => {
                let checked = self.stream(c.id).map(|s| s.credit(c.bytes));
                self.checked(core, checked);
            }
            Kind::Chunks(c) if c.used.is_empty() => {
                let checked = self.stream(c.id).map(|s| s.offers(c.offers));
                self.checked(core, checked);
            }
            Kind::Revoke(r) => core.remote.on_revoke(r.offers, &core.peer),
            Kind::Revoked(r) => core.remote.on_revoked(r.offers, &mut core.woken),
            Kind::Ping(ping) => self.ping(core, ping, now),
            Kind::Goaway(status) => {
                tracing::debug!(
                    message = %crate::observe::logs::shown_reason(&status.message),
                    "client said goodbye"
                );
                core.close(
                    End {
                        error: None,
                        status: Status::unavailable("the client closed the connection"),
                    },
                    None,
                );
            }
            other => {
                let reason = format!("unexpected {} frame from a client", frame_name(&other));
                core.violation(reason, true);
            }
        }
        None
    }

    fn handshake(&mut self, core: &mut Core, kind: Kind, now: Instant) {
        let Kind::Hello(hello) = kind else {
            let error = Error::Protocol {
                peer: core.peer.to_string(),
                reason: "the first frame is not a Hello".into(),
            };
            let goaway = Status::invalid_argument(error.to_string());
            return self.fail(core, error, goaway);
        };
        if let Some(status) = self.settings.refusal.clone() {
            // A client a limit turned away is told why, and nothing else happens.
            core.tx.credits.handshake(hello.credits, hello.credits);
            core.close(
                End {
                    error: None,
                    status: status.clone(),
                },
                Some(status),
            );
            return;
        }
        if let Err(error) = check_hello(&hello, &core.peer) {
            let goaway = match &error {
                Error::VersionMismatch { .. } => Status::failed_precondition(error.to_string()),
                _ => Status::invalid_argument(error.to_string()),
            };
            // The goaway needs a credit: believe the Hello's receive count for it.
            core.tx.credits.handshake(hello.credits, hello.credits);
            return self.fail(core, error, goaway);
        }
        core.peer_handshake(&hello, 0);
        let s = &self.settings;
        let negotiated = Negotiated {
            max_in_flight: hello.max_in_flight.clamp(1, s.max_in_flight),
            inline_threshold: s.inline_threshold.min(hello.inline_threshold),
            pull_writes: s.pull_writes,
            stream_window: stream_window(s.stream_window, s.max_frame),
            peer_stream_window: hello.stream_window,
            peer_token: hello.token,
        };
        let ack = Hello {
            version: PROTOCOL_VERSION,
            max_frame: s.max_frame as u32,
            // What was posted before the Hello arrived: receives added since travel as
            // credits of the HelloAck frame itself.
            credits: s.initial_receives.min(s.recv_credits),
            max_credits: s.recv_credits,
            max_in_flight: negotiated.max_in_flight,
            inline_threshold: negotiated.inline_threshold,
            slots: Vec::new(),
            pull_writes: negotiated.pull_writes,
            token: core.remote.token(),
            stream_window: negotiated.stream_window,
        };
        self.negotiated = Some(negotiated);
        core.phase = Phase::Open;
        core.notice = true;
        self.quiet_since = now;
        core.queue(&Kind::HelloAck(ack), Need::Priority)
            .expect("a HelloAck fits any receive the client may post");
    }

    fn fail(&mut self, core: &mut Core, error: Error, goaway: Status) {
        let status = Status::unavailable(error.to_string());
        core.close(
            End {
                error: Some(error),
                status,
            },
            Some(goaway),
        );
    }

    /// Checks a request against the connection: the call id, the limits, its write slot. The
    /// request is taken from `request` when it passes.
    pub(super) fn admit(
        &mut self,
        core: &mut Core,
        request: &mut RequestFrame,
        now: Instant,
        incoming: &mut Option<Incoming<H>>,
    ) {
        self.quiet_since = now;
        let id = request.id;
        if self.calls.contains_key(&id) {
            core.violation(format!("call id {id} reused while in flight"), true);
            return;
        }
        // The slot first: whatever happens to the request, the client wrote into it.
        let slot = match request.slot {
            None => Ok(None),
            Some(index) => self
                .slots
                .take(index, request.payload_len, H::window_len)
                .map(Some)
                .map_err(|(refusal, _window)| slot_refused(refusal)),
        };
        let refusal = if self.stopping {
            Some(Status::unavailable("the server is shutting down"))
        } else if self.calls.len() >= self.max_in_flight() as usize {
            Some(Status::resource_exhausted(format!(
                "too many calls in flight on this connection (max_in_flight = {})",
                self.max_in_flight()
            )))
        } else {
            slot.as_ref().err().cloned()
        };
        *incoming = Some(match refusal {
            Some(status) => Incoming::Refused { id, status },
            None => Incoming::Request(Admitted {
                request: std::mem::take(request),
                slot: slot.ok().flatten(),
                arrived: now,
            }),
        });
    }

    fn max_in_flight(&self) -> u32 {
        self.negotiated.map_or(1, |n| n.max_in_flight)
    }

    fn ping(&mut self, core: &mut Core, ping: crate::protocol::frames::CallId, now: Instant) {
        let limit = self.settings.max_pings_per_second;
        if limit > 0 && self.pings.check(now) == Verdict::Hold {
            let status = Status::resource_exhausted(format!(
                "more than {limit} pings in a second on one connection (max_pings_per_second); \
                 connection closed"
            ));
            let error = Error::LimitExceeded {
                limit: "max_pings_per_second",
                max: limit.into(),
                actual: u64::from(limit) + 1,
            };
            core.close(
                End {
                    error: Some(error),
                    status: status.clone(),
                },
                Some(status),
            );
            return;
        }
        let _ = core.send(Kind::Pong(ping));
    }

    fn checked(
        &mut self,
        core: &mut Core,
        checked: Option<std::result::Result<(), crate::protocol::stream::Violation>>,
    ) {
        if let Some(Err(v)) = checked {
            core.violation(v.0, true);
        }
    }

    pub(super) fn stream(&self, id: u64) -> Option<&H::Stream> {
        self.calls.get(&id).and_then(|c| c.stream.as_ref())
    }

    /// Ends every call in flight: its task stops its handler and answers into nothing.
    pub(super) fn end_calls(&mut self) {
        for call in self.calls.values() {
            call.events.end(EndReason::ConnectionLost);
        }
    }

    pub(super) fn poll_timeout(&self, core: &Core) -> Option<Instant> {
        match core.phase {
            Phase::Handshake => Some(self.handshake_deadline),
            Phase::Open if self.calls.is_empty() => {
                self.settings.idle_timeout.map(|t| self.quiet_since + t)
            }
            _ => None,
        }
    }

    pub(super) fn handle_timeout(&mut self, core: &mut Core, now: Instant) {
        match core.phase {
            Phase::Handshake if now >= self.handshake_deadline => {
                let limit = self.settings.handshake_timeout;
                let error = Error::Protocol {
                    peer: core.peer.to_string(),
                    reason: format!("no handshake within {limit:?} (handshake_timeout)"),
                };
                let goaway = Status::invalid_argument(error.to_string());
                self.fail(core, error, goaway);
            }
            Phase::Open if self.calls.is_empty() => {
                let Some(limit) = self.settings.idle_timeout else {
                    return;
                };
                if now < self.quiet_since + limit {
                    return;
                }
                tracing::debug!(peer = %core.peer, "closing an idle connection");
                let status = Status::unavailable(format!(
                    "the server closed a connection idle for {limit:?} (idle_timeout)"
                ));
                core.close_draining(
                    End {
                        error: None,
                        status: status.clone(),
                    },
                    status,
                );
            }
            _ => {}
        }
    }

    /// Arms owed write slots with the windows `make` gives, as long as their descriptors fit
    /// in `room` bytes of a frame.
    pub(super) fn arm_slots(
        &mut self,
        mut room: usize,
        mut make: impl FnMut() -> Option<(H::Window, DescriptorFrame)>,
    ) -> Vec<SlotFrame> {
        let mut armed = Vec::new();
        if !self.slots_wanted {
            return armed;
        }
        while let Some(index) = self.slots.next_owed() {
            let Some((window, descriptor)) = make() else {
                break;
            };
            let frame = SlotFrame {
                index,
                window: Some(descriptor),
            };
            // A repeated field costs its tag and a length prefix besides the message.
            let cost = prost::Message::encoded_len(&frame) + 4;
            if cost > room {
                break; // the window is dropped, and with it taken down
            }
            room -= cost;
            self.slots.armed(window);
            armed.push(frame);
        }
        armed
    }
}

fn slot_refused(refusal: SlotRefusal) -> Status {
    match refusal {
        SlotRefusal::NotArmed { index } => Status::invalid_argument(format!(
            "write slot {index} is not armed (never announced, or already used)"
        )),
        SlotRefusal::TooSmall { index, len, size } => Status::invalid_argument(format!(
            "{len} bytes announced in write slot {index} of {size} bytes"
        )),
    }
}

fn frame_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Hello(_) => "Hello",
        Kind::HelloAck(_) => "HelloAck",
        Kind::Request(_) => "Request",
        Kind::Grant(_) => "Grant",
        Kind::Ack(_) => "Ack",
        Kind::Response(_) => "Response",
        Kind::Cancel(_) => "Cancel",
        Kind::Goaway(_) => "Goaway",
        Kind::Revoke(_) => "Revoke",
        Kind::Revoked(_) => "Revoked",
        Kind::Ping(_) => "Ping",
        Kind::Pong(_) => "Pong",
        Kind::Messages(_) => "Messages",
        Kind::Credit(_) => "Credit",
        Kind::Chunks(_) => "Chunks",
    }
}
