//! One side of a connection as state without I/O, in the manner of quinn-proto's
//! `Connection`: everything the protocol decides about a connection lives here, and nothing
//! here touches a transport, a runtime or a lock.
//!
//! It owns the handshake, the credits and the frames waiting for them, the receives to add as
//! the connection gets busy, the calls in flight (the client's window and the events each call
//! waits for; the server's admission, in-flight limit and refusals), the server's write slots,
//! remote buffers both ways (offers, their revocation, the uses of the peer's), the routing of
//! stream frames, pings, goaways, the server's idle timeout and draining, the calls' deadlines
//! on both sides (one timer per connection for all of them), and every decision to end the
//! connection over what the peer sent.
//!
//! What goes in: received frames ([`handle_datagram_into`](Connection::handle_datagram_into), with the
//! time when the side needs it), the fact that a receive was re-posted or added, the
//! transport's failure ([`handle_lost`](Connection::handle_lost)), time
//! ([`handle_timeout`](Connection::handle_timeout)), and what the application asks for (start
//! a call, answer one, offer memory, ping, leave).
//! What comes out: frames to send ([`poll_transmit`](Connection::poll_transmit)), receives to
//! post ([`take_receives`](Connection::take_receives)), requests for the server's application
//! (written where the caller keeps them by `handle_datagram_into`), calls to wake ([`take_woken`](Connection::take_woken)), the
//! next instant it must be told about ([`poll_timeout`](Connection::poll_timeout)), and the
//! end ([`should_close`](Connection::should_close), [`end`](Connection::end)).
//!
//! `crate::session` drives one of these per connection over a transport; the simulation in
//! `protocol::sim` drives two of them through a simulated link.
//!
//! Files: `transmit.rs` (the send queue and credits), `handshake.rs` (what each side announces
//! and accepts), `client.rs` and `server.rs` (each side as the peer's frames move it),
//! `client_calls.rs` and `server_calls.rs` (what each side's application asks of it),
//! `offers.rs` (remote buffers), `scratch.rs` (the memory frames pass through, the thread's
//! rather than each connection's). Its behaviour is proven by `protocol::sim`.

mod client;
mod client_calls;
pub(crate) mod handshake;
mod offers;
mod scratch;
mod server;
mod server_calls;
mod transmit;

pub(crate) use client::{ClientSettings, ServerEvent};
pub(crate) use handshake::Negotiated;
pub(crate) use server::{Admitted, Incoming, ServerSettings};
pub(crate) use transmit::Transmit;

use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use super::codec::Decoder;
use super::credits::{Credits, Need};
use super::frames::{Kind, MessagesFrame, ResponseFrame, StatusFrame, UsedWindow, WindowOffer};
use super::mailbox::EndReason;
use super::stream::Violation;
use crate::error::{Error, Result};
use crate::status::Status;
use crate::transport::Descriptor;

/// The types the runtime gives the protocol state to hold (the simulation gives its own).
pub(crate) trait Handles: 'static {
    /// A window of this side's memory exposed to the peer (the transport's `Grant`): the
    /// server's write slots, the windows of a call the client gave up on (kept until the
    /// server's response). Dropping it takes the window down.
    type Window: Send + std::fmt::Debug + 'static;
    /// Bytes a window spans.
    fn window_len(window: &Self::Window) -> u64;
    /// A streaming call's streams, fed the peer's stream frames.
    type Stream: StreamRoute + std::fmt::Debug;
    /// Where the client's frames about one server call go (its acks, its end).
    type ServerCall: CallEvents + std::fmt::Debug;
}

/// A streaming call's streams, as the connection routes the peer's frames to them. The rules
/// they check are `protocol::stream`'s; a [`Violation`] ends the connection.
pub(crate) trait StreamRoute {
    /// The peer's `Messages` frame.
    fn messages(&self, frame: MessagesFrame) -> std::result::Result<(), Violation>;
    /// The peer's `Credit` frame.
    fn credit(&self, bytes: u64) -> std::result::Result<(), Violation>;
    /// Windows the client offers (server side).
    fn offers(&self, offers: Vec<WindowOffer>) -> std::result::Result<(), Violation>;
    /// Windows the server is done with (client side).
    fn used(&self, used: Vec<UsedWindow>) -> std::result::Result<(), Violation>;
    /// The call's response (client side): its streams end with it.
    fn respond(&self, response: ResponseFrame);
    /// The call is over with `status`: whatever waits on its streams stops.
    fn end(&self, status: Status);
}

/// Where the client's frames about one server call go.
pub(crate) trait CallEvents {
    /// The client's `Ack`: its transfer is done, or (after a grant that asked for a buffer)
    /// the window for the result.
    fn ack(&self, window: Option<Descriptor>);
    /// The call ends early: the client cancelled it, or its connection ended.
    fn end(&self, reason: EndReason);
}

/// How the connection ended.
#[derive(Debug)]
pub(crate) struct End {
    /// `None` when it ended as it should (this side shut down or left, the server closed an
    /// idle connection, the peer said goodbye); otherwise why it failed.
    pub(crate) error: Option<Error>,
    /// What calls still waiting, and new ones, are told.
    pub(crate) status: Status,
}

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the peer's handshake.
    Handshake,
    /// Calls may run.
    Open,
    /// The end was decided; the last frames are leaving.
    Closing,
    /// The transport is closed (or failed).
    Closed,
}

/// The connection's one timer for its calls' deadlines (as quinn-proto keeps one per
/// connection rather than one per stream), on either side. A call's deadline costs it a
/// comparison; the timer is set again only when it fires, or when a call's deadline comes
/// before it (the first call after a quiet spell). A tokio timer per call cost about 350 ns
/// on the development VM, where a small call takes 2 to 2.6 µs.
#[derive(Debug, Default)]
pub(super) struct DeadlineTimer {
    /// No call that waits has a deadline before this instant; `None`: no call has one.
    pub(super) at: Option<Instant>,
    /// The task that keeps a client's timer, woken when `at` moves earlier (a server's
    /// connection loop learns it from [`Connection::take_timer_moved`]).
    pub(super) waker: Option<Waker>,
}

impl DeadlineTimer {
    /// A call with `deadline` started: whether the timer must be set earlier for it.
    pub(super) fn add(&mut self, deadline: Instant) -> bool {
        let earlier = self.at.is_none_or(|at| deadline < at);
        if earlier {
            self.at = Some(deadline);
        }
        earlier
    }

    /// Whether the timer is due at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.at.is_some_and(|at| at <= now)
    }

    /// Time passed: if the timer is due, `passed` is given each call whose deadline
    /// (`waiting`: `None` for a call not waiting any more) is `now` or earlier, and the timer
    /// is set to the earliest deadline left.
    pub(super) fn expire<'a, C: 'a>(
        &mut self,
        now: Instant,
        calls: impl Iterator<Item = &'a mut C>,
        waiting: impl Fn(&C) -> Option<Instant>,
        mut passed: impl FnMut(&mut C),
    ) {
        if !self.due(now) {
            return;
        }
        let mut next = None;
        for call in calls {
            match waiting(call) {
                Some(deadline) if deadline <= now => passed(call),
                Some(deadline) => next = earliest(next, Some(deadline)),
                None => {}
            }
        }
        self.at = next;
    }
}

/// The earlier of two instants the state must hear of.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Tasks to wake once the state is unlocked: nearly always one.
#[derive(Debug, Default)]
pub(crate) struct Woken {
    first: Option<Waker>,
    more: Vec<Waker>,
}

impl Woken {
    pub(crate) fn push(&mut self, waker: Waker) {
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.more.push(waker);
        }
    }

    pub(crate) fn extend(&mut self, waker: Option<Waker>) {
        if let Some(w) = waker {
            self.push(w);
        }
    }

    /// Wakes them all (after the lock is released).
    pub(crate) fn wake(self) {
        if let Some(w) = self.first {
            w.wake();
        }
        self.more.into_iter().for_each(Waker::wake);
    }
}

/// What both sides share: the frames going out, the frames coming in, remote buffers, the
/// wake-ups owed, and the end.
///
/// In this order (`repr(C)`): what every frame and every call read or write first; then the
/// end, boxed (set once per connection, inline it would put 100 cold bytes among the hot
/// ones); then the remote buffers, whose one hot field (the confirmations owed) comes first
/// in them; last the peer's address, which only messages use.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Core {
    pub(crate) tx: transmit::Transmits,
    woken: Woken,
    /// Size of the peer's receives (from its handshake; until then the smallest any build
    /// posts).
    peer_max_frame: usize,
    /// Receives to add (the connection got busier).
    to_post: u32,
    /// The last frame received said its sender was starved (receives grow only then).
    peer_starved: bool,
    /// The calls in flight were ended (once the end was decided).
    calls_ended: bool,
    /// Something the driver must look at changed (the handshake finished, new calls started
    /// to be refused, the end was decided): see [`Connection::is_quiet`].
    notice: bool,
    /// A server call's deadline comes before the timer: see
    /// [`Connection::take_timer_moved`].
    timer_moved: bool,
    phase: Phase,
    end: Option<Box<End>>,
    pub(crate) remote: offers::RemoteBuffers,
    /// The peer's address, for messages.
    peer: Arc<str>,
}

impl Core {
    fn new(peer: Arc<str>, credits: Credits, token: u64) -> Core {
        Core {
            tx: transmit::Transmits::new(credits),
            peer,
            peer_max_frame: super::FRAME_OVERHEAD * 2,
            phase: Phase::Handshake,
            remote: offers::RemoteBuffers::new(token),
            to_post: 0,
            peer_starved: false,
            woken: Woken::default(),
            end: None,
            calls_ended: false,
            notice: false,
            timer_moved: false,
        }
    }

    /// Queues an ordinary frame (it never takes the peer's last receive).
    pub(crate) fn send(&mut self, kind: Kind) -> Result<()> {
        self.queue(&kind, Need::Ordinary)
    }

    /// [`send`](Self::send) for a request or a response, encoded from where the caller keeps
    /// it.
    pub(crate) fn send_hot(&mut self, hot: crate::protocol::hot::Hot<'_>) -> Result<()> {
        if !self.open() {
            return Err(self.closed_error());
        }
        self.tx.queue_hot(hot, self.peer_max_frame)
    }

    fn queue(&mut self, kind: &Kind, need: Need) -> Result<()> {
        if !self.open() {
            return Err(self.closed_error());
        }
        self.tx.queue(kind, need, self.peer_max_frame)
    }

    /// Whether frames may still be queued.
    fn open(&self) -> bool {
        !self.tx.is_closing() && self.phase != Phase::Closed
    }

    /// The error an operation on a connection that ended gets.
    pub(crate) fn closed_error(&self) -> Error {
        Error::ConnectionClosed {
            peer: self.peer.to_string(),
            reason: self
                .end
                .as_ref()
                .map_or_else(|| "closed".into(), |e| e.status.message().to_owned()),
        }
    }

    /// The connection is over for `end`: `last` (a goaway) leaves after what is queued, if a
    /// credit allows it; then the transport is closed ([`Connection::should_close`]). What
    /// cannot go at once is dropped.
    fn close(&mut self, end: End, last: Option<Status>) {
        self.close_with(end, last, false);
    }

    /// The connection is over for `end`, which loses nothing: what is queued (a server's last
    /// answers) goes as the peer's credits come back, then `last`; the peer's frames are read
    /// for their credits until then ([`Connection::is_draining`]). The driver bounds how long
    /// it waits for them.
    fn close_draining(&mut self, end: End, last: Status) {
        self.close_with(end, Some(last), true);
    }

    fn close_with(&mut self, end: End, last: Option<Status>, drain: bool) {
        if self.end.is_some() {
            return;
        }
        let last = last.map(|s| Kind::Goaway(StatusFrame::from(&s)));
        self.tx.close(last, self.peer_max_frame, drain);
        self.end = Some(Box::new(end));
        self.notice = true;
        if self.phase != Phase::Closed {
            self.phase = Phase::Closing;
        }
    }

    /// The peer broke the protocol: the connection ends with that error, after a goaway that
    /// tells the peer why when `tell` (the server does; a client just leaves).
    fn violation(&mut self, reason: impl Into<String>, tell: bool) {
        let error = Error::Protocol {
            peer: self.peer.to_string(),
            reason: reason.into(),
        };
        let status = Status::internal(format!("protocol violation: {}", reason_of(&error)));
        let goaway = tell.then(|| Status::invalid_argument(error.to_string()));
        self.close(
            End {
                error: Some(error),
                status,
            },
            goaway,
        );
    }

    /// Takes in the peer's handshake (`hello`, of which `spent` credits were used already):
    /// the size and number of its receives, and its token for remote buffers.
    fn peer_handshake(&mut self, hello: &super::frames::Hello, spent: u32) {
        let receives = handshake::PeerReceives::of(hello, spent);
        self.peer_max_frame = receives.max_frame;
        let ignored = self
            .tx
            .credits
            .handshake(receives.usable, receives.announced);
        if ignored > 0 {
            tracing::debug!(peer = %self.peer, ignored, "the peer announced more credits than it may");
        }
        self.remote.handshake(hello.token);
    }

    pub(crate) fn wake(&mut self, waker: Option<Waker>) {
        self.woken.extend(waker);
    }
}

/// The reason part of a protocol error.
fn reason_of(e: &Error) -> String {
    match e {
        Error::Protocol { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// Which side this is, with its own state.
#[derive(Debug)]
enum Side<H: Handles> {
    Client(client::ClientSide<H>),
    Server(server::ServerSide<H>),
}

/// One side of a connection. See the module docs.
#[repr(C)]
pub(crate) struct Connection<H: Handles> {
    pub(crate) core: Core,
    side: Side<H>,
}

impl<H: Handles> std::fmt::Debug for Connection<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.core.peer)
            .field("phase", &self.core.phase)
            .field("queued", &self.core.tx.queued())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl<H: Handles> Connection<H> {
    /// Bytes from the start of this state to the end of the last field every call reads or
    /// writes on this side (the `repr(C)` orders of `Core`, `ServerSide` and `ClientSide`):
    /// for a server the limits of its settings that a request is checked against, for a
    /// client its calls in flight, the first of them inline.
    pub(crate) fn hot_bytes(&self) -> usize {
        let start = self as *const Self as usize;
        let end = match &self.side {
            Side::Server(s) => {
                let limits = &s.settings.inline_threshold;
                limits as *const u32 as usize + std::mem::size_of_val(limits)
            }
            Side::Client(c) => {
                let calls = &c.calls;
                calls as *const crate::protocol::CallMap<client::ClientCall<H>> as usize
                    + std::mem::size_of_val(calls)
            }
        };
        end - start
    }
}

impl<H: Handles> Connection<H> {
    /// Handles a received frame's bytes (the receive they came in is the caller's to re-post:
    /// [`reposted`](Self::reposted)). A request for the server's application comes back;
    /// everything else is handled here. (See [`handle_datagram_into`](Self::handle_datagram_into).)
    #[cfg(test)]
    pub(crate) fn handle_datagram(
        &mut self,
        bytes: &[u8],
        now: impl FnOnce() -> Instant,
    ) -> Option<Incoming<H>> {
        let mut incoming = None;
        self.handle_datagram_into(bytes, now, &mut incoming);
        incoming
    }

    /// Handles a received frame's bytes (the receive they came in is the caller's to re-post:
    /// [`reposted`](Self::reposted)). A request for the server's application is put in
    /// `incoming` (which the caller left `None`: a request is a few hundred bytes, and each
    /// move of it a `memcpy`, so it is written where the caller keeps it); everything else is
    /// handled here.
    ///
    /// `now` gives the time, and is called only by a side that needs it: a server dates every
    /// frame (its idle timer, a request's deadline), a client none, so its reads cost no clock
    /// read (about 40 ns on the development VM, a fiftieth of a small call).
    pub(crate) fn handle_datagram_into(
        &mut self,
        bytes: &[u8],
        now: impl FnOnce() -> Instant,
        incoming: &mut Option<Incoming<H>>,
    ) {
        // The block the bytes are copied into and the frame they are decoded into are the
        // thread's (see `scratch`): the same few cache lines for every connection.
        scratch::with_decode(|scratch| {
            let frame = match self.side {
                Side::Client(_) => &mut scratch.client,
                Side::Server(_) => &mut scratch.server,
            };
            self.handle_decoded(bytes, now, incoming, &mut scratch.decoder, frame);
        });
    }

    #[inline(always)]
    fn handle_decoded(
        &mut self,
        bytes: &[u8],
        now: impl FnOnce() -> Instant,
        incoming: &mut Option<Incoming<H>>,
        decoder: &mut Decoder,
        frame: &mut super::frames::Frame,
    ) {
        if matches!(self.core.phase, Phase::Closing | Phase::Closed) {
            // What still arrives after the end changes nothing, but the credits it returns
            // while a draining end waits for them.
            if self.is_draining() && decoder.decode_into(bytes, frame).is_ok() && frame.credits > 0
            {
                self.core.tx.credits.returned(frame.credits);
            }
            return;
        }
        let Connection { core, side } = self;
        if let Err(reason) = decoder.decode_into(bytes, frame) {
            let tell = matches!(side, Side::Server(_));
            core.violation(reason, tell);
            self.after();
            return;
        }
        if frame.credits > 0 {
            let ignored = core.tx.credits.returned(frame.credits);
            if ignored > 0 {
                tracing::debug!(
                    peer = %core.peer,
                    ignored,
                    "the peer returned more credits than receives it announced; ignored"
                );
            }
        }
        // Receives grow only when the peer says it waited for a credit: an idle connection, or
        // one with a call at a time, keeps its initial receives.
        core.peer_starved = frame.starved;
        let open = core.phase == Phase::Open;
        match (side, frame.kind.as_mut()) {
            (_, None) => return, // a credit update
            // The frames of every call, handled in place (the frame stays for the next one).
            (Side::Server(server), Some(Kind::Request(request))) if open => {
                server.admit(core, request, now(), incoming);
            }
            (Side::Client(client), Some(Kind::Response(response))) if open => {
                client.on_response(core, response);
            }
            (Side::Client(client), Some(_)) => {
                let kind = frame.kind.take().expect("a kind was seen");
                client.handle(core, kind);
            }
            (Side::Server(server), Some(_)) => {
                let kind = frame.kind.take().expect("a kind was seen");
                *incoming = server.handle(core, kind, now());
            }
        }
        self.after();
    }

    /// Once the end is decided, every call in flight ends with it.
    fn after(&mut self) {
        if self.core.end.is_some() && !self.core.calls_ended {
            self.end_calls();
        }
    }

    /// What arrived is not a frame at all (a transport completion of the wrong kind): the
    /// connection ends as for a malformed frame.
    pub(crate) fn handle_malformed(&mut self, reason: String) {
        let tell = matches!(self.side, Side::Server(_));
        self.core.violation(reason, tell);
        self.after();
    }

    /// The receive of the frame just handled was posted again: the peer gets its credit back.
    /// If the frame said its sender was starved, the receives double (up to `recv_credits`)
    /// and their credits go to the peer at once.
    pub(crate) fn reposted(&mut self) {
        let core = &mut self.core;
        if std::mem::take(&mut core.peer_starved) {
            let growth = core.tx.credits.growth(core.to_post);
            if growth > 0 {
                core.to_post += growth;
                core.tx.peer_starved();
            }
        }
        core.tx.reposted();
    }

    /// Receives to add now (each one posted is reported with [`grew`](Self::grew)).
    pub(crate) fn take_receives(&mut self) -> u32 {
        std::mem::take(&mut self.core.to_post)
    }

    /// One more receive was posted: the peer gets a credit for it with the next frame.
    pub(crate) fn grew(&mut self) {
        self.core.tx.credits.grew();
    }

    /// The next frame to send, if one may go now.
    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit<'_>> {
        let core = &mut self.core;
        if core.tx.queued() == 0 && !core.tx.is_closing() {
            // Confirmations of the peer's revocations go after the frames queued before them.
            if let Some(kind) = core.remote.confirmations(core.peer_max_frame) {
                let _ = core.tx.queue(&kind, Need::Ordinary, core.peer_max_frame);
            }
        }
        core.tx.poll(core.peer_max_frame)
    }

    /// Tasks to wake, taken (wake them once the state is unlocked).
    pub(crate) fn take_woken(&mut self) -> Woken {
        std::mem::take(&mut self.core.woken)
    }

    /// Whether there is nothing for the driver to do: no receive to post, no frame to send,
    /// nobody to wake, nothing changed that it must look at (see [`take_notice`]). Checked on
    /// every release of the state, so it must stay cheap.
    ///
    /// [`take_notice`]: Self::take_notice
    pub(crate) fn is_quiet(&self) -> bool {
        let core = &self.core;
        core.to_post == 0
            && !core.tx.has_output()
            && core.woken.first.is_none()
            && !core.notice
            && !core.timer_moved
            && !core.remote.owes()
    }

    /// Whether a new call's deadline moved [`poll_timeout`](Self::poll_timeout) earlier since
    /// this was last asked (a server's: its connection loop sets its timer again).
    pub(crate) fn take_timer_moved(&mut self) -> bool {
        std::mem::take(&mut self.core.timer_moved)
    }

    /// Whether something the driver must look at changed since it last asked (the handshake
    /// finished, new calls started to be refused, the end was decided).
    pub(crate) fn take_notice(&mut self) -> bool {
        std::mem::take(&mut self.core.notice)
    }

    /// Whether the transport should be closed now: the end was decided and every frame that
    /// could still go has been handed out.
    pub(crate) fn should_close(&self) -> bool {
        self.core.phase == Phase::Closing && self.core.tx.queued() == 0 && !self.is_draining()
    }

    /// Whether the end was decided and drains: frames still wait for the peer's credits, so
    /// the peer's frames are still read (for nothing else). The driver gives up after a while
    /// ([`handle_lost`](Self::handle_lost)).
    pub(crate) fn is_draining(&self) -> bool {
        self.core.phase == Phase::Closing && self.core.tx.is_draining()
    }

    /// The transport was closed (or failed): nothing goes out any more.
    pub(crate) fn closed(&mut self) {
        self.core.phase = Phase::Closed;
    }

    /// The transport failed (or the peer closed it): the connection is over, with `error`
    /// unless it had already ended for another reason.
    pub(crate) fn handle_lost(&mut self, error: Error) {
        let status = match &self.side {
            Side::Client(_) => Status::unavailable(format!("connection lost: {error}")),
            Side::Server(_) => Status::unavailable(error.to_string()),
        };
        self.core.close(
            End {
                error: Some(error),
                status,
            },
            None,
        );
        self.core.phase = Phase::Closed;
        self.after();
    }

    /// How the connection ended, once it did.
    pub(crate) fn end(&self) -> Option<&End> {
        self.core.end.as_deref()
    }

    /// Whether the handshake is done (and the connection not over).
    pub(crate) fn is_open(&self) -> bool {
        self.core.phase == Phase::Open
    }

    /// The next instant at which [`handle_timeout`](Self::handle_timeout) must be called.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.side {
            Side::Client(client) => client.deadlines.at,
            Side::Server(server) => earliest(server.poll_timeout(&self.core), server.deadlines.at),
        }
    }

    /// Time passed: calls' deadlines may have passed, a server's handshake be late or its
    /// connection idle.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let Connection { core, side, .. } = self;
        match side {
            Side::Server(server) => {
                server.expire(now);
                server.handle_timeout(core, now);
            }
            Side::Client(client) => client.expire(core, now),
        }
        self.after();
    }

    /// Ends every call still in flight: the connection is over.
    fn end_calls(&mut self) {
        self.core.calls_ended = true;
        let Connection { core, side, .. } = self;
        core.remote.end(&mut core.woken);
        match side {
            Side::Client(client) => client.end_calls(core),
            Side::Server(server) => server.end_calls(),
        }
    }

    /// Calls in flight: on a client, sent and not answered; on a server, started and not
    /// answered.
    pub(crate) fn calls_in_flight(&self) -> usize {
        match &self.side {
            Side::Client(c) => c.in_flight(),
            Side::Server(s) => s.in_flight(),
        }
    }

    /// Size of the peer's receives: no frame this side sends may be larger.
    pub(crate) fn peer_max_frame(&self) -> usize {
        self.core.peer_max_frame
    }

    /// Queues an ordinary frame.
    pub(crate) fn send(&mut self, kind: Kind) -> Result<()> {
        self.core.send(kind)
    }
}
