//! One server connection: its session (`crate::session`, over the protocol state of
//! `protocol::connection`), the loop that reads its frames and starts the calls the state
//! admits, and its end. What a call does is in `call.rs`; what the connection decides (the
//! handshake, admission, refusals, pings, idle, draining, frames a client must not send) is
//! the state's.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::call::{self, error_response, ClientEvent};
use super::share::PoolShares;
use super::slots::Slots;
use super::spare::Spare;
use super::start::start_call;
use super::waited::{poll_call, Entry, Inline, LocalCalls, Waited};
use super::Shared;
use crate::error::Error;
use crate::observe::logs::{self, Ending};
use crate::protocol::connection::{Connection as Proto, Incoming, Negotiated, ServerSettings};
use crate::protocol::mailbox::Mailbox;
use crate::remote::RemoteMemory;
use crate::service::{CallConn, HasCallConn};
use crate::session::{now, Read, Runtime, Session};
use crate::status::Status;
use crate::transport::{Connection, Fencing, Grant};

/// Receives a refused client's Hello may use: two of 1 KiB (a Hello is tens of bytes).
const REFUSAL_FRAME: usize = 1024;
/// Longest a refused client may take to send its Hello.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);
/// Longest wait for the client to receive the last frames before the connection closes.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// What the server announces and enforces on a connection over `conn`.
fn settings(shared: &Shared, conn: &dyn Connection) -> ServerSettings {
    let cfg = &shared.config;
    ServerSettings {
        max_frame: cfg.max_frame,
        initial_receives: initial_receives(shared),
        recv_credits: cfg.recv_credits,
        max_in_flight: cfg.max_in_flight,
        inline_threshold: cfg.inline_threshold,
        // Pull by default where a granted pool buffer could not be fenced off again.
        pull_writes: cfg
            .pull_writes
            .unwrap_or(conn.fencing() == Fencing::Unfenced),
        stream_window: cfg.stream_window,
        token: crate::remote::new_token(),
        write_slots: cfg.write_slots,
        handshake_timeout: cfg.handshake_timeout,
        idle_timeout: cfg.idle_timeout,
        max_pings_per_second: cfg.max_pings_per_second,
        refusal: None,
    }
}

/// Receives posted when a connection opens (the rest come as it gets busy).
fn initial_receives(shared: &Shared) -> u32 {
    shared
        .config
        .initial_receives
        .min(shared.config.recv_credits)
}

/// Tells a client that a limit turned it away why (in its handshake), with as little as
/// possible allocated for it and for at most [`REFUSAL_WAIT`].
pub(super) async fn refuse(
    shared: Arc<Shared>,
    conn: Arc<dyn Connection>,
    status: Status,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    let wait = shared.config.handshake_timeout.min(REFUSAL_WAIT);
    let settings = ServerSettings {
        max_frame: REFUSAL_FRAME,
        initial_receives: 2,
        recv_credits: 2,
        handshake_timeout: wait,
        refusal: Some(status),
        ..settings(&shared, conn.as_ref())
    };
    let proto = Proto::server(settings, Arc::from(conn.peer()), now());
    if let Ok(session) = Session::new(conn.clone(), proto, REFUSAL_FRAME, 2, false) {
        let told = std::future::poll_fn(|cx| match session.poll_frames(cx, &mut |_, _| {}) {
            Poll::Ready(Read::Over) => Poll::Ready(()),
            // A refused client's requests are not read.
            Poll::Ready(_) | Poll::Pending => Poll::Pending,
        });
        if tokio::time::timeout(wait, told).await.is_ok() {
            session.finish(LAST_WORDS).await;
        }
    }
    conn.close();
}

/// Serves one connection until it ends.
pub(super) async fn serve(
    shared: Arc<Shared>,
    conn: Arc<dyn Connection>,
    stop: watch::Receiver<bool>,
    // Counted until this task ends.
    _admitted: super::admission::Admitted,
) {
    let peer = conn.peer().to_owned();
    if let Err(e) = run(shared.clone(), conn.clone(), stop).await {
        let ending = Ending::of(&e);
        crate::observe::connection_dropped(ending.as_str());
        match ending {
            // The peer went away (closed or reset): nothing an operator must look at.
            Ending::Closed => tracing::debug!(%peer, error = %e, "connection ended"),
            // A limit, a timeout or a protocol violation: say which, within the log budget.
            Ending::Protocol | Ending::Other => {
                if let Some(line) = shared.logs.line("connection dropped", ending.as_str()) {
                    tracing::warn!(
                        %peer,
                        error = %logs::shown_reason(&e.to_string()),
                        suppressed = line.suppressed,
                        "connection dropped"
                    )
                }
            }
        }
    } else {
        tracing::debug!(%peer, "connection ended");
    }
    conn.close();
}

/// What every call of one connection shares. In this order (`repr(C)`): what every call
/// reads (the session, what the handshake settled) first, next to the reference count each
/// call takes, then what some calls use. A request's reference to what it tells its handler
/// of the connection (`info`, a [`HasCallConn`]) is this same one.
#[repr(C)]
pub(super) struct ConnCtx {
    pub(super) session: Arc<Session>,
    /// What the handshake settled.
    pub(super) negotiated: Negotiated,
    /// The client's address, who it proved to be (TLS) and the offers both ways on this
    /// connection: shared by every call's request.
    pub(super) info: CallConn,
    /// The memory of the connection's write slots.
    pub(super) slots: Slots,
    /// Longest wait for the client's ack of a transfer, and for its answer to an RDMA
    /// operation.
    pub(super) transfer_timeout: Duration,
    /// Longest wait for a free pool buffer.
    pub(super) buffer_wait: Duration,
    /// The connection's share of each path's pool.
    pub(super) shares: PoolShares,
}

impl ConnCtx {
    /// A window of a free write slot buffer, for the state to arm a slot with.
    pub(super) fn slot_window(&self) -> Option<(Grant, crate::protocol::frames::DescriptorFrame)> {
        self.slots.window(self.session.transport().as_ref())
    }

    /// Answers request `id`, which was never started, with `status` (a refused request may
    /// still have used a slot: owed slots are armed with it).
    fn refuse(&self, id: u64, status: &Status) {
        let mut locked = self.session.lock();
        if let Err(e) = locked.proto.refuse(id, status, || self.slot_window()) {
            tracing::debug!(call = id, error = %e, "refusal not sent: connection gone");
        }
    }
}

impl HasCallConn for ConnCtx {
    fn call_conn(&self) -> &CallConn {
        &self.info
    }
}

impl std::fmt::Debug for ConnCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnCtx")
            .field("peer", &self.info.peer)
            .finish()
    }
}

async fn run(
    shared: Arc<Shared>,
    conn: Arc<dyn Connection>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let cfg = &shared.config;
    let peer: Arc<str> = Arc::from(conn.peer());
    let proto = Proto::server(settings(&shared, conn.as_ref()), peer.clone(), now());
    let session = Session::new(
        conn.clone(),
        proto,
        cfg.max_frame,
        initial_receives(&shared),
        false,
    )?;
    // Listed for `ServerHandle::connections` (and counted) while it serves: from before the
    // client learns it is connected.
    let _listed = super::listing::Live::list(&shared, peer.clone(), session.clone());
    let _counted = crate::observe::OpenConnection::new();
    let mut serving = Serving {
        run: call::run,
        ends_calls: EndsCalls(session.clone()),
        local: (cfg.inline_handlers
            && tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::CurrentThread)
            .then(LocalCalls::new),
        shared: shared.clone(),
        session: session.clone(),
        peer,
        ctx: None,
    };
    let mut stopping = *stop.borrow_and_update();
    if stopping {
        session.lock().proto.shutdown();
    }
    // When the state wants to hear of time (the handshake's deadline, the idle timeout).
    let timer = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(timer);
    let mut timer_at = None;
    // Calls that end change it only with an idle timeout (without one, only frames do).
    let idle = cfg.idle_timeout.is_some();
    let mut first = true;
    // Once the end is decided, a draining one reads on (for the client's credits) while its
    // last frames wait for them, for at most LAST_WORDS.
    let mut drain_until: Option<Instant> = None;
    loop {
        if session.is_over() {
            let until = *drain_until.get_or_insert_with(|| Instant::now() + LAST_WORDS);
            if !session.lock().proto.is_draining() || Instant::now() >= until {
                break;
            }
            tokio::select! {
                read = std::future::poll_fn(|cx| serving.poll(cx)) => {
                    if matches!(read, Read::Over) {
                        break;
                    }
                }
                () = tokio::time::sleep_until(until) => {}
            }
            continue;
        }
        if idle || first {
            first = false;
            let at = session.timeout();
            if at != timer_at {
                timer_at = at;
                if let Some(at) = at {
                    timer.as_mut().reset(Instant::from_std(at));
                }
            }
        }
        tokio::select! {
            read = std::future::poll_fn(|cx| serving.poll(cx)) => match read {
                Read::Timer(at) => {
                    timer_at = at;
                    if let Some(at) = at {
                        timer.as_mut().reset(Instant::from_std(at));
                    }
                }
                Read::Over => break,
            },
            () = &mut timer, if timer_at.is_some() => {
                session.lock().proto.handle_timeout(now());
                // Set again at the top of the loop.
                timer_at = None;
                first = true;
            }
            () = session.ended() => {}
            changed = stop.changed(), if !stopping => {
                // A dropped sender means the server is gone: stop as well.
                stopping = changed.is_err() || *stop.borrow_and_update();
                if stopping {
                    session.lock().proto.shutdown();
                }
            }
        }
    }
    serving.end();
    // The last words (a goaway) reach the client before the transport closes.
    session.finish(LAST_WORDS).await;
    let locked = session.lock();
    match locked.proto.end() {
        Some(end) => match &end.error {
            Some(e) => Err(e.duplicate()),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// What the connection loop serves with: what it starts calls with, and what ends them.
/// (`R` is [`call::run`], whose future's type has no name.)
struct Serving<R, F> {
    /// Runs a call.
    run: R,
    shared: Arc<Shared>,
    session: Arc<Session>,
    peer: Arc<str>,
    /// What the calls share, once the first request came.
    ctx: Option<Arc<ConnCtx>>,
    /// Ends the calls still in flight when this goes.
    ends_calls: EndsCalls,
    /// The calls that waited, on a current-thread runtime (see `waited`); `None` where each
    /// gets a task of its own.
    local: Option<LocalCalls<F>>,
}

impl<R, F> Serving<R, F>
where
    R: Fn(call::Call, Mailbox<ClientEvent>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    /// Reads the connection, starting each call the state admits where its request lands;
    /// ready when the state wants to hear of time at another instant, or when the connection
    /// is over.
    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Read> {
        let session = self.session.clone();
        let read = session.poll_frames(cx, &mut |incoming, cx| self.incoming(incoming, cx));
        // After the frames, which may have woken calls (or started some that wait).
        if let (Some(local), Some(ctx)) = (&mut self.local, &self.ctx) {
            local.poll(cx, |id, ep| answer_panic(ctx, id, ep));
        }
        read
    }

    /// Ends the connection's calls: those still in flight see it end; those that waited here
    /// go on, each on a task of its own, to answer how they ended (their answers go nowhere).
    fn end(self) {
        let Serving {
            ends_calls,
            local,
            ctx,
            ..
        } = self;
        drop(ends_calls);
        if let (Some(mut local), Some(ctx)) = (local, ctx) {
            for entry in local.drain() {
                drop(tokio::spawn(Waited::new(entry, ctx.clone())));
            }
        }
    }

    /// A request the state admitted, or refused (by reference: see `Session::poll_frames`).
    fn incoming(&mut self, incoming: &mut Incoming<Runtime>, cx: &mut std::task::Context<'_>) {
        // Borrowed: a call that starts takes its own reference (`start_call`).
        let ctx: &Arc<ConnCtx> = self
            .ctx
            .get_or_insert_with(|| context(&self.shared, &self.session, &self.peer));
        let shared = &*self.shared;
        let admitted = match incoming {
            Incoming::Refused { id, status } => {
                refused(shared, ctx, *id, status);
                return ctx.refuse(*id, status);
            }
            Incoming::Request(admitted) => admitted,
        };
        let id = admitted.request.id;
        let (mut running, ep) = match start_call(shared, ctx, admitted, &self.run) {
            Ok(started) => started,
            Err(status) => {
                refused(shared, ctx, id, &status);
                return ctx.refuse(id, &status);
            }
        };
        let first = if shared.config.inline_handlers {
            poll_call(running.as_mut(), cx)
        } else {
            Inline::Waiting
        };
        if let Inline::Done = first {
            return Spare::keep(running); // the common end, kept short
        }
        let entry = Entry {
            call: running,
            id,
            ep,
        };
        match first {
            // Polled again by this task on a current-thread runtime, else on a task of its
            // own, detached: it ends with its call, which ends with the connection at the
            // latest (see `EndsCalls`).
            Inline::Waiting => match &mut self.local {
                Some(local) => local.insert(entry),
                None => drop(tokio::spawn(Waited::new(entry, ctx.clone()))),
            },
            over => entry.finish(over, |id, ep| answer_panic(ctx, id, ep)),
        }
    }
}

/// What the connection's calls share, once the handshake settled it.
fn context(shared: &Shared, session: &Arc<Session>, peer: &Arc<str>) -> Arc<ConnCtx> {
    let cfg = &shared.config;
    let negotiated = *session
        .lock()
        .proto
        .negotiated()
        .expect("requests come after the handshake");
    Arc::new(ConnCtx {
        session: session.clone(),
        // Memory of this connection only, registered when its first large payload comes.
        slots: Slots::new(cfg.write_slots, cfg.slot_size),
        info: CallConn {
            peer: peer.clone(),
            peer_identity: session.transport().peer_identity(),
            remote: RemoteMemory::new(session.clone(), cfg.transfer_timeout),
        },
        negotiated,
        transfer_timeout: cfg.transfer_timeout,
        buffer_wait: cfg.buffer_wait,
        shares: PoolShares::new(cfg.pool_share_percent, shared.routes.path_count()),
    })
}

/// Logs and counts a refused request, within the log budget.
fn refused(shared: &Shared, ctx: &ConnCtx, id: u64, status: &Status) {
    crate::observe::server_refused(status.code());
    let code = status.code().as_str();
    if let Some(line) = shared.logs.line("call refused", code) {
        tracing::warn!(
            peer = %ctx.info.peer,
            call = id,
            code,
            reason = %logs::shown_reason(status.message()),
            suppressed = line.suppressed,
            "call refused"
        );
    }
}

/// Ends a connection's calls still in flight when the connection loop ends, for whatever
/// reason: each is ended (`CANCELLED`, "ended with its connection"), its handler's future is
/// dropped and it records how it ended (its answer goes nowhere), on its own task (those that
/// waited on the connection's task are given one: `Serving::end`).
struct EndsCalls(Arc<Session>);

impl Drop for EndsCalls {
    fn drop(&mut self) {
        if !self.0.is_over() {
            // Nothing a stopped call answers may reach the client as if it were a status of
            // the server's choosing.
            self.0.abort(Error::ConnectionClosed {
                peer: self.0.peer().to_owned(),
                reason: "the server stopped serving it".into(),
            });
        }
    }
}

/// Answers for a call whose handler panicked, if it had not answered.
pub(super) fn answer_panic(ctx: &ConnCtx, id: u64, ep: &crate::service::EndpointDef) {
    let mut locked = ctx.session.lock();
    if !locked.proto.in_flight(id) {
        return;
    }
    tracing::error!(
        call = id,
        method = ep.method,
        path = ep.path,
        op = %ep.op,
        peer = &*ctx.info.peer,
        "handler panicked"
    );
    let frame = error_response(id, &Status::internal("the handler panicked"));
    let _ = locked.proto.respond(frame, now, || ctx.slot_window());
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::ConnCtx;
    use crate::protocol::connection::Negotiated;

    /// What every call reads of its connection's shared context (the session, what the
    /// handshake settled) comes first, within 48 bytes: with the reference count each call
    /// takes (its request's included, the same one), 64.
    #[test]
    fn what_every_call_reads_of_its_connection_is_together() {
        assert_eq!(offset_of!(ConnCtx, session), 0);
        let end = offset_of!(ConnCtx, negotiated) + size_of::<Negotiated>();
        assert!(end <= 48, "the hot fields end at byte {end}");
    }
}
