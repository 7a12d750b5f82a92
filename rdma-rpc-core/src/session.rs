//! One connection's protocol state ([`protocol::connection::Connection`]) driven over a
//! transport: the only place where the two meet.
//!
//! The state sits behind one lock. Whoever changes it (a call starting, a handler answering,
//! the task that reads frames) does so through [`Session::lock`]; when the guard is released,
//! the receives the state wants are posted, the frames it hands out are sent (in order, while
//! still locked, so frames leave in the order the state decided), the tasks it woke are woken
//! (after the lock), and once the end is decided the transport is closed, after the last frame
//! (a goaway) has reached the peer when there is one. Frames that arrive are read by
//! [`Session::poll_frames`]: each is handed to the state with the time, and its receive is
//! posted again.
//!
//! On the client, calls complete where their frame lands: the task of a call waiting for its
//! response reads the connection itself, so a response wakes its own call and no other task
//! runs in between. One task at a time is the reader the transport wakes: the transport
//! always holds the same forwarding waker, which wakes the current reader (a waiting call,
//! or, when none waits, the connection's driver task); a call that is done hands the role to
//! another waiting call. A call that starts to wait while another reads, and the transport
//! has not woken that reader since it last found nothing, leaves the role where it is and
//! looks at nothing: the reader will be woken when a frame lands (with 8 calls in flight,
//! 7 of 8 waits read nothing and move no waker). When the transport did wake the reader,
//! the call reads too and takes the role, rather than rely on the reader's task being polled
//! soon. The role is handed on without a wake while the transport will give one.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::protocol::connection::{
    CallEvents, Connection as Proto, Handles, Incoming, StreamRoute,
};
use crate::protocol::frames::{Kind, MessagesFrame, ResponseFrame, UsedWindow, WindowOffer};
use crate::protocol::mailbox::{EndReason, Sender};
use crate::protocol::stream::Violation;
use crate::server::ClientEvent;
use crate::status::Status;
use crate::stream::StreamCell;
use crate::transport::{BoxFuture, Connection, Descriptor, Grant, RecvOpcode, SendData};

/// The handles the runtime gives the protocol state.
#[derive(Debug)]
pub(crate) struct Runtime;

impl Handles for Runtime {
    type Window = Grant;
    type Stream = Arc<StreamCell>;
    type ServerCall = Sender<ClientEvent>;

    fn window_len(window: &Grant) -> u64 {
        window.descriptor().len
    }
}

impl StreamRoute for Arc<StreamCell> {
    fn messages(&self, frame: MessagesFrame) -> std::result::Result<(), Violation> {
        StreamCell::messages(self, frame)
    }

    fn credit(&self, bytes: u64) -> std::result::Result<(), Violation> {
        StreamCell::credit(self, bytes)
    }

    fn offers(&self, offers: Vec<WindowOffer>) -> std::result::Result<(), Violation> {
        StreamCell::offers(self, offers)
    }

    fn used(&self, used: Vec<UsedWindow>) -> std::result::Result<(), Violation> {
        StreamCell::used(self, used)
    }

    fn respond(&self, response: ResponseFrame) {
        StreamCell::respond(self, response)
    }

    fn end(&self, status: Status) {
        StreamCell::end(self, status)
    }
}

impl CallEvents for Sender<ClientEvent> {
    fn ack(&self, window: Option<Descriptor>) {
        self.send(ClientEvent::Ack(window));
    }

    fn end(&self, reason: EndReason) {
        Sender::end(self, reason);
    }
}

/// The protocol state as the runtime holds it.
pub(crate) type State = Proto<Runtime>;

/// What the lock holds: the protocol state, and which call reads the connection (client).
/// In this order (`repr(C)`): the two small fields first, next to the lock, then the state,
/// whose hot fields come first.
#[repr(C)]
pub(crate) struct Inner {
    /// The call whose task the transport wakes now; `None`: the driver task.
    reader: Option<u64>,
    /// The instant the state last said it wants to hear of time (server), as its reader last
    /// learned it.
    timeout: Option<std::time::Instant>,
    pub(crate) proto: State,
}

/// What reading the connection came to (requests for the server's application go to the
/// reader's handler as they come).
#[derive(Debug)]
pub(crate) enum Read {
    /// The instant at which the state wants to hear of time changed (a server's handshake
    /// deadline, its idle timeout, a call's deadline): the reader sets its timer to it.
    Timer(Option<std::time::Instant>),
    /// The connection is over.
    Over,
}

/// Wakes whichever task reads the connection now (see the module docs).
#[derive(Default)]
struct Forward {
    /// The reader's waker.
    target: Mutex<Option<Waker>>,
    /// How many times the transport woke the reader: changed under `target`'s lock, so a
    /// reader set after a wake sees its count.
    wakes: AtomicU64,
}

impl Wake for Forward {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let target = {
            let target = lock(&self.target);
            // Only written under the lock: no read-modify-write needed.
            self.wakes
                .store(self.wakes.load(Ordering::Relaxed) + 1, Ordering::Release);
            target.clone()
        };
        if let Some(w) = target {
            w.wake();
        }
    }
}

/// One connection. See the module docs.
///
/// Laid out for a session that is one of many (`repr(C)`): what every call reads or writes
/// comes first, the fields of the first cache line, then the end notification and the lock
/// with the protocol state, whose own hot fields come first too (see `Inner`, `Core`,
/// `ServerSide`, `ClientSide`); what only setting up and ending a connection touch comes
/// last. Laid out by the compiler, a call touched some ten lines of a session, each a cache
/// miss when a thousand sessions take turns (`what_a_call_touches_of_a_session_is_together`).
#[repr(C)]
pub(crate) struct Session {
    transport: Arc<dyn Connection>,
    /// What the transport wakes: the current reader, through the forwarding waker (a
    /// client, whose calls read), or whoever polls (a server, whose connection task reads).
    forward_waker: Waker,
    forward: Arc<Forward>,
    /// `forward`'s count of wakes when a read last found the transport empty, leaving it the
    /// forwarding waker (`u64::MAX`: never). While no wake came since, the transport will wake
    /// whoever becomes the reader: a new reader need not be woken to look (see `hand_off`).
    armed_at: AtomicU64,
    /// Size of the peer's receives, once the handshake said (read without the lock).
    peer_max_frame: AtomicUsize,
    /// The end was decided.
    over: AtomicBool,
    /// New calls are refused (a client whose server said goodbye, a server shutting down).
    refusing: AtomicBool,
    /// A call's deadline moved the state's timer earlier: the reader hands the new instant
    /// to its loop ([`Read::Timer`]) once it is done with the request that started the call.
    timer_moved: AtomicBool,
    forwarding: bool,
    /// The transport is to be closed once the last frame is out.
    close_after_last: AtomicBool,
    /// Woken when new calls start to be refused, and when the end is decided.
    ended: tokio::sync::Notify,
    state: Mutex<Inner>,
    /// Size of this side's receives.
    max_frame: usize,
    /// The driver task's waker (client): the reader when no call waits.
    driver: Mutex<Option<Waker>>,
    /// The last frame's send, awaited (briefly) before the transport closes.
    last: Mutex<Option<BoxFuture<'static, Result<()>>>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("peer", &self.transport.peer())
            .field("over", &self.over.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Requests a server reads with one clock reading (see [`Session::poll_frames`]). With 8 calls
/// in flight, the server's read of a batch of requests costs one clock read instead of 8 (each
/// about 20 to 40 ns on the development VMs, some 2% of a small call).
const REQUESTS_PER_CLOCK: u32 = 8;

/// The time the protocol state is told: the runtime's clock (paused in tests that pause it).
pub(crate) fn now() -> std::time::Instant {
    #[cfg(test)]
    CLOCK_READS.with(|reads| reads.set(reads.get() + 1));
    tokio::time::Instant::now().into_std()
}

#[cfg(test)]
thread_local! {
    /// Reads of [`now`] on this thread: a test counts what a call costs in clock reads.
    pub(crate) static CLOCK_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Locks of a session's state ([`Session::lock`]) on this thread: a test counts them per
    /// call.
    pub(crate) static LOCKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Session {
    /// Drives `proto` over `transport`, with `receives` receives of `max_frame` bytes posted
    /// first. With `forwarding` (a client), the transport wakes the current reader (see
    /// [`set_reader`](Self::set_reader)); otherwise whoever polls [`poll_frames`](Self::poll_frames).
    pub(crate) fn new(
        transport: Arc<dyn Connection>,
        proto: State,
        max_frame: usize,
        receives: u32,
        forwarding: bool,
    ) -> Result<Arc<Session>> {
        for _ in 0..receives {
            transport.post_recv(RegisteredBuf::new(max_frame, Access::LOCAL_WRITE)?)?;
        }
        let forward = Arc::new(Forward::default());
        let session = Arc::new(Session {
            peer_max_frame: AtomicUsize::new(proto.peer_max_frame()),
            transport,
            state: Mutex::new(Inner {
                timeout: proto.poll_timeout(),
                proto,
                reader: None,
            }),
            max_frame,
            over: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            driver: Mutex::new(None),
            ended: tokio::sync::Notify::new(),
            last: Mutex::new(None),
            close_after_last: AtomicBool::new(false),
            timer_moved: AtomicBool::new(false),
            forward_waker: Waker::from(forward.clone()),
            forward,
            forwarding,
            armed_at: AtomicU64::new(u64::MAX),
        });
        // The first frame (a client's Hello) leaves now.
        drop(session.lock());
        Ok(session)
    }

    /// The state, locked; released, it sends what the state decided (see the module docs).
    pub(crate) fn lock(&self) -> Locked<'_> {
        #[cfg(test)]
        LOCKS.with(|locks| locks.set(locks.get() + 1));
        Locked {
            session: self,
            inner: Some(lock(&self.state)),
        }
    }

    /// The transport, for one-sided operations and windows.
    pub(crate) fn transport(&self) -> &Arc<dyn Connection> {
        &self.transport
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> &str {
        self.transport.peer()
    }

    /// Size of the peer's receives: no frame may be larger.
    pub(crate) fn peer_max_frame(&self) -> usize {
        self.peer_max_frame.load(Ordering::Relaxed)
    }

    /// Queues a frame.
    pub(crate) fn send(&self, kind: Kind) -> Result<()> {
        self.lock().proto.send(kind)
    }

    /// Whether new calls are refused, or the end was decided (read without the lock).
    pub(crate) fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::Acquire) || self.is_over()
    }

    /// Whether the end was decided.
    pub(crate) fn is_over(&self) -> bool {
        self.over.load(Ordering::Acquire)
    }

    /// Resolves once new calls are refused or the end is decided.
    pub(crate) async fn refused(&self) {
        self.until(Self::is_refusing).await;
    }

    /// Resolves once the end is decided (and not when new calls start to be refused: the same
    /// notification announces both, so it is checked again each time).
    pub(crate) async fn ended(&self) {
        self.until(Self::is_over).await;
    }

    async fn until(&self, done: fn(&Session) -> bool) {
        loop {
            let notified = self.ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(self) {
                return;
            }
            notified.await;
        }
    }

    /// Reads the frames that arrived, handing each to the state, until none is left
    /// (`Pending`), the state wants to hear of time at another instant, or the connection is
    /// over. A request for the server's application goes to `on_request` where it lands (by
    /// reference: what it does not take is dropped here; a request is a few hundred bytes,
    /// and each move of it is a `memcpy`). The transport wakes the current
    /// reader (see [`set_reader`](Self::set_reader)) of a forwarding session, or `cx`.
    ///
    /// Each frame spends one unit of the task's tokio budget, as tokio's own sockets do: a
    /// connection whose frames never stop arriving makes its task yield now and then.
    pub(crate) fn poll_frames(
        &self,
        cx: &mut Context<'_>,
        on_request: &mut dyn FnMut(&mut Incoming<Runtime>, &mut Context<'_>),
    ) -> Poll<Read> {
        let waker = if self.forwarding {
            &self.forward_waker
        } else {
            cx.waker()
        };
        let mut recv_cx = Context::from_waker(waker);
        // The clock is read at most once for the frames that land together, as quinn-proto
        // does for a batch of datagrams, and again after every `REQUESTS_PER_CLOCK` requests
        // handed over (their handlers may have run inline: a frame read after them is dated
        // no more than that many handlers' synchronous work early); only when the state asks
        // (a client's never does).
        let mut clock = None;
        let mut requests = 0;
        loop {
            if self.is_over() {
                let locked = self.lock();
                // A draining end reads on: its last frames wait for the peer's credits.
                if locked.proto.end().is_some() && !locked.proto.is_draining() {
                    return Poll::Ready(Read::Over);
                }
            }
            let budget = std::task::ready!(tokio::task::coop::poll_proceed(cx));
            let wakes = self.forward.wakes.load(Ordering::Acquire);
            let completion = match self.transport.poll_recv(&mut recv_cx) {
                Poll::Pending => {
                    if self.forwarding {
                        self.armed_at.store(wakes, Ordering::Release);
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    self.transport.close();
                    self.lock().proto.handle_lost(e);
                    return Poll::Ready(Read::Over);
                }
                Poll::Ready(Ok(c)) => c,
            };
            budget.made_progress();
            let mut locked = self.lock();
            if completion.opcode != RecvOpcode::Send {
                locked.proto.handle_malformed(format!(
                    "expected a control frame, got {:?}",
                    completion.opcode
                ));
                if let Some(at) = self.new_timeout(&mut locked) {
                    return Poll::Ready(Read::Timer(at));
                }
                continue;
            }
            // Written where it is kept, and handed over by reference: each move of a request
            // is a `memcpy` of a few hundred bytes.
            let mut incoming = None;
            locked.proto.handle_datagram_into(
                completion.buf.as_slice(),
                || *clock.get_or_insert_with(now),
                &mut incoming,
            );
            if self.transport.post_recv(completion.buf).is_ok() {
                locked.proto.reposted();
            }
            let timer = self.new_timeout(&mut locked);
            drop(locked);
            if let Some(incoming) = incoming.as_mut() {
                on_request(incoming, cx);
                requests += 1;
                if requests % REQUESTS_PER_CLOCK == 0 {
                    clock = None;
                }
                // The call it started may have a deadline before the timer.
                if self.timer_moved.load(Ordering::Relaxed)
                    && self.timer_moved.swap(false, Ordering::AcqRel)
                {
                    return Poll::Ready(Read::Timer(self.timeout()));
                }
            }
            if let Some(at) = timer {
                return Poll::Ready(Read::Timer(at));
            }
        }
    }

    /// The instant at which the state wants to hear of time, if it changed (and this session
    /// reports it: a forwarding one does not).
    fn new_timeout(&self, locked: &mut Locked<'_>) -> Option<Option<std::time::Instant>> {
        let timer = (!self.forwarding)
            .then(|| locked.proto.poll_timeout())
            .filter(|&at| at != locked.timeout);
        if let Some(at) = timer {
            locked.timeout = at;
        }
        timer
    }

    /// The instant at which the state wants to hear of time now (see [`Read::Timer`]).
    pub(crate) fn timeout(&self) -> Option<std::time::Instant> {
        let mut locked = self.lock();
        let at = locked.proto.poll_timeout();
        locked.timeout = at;
        at
    }

    /// Makes `waker` the one the transport wakes (the reader), as call `id` (`None`: the
    /// driver task).
    pub(crate) fn set_reader(&self, inner: &mut Inner, id: Option<u64>, waker: &Waker) {
        inner.reader = id;
        let mut target = lock(&self.forward.target);
        match &*target {
            Some(w) if w.will_wake(waker) => {}
            _ => *target = Some(waker.clone()),
        }
    }

    /// Whether a call other than `id` reads the connection now and the transport will wake it
    /// when a frame lands (a read found the transport empty since its last wake): call `id`
    /// need not read, nor become the reader. When the transport already woke the reader,
    /// `id` reads too rather than rely on the reader's task being polled soon.
    pub(crate) fn another_reads(&self, inner: &Inner, id: u64) -> bool {
        inner.reader.is_some_and(|r| r != id) && self.armed()
    }

    /// The driver task reads the connection when no call does: `waker` is its waker.
    pub(crate) fn set_driver(&self, inner: &mut Inner, waker: &Waker) {
        {
            let mut driver = lock(&self.driver);
            match &*driver {
                Some(w) if w.will_wake(waker) => {}
                _ => *driver = Some(waker.clone()),
            }
        }
        if inner.reader.is_none() {
            self.set_reader(inner, None, waker);
        }
    }

    /// Call `id` no longer reads the connection (it is done, or gone): the role goes to
    /// another waiting call, or to the driver; either is woken to read whatever may have
    /// arrived meanwhile, unless the transport is known to wake it when something does (a
    /// read found it empty, and it woke nobody since): a wake then would be a poll of a task
    /// for nothing.
    pub(crate) fn hand_off(&self, inner: &mut Inner, id: u64) {
        if inner.reader != Some(id) {
            return;
        }
        let next = inner
            .proto
            .waiting_call(id)
            .map(|(next, waker)| (Some(next), waker))
            .or_else(|| lock(&self.driver).clone().map(|w| (None, w)));
        match next {
            Some((next, waker)) => {
                self.set_reader(inner, next, &waker);
                // After `set_reader`: a wake the old reader got is counted by now.
                if !self.armed() {
                    waker.wake();
                }
            }
            None => inner.reader = None,
        }
    }

    /// Whether the transport holds the forwarding waker and has not used it since (see
    /// `armed_at`).
    fn armed(&self) -> bool {
        self.armed_at.load(Ordering::Acquire) == self.forward.wakes.load(Ordering::Acquire)
    }

    /// Waits (at most `patience`) for the last frame to reach the peer, then closes the
    /// transport: for whoever ends a connection that said goodbye.
    pub(crate) async fn finish(&self, patience: Duration) {
        let last = lock(&self.last).take();
        if let Some(last) = last {
            let _ = tokio::time::timeout(patience, last).await;
        }
        if self.close_after_last.swap(false, Ordering::AcqRel) || self.is_over() {
            self.transport.close();
            self.lock().proto.closed();
        }
    }

    /// Ends the connection now (the runtime gives up on it): calls in flight end with
    /// `error`, the transport closes.
    pub(crate) fn abort(&self, error: Error) {
        self.transport.close();
        self.lock().proto.handle_lost(error);
    }
}

/// The state, locked. See [`Session::lock`].
pub(crate) struct Locked<'a> {
    session: &'a Session,
    inner: Option<MutexGuard<'a, Inner>>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        self.inner.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        self.inner.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let Some(mut inner) = self.inner.take() else {
            return;
        };
        if inner.proto.is_quiet() {
            return; // nothing to post, send, wake or look at: the common release
        }
        let session = self.session;
        let transport = &session.transport;
        let proto = &mut inner.proto;
        for _ in 0..proto.take_receives() {
            let posted = RegisteredBuf::new(session.max_frame, Access::LOCAL_WRITE)
                .and_then(|buf| transport.post_recv(buf));
            if posted.is_ok() {
                proto.grew();
            }
        }
        while let Some(t) = proto.poll_transmit() {
            if t.last {
                let last = SendData::Bytes(bytes::Bytes::copy_from_slice(t.frame));
                *lock(&session.last) = Some(transport.send(last, None));
            } else if let Err(e) = transport.send_frame(t.frame) {
                // A failure puts the connection in error, which the reader sees.
                tracing::debug!(peer = transport.peer(), error = %e, "frame not sent");
            }
        }
        if proto.take_timer_moved() {
            session.timer_moved.store(true, Ordering::Release);
        }
        let mut newly_refusing = false;
        let mut close_now = false;
        let mut over = false;
        if proto.take_notice() {
            session
                .peer_max_frame
                .store(proto.peer_max_frame(), Ordering::Relaxed);
            let refusing = proto.is_refusing();
            newly_refusing = refusing && !session.refusing.swap(refusing, Ordering::AcqRel);
            over = proto.end().is_some();
        }
        if proto.should_close() {
            proto.closed();
            close_now = true;
        }
        let woken = proto.take_woken();
        drop(inner);
        woken.wake();
        if newly_refusing {
            session.ended.notify_waiters();
        }
        if over && !session.over.swap(true, Ordering::AcqRel) {
            session.ended.notify_waiters();
            // Whoever reads the connection learns of the end.
            session.forward_waker.wake_by_ref();
        }
        if close_now {
            if lock(&session.last).is_some() {
                session.close_after_last.store(true, Ordering::Release);
            } else {
                transport.close();
            }
        }
    }
}

impl std::fmt::Debug for Locked<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::{Inner, Session, State};
    use crate::protocol::connection::{ClientSettings, ServerSettings};

    /// Where the protocol state starts in a session: after the session's own fields of the
    /// first line, the end notification and the lock (measured on a lock holding `state`).
    fn state_offset(state: State) -> usize {
        let lock = Mutex::new(Inner {
            reader: None,
            timeout: None,
            proto: state,
        });
        let held = lock.lock().unwrap();
        let proto = &held.proto as *const State as usize - &lock as *const _ as usize;
        offset_of!(Session, state) + proto
    }

    /// What every call reads or writes of a session, on either side, lies in its first few
    /// cache lines: with a thousand sessions taking turns, each line is a miss per call.
    /// Laid out by the compiler, a server's request touched fields 1 KB apart.
    #[test]
    fn what_a_call_touches_of_a_session_is_together() {
        assert!(
            offset_of!(Session, close_after_last) < 64,
            "the session's own hot fields share its first line"
        );
        let server = State::server(
            ServerSettings {
                idle_timeout: Some(Duration::from_secs(60)),
                max_in_flight: 64,
                inline_threshold: 1024,
                max_frame: 16 << 10,
                initial_receives: 8,
                recv_credits: 64,
                pull_writes: false,
                stream_window: 1 << 20,
                token: 1,
                write_slots: 0,
                handshake_timeout: Duration::from_secs(5),
                max_pings_per_second: 0,
                refusal: None,
            },
            Arc::from("client"),
            Instant::now(),
        );
        let client = State::client(
            ClientSettings {
                max_frame: 16 << 10,
                initial_receives: 8,
                recv_credits: 64,
                max_in_flight: 64,
                inline_threshold: 1024,
                stream_window: 1 << 20,
                token: 2,
            },
            Arc::from("server"),
        );
        // 544 bytes for a server and 704 for a client when this was written (three of the
        // client's lines are its call in flight); with the compiler's layout the hot fields
        // of either side spanned more than 1,100 bytes.
        for (side, state, most) in [("server", server, 9 * 64), ("client", client, 11 * 64)] {
            let hot = state.hot_bytes();
            let span = state_offset(state) + hot;
            assert!(
                span <= most,
                "a {side} call touches the first {span} bytes of its session (at most {most})"
            );
        }
    }
}
