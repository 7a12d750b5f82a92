//! One server connection: handshake, then frames in, calls out.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::call::{self, error_response, ClientEvent, InFlight};
use super::share::PoolShares;
use super::slots::{SharedSlots, Slots};
use super::Shared;
use crate::error::Error;
use crate::interceptor::IncomingCall;
use crate::observe::logs::{self, Ending};
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{Hello, Kind, RequestFrame, StatusFrame};
use crate::protocol::mailbox::{call_mailbox, CallLimits, EndReason, Mailbox, Sender};
use crate::protocol::rate::{Rate, Verdict};
use crate::protocol::route::{Incoming, RequestShape};
use crate::protocol::stream::Direction;
use crate::protocol::PROTOCOL_VERSION;
use crate::remote::{End, RemoteMemory};
use crate::service::RawRequest;
use crate::service::StreamKind;
use crate::status::Status;
use crate::stream::{Setup, StreamCell};
use crate::transport::PeerIdentity;
use crate::transport::{Connection, Fencing};

/// Receives a refused client's Hello may use: two of 1 KiB (a Hello is tens of bytes).
const REFUSAL_FRAME: usize = 1024;
/// Longest a refused client may take to send its Hello.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);

/// Tells a client that a limit turned it away why (in its handshake), with as little as
/// possible allocated for it and for at most [`REFUSAL_WAIT`].
pub(super) async fn refuse(
    shared: Arc<Shared>,
    conn: Arc<dyn Connection>,
    status: Status,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    if let Ok(channel) = FrameChannel::new(conn.clone(), 2, REFUSAL_FRAME, false) {
        let wait = shared.config.handshake_timeout.min(REFUSAL_WAIT);
        if handshake_hello(&channel, wait).await.is_ok() {
            goaway(&channel, &status).await;
        }
    }
    conn.close();
}

fn open(shared: &Shared, conn: Arc<dyn Connection>) -> Result<FrameChannel, Error> {
    FrameChannel::growing(
        conn,
        initial_receives(shared),
        shared.config.recv_credits,
        shared.config.max_frame,
        false,
    )
}

/// Receives posted when a connection opens (the rest come as it gets busy).
fn initial_receives(shared: &Shared) -> u32 {
    shared
        .config
        .initial_receives
        .min(shared.config.recv_credits)
}

/// Longest wait for the client to receive the last frames before the connection closes.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// Tells the client why the connection ends, if a credit allows it (before the handshake
/// there is none). Waits (at most [`LAST_WORDS`]) until the client's transport has that
/// frame and so every frame before it, such as the responses of calls drained at shutdown,
/// then gives the client a moment to read them before the connection is closed.
async fn goaway(channel: &FrameChannel, status: &Status) {
    if let Some(sent) = channel.try_send_last(Kind::Goaway(StatusFrame::from(status))) {
        let _ = tokio::time::timeout(LAST_WORDS, sent).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tells the client, as the server starts to drain the calls in flight on this connection,
/// that it shuts down: the client sends its next calls elsewhere (a client of several servers
/// skips this one) while these calls still get their responses; the last goaway follows them.
/// Sent from a task of its own, which waits for a credit if none is free.
fn draining(channel: &Arc<FrameChannel>) {
    let channel = channel.clone();
    let status = Status::unavailable("the server is shutting down");
    tokio::spawn(async move {
        let _ = channel
            .send_priority(Kind::Goaway(StatusFrame::from(&status)))
            .await;
    });
}

/// Waits (at most `limit`) for the client's Hello and applies it.
async fn handshake_hello(channel: &FrameChannel, limit: Duration) -> Result<Hello, Error> {
    let peer = channel.conn().peer().to_owned();
    let frame = tokio::time::timeout(limit, channel.recv())
        .await
        .map_err(|_| Error::Protocol {
            peer: peer.clone(),
            reason: format!("no handshake within {limit:?} (handshake_timeout)"),
        })??;
    let Some(Kind::Hello(hello)) = frame.kind else {
        return Err(Error::Protocol {
            peer,
            reason: "the first frame is not a Hello".into(),
        });
    };
    // A peer of another version is told so (by the caller), whatever else its Hello says.
    if hello.version == PROTOCOL_VERSION {
        if let Some(reason) = crate::protocol::unusable_hello(&hello) {
            return Err(Error::Protocol { peer, reason });
        }
    }
    channel.set_peer(
        hello.credits,
        hello.credits.max(hello.max_credits),
        hello.max_frame,
    );
    Ok(hello)
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

async fn run(
    shared: Arc<Shared>,
    conn: Arc<dyn Connection>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let channel = Arc::new(open(&shared, conn)?);
    let hello = match handshake_hello(&channel, shared.config.handshake_timeout).await {
        Ok(hello) => hello,
        Err(e) => {
            goaway(&channel, &Status::invalid_argument(e.to_string())).await;
            return Err(e);
        }
    };
    if hello.version != PROTOCOL_VERSION {
        let e = Error::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: hello.version,
        };
        goaway(&channel, &Status::failed_precondition(e.to_string())).await;
        return Err(e);
    }
    let cfg = &shared.config;
    let max_in_flight = hello.max_in_flight.clamp(1, cfg.max_in_flight);
    let inline_threshold = cfg.inline_threshold.min(hello.inline_threshold);
    // Memory of this connection only, registered when its first large payload comes.
    let slots: SharedSlots = Arc::new(Slots::new(cfg.write_slots, cfg.slot_size));
    // Pull by default where a granted pool buffer could not be fenced off again.
    let pull_writes = cfg
        .pull_writes
        .unwrap_or(channel.conn().fencing() == Fencing::Unfenced);
    let ack = Hello {
        version: PROTOCOL_VERSION,
        max_frame: cfg.max_frame as u32,
        // What was posted before the Hello arrived: the receives added since travel as
        // credits of the HelloAck frame itself.
        credits: initial_receives(&shared),
        max_credits: cfg.recv_credits,
        max_in_flight,
        inline_threshold,
        slots: Vec::new(),
        pull_writes,
        token: crate::remote::new_token(),
        stream_window: crate::client::stream_window(cfg.stream_window, cfg.max_frame),
    };
    let remote = RemoteMemory::new(End::new(
        channel.clone(),
        ack.token,
        hello.token,
        shared.config.transfer_timeout,
    ));
    let negotiated = Negotiated {
        inline_threshold,
        pull_writes,
        stream_window: ack.stream_window,
        peer_stream_window: hello.stream_window,
        peer: Arc::from(channel.conn().peer()),
        peer_identity: channel.conn().peer_identity(),
        remote,
    };
    let calls = InFlight::default();
    // Listed for `ServerHandle::connections` (and counted) while it serves: from before the
    // client learns it is connected.
    let _listed = super::listing::Live::list(&shared, negotiated.peer.clone(), calls.clone());
    let _counted = crate::observe::OpenConnection::new();
    channel.send_priority(Kind::HelloAck(ack)).await?;

    let mut shares = PoolShares::new(cfg.pool_share_percent);
    let mut task_ids = HashMap::new();
    let mut tasks = CallTasks {
        set: JoinSet::new(),
        calls: calls.clone(),
        conn: channel.conn().clone(),
    };
    // The box of the last call that ran to completion here, reused by the next one: a call
    // that answers at once costs no allocation for its state.
    let mut spare = None;
    let mut stopping = *stop.borrow_and_update();
    // Idle: no call in flight and no frame from the client for `idle_timeout`.
    let idle_timeout = shared.config.idle_timeout;
    // (Without a limit the branch below is off; the timer is never awaited.)
    let idle = tokio::time::sleep(idle_timeout.unwrap_or(Duration::from_secs(86_400)));
    tokio::pin!(idle);
    // Pings are answered by this task: at most `max_pings_per_second` of them.
    let ping_limit = cfg.max_pings_per_second;
    let mut pings = Rate::new(ping_limit, Duration::from_secs(1));
    loop {
        if let Some(limit) = idle_timeout {
            if !tasks.set.is_empty() || calls.len() > 0 {
                idle.as_mut().reset(Instant::now() + limit);
            }
        }
        if stopping && tasks.set.is_empty() {
            goaway(
                &channel,
                &Status::unavailable("the server is shutting down"),
            )
            .await;
            return Ok(());
        }
        tokio::select! {
            () = &mut idle, if idle_timeout.is_some() && tasks.set.is_empty() => {
                let limit = idle_timeout.unwrap_or_default();
                tracing::debug!(peer = channel.conn().peer(), "closing an idle connection");
                goaway(
                    &channel,
                    &Status::unavailable(format!(
                        "the server closed a connection idle for {limit:?} (idle_timeout)"
                    )),
                )
                .await;
                return Ok(());
            }
            frame = channel.recv() => {
                let frame = frame?;
                if let Some(limit) = idle_timeout {
                    idle.as_mut().reset(Instant::now() + limit);
                }
                let kind = match frame.kind {
                    None => continue, // a credit update
                    Some(kind) => kind,
                };
                match kind {
                    Kind::Request(req) => {
                        if calls.contains(req.id) {
                            let e = channel.malformed(format!("call id {} reused while in flight", req.id));
                            goaway(&channel, &Status::invalid_argument(e.to_string())).await;
                            return Err(e);
                        }
                        let refusal = if stopping {
                            Some(Status::unavailable("the server is shutting down"))
                        } else if calls.len() >= max_in_flight as usize {
                            Some(Status::resource_exhausted(format!(
                                "too many calls in flight on this connection (max_in_flight = {max_in_flight})"
                            )))
                        } else {
                            None
                        };
                        let id = req.id;
                        let started = refusal.map_or_else(
                            || start_call(&shared, &channel, &calls, &slots, &mut shares, req, &negotiated),
                            Err,
                        );
                        match started {
                            Ok((call, mailbox, events)) => {
                                calls.insert(id, call::Routed { events, stream: call.stream.clone() });
                                let ep = call.endpoint;
                                let mut running = match spare.take() {
                                    Some(mut reused) => {
                                        std::pin::Pin::set(&mut reused, call::run(call, mailbox));
                                        reused
                                    }
                                    None => Box::pin(call::run(call, mailbox)),
                                };
                                let first = if cfg.inline_handlers {
                                    poll_inline(running.as_mut()).await
                                } else {
                                    Inline::Waiting
                                };
                                match first {
                                    Inline::Done => spare = Some(running),
                                    Inline::Waiting => {
                                        let handle = tasks.set.spawn(running);
                                        task_ids.insert(handle.id(), (id, ep));
                                    }
                                    Inline::Panicked => {
                                        drop(running);
                                        answer_panic(&channel, &calls, id, &ep, &negotiated.peer).await?;
                                    }
                                }
                            }
                            Err(status) => {
                                crate::observe::server_refused(status.code());
                                let code = status.code().as_str();
                                if let Some(line) = shared.logs.line("call refused", code) {
                                    tracing::warn!(
                                        peer = %negotiated.peer,
                                        call = id,
                                        code,
                                        reason = %logs::shown_reason(status.message()),
                                        suppressed = line.suppressed,
                                        "call refused"
                                    );
                                }
                                let mut frame = error_response(id, &status);
                                // A refused request may still have used a slot.
                                let room = channel.peer_max_frame().saturating_sub(prost::Message::encoded_len(&frame) + 64);
                                frame.slots = slots.arm(channel.conn().as_ref(), room);
                                send_aside(&channel, Kind::Response(frame));
                            }
                        }
                    }
                    Kind::Ack(ack) => calls.route(ack.id, ClientEvent::Ack(ack.reply_to.map(Into::into))),
                    Kind::Messages(m) => {
                        if let Some(cell) = calls.stream(m.id) {
                            broke(&channel, cell.messages(m)).await?;
                        }
                    }
                    Kind::Credit(c) => {
                        if let Some(cell) = calls.stream(c.id) {
                            broke(&channel, cell.credit(c.bytes)).await?;
                        }
                    }
                    Kind::Chunks(c) if c.used.is_empty() => {
                        if let Some(cell) = calls.stream(c.id) {
                            broke(&channel, cell.offers(c.offers)).await?;
                        }
                    }
                    Kind::Cancel(call) => calls.end(call.id, EndReason::Cancelled),
                    Kind::Revoke(r) => negotiated.remote.end().on_revoke(r.offers),
                    Kind::Revoked(r) => negotiated.remote.end().on_revoked(r.offers),
                    Kind::Ping(ping) => {
                        if ping_limit > 0 && pings.check(std::time::Instant::now()) == Verdict::Hold {
                            return Err(too_many_pings(&channel, ping_limit).await);
                        }
                        send_aside(&channel, Kind::Pong(ping))
                    }
                    Kind::Goaway(status) => {
                        tracing::debug!(message = %logs::shown_reason(&status.message), "client said goodbye");
                        return Ok(());
                    }
                    other => {
                        let e = channel.malformed(format!("unexpected {} frame from a client", frame_name(&other)));
                        goaway(&channel, &Status::invalid_argument(e.to_string())).await;
                        return Err(e);
                    }
                }
            }
            Some(done) = tasks.set.join_next_with_id() => {
                let (task, panicked) = match done {
                    Ok((task, ())) => (task, false),
                    Err(e) => (e.id(), e.is_panic()),
                };
                if let Some((id, ep)) = task_ids.remove(&task) {
                    if panicked {
                        answer_panic(&channel, &calls, id, &ep, &negotiated.peer).await?;
                    } else {
                        calls.remove(id);
                    }
                }
            }
            changed = stop.changed(), if !stopping => {
                // A dropped sender means the server is gone: stop as well.
                stopping = changed.is_err() || *stop.borrow_and_update();
                if stopping && !tasks.set.is_empty() {
                    draining(&channel);
                }
            }
        }
    }
}

/// The tasks of a connection's calls that waited. When the connection loop ends, for whatever
/// reason, the connection is closed and every call still in flight is ended (`CANCELLED`,
/// "ended with its connection"): its handler's future is dropped and it records how it ended
/// (its answer goes nowhere); its task finishes by itself.
struct CallTasks {
    set: JoinSet<()>,
    calls: InFlight,
    conn: Arc<dyn Connection>,
}

impl Drop for CallTasks {
    fn drop(&mut self) {
        if self.calls.len() > 0 {
            // First: nothing a stopped call answers may reach the client as if it were a
            // status of the server's choosing.
            self.conn.close();
        }
        self.calls.end_all(EndReason::ConnectionLost);
        self.set.detach_all();
    }
}

/// How far the first poll of a call on the connection's task got.
enum Inline {
    /// Answered: nothing left to run.
    Done,
    /// Waiting for something: the call continues on a task of its own.
    Waiting,
    /// The handler panicked; the call never answered.
    Panicked,
}

/// Polls a call once on the connection's own task (run to completion). A call that waits
/// keeps the waker of this task until its own task polls it again, which costs at most a
/// spurious wake-up of the connection loop.
async fn poll_inline(mut call: std::pin::Pin<&mut (impl Future<Output = ()> + ?Sized)>) -> Inline {
    std::future::poll_fn(|cx| {
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(cx)));
        Poll::Ready(match polled {
            Ok(Poll::Ready(())) => Inline::Done,
            Ok(Poll::Pending) => Inline::Waiting,
            Err(_) => Inline::Panicked,
        })
    })
    .await
}

/// Answers for a call whose handler panicked, if it had not answered.
/// Sends a frame the reader itself answers with (a refusal, a pong) without holding the reader
/// up: one that finds no credit waits for it on a task of its own. The reader must go on
/// reading, since the credits it would wait for come back in frames only it reads: waiting in
/// place deadlocked a flood of refused calls once the client had no credit left to give.
fn send_aside(channel: &Arc<FrameChannel>, kind: Kind) {
    let channel = channel.clone();
    let mut sending = Box::pin(async move { channel.send(kind).await });
    // A failure puts the connection in error, which the reader sees in its next receive.
    if crate::bounded::poll_once(&mut sending).is_none() {
        tokio::spawn(sending);
    }
}

async fn answer_panic(
    channel: &FrameChannel,
    calls: &InFlight,
    id: u64,
    ep: &crate::service::EndpointDef,
    peer: &str,
) -> Result<(), Error> {
    if calls.remove(id) {
        tracing::error!(
            call = id,
            method = ep.method,
            path = ep.path,
            op = %ep.op,
            peer,
            "handler panicked"
        );
        let frame = error_response(id, &Status::internal("the handler panicked"));
        channel.send(Kind::Response(frame)).await?;
    }
    Ok(())
}

/// Ends a connection that pinged more than `limit` times in a second: tells the client so
/// (`RESOURCE_EXHAUSTED` naming the setting) and returns the error that ends it.
async fn too_many_pings(channel: &FrameChannel, limit: u32) -> Error {
    let status = Status::resource_exhausted(format!(
        "more than {limit} pings in a second on one connection (max_pings_per_second); \
         connection closed"
    ));
    goaway(channel, &status).await;
    Error::LimitExceeded {
        limit: "max_pings_per_second",
        max: limit.into(),
        actual: u64::from(limit) + 1,
    }
}

/// Ends the connection if the client broke a stream's rules (`protocol::stream`).
async fn broke(
    channel: &FrameChannel,
    checked: Result<(), crate::protocol::stream::Violation>,
) -> Result<(), Error> {
    let Err(violation) = checked else {
        return Ok(());
    };
    let e = channel.malformed(violation.0);
    goaway(channel, &Status::invalid_argument(e.to_string())).await;
    Err(e)
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

/// What the handshake settled for the connection's calls.
struct Negotiated {
    inline_threshold: u32,
    pull_writes: bool,
    /// Bytes of stream messages this server buffers per call.
    stream_window: u64,
    /// Bytes of stream messages the client buffers per call.
    peer_stream_window: u64,
    /// The client's address, shared by every call's request.
    peer: Arc<str>,
    /// Who the client proved to be (TLS), shared by every call's request.
    peer_identity: Option<Arc<PeerIdentity>>,
    /// Offers both ways on this connection.
    remote: RemoteMemory,
}

/// Checks a request against its endpoint and prepares the call.
fn start_call(
    shared: &Shared,
    channel: &Arc<FrameChannel>,
    in_flight: &InFlight,
    slots: &SharedSlots,
    shares: &mut PoolShares,
    req: RequestFrame,
    &Negotiated {
        inline_threshold,
        pull_writes,
        stream_window,
        peer_stream_window,
        ref peer,
        ref peer_identity,
        ref remote,
    }: &Negotiated,
) -> Result<(call::Call, Mailbox<ClientEvent>, Sender<ClientEvent>), Status> {
    // Take the slot first: whatever happens to the request, the client used it.
    let slot = req
        .slot
        .map(|index| slots.take(index, req.payload_len))
        .transpose()?;
    let path = std::str::from_utf8(&req.path)
        .map_err(|_| Status::invalid_argument("the request's path is not UTF-8"))?;
    let route = shared.routes.find(path, req.op)?;
    let ep = route.endpoint;
    if let Some(status) = crate::protocol::oversized_message(&ep, req.metadata.len()) {
        return Err(status);
    }
    if ep.op.is_inbound() && req.payload_len > u64::from(inline_threshold) {
        // Slots would have saved this payload a round trip: arm them with the response.
        slots.want();
    }
    let shape = RequestShape {
        payload_len: req.payload_len,
        inline_len: req.inline_payload.as_ref().map(|p| p.len()),
        slot: slot.is_some(),
        source: req.source.is_some(),
        reply_to: req.reply_to.is_some(),
        offers: req.offers.len(),
    };
    let (incoming, stream) = match ep.stream {
        StreamKind::Unary => (
            crate::protocol::route::incoming(&ep, &shape, pull_writes)?,
            None,
        ),
        kind => {
            crate::protocol::route::streaming(&ep, &shape)?;
            let setup = match kind {
                StreamKind::Messages {
                    requests,
                    responses,
                } => Setup {
                    receives: requests.then_some(stream_window),
                    sends: responses.then_some(peer_stream_window),
                    ..Setup::default()
                },
                StreamKind::Bulk { max_len } => Setup {
                    offered: Some(if ep.op.is_inbound() {
                        (Direction::Write, req.payload_len)
                    } else {
                        (Direction::Read, max_len)
                    }),
                    ..Setup::default()
                },
                StreamKind::Unary => Setup::default(),
            };
            let cell = StreamCell::new(setup);
            if !req.offers.is_empty() {
                cell.offers(req.offers)
                    .map_err(|v| Status::invalid_argument(format!("{} {}: {v}", ep.op, ep.path)))?;
            }
            (Incoming::Nothing, Some(cell))
        }
    };
    let mut metadata = crate::metadata::Metadata::from_frames(req.call_metadata)?;
    if !shared.interceptors.is_empty() {
        let mut call = IncomingCall {
            service: route.service.name(),
            endpoint: &ep,
            peer,
            peer_identity: peer_identity.as_deref(),
            metadata: &mut metadata,
        };
        // A refusal is logged with the others, by the connection loop.
        shared.interceptors.run(&mut call)?;
    }
    let timeout = (req.timeout_us > 0).then(|| Duration::from_micros(req.timeout_us));
    let deadline = crate::protocol::deadline::call_deadline(
        Instant::now(),
        timeout,
        ep.timeout(),
        shared.config.max_call_duration,
    );
    let limits = CallLimits {
        deadline,
        max_response_len: call::max_response_len(&ep, channel.peer_max_frame()),
    };
    let (tx, events) = call_mailbox(limits);
    let context = crate::service::CallContext::new(events.end_signal());
    let call = call::Call {
        id: req.id,
        in_flight: in_flight.clone(),
        channel: channel.clone(),
        service: route.service.clone(),
        index: route.index,
        endpoint: ep,
        pool: route.pool.clone(),
        holders: route.holders.clone(),
        holding: None,
        share: shares.of(ep.path, &route.pool),
        share_permit: None,
        peer: peer.clone(),
        request: Some(RawRequest {
            message: req.metadata,
            metadata,
            peer: peer.clone(),
            peer_identity: peer_identity.clone(),
            timeout,
            remote: Some(remote.for_call(context.clone())),
            context,
        }),
        incoming,
        payload_len: req.payload_len,
        inline_payload: req.inline_payload,
        slot,
        source: req.source.map(Into::into),
        reply_to: req.reply_to.map(Into::into),
        slots: slots.clone(),
        transfer_timeout: shared.config.transfer_timeout,
        buffer_wait: shared.config.buffer_wait,
        inline_threshold: inline_threshold as usize,
        grants: 0,
        metrics: route.metrics.clone(),
        stream,
        peer_stream_window,
    };
    Ok((call, events, tx))
}
