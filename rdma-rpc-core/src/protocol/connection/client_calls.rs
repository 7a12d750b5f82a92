//! What a client's application asks of its connection: room in the window for a call, the
//! call's request and the events it waits for, giving a call up, the write slots and result
//! windows a call may use, pings, and leaving.

use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::client::{ClientCall, ClientSettings, ClientSide, Ping, ServerEvent};
use super::handshake::stream_window;
use super::{Core, End, Handles, Negotiated, Phase};
use crate::encoded::Small;
use crate::protocol::credits::Need;
use crate::protocol::frames::{CallId, Hello, Kind, RequestFrame};
use crate::protocol::PROTOCOL_VERSION;
use crate::service::EndpointDef;
use crate::status::{Code, Status};
use crate::transport::Descriptor;

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

    /// Whether a caller that is not in line may open a call now: nobody waits for room before
    /// it and the window has room ([`poll_room`](Self::poll_room) would be ready at once).
    /// `Err` once the connection refuses calls.
    pub(crate) fn room_now(&mut self) -> std::result::Result<bool, Status> {
        let (_, c) = self.client_side();
        match &c.over {
            Some(status) => Err(status.clone()),
            None => Ok(c.room.waiting.is_empty() && c.in_flight < c.window),
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
    /// call's frames go to `stream`. A call with a `deadline` that is still waiting for the
    /// server then gets [`ServerEvent::DeadlinePassed`] from the connection's timer (see
    /// [`poll_timeout`](Self::poll_timeout) and [`set_timer_waker`](Self::set_timer_waker)).
    pub(crate) fn open_call(
        &mut self,
        stream: Option<H::Stream>,
        deadline: Option<Instant>,
    ) -> u64 {
        let (core, c) = self.client_side();
        let id = c.next_id;
        c.next_id += 1;
        c.in_flight += 1;
        c.calls.insert(id, ClientCall::new(stream, deadline));
        if deadline.is_some_and(|d| c.deadlines.add(d)) {
            // The timer must be set earlier than it is.
            core.woken.extend(c.deadlines.waker.clone());
        }
        id
    }

    /// The task that keeps the connection's timer (calls `handle_timeout` at
    /// [`poll_timeout`](Self::poll_timeout)): woken when a new call's deadline comes first.
    pub(crate) fn set_timer_waker(&mut self, waker: &Waker) {
        let (_, c) = self.client_side();
        match &c.deadlines.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => c.deadlines.waker = Some(waker.clone()),
        }
    }

    /// Sends the request of call `id`. If it cannot go (the connection ended, or the frame is
    /// larger than the server's receives), the call is forgotten: it never reached the
    /// server, so its place in the window is free again.
    pub(crate) fn send_request(
        &mut self,
        id: u64,
        request: &RequestFrame,
        small: Option<&Small>,
    ) -> crate::Result<()> {
        let (core, c) = self.client_side();
        let sent = core.send_hot(crate::protocol::hot::Hot::request_with(request, small));
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
                } else {
                    // The call goes on to other things (a grant's transfer, its stream) and
                    // is no longer waiting here: it must not be handed the connection to read
                    // (`waiting_call`) until it waits again.
                    call.waker = None;
                }
                Poll::Ready(Some(event))
            }
            None if call.over => {
                c.calls.remove(&id);
                Poll::Ready(None)
            }
            None if call.expired => {
                // The caller gives the call up (`abandon`): it stays until then.
                call.waker = None;
                Poll::Ready(Some(ServerEvent::DeadlinePassed))
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

    /// Call `id`, just sent, will wait for its first event in the task of `waker`: as
    /// [`poll_event`](Self::poll_event) finding none would (it may still find one).
    pub(crate) fn will_wait(&mut self, id: u64, waker: Waker) {
        let (_, c) = self.client_side();
        if let Some(call) = c.calls.get_mut(&id) {
            call.waker = Some(waker);
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
        call.hold(windows);
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
