//! The client's side of a connection: the handshake it starts, its calls in flight within the
//! window the server allows, the events each call waits for (the server's grants and its
//! response), calls the caller gave up on (told to the server, their windows kept until the
//! response), the write slots the server armed for it, the result sizes it learned, pings,
//! and the server's goodbye.

use std::collections::{HashMap, VecDeque};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::handshake::{check_ack, stream_window, Negotiated, PeerReceives};
use super::{Core, End, Handles, Phase, StreamRoute};
use crate::error::Error;
use crate::protocol::credits::Need;
use crate::protocol::frames::{
    CallId, GrantFrame, Hello, Kind, RequestFrame, ResponseFrame, SlotFrame, StatusFrame,
};
use crate::protocol::{CallMap, PROTOCOL_VERSION};
use crate::service::EndpointDef;
use crate::status::{Code, Status};
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

/// What the server said about a call.
#[derive(Debug)]
pub(crate) enum ServerEvent {
    Grant(GrantFrame),
    Response(ResponseFrame),
}

/// One call in flight.
#[derive(Debug)]
struct ClientCall<H: Handles> {
    /// Events not yet taken, oldest first (the first in place: most calls get one).
    first: Option<ServerEvent>,
    rest: VecDeque<ServerEvent>,
    /// The task waiting for an event.
    waker: Option<Waker>,
    /// The response came (it may still wait in the events).
    answered: bool,
    /// The connection ended before the response: no event will come.
    over: bool,
    /// The caller gave up: the server was told, its events are dropped.
    abandoned: bool,
    /// Windows of an abandoned call, open until the server's response.
    hold: Vec<H::Window>,
    /// A streaming call's streams (its frames and response go there).
    stream: Option<H::Stream>,
}

impl<H: Handles> ClientCall<H> {
    fn new(stream: Option<H::Stream>) -> Self {
        ClientCall {
            first: None,
            rest: VecDeque::new(),
            waker: None,
            answered: false,
            over: false,
            abandoned: false,
            hold: Vec::new(),
            stream,
        }
    }

    fn push(&mut self, event: ServerEvent) -> Option<Waker> {
        if self.first.is_none() && self.rest.is_empty() {
            self.first = Some(event);
        } else {
            self.rest.push_back(event);
        }
        self.waker.take()
    }

    fn pop(&mut self) -> Option<ServerEvent> {
        self.first.take().or_else(|| self.rest.pop_front())
    }
}

/// Callers waiting for room in the window, served in order.
#[derive(Debug, Default)]
struct Room {
    waiting: VecDeque<(u64, Option<Waker>)>,
    next_ticket: u64,
}

/// A ping waiting for its pong.
#[derive(Debug, Default)]
struct Ping {
    answered: bool,
    waker: Option<Waker>,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct ClientSide<H: Handles> {
    settings: ClientSettings,
    negotiated: Option<Negotiated>,
    calls: CallMap<ClientCall<H>>,
    /// Calls sent and not answered: what the window counts.
    in_flight: usize,
    /// Calls the server allows in flight.
    window: usize,
    next_id: u64,
    room: Room,
    pings: CallMap<Ping>,
    /// Write slots of the server not used yet: (index, window).
    slots: Vec<(u32, Descriptor)>,
    /// Size of the window offered for results, per outbound endpoint: its last result.
    reply_sizes: HashMap<(&'static str, u32), usize, std::hash::BuildHasherDefault<FxHasher>>,
    /// New calls are refused with this: the server said goodbye, this client left, or the
    /// connection ended.
    over: Option<Status>,
}

/// Hashes an endpoint key (its static path's address, and the op) with one multiplication.
#[derive(Default)]
pub(crate) struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

impl<H: Handles> ClientSide<H> {
    fn new(settings: ClientSettings) -> Self {
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
        }
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The server's frame.
    pub(super) fn handle(&mut self, core: &mut Core, kind: Kind, _now: Instant) {
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
        let receives = PeerReceives::of(&ack, 1);
        core.peer_max_frame = receives.max_frame;
        let ignored = core
            .tx
            .credits
            .handshake(receives.usable, receives.announced);
        if ignored > 0 {
            tracing::debug!(peer = %core.peer, ignored, "the server announced more credits than it may");
        }
        core.remote.handshake(ack.token);
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

    fn room_freed(&mut self, core: &mut Core) {
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

impl<H: Handles> super::Connection<H> {
    /// A client's side of a new connection: its Hello is queued (with the one credit every side
    /// starts with).
    pub(crate) fn client(settings: ClientSettings, peer: std::sync::Arc<str>) -> Self {
        let initial = settings.initial_receives.min(settings.recv_credits);
        let credits = crate::protocol::credits::Credits::new(initial, settings.recv_credits, true);
        let mut core = Core::new(peer, credits, settings.token);
        let hello = Hello {
            version: PROTOCOL_VERSION,
            max_frame: settings.max_frame as u32,
            credits: initial,
            max_credits: settings.recv_credits,
            max_in_flight: settings.max_in_flight,
            inline_threshold: settings.inline_threshold,
            token: settings.token,
            stream_window: stream_window(settings.stream_window, settings.max_frame),
            ..Default::default()
        };
        core.queue(&Kind::Hello(hello), Need::Priority)
            .expect("a Hello fits any receive");
        super::Connection {
            core,
            side: super::Side::Client(ClientSide::new(settings)),
            frame: Default::default(),
        }
    }

    fn client_side(&mut self) -> (&mut Core, &mut ClientSide<H>) {
        match &mut self.side {
            super::Side::Client(c) => (&mut self.core, c),
            super::Side::Server(_) => unreachable!("a client operation on a server connection"),
        }
    }

    fn client_ref(&self) -> &ClientSide<H> {
        match &self.side {
            super::Side::Client(c) => c,
            super::Side::Server(_) => unreachable!("a client operation on a server connection"),
        }
    }

    /// What the handshake settled, once it is done.
    pub(crate) fn negotiated(&self) -> Option<&Negotiated> {
        match &self.side {
            super::Side::Client(c) => c.negotiated.as_ref(),
            super::Side::Server(s) => s.negotiated(),
        }
    }

    /// Why new calls are refused, if they are: the server said goodbye, this client left, or
    /// the connection ended.
    pub(crate) fn lost(&self) -> Option<Status> {
        self.client_ref().over.clone()
    }

    /// Whether new calls are refused (see [`lost`](Self::lost)).
    pub(crate) fn is_refusing(&self) -> bool {
        match &self.side {
            super::Side::Client(c) => c.over.is_some(),
            super::Side::Server(s) => s.is_stopping(),
        }
    }

    /// Waits for room in the window for one more call; `ticket` keeps the caller's place in
    /// line (release it with [`leave_line`](Self::leave_line) if the caller gives up).
    pub(crate) fn poll_room(
        &mut self,
        ticket: &mut Option<u64>,
        cx: &Context<'_>,
    ) -> Poll<std::result::Result<(), Status>> {
        let (core, c) = self.client_side();
        if let Some(status) = &c.over {
            if let Some(t) = ticket.take() {
                c.room.waiting.retain(|(w, _)| *w != t);
            }
            return Poll::Ready(Err(status.clone()));
        }
        let first = match (ticket.as_ref(), c.room.waiting.front()) {
            (_, None) => true,
            (Some(t), Some((head, _))) => t == head,
            (None, Some(_)) => false,
        };
        if first && c.in_flight < c.window {
            if ticket.take().is_some() {
                c.room.waiting.pop_front();
                // Room may be left for the next in line.
                if c.in_flight + 1 < c.window {
                    if let Some((_, w)) = c.room.waiting.front_mut() {
                        core.woken.extend(w.take());
                    }
                }
            }
            return Poll::Ready(Ok(()));
        }
        match ticket {
            Some(t) => {
                if let Some((_, w)) = c.room.waiting.iter_mut().find(|(id, _)| id == t) {
                    *w = Some(cx.waker().clone());
                }
            }
            None => {
                let t = c.room.next_ticket;
                c.room.next_ticket += 1;
                c.room.waiting.push_back((t, Some(cx.waker().clone())));
                *ticket = Some(t);
            }
        }
        Poll::Pending
    }

    /// A caller waiting for room gave up.
    pub(crate) fn leave_line(&mut self, ticket: u64) {
        let (core, c) = self.client_side();
        let was_first = c.room.waiting.front().is_some_and(|(t, _)| *t == ticket);
        c.room.waiting.retain(|(t, _)| *t != ticket);
        if was_first && c.in_flight < c.window {
            c.room_freed(core);
        }
    }

    /// Opens a call in the room [`poll_room`](Self::poll_room) found: its id. A streaming
    /// call's frames go to `stream`.
    pub(crate) fn open_call(&mut self, stream: Option<H::Stream>) -> u64 {
        let (_, c) = self.client_side();
        let id = c.next_id;
        c.next_id += 1;
        c.in_flight += 1;
        c.calls.insert(id, ClientCall::new(stream));
        id
    }

    /// Sends the request of call `id`. If it cannot go (the connection ended, or the frame is
    /// larger than the server's receives), the call is forgotten: it never reached the
    /// server, so its place in the window is free again.
    pub(crate) fn send_request(&mut self, id: u64, request: RequestFrame) -> crate::Result<()> {
        let (core, c) = self.client_side();
        let sent = core.send(Kind::Request(request));
        if sent.is_err() {
            if let Some(call) = c.calls.remove(&id) {
                if !call.answered && !call.over {
                    c.in_flight -= 1;
                    c.room_freed(core);
                }
            }
        }
        sent
    }

    /// The next event of call `id`; `None` once the connection ended without one (the call
    /// is then forgotten, as it is once its response is taken).
    pub(crate) fn poll_event(&mut self, id: u64, cx: &Context<'_>) -> Poll<Option<ServerEvent>> {
        let (_, c) = self.client_side();
        let Some(call) = c.calls.get_mut(&id) else {
            return Poll::Ready(None);
        };
        match call.pop() {
            Some(event) => {
                if matches!(event, ServerEvent::Response(_)) {
                    c.calls.remove(&id);
                }
                Poll::Ready(Some(event))
            }
            None if call.over => {
                c.calls.remove(&id);
                Poll::Ready(None)
            }
            None => {
                match &call.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => call.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }

    /// A call waiting for an event other than `except`, with its waker: who reads the
    /// connection next when the reader's call is done.
    pub(crate) fn waiting_call(&self, except: u64) -> Option<(u64, Waker)> {
        let c = self.client_ref();
        c.calls.iter().find_map(|(&id, call)| {
            (id != except)
                .then(|| call.waker.clone())
                .flatten()
                .map(|w| (id, w))
        })
    }

    /// The caller gave up on call `id` before its response: the server is told (`Cancel`), and
    /// the call (its place in the window, and `windows`, which the server may still write or
    /// read) stays until the server's response arrives.
    pub(crate) fn abandon(&mut self, id: u64, windows: impl IntoIterator<Item = H::Window>) {
        let (core, c) = self.client_side();
        let Some(call) = c.calls.get_mut(&id) else {
            return; // the connection ended, or the response was taken
        };
        if call.answered {
            // The response came and nobody will take it: the server is done with the windows.
            c.calls.remove(&id);
            return;
        }
        if call.over {
            c.calls.remove(&id);
            return;
        }
        call.abandoned = true;
        call.waker = None;
        call.first = None;
        call.rest.clear();
        call.hold.extend(windows);
        let _ = core.send(Kind::Cancel(CallId { id }));
    }

    /// A free write slot that holds `len` bytes.
    pub(crate) fn take_slot(&mut self, len: usize) -> Option<(u32, Descriptor)> {
        let (_, c) = self.client_side();
        let at = c.slots.iter().position(|(_, w)| w.len >= len as u64)?;
        Some(c.slots.swap_remove(at))
    }

    /// The size of the window to offer for a result of `endpoint`, if any
    /// ([`call::reply_window`](crate::protocol::call::reply_window)).
    pub(crate) fn reply_size(&self, endpoint: &EndpointDef) -> Option<usize> {
        let c = self.client_ref();
        let negotiated = c.negotiated?;
        let learned = c.reply_sizes.get(&(endpoint.path, endpoint.op.as_u32()));
        crate::protocol::call::reply_window(endpoint, learned.copied(), &negotiated)
    }

    /// Remembers a result's size: the next call offers a window that large (none for results
    /// that travel inline).
    pub(crate) fn learn_reply_size(&mut self, endpoint: &EndpointDef, len: usize) {
        let (_, c) = self.client_side();
        let Some(negotiated) = c.negotiated else {
            return;
        };
        let size = crate::protocol::call::learned(len, &negotiated);
        c.reply_sizes
            .insert((endpoint.path, endpoint.op.as_u32()), size);
    }

    /// Sends a ping: its id, for [`poll_pong`](Self::poll_pong).
    pub(crate) fn ping(&mut self) -> std::result::Result<u64, Status> {
        let (core, c) = self.client_side();
        if let Some(status) = &c.over {
            return Err(status.clone());
        }
        let id = c.next_id;
        c.next_id += 1;
        core.send(Kind::Ping(CallId { id })).map_err(Status::from)?;
        c.pings.insert(id, Ping::default());
        Ok(id)
    }

    /// Whether ping `id` was answered (`Err` once the connection ended without a pong).
    pub(crate) fn poll_pong(
        &mut self,
        id: u64,
        cx: &Context<'_>,
    ) -> Poll<std::result::Result<(), Status>> {
        let (core, c) = self.client_side();
        let over = c.over.clone();
        let Some(ping) = c.pings.get_mut(&id) else {
            return Poll::Ready(Err(
                over.unwrap_or_else(|| Status::unavailable("connection lost"))
            ));
        };
        if ping.answered {
            c.pings.remove(&id);
            return Poll::Ready(Ok(()));
        }
        if core.phase == Phase::Closed || core.tx.is_closing() {
            c.pings.remove(&id);
            let status = core.end.as_ref().map_or_else(
                || Status::unavailable("connection lost"),
                |e| e.status.clone(),
            );
            return Poll::Ready(Err(status));
        }
        ping.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The caller of ping `id` stopped waiting.
    pub(crate) fn forget_ping(&mut self, id: u64) {
        let (_, c) = self.client_side();
        c.pings.remove(&id);
    }

    /// This client closes the connection for good: calls in flight end with
    /// `UNAVAILABLE`, and the server gets a goodbye (it counts a client that left, not a
    /// connection lost). Returns `false` if it was closed already.
    pub(crate) fn leave(&mut self) -> bool {
        let (core, c) = self.client_side();
        if core.end.is_some() && core.tx.is_closing() {
            return false;
        }
        let status = Status::unavailable("closed by this client");
        c.over = Some(status.clone());
        let open = core.phase == Phase::Open;
        let goodbye = open.then(|| Status::new(Code::Ok, "the client is leaving"));
        core.close(
            End {
                error: None,
                status,
            },
            goodbye,
        );
        core.calls_ended = true;
        c.end_calls(core);
        true
    }
}
