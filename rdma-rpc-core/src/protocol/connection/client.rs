//! The client's side of a connection, as the server's frames move it: the handshake it started,
//! the events each call waits for (the server's grants and its response), calls the caller
//! gave up on (their windows kept until the response), the write slots the server arms for it,
//! pongs, and the server's goodbye. What the application asks of it is in `client_calls.rs`.

use std::collections::{HashMap, VecDeque};
use std::task::Waker;
use std::time::Instant;

use super::handshake::{check_ack, stream_window, Negotiated};
use super::{Core, DeadlineTimer, End, Handles, Phase, StreamRoute};
use crate::error::Error;
use crate::protocol::frames::{GrantFrame, Kind, ResponseFrame, SlotFrame, StatusFrame};
use crate::protocol::{CallMap, PathHasher};
use crate::status::Status;
use crate::transport::Descriptor;

/// What a client announces.
#[derive(Debug, Clone)]
pub(crate) struct ClientSettings {
    /// Size of each receive it posts.
    pub(crate) max_frame: usize,
    /// Receives it posts at first.
    pub(crate) initial_receives: u32,
    /// Most receives it posts as the connection gets busy.
    pub(crate) recv_credits: u32,
    /// Calls it wants in flight.
    pub(crate) max_in_flight: u32,
    /// Payloads up to this size travel inside frames (the server may lower it).
    pub(crate) inline_threshold: u32,
    /// Bytes of stream messages it buffers per call (raised to two frames' worth).
    pub(crate) stream_window: u64,
    /// Its token for this connection.
    pub(crate) token: u64,
}

/// What the server said about a call, or that the call's deadline passed first.
#[derive(Debug)]
pub(crate) enum ServerEvent {
    Grant(GrantFrame),
    Response(ResponseFrame),
    /// Not the server's: the call's deadline (given when it opened) passed while it waited
    /// for the server. The caller gives it up ([`abandon`](super::Connection::abandon)).
    DeadlinePassed,
}

/// One call in flight.
///
/// Kept inline in the connection's state when it is the only one (see `CallMap`), so it is
/// laid out for that (`repr(C)`): what a call's send and its response write first, then its
/// event, and what only streams and abandoned calls need boxed behind one pointer. Three
/// cache lines where it took four.
#[derive(Debug)]
#[repr(C)]
pub(super) struct ClientCall<H: Handles> {
    /// The task waiting for an event.
    pub(super) waker: Option<Waker>,
    /// When the call must have its response, if it must.
    pub(super) deadline: Option<Instant>,
    /// A streaming call's streams (its frames and response go there).
    pub(super) stream: Option<H::Stream>,
    /// The response came (it may still wait in the events).
    pub(super) answered: bool,
    /// The connection ended before the response: no event will come.
    pub(super) over: bool,
    /// The caller gave up: the server was told, its events are dropped.
    pub(super) abandoned: bool,
    /// The deadline passed first: the caller is told so when it next waits.
    pub(super) expired: bool,
    /// The oldest event not yet taken (most calls get one, their response).
    pub(super) first: Option<ServerEvent>,
    /// The events after it, and the windows an abandoned call holds, once there are any.
    more: Option<Box<MoreOfACall<H>>>,
}

/// What few calls need: events queued behind the first, windows held after the caller gave up.
#[derive(Debug)]
struct MoreOfACall<H: Handles> {
    /// Events after [`ClientCall::first`], oldest first.
    rest: VecDeque<ServerEvent>,
    /// Windows of an abandoned call, open until the server's response.
    hold: Vec<H::Window>,
}

impl<H: Handles> ClientCall<H> {
    pub(super) fn new(stream: Option<H::Stream>, deadline: Option<Instant>) -> Self {
        ClientCall {
            waker: None,
            deadline,
            stream,
            answered: false,
            over: false,
            abandoned: false,
            expired: false,
            first: None,
            more: None,
        }
    }

    fn more(&mut self) -> &mut MoreOfACall<H> {
        self.more.get_or_insert_with(|| {
            Box::new(MoreOfACall {
                rest: VecDeque::new(),
                hold: Vec::new(),
            })
        })
    }

    fn push(&mut self, event: ServerEvent) -> Option<Waker> {
        let queued = self.more.as_ref().is_some_and(|m| !m.rest.is_empty());
        if self.first.is_none() && !queued {
            self.first = Some(event);
        } else {
            self.more().rest.push_back(event);
        }
        self.waker.take()
    }

    /// An abandoned call drops its events and holds `windows` until the server's response.
    pub(super) fn hold(&mut self, windows: impl IntoIterator<Item = H::Window>) {
        self.first = None;
        if let Some(more) = &mut self.more {
            more.rest.clear();
        }
        let mut windows = windows.into_iter().peekable();
        if windows.peek().is_some() {
            self.more().hold.extend(windows);
        }
    }

    pub(super) fn pop(&mut self) -> Option<ServerEvent> {
        self.first
            .take()
            .or_else(|| self.more.as_mut()?.rest.pop_front())
    }
}

/// Callers waiting for room in the window, served in order.
#[derive(Debug, Default)]
pub(super) struct Room {
    pub(super) waiting: VecDeque<(u64, Option<Waker>)>,
    pub(super) next_ticket: u64,
}

/// A ping waiting for its pong.
#[derive(Debug, Default)]
pub(super) struct Ping {
    pub(super) answered: bool,
    pub(super) waker: Option<Waker>,
}

/// See the module docs.
///
/// In this order (`repr(C)`): what every call reads and writes (the window, the ids, the line
/// of callers, the deadlines, what the handshake settled, the call itself) first, right after
/// the connection's shared state (`Core`); then what only some calls or the connection's
/// start and end use.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct ClientSide<H: Handles> {
    /// Calls sent and not answered: what the window counts.
    pub(super) in_flight: usize,
    /// Calls the server allows in flight.
    pub(super) window: usize,
    pub(super) next_id: u64,
    pub(super) room: Room,
    pub(super) deadlines: DeadlineTimer,
    pub(super) negotiated: Option<Negotiated>,
    pub(super) calls: CallMap<ClientCall<H>>,
    pub(super) settings: ClientSettings,
    /// New calls are refused with this: the server said goodbye, this client left, or the
    /// connection ended.
    pub(super) over: Option<Status>,
    /// Size of the window offered for results, per outbound endpoint: its last result.
    pub(super) reply_sizes:
        HashMap<(&'static str, u32), usize, std::hash::BuildHasherDefault<PathHasher>>,
    pub(super) pings: CallMap<Ping>,
    /// Write slots of the server not used yet: (index, window).
    pub(super) slots: Vec<(u32, Descriptor)>,
}

impl<H: Handles> ClientSide<H> {
    pub(super) fn new(settings: ClientSettings) -> Self {
        ClientSide {
            settings,
            negotiated: None,
            calls: CallMap::default(),
            in_flight: 0,
            window: 0,
            next_id: 1,
            room: Room::default(),
            pings: CallMap::default(),
            slots: Vec::new(),
            reply_sizes: HashMap::default(),
            over: None,
            deadlines: DeadlineTimer::default(),
        }
    }

    /// Time passed: calls whose deadline passed before their response are told so (woken),
    /// and the timer is set to the earliest deadline left.
    pub(super) fn expire(&mut self, core: &mut Core, now: Instant) {
        self.deadlines.expire(
            now,
            self.calls.values_mut(),
            |call| {
                let waiting = !(call.answered || call.over || call.abandoned || call.expired);
                call.deadline.filter(|_| waiting)
            },
            |call| {
                call.expired = true;
                core.woken.extend(call.waker.take());
            },
        );
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The server's frame.
    pub(super) fn handle(&mut self, core: &mut Core, kind: Kind) {
        if core.phase == Phase::Handshake {
            return self.handshake(core, kind);
        }
        match kind {
            Kind::Response(mut r) => self.on_response(core, &mut r),
            Kind::Grant(g) => {
                if let Some(call) = self.calls.get_mut(&g.id) {
                    if !call.abandoned && !call.answered && call.stream.is_none() {
                        let waker = call.push(ServerEvent::Grant(g));
                        core.wake(waker);
                    }
                }
            }
            Kind::Revoke(r) => core.remote.on_revoke(r.offers, &core.peer),
            Kind::Revoked(r) => core.remote.on_revoked(r.offers, &mut core.woken),
            Kind::Messages(m) => {
                let checked = self.stream(m.id).map(|s| s.messages(m));
                self.checked(core, checked);
            }
            Kind::Credit(c) => {
                let checked = self.stream(c.id).map(|s| s.credit(c.bytes));
                self.checked(core, checked);
            }
            Kind::Chunks(c) if c.offers.is_empty() => {
                let checked = self.stream(c.id).map(|s| s.used(c.used));
                self.checked(core, checked);
            }
            Kind::Pong(pong) => {
                if let Some(ping) = self.pings.get_mut(&pong.id) {
                    ping.answered = true;
                    core.wake(ping.waker.take());
                }
            }
            Kind::Goaway(status) => self.goaway(core, status),
            _ => core.violation("unexpected frame from the server", false),
        }
    }

    fn handshake(&mut self, core: &mut Core, kind: Kind) {
        let peer = core.peer.to_string();
        let ack = match kind {
            Kind::HelloAck(ack) => ack,
            Kind::Goaway(status) => {
                let status = Status::from(status);
                let error = Error::ConnectionClosed {
                    peer,
                    reason: format!("refused by the server: {status}"),
                };
                return self.fail(core, error);
            }
            _ => {
                let error = Error::Protocol {
                    peer,
                    reason: "the server did not answer the handshake".into(),
                };
                return self.fail(core, error);
            }
        };
        if let Err(error) = check_ack(&ack, &peer) {
            return self.fail(core, error);
        }
        // The Hello used the one credit every side starts with.
        core.peer_handshake(&ack, 1);
        let s = &self.settings;
        let negotiated = Negotiated {
            max_in_flight: ack.max_in_flight.max(1),
            inline_threshold: ack.inline_threshold.min(s.inline_threshold),
            pull_writes: ack.pull_writes,
            stream_window: stream_window(s.stream_window, s.max_frame),
            peer_stream_window: ack.stream_window,
            peer_token: ack.token,
        };
        self.window = negotiated.max_in_flight as usize;
        self.negotiated = Some(negotiated);
        self.add_slots(ack.slots);
        core.phase = Phase::Open;
        core.notice = true;
        // Callers that came before the handshake finished wait for room in the window.
        self.room_freed(core);
    }

    /// The handshake failed with `error`.
    fn fail(&mut self, core: &mut Core, error: Error) {
        let status = Status::unavailable(error.to_string());
        core.close(
            End {
                error: Some(error),
                status,
            },
            None,
        );
    }

    fn goaway(&mut self, core: &mut Core, status: StatusFrame) {
        let status = Status::from(status);
        tracing::debug!(
            code = status.code().as_str(),
            message = %crate::observe::logs::shown_reason(status.message()),
            "server said goodbye"
        );
        // Calls in flight still get their responses; new calls are refused.
        let said = Status::new(
            status.code(),
            format!("the server closed the connection: {}", status.message()),
        );
        self.over.get_or_insert(said);
        core.notice = true;
        for (_, waker) in self.room.waiting.iter_mut() {
            core.woken.extend(waker.take());
        }
    }

    /// Ends the connection if a stream frame broke the rules (`None`: a call the client gave
    /// up on, answered since).
    fn checked(
        &mut self,
        core: &mut Core,
        checked: Option<std::result::Result<(), crate::protocol::stream::Violation>>,
    ) {
        if let Some(Err(v)) = checked {
            core.violation(v.0, false);
        }
    }

    fn stream(&self, id: u64) -> Option<&H::Stream> {
        self.calls.get(&id).and_then(|c| c.stream.as_ref())
    }

    /// The server's response to a call (taken from `response`).
    pub(super) fn on_response(&mut self, core: &mut Core, response: &mut ResponseFrame) {
        if !response.slots.is_empty() {
            self.add_slots(std::mem::take(&mut response.slots));
        }
        self.respond(core, std::mem::take(response));
    }

    fn respond(&mut self, core: &mut Core, response: ResponseFrame) {
        let id = response.id;
        let Some(call) = self.calls.get_mut(&id) else {
            return; // an id never used, or answered already: nothing waits for it
        };
        if call.answered {
            return;
        }
        call.answered = true;
        self.in_flight -= 1;
        if let Some(stream) = &call.stream {
            stream.respond(response);
            self.calls.remove(&id);
        } else if call.abandoned {
            // The server answered, so it is done with the windows (their memory may serve
            // again).
            self.calls.remove(&id);
        } else {
            let waker = call.push(ServerEvent::Response(response));
            core.wake(waker);
        }
        self.room_freed(core);
    }

    pub(super) fn room_freed(&mut self, core: &mut Core) {
        if let Some((_, waker)) = self.room.waiting.front_mut() {
            core.woken.extend(waker.take());
        }
    }

    fn add_slots(&mut self, frames: Vec<SlotFrame>) {
        for frame in frames {
            if let Some(window) = frame.window {
                self.slots.push((frame.index, window.into()));
            }
        }
    }

    /// Ends every call in flight: the connection is over (`core.end` says why).
    pub(super) fn end_calls(&mut self, core: &mut Core) {
        let status = core.end.as_ref().map_or_else(
            || Status::unavailable("connection lost"),
            |e| e.status.clone(),
        );
        self.over.get_or_insert_with(|| status.clone());
        self.calls.retain(|_, call| {
            if let Some(stream) = &call.stream {
                stream.end(status.clone());
            }
            call.over = true;
            core.woken.extend(call.waker.take());
            // A call the caller gave up on has nobody to tell; its windows go now.
            !call.abandoned && call.stream.is_none()
        });
        self.in_flight = 0;
        for (_, waker) in self.room.waiting.iter_mut() {
            core.woken.extend(waker.take());
        }
        for ping in self.pings.values_mut() {
            core.woken.extend(ping.waker.take());
        }
    }
}
