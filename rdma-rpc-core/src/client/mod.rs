//! The client: one connection, many concurrent calls, cheap to clone.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use rdma_rpc_core::Client;
//!
//! let client = Client::connect("tcp://127.0.0.1:7470").await?;
//! // Generated clients wrap it: `KvStoreClient::new(client.clone())`.
//! # Ok(()) }
//! ```
//!
//! One client can also stand for several servers and spread calls over them
//! ([`ClientBuilder::connect_balanced`], see [`balance`]).

pub mod balance;
mod call;
mod copies;
mod reconnect;
mod stream;

pub use stream::{Download, ReadStream, RequestStream};

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use crate::error::{Error, Result};
use crate::interceptor::{Chain, ClientInterceptor};
use crate::memory::StagingPools;
use crate::metadata::Metadata;
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{CallId, GrantFrame, Hello, Kind, ResponseFrame, SlotFrame};
use crate::protocol::mailbox;
use crate::protocol::CallMap;
use crate::protocol::PROTOCOL_VERSION;
use crate::remote::{End, RemoteMemory};
use crate::service::EndpointDef;
use crate::status::Status;
use crate::transport::{transport_for, Descriptor, Grant, Transport};

/// Settings of a client.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Calls this client wants in flight at once; the server may grant fewer. Calls beyond
    /// wait. Default 128.
    pub max_in_flight: u32,
    /// Size of each receive posted for control frames. Default 16 KiB.
    pub max_frame: usize,
    /// Most receives posted for control frames: `initial_receives` (4) at first, one more with
    /// each frame received (other than the handshake and credit updates) until this many.
    /// Default 64.
    pub recv_credits: u32,
    /// Receives posted when the connection opens, before any growth: at least 4 and at most
    /// `recv_credits`. A client that keeps a known number of calls in flight sets it and
    /// `recv_credits` that high, so nothing grows (over DOCA: nothing is registered) mid-run.
    /// Default 4.
    pub initial_receives: u32,
    /// Send payloads up to this size travel inside the request frame. Default 8 KiB (the
    /// server may lower it).
    pub inline_threshold: u32,
    /// Deadline of calls that set none and whose endpoint has none. Default: none.
    pub default_timeout: Option<Duration>,
    /// Longest wait for the connection and handshake (also of each reconnection). Default
    /// 10 s.
    pub connect_timeout: Duration,
    /// Dial again when a call finds the connection lost (the server restarted, the network
    /// failed, the server closed an idle connection). Calls in flight at the loss still fail;
    /// see [`Client`]. Default `true`.
    pub reconnect: bool,
    /// Wait after the first failed reconnection; it doubles with each further failure, up to
    /// `reconnect_backoff_max` (less up to a fifth, at random). Default 100 ms.
    pub reconnect_backoff: Duration,
    /// Longest wait between reconnection attempts. Default 5 s.
    pub reconnect_backoff_max: Duration,
    /// Memory kept registered for results (the windows receive and read calls offer) and
    /// pulled payloads, per power-of-two size class; buffers beyond it are allocated per call.
    /// Over DOCA it also bounds the plain buffers kept warm for the copies of pushed results.
    /// Default 64 MiB.
    pub staging_budget: usize,
    /// Longest wait for the server to answer a one-sided operation this client makes through
    /// [`RemoteMemory`] (a read of memory a handler lent, say): a server
    /// that has not answered by then loses the connection, which frees what the operation
    /// held. Default 30 s.
    pub transfer_timeout: Duration,
    /// Bytes of stream messages this client buffers per call before the server must wait
    /// for it to take some (message streams; see docs/spec.md). At least two frames' worth;
    /// less is raised to that. Default 256 KiB.
    pub stream_window: u64,
    /// Windows a bulk stream offers the server at once, each of one chunk (the endpoint's
    /// buffer size): how many chunks are in flight, and how much staging memory a stream
    /// holds. Default 4.
    pub stream_depth: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_in_flight: 128,
            max_frame: 16 * 1024,
            recv_credits: 64,
            initial_receives: crate::protocol::INITIAL_RECEIVES,
            inline_threshold: 8 * 1024,
            default_timeout: None,
            connect_timeout: Duration::from_secs(10),
            reconnect: true,
            reconnect_backoff: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            staging_budget: 64 << 20,
            transfer_timeout: Duration::from_secs(30),
            stream_window: 256 << 10,
            stream_depth: 4,
        }
    }
}

/// Builds a [`Client`].
#[derive(Debug, Default)]
pub struct ClientBuilder {
    config: ClientConfig,
    transport: Option<Arc<dyn Transport>>,
    interceptors: Chain<dyn ClientInterceptor>,
}

impl ClientBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: ClientConfig) -> Self {
        self.config = config;
        self
    }

    /// Uses this transport instead of the one the address scheme names.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// See [`ClientConfig::default_timeout`].
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.default_timeout = Some(timeout);
        self
    }

    /// Adds an interceptor: it runs before each call leaves, after those added before it (see
    /// [`interceptor`](crate::interceptor)).
    pub fn interceptor(mut self, interceptor: impl ClientInterceptor) -> Self {
        self.interceptors.push(Arc::new(interceptor));
        self
    }

    setters! {
        /// See [`ClientConfig::max_in_flight`].
        max_in_flight: u32,
        /// See [`ClientConfig::max_frame`].
        max_frame: usize,
        /// See [`ClientConfig::recv_credits`].
        recv_credits: u32,
        /// See [`ClientConfig::initial_receives`].
        initial_receives: u32,
        /// See [`ClientConfig::inline_threshold`].
        inline_threshold: u32,
        /// See [`ClientConfig::connect_timeout`].
        connect_timeout: Duration,
        /// See [`ClientConfig::reconnect`].
        reconnect: bool,
        /// See [`ClientConfig::reconnect_backoff`].
        reconnect_backoff: Duration,
        /// See [`ClientConfig::reconnect_backoff_max`].
        reconnect_backoff_max: Duration,
        /// See [`ClientConfig::staging_budget`].
        staging_budget: usize,
        /// See [`ClientConfig::transfer_timeout`].
        transfer_timeout: Duration,
        /// See [`ClientConfig::stream_window`].
        stream_window: u64,
        /// See [`ClientConfig::stream_depth`].
        stream_depth: usize,
    }

    /// Connects and runs the handshake.
    pub async fn connect(self, addr: &str) -> Result<Client> {
        self.check()?;
        let transport = match self.transport {
            Some(t) => t,
            None => transport_for(addr)?,
        };
        let counters = Arc::new(Counters::default());
        let inner = dial(&transport, addr, &self.config, &counters).await?;
        Ok(Client::single(
            inner,
            addr,
            transport,
            self.config,
            self.interceptors,
            counters,
        ))
    }

    /// Connects to several servers, those `resolver` names (a fixed or changing list:
    /// [`Addresses`](balance::Addresses); every address of a DNS name:
    /// [`Dns`](balance::Dns); or a discovery service's client), and spreads calls over
    /// those ready. Resolves once, dials every server, and returns once one is ready (an
    /// error naming why each failed if none is); the others join as they connect. See
    /// [`balance`].
    pub async fn connect_balanced(self, resolver: impl balance::Resolver) -> Result<Client> {
        balance::connect(self, resolver).await
    }

    /// Checks the settings that a connection needs.
    fn check(&self) -> Result<()> {
        let min_receives = crate::protocol::credits::MIN_RECEIVES;
        if self.config.max_frame < 2 * crate::protocol::FRAME_OVERHEAD
            || self.config.recv_credits < min_receives
        {
            return Err(Error::InvalidArgument(format!(
                "max_frame must be at least {} bytes and recv_credits at least {min_receives}",
                2 * crate::protocol::FRAME_OVERHEAD
            )));
        }
        crate::protocol::credits::check_initial(
            self.config.initial_receives,
            self.config.recv_credits,
        )?;
        Ok(())
    }
}

/// A handshake that found no receive posted for it: the server accepted the connection (a
/// bound server does) but does not run (`serve` was never called, or it is stuck). Said so
/// instead of the transport's "receiver not ready", which points elsewhere.
fn unserved(peer: &str, e: Error) -> Error {
    match e {
        Error::ReceiverNotReady { retry_ms } => Error::ConnectionClosed {
            peer: peer.to_owned(),
            reason: format!(
                "the server accepted the connection but took no handshake within {retry_ms} ms: \
                 is it serving? (a bound server answers once serve() or \
                 serve_with_shutdown() runs, on a task of its own)"
            ),
        },
        other => other,
    }
}

/// Connects to `addr` and runs the handshake, within the connect timeout.
async fn dial(
    transport: &Arc<dyn Transport>,
    addr: &str,
    config: &ClientConfig,
    counters: &Arc<Counters>,
) -> Result<Arc<Inner>> {
    let limit = config.connect_timeout;
    tokio::time::timeout(limit, async {
        let conn = transport.connect(addr).await?;
        Client::handshake(conn, config, counters.clone()).await
    })
    .await
    .map_err(|_| Error::ConnectionClosed {
        peer: addr.to_owned(),
        reason: format!("no connection and handshake within {limit:?}"),
    })?
}

/// Counters of a client, for reports and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Calls that got a response (success or error status).
    pub calls: u64,
    /// Grants the server answered a request with before responding: each costs one extra
    /// round trip (request → grant, then ack → response). Payloads that travelled inline,
    /// through a write slot, pulled by the server or pushed into the window the request
    /// offered took none.
    pub transfers: u64,
}

impl ClientStats {
    /// Protocol round trips per call between `before` and `self`.
    pub fn round_trips_since(&self, before: &ClientStats) -> f64 {
        let calls = self.calls.saturating_sub(before.calls);
        if calls == 0 {
            return 0.0;
        }
        let transfers = self.transfers.saturating_sub(before.transfers);
        (calls + transfers) as f64 / calls as f64
    }
}

/// What the server said about a call.
#[derive(Debug)]
pub(crate) enum ServerEvent {
    Grant(GrantFrame),
    Response(ResponseFrame),
}

/// A call the driver routes frames to. The permit is the call's place in the in-flight
/// window; it is released when the server's response arrives (also for calls the caller
/// abandoned), so client and server always agree on what is in flight.
struct Entry {
    events: Option<mailbox::Sender<ServerEvent>>,
    /// A streaming call's streams (its frames and response go there, not to `events`).
    stream: Option<Arc<crate::stream::StreamCell>>,
    /// Windows of an abandoned call, open until the server's response.
    hold: Vec<Grant>,
    _permit: OwnedSemaphorePermit,
}

/// Results of outbound endpoints up to this size are offered a window of the endpoint's whole
/// buffer on their first call; larger endpoints learn the size from their first result.
const FIRST_REPLY_WINDOW: u64 = 64 << 10;

pub(crate) struct Inner {
    channel: Arc<FrameChannel>,
    /// Offers both ways on this connection.
    remote: RemoteMemory,
    calls: Mutex<CallMap<Entry>>,
    /// Set once the connection is over: why.
    closed: Mutex<Option<Status>>,
    /// Whether `closed` is set.
    over: AtomicBool,
    /// Wakes those waiting for the connection to be over, once `over` is set.
    gone: tokio::sync::Notify,
    /// Closed by this client: its goodbye closes the connection.
    leaving: AtomicBool,
    in_flight: Arc<Semaphore>,
    /// Calls the server lets this connection have in flight (`in_flight`'s permits).
    window: usize,
    next_id: AtomicU64,
    counters: Arc<Counters>,
    /// Pings waiting for their pong, by id.
    pings: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<()>>>,
    inline_threshold: usize,
    /// Write slots of the server not used yet: (index, window).
    slots: Mutex<Vec<(u32, Descriptor)>>,
    /// Large payloads are pulled by the server from a window of the request.
    pull_writes: bool,
    /// Size of the window offered for results, per outbound endpoint: its last result.
    reply_sizes: Mutex<HashMap<(&'static str, u32), usize>>,
    staging: StagingPools,
    /// Warm buffers for copies of pushed results over unfenced transports.
    copies: Arc<copies::CopyPool>,
    /// The task reading the connection (set once, right after construction).
    driver: OnceLock<AbortHandle>,
    /// Bytes of stream messages the server buffers per call (its `stream_window`).
    peer_stream_window: u64,
    /// Bytes of stream messages this client buffers per call.
    stream_window: u64,
    /// Windows a bulk stream offers at once.
    stream_depth: usize,
}

/// Counters of a client, kept across reconnections.
#[derive(Debug, Default)]
struct Counters {
    completed: AtomicU64,
    transfers: AtomicU64,
}

impl Inner {
    /// Marks the connection over, for `why` unless it already was.
    fn end(&self, why: Status) {
        lock(&self.closed).get_or_insert(why);
        self.over.store(true, Ordering::Release);
        self.gone.notify_waiters();
    }

    /// Resolves once the connection is over (lost, ended by the server's goaway, or closed).
    pub(super) async fn ended(&self) {
        let notified = self.gone.notified();
        tokio::pin!(notified);
        // Registered before the check: an end between the two still wakes this.
        notified.as_mut().enable();
        if self.lost().is_none() {
            notified.await;
        }
    }

    /// Ends every call in flight with the reason the connection is over: dropping the
    /// entries ends each waiting call (it sees its channel close); streams are told why.
    fn end_calls(&self) {
        let mut calls = lock(&self.calls);
        for entry in calls.values() {
            if let Some(cell) = &entry.stream {
                cell.end(self.closed_status());
            }
        }
        calls.clear();
        drop(calls);
        lock(&self.pings).clear();
    }

    /// Why the connection is over, if it is.
    fn lost(&self) -> Option<Status> {
        // Read on every call: the flag spares the lock while the connection lives.
        if !self.over.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.closed).clone()
    }

    /// A free write slot that holds `len` bytes.
    fn take_slot(&self, len: usize) -> Option<(u32, Descriptor)> {
        let mut slots = lock(&self.slots);
        let at = slots.iter().position(|(_, w)| w.len >= len as u64)?;
        Some(slots.swap_remove(at))
    }

    fn add_slots(&self, frames: Vec<SlotFrame>) {
        if frames.is_empty() {
            return;
        }
        let mut slots = lock(&self.slots);
        for frame in frames {
            if let Some(window) = frame.window {
                slots.push((frame.index, window.into()));
            }
        }
    }

    /// The window to offer for a result of `endpoint`, if any.
    fn reply_size(&self, endpoint: &EndpointDef) -> Option<usize> {
        let key = (endpoint.path, endpoint.op.as_u32());
        match lock(&self.reply_sizes).get(&key) {
            Some(&size) => (size > 0).then_some(size),
            None => {
                let size = endpoint.buffer_size;
                (size > self.inline_threshold as u64 && size <= FIRST_REPLY_WINDOW)
                    .then_some(size as usize)
            }
        }
    }

    /// The streams of call `id`, if it is in flight and streams.
    fn stream_of(&self, id: u64) -> Option<Arc<crate::stream::StreamCell>> {
        lock(&self.calls).get(&id).and_then(|e| e.stream.clone())
    }

    /// Remembers a result's size: the next call offers a window that large (none for results
    /// that travel inline).
    fn learn_reply_size(&self, endpoint: &EndpointDef, len: usize) {
        let size = if len > self.inline_threshold { len } else { 0 };
        lock(&self.reply_sizes).insert((endpoint.path, endpoint.op.as_u32()), size);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(driver) = self.driver.get() {
            driver.abort();
        }
        if self.leaving.load(Ordering::Acquire) {
            // `Client::close` said goodbye; that closes the connection.
        } else if self.lost().is_none() {
            // The last handle is gone: a client that leaves, not a connection lost.
            leave(&self.channel);
        } else {
            self.channel.conn().close();
        }
    }
}

/// The status of a call refused while the client waits `wait` before its next attempt to
/// reconnect: the same message for every call of the wait (no countdown in it, so errors
/// group), the wait in [`Status::retry_after`].
fn backing_off(why: &Status, addr: &str, error: &str, wait: Duration) -> Status {
    Status::unavailable(format!(
        "{} (reconnecting to {addr} failed: {error}; waiting before the next attempt)",
        why.message()
    ))
    .with_retry_after(wait)
}

/// Longest a client's goodbye waits for the server to have it before the connection closes.
const GOODBYE_WAIT: Duration = Duration::from_secs(1);

/// Says goodbye to the server (a goaway frame, as the server sends one when it stops), then
/// closes the connection once the server has the frame (at most [`GOODBYE_WAIT`] later). The
/// server then counts a client that left, not a connection lost
/// (`rdma_rpc_server_connections_dropped_total`). Without a credit free now, it closes at once.
fn goodbye(channel: &Arc<FrameChannel>) -> crate::transport::BoxFuture<'static, ()> {
    let frame = crate::protocol::frames::StatusFrame::from(&Status::new(
        crate::status::Code::Ok,
        "the client is leaving",
    ));
    let sent = channel.try_send_last(Kind::Goaway(frame));
    let channel = channel.clone();
    Box::pin(async move {
        if let Some(sent) = sent {
            let _ = tokio::time::timeout(GOODBYE_WAIT, sent).await;
        }
        channel.conn().close();
    })
}

/// Runs a [`goodbye`] on a task of its own; outside a runtime, closes at once.
fn leave(channel: &Arc<FrameChannel>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(goodbye(channel))),
        Err(_) => channel.conn().close(),
    }
}

/// A connection to a server. Clones share the connection; calls run concurrently.
///
/// When the connection is lost, calls in flight fail with `UNAVAILABLE` and the next call
/// dials again (unless [`ClientConfig::reconnect`] is off): lazily, with exponential backoff
/// between failed attempts; calls made during a backoff fail at once with `UNAVAILABLE`,
/// the same message each (the last attempt's error) and the time left until the next
/// attempt in [`Status::retry_after`]. A call is never repeated by the client: one that was
/// in flight may or may not have run. Offers of [`remote_memory`](Client::remote_memory)
/// belong to one connection and end with it.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

/// What the clones of a client share: the current connection and how to make a new one.
struct Shared {
    /// For a client of several servers, a connection of one of them, for
    /// [`Client::remote_memory`] when none is ready (a call replaces it once it is lost).
    current: Mutex<Arc<Inner>>,
    /// How to dial again; `None` when reconnection is off.
    redial: Option<Redial>,
    /// Closed by [`Client::close`]: never reconnects.
    closed: AtomicBool,
    counters: Arc<Counters>,
    interceptors: Chain<dyn ClientInterceptor>,
    config: ClientConfig,
    metrics: crate::observe::ClientEndpoints,
    /// The servers of a client of several ([`ClientBuilder::connect_balanced`]); each call
    /// takes a connection from them.
    balance: Option<Arc<balance::Balancer>>,
}

struct Redial {
    addr: String,
    transport: Arc<dyn Transport>,
    /// Held by the one attempt that runs; calls that find the connection lost meanwhile wait
    /// for its outcome.
    backoff: tokio::sync::Mutex<reconnect::Backoff>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(balance) = &self.shared.balance {
            return f
                .debug_struct("Client")
                .field("servers", &balance.servers())
                .finish();
        }
        let inner = self.current();
        f.debug_struct("Client")
            .field("peer", &inner.channel.conn().peer())
            .field("in_flight_available", &inner.in_flight.available_permits())
            .field("reconnect", &self.shared.redial.is_some())
            .finish()
    }
}

/// Options of one call: its deadline and metadata. Generated clients take them from a
/// [`Request`](crate::Request); raw calls take them directly (a plain `Option<Duration>`
/// converts into a deadline without metadata).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CallOptions {
    /// Deadline; overrides the endpoint's default and [`ClientConfig::default_timeout`].
    pub timeout: Option<Duration>,
    /// Metadata the handler reads.
    pub metadata: Metadata,
}

impl CallOptions {
    /// No deadline of its own, no metadata.
    pub fn new() -> CallOptions {
        CallOptions::default()
    }

    /// Sets the deadline.
    pub fn timeout(mut self, timeout: Duration) -> CallOptions {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the metadata.
    pub fn metadata(mut self, metadata: Metadata) -> CallOptions {
        self.metadata = metadata;
        self
    }
}

impl From<Option<Duration>> for CallOptions {
    fn from(timeout: Option<Duration>) -> CallOptions {
        CallOptions {
            timeout,
            metadata: Metadata::new(),
        }
    }
}

impl From<Duration> for CallOptions {
    fn from(timeout: Duration) -> CallOptions {
        CallOptions::from(Some(timeout))
    }
}

impl Client {
    /// Connects to `addr` with default settings (`tcp://host:port` selects the software
    /// transport).
    pub async fn connect(addr: &str) -> Result<Client> {
        Client::builder().connect(addr).await
    }

    /// A builder for settings.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client of one server over `inner`, which reconnects to `addr` if the settings say so.
    fn single(
        inner: Arc<Inner>,
        addr: &str,
        transport: Arc<dyn Transport>,
        config: ClientConfig,
        interceptors: Chain<dyn ClientInterceptor>,
        counters: Arc<Counters>,
    ) -> Client {
        let redial = config.reconnect.then(|| Redial {
            addr: addr.to_owned(),
            transport,
            backoff: tokio::sync::Mutex::new(reconnect::Backoff::new(
                config.reconnect_backoff,
                config.reconnect_backoff_max,
            )),
        });
        Client {
            shared: Arc::new(Shared {
                current: Mutex::new(inner),
                redial,
                closed: AtomicBool::new(false),
                counters,
                interceptors,
                config,
                metrics: Default::default(),
                balance: None,
            }),
        }
    }

    fn current(&self) -> Arc<Inner> {
        lock(&self.shared.current).clone()
    }

    /// The connection calls use now: the current one, or a new one if it was lost.
    ///
    /// The dialing lives in a boxed future of its own: the future of every call would
    /// otherwise carry room for a whole connection handshake.
    async fn connection(&self) -> Result<Arc<Inner>, Status> {
        if let Some(balance) = &self.shared.balance {
            let inner = balance.pick().await?;
            // What `remote_memory` falls back on: not a lost connection, which would keep its
            // memory until this client is dropped.
            let mut current = lock(&self.shared.current);
            if current.lost().is_some() {
                *current = inner.clone();
            }
            return Ok(inner);
        }
        let inner = self.current();
        match inner.lost() {
            None => Ok(inner),
            Some(why) => Box::pin(self.redial(why)).await,
        }
    }

    /// The slow path of [`connection`](Client::connection): the connection is over.
    async fn redial(&self, why: Status) -> Result<Arc<Inner>, Status> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(why);
        }
        let Some(redial) = &self.shared.redial else {
            return Err(why);
        };
        let mut backoff = redial.backoff.lock().await;
        // Another call may have reconnected while this one waited.
        let inner = self.current();
        let Some(why) = inner.lost() else {
            return Ok(inner);
        };
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(why);
        }
        let addr = &redial.addr;
        if let Err((wait, error)) = backoff.ready(Instant::now()) {
            return Err(backing_off(&why, addr, error, wait));
        }
        match dial(
            &redial.transport,
            addr,
            &self.shared.config,
            &self.shared.counters,
        )
        .await
        {
            Ok(fresh) => {
                if backoff.failures() > 0 {
                    tracing::info!(
                        addr = %addr,
                        attempts = backoff.failures() + 1,
                        "reconnected"
                    );
                } else {
                    tracing::info!(addr = %addr, "reconnected");
                }
                backoff.succeeded();
                crate::observe::reconnect(true);
                *lock(&self.shared.current) = fresh.clone();
                Ok(fresh)
            }
            Err(e) => {
                let wait = backoff.failed(Instant::now(), e.to_string(), reconnect::jitter());
                crate::observe::reconnect(false);
                tracing::warn!(
                    addr = %addr,
                    error = %e,
                    next_attempt_in = ?wait,
                    "reconnecting failed"
                );
                Err(backing_off(&why, addr, &e.to_string(), wait))
            }
        }
    }

    /// The server's address; for a client of several servers, their addresses, separated by
    /// `, `.
    pub fn peer(&self) -> String {
        if let Some(balance) = &self.shared.balance {
            let servers = balance.servers();
            let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
            return addrs.join(", ");
        }
        self.current().channel.conn().peer().to_owned()
    }

    /// The current connection's remote memory: offer client memory to the server (the
    /// handles go in request messages), and use the remote buffers the server offers. Offers
    /// end with the connection (a reconnection starts with none).
    ///
    /// A client of several servers sends each call to any of them, so an offer made here may
    /// not reach the server of the next call: take one server's client with
    /// [`pick`](Client::pick) and make both the offer and the call with it.
    pub fn remote_memory(&self) -> RemoteMemory {
        if let Some(inner) = self.shared.balance.as_ref().and_then(|b| b.ready_one()) {
            return inner.remote.clone();
        }
        self.current().remote.clone()
    }

    /// Counters of this client (shared by clones, kept across reconnections).
    pub fn stats(&self) -> ClientStats {
        let counters = &self.shared.counters;
        ClientStats {
            calls: counters.completed.load(Ordering::Relaxed),
            transfers: counters.transfers.load(Ordering::Relaxed),
        }
    }

    /// Whether the connection is over: closed here, or lost or ended by the server once this
    /// client has seen it (a failed call has). New calls then fail at once with the reason,
    /// or, with [`ClientConfig::reconnect`] on and unless [`close`](Client::close) was
    /// called, dial again.
    ///
    /// A client of several servers is closed when [`close`](Client::close) was called or no
    /// server is ready.
    pub fn is_closed(&self) -> bool {
        if let Some(balance) = &self.shared.balance {
            return self.shared.closed.load(Ordering::Acquire) || balance.ready_one().is_none();
        }
        self.current().lost().is_some()
    }

    /// Closes the connection for good: calls in flight end with
    /// [`Code::Unavailable`](crate::Code), and later calls fail (no reconnection).
    ///
    /// The client says goodbye first, so the server counts a client that left rather than a
    /// connection lost; the connection closes once the server has the goodbye, on a task of
    /// its own. A process about to exit awaits [`shutdown`](Client::shutdown) instead.
    pub fn close(&self) {
        if let Some(balance) = &self.shared.balance {
            self.shared.closed.store(true, Ordering::Release);
            balance.close();
            return;
        }
        if let Some(inner) = self.begin_close() {
            leave(&inner.channel);
        }
    }

    /// As [`close`](Client::close), and resolves once the server has the client's goodbye
    /// and the connection is closed (at most a second): for a process that exits right after
    /// (a probe, a command line tool), whose runtime would otherwise stop before the goodbye
    /// left.
    pub async fn shutdown(&self) {
        if let Some(balance) = &self.shared.balance {
            self.shared.closed.store(true, Ordering::Release);
            balance.shutdown().await;
            return;
        }
        if let Some(inner) = self.begin_close() {
            goodbye(&inner.channel).await;
        }
    }

    /// Marks the client closed and ends the calls in flight; the connection to say goodbye
    /// on, if it was still open.
    fn begin_close(&self) -> Option<Arc<Inner>> {
        self.shared.closed.store(true, Ordering::Release);
        let inner = self.current();
        if inner.leaving.swap(true, Ordering::AcqRel) {
            return None; // closed before: its goodbye is under way
        }
        let open = inner.lost().is_none();
        inner.end(Status::unavailable("closed by this client"));
        inner.end_calls();
        if open {
            Some(inner)
        } else {
            inner.channel.conn().close();
            None
        }
    }

    /// Measures one round trip to the server's runtime (no handler runs): a ping frame the
    /// server answers at once. Reconnects first if the connection was lost.
    pub async fn ping(&self) -> Result<Duration, Status> {
        let inner = self.connection().await?;
        inner.ping().await
    }

    async fn handshake(
        conn: Arc<dyn crate::transport::Connection>,
        config: &ClientConfig,
        counters: Arc<Counters>,
    ) -> Result<Arc<Inner>> {
        let initial = config.initial_receives.min(config.recv_credits);
        let token = crate::remote::new_token();
        let channel = Arc::new(FrameChannel::growing(
            conn,
            initial,
            config.recv_credits,
            config.max_frame,
            true,
        )?);
        let peer = channel.conn().peer().to_owned();
        let answer = async {
            channel
                .send_priority(Kind::Hello(Hello {
                    version: PROTOCOL_VERSION,
                    max_frame: config.max_frame as u32,
                    credits: initial,
                    max_credits: config.recv_credits,
                    max_in_flight: config.max_in_flight,
                    inline_threshold: config.inline_threshold,
                    token,
                    stream_window: stream_window(config.stream_window, config.max_frame),
                    ..Default::default()
                }))
                .await?;
            channel.recv().await
        };
        let ack = match answer.await.map_err(|e| unserved(&peer, e))?.kind {
            Some(Kind::HelloAck(ack)) => ack,
            Some(Kind::Goaway(status)) => {
                let status = Status::from(status);
                return Err(Error::ConnectionClosed {
                    peer,
                    reason: format!("refused by the server: {status}"),
                });
            }
            _ => {
                return Err(Error::Protocol {
                    peer,
                    reason: "the server did not answer the handshake".into(),
                })
            }
        };
        if ack.version != PROTOCOL_VERSION {
            return Err(Error::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: ack.version,
            });
        }
        if let Some(reason) = crate::protocol::unusable_hello(&ack) {
            return Err(Error::Protocol { peer, reason });
        }
        // The Hello used the one credit every side starts with.
        channel.set_peer(
            ack.credits.saturating_sub(1),
            ack.credits.max(ack.max_credits),
            ack.max_frame,
        );
        let max_in_flight = ack.max_in_flight.max(1);
        let slots = ack
            .slots
            .into_iter()
            .filter_map(|s| Some((s.index, s.window?.into())))
            .collect();
        let remote = RemoteMemory::new(End::new(
            channel.clone(),
            token,
            ack.token,
            config.transfer_timeout,
        ));
        let inner = Arc::new(Inner {
            remote,
            staging: StagingPools::new(config.staging_budget),
            copies: copies::CopyPool::new(config.staging_budget),
            inline_threshold: ack.inline_threshold.min(config.inline_threshold) as usize,
            slots: Mutex::new(slots),
            pull_writes: ack.pull_writes,
            reply_sizes: Mutex::new(HashMap::new()),
            channel: channel.clone(),
            calls: Mutex::new(CallMap::default()),
            closed: Mutex::new(None),
            over: AtomicBool::new(false),
            gone: tokio::sync::Notify::new(),
            leaving: AtomicBool::new(false),
            in_flight: Arc::new(Semaphore::new(max_in_flight as usize)),
            window: max_in_flight as usize,
            next_id: AtomicU64::new(1),
            counters,
            pings: Mutex::new(HashMap::new()),
            driver: OnceLock::new(),
            peer_stream_window: ack.stream_window,
            stream_window: stream_window(config.stream_window, config.max_frame),
            stream_depth: config.stream_depth.max(1),
        });
        // Spawned once `inner` exists: a driver started inside `Arc::new_cyclic` could read a
        // frame (a credit update, a goaway) before its weak reference upgrades, and would
        // take that for a client that is gone.
        let driver = tokio::spawn(drive(Arc::downgrade(&inner), channel));
        let _ = inner.driver.set(driver.abort_handle());
        Ok(inner)
    }
}

impl Inner {
    async fn ping(&self) -> Result<Duration, Status> {
        if let Some(why) = self.lost() {
            return Err(why);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        lock(&self.pings).insert(id, tx);
        // Forgets the ping if the caller stops waiting.
        struct Forget<'a>(&'a Inner, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                lock(&self.0.pings).remove(&self.1);
            }
        }
        let _forget = Forget(self, id);
        let started = Instant::now();
        self.channel
            .send(Kind::Ping(CallId { id }))
            .await
            .map_err(Status::from)?;
        match rx.await {
            Ok(()) => Ok(started.elapsed()),
            Err(_) => Err(self
                .lost()
                .unwrap_or_else(|| Status::unavailable("connection lost"))),
        }
    }
}

/// The stream window a side announces: what it asked for, and at least two frames' worth.
pub(crate) fn stream_window(wanted: u64, max_frame: usize) -> u64 {
    wanted.max(crate::protocol::stream::min_window(max_frame))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The status a connection ends with when the server broke a stream's rules.
fn violation(v: crate::protocol::stream::Violation) -> Status {
    Status::internal(format!("protocol violation: {v}"))
}

/// Reads frames and routes them to calls. When the connection ends, every call in flight
/// ends with the reason.
async fn drive(inner: std::sync::Weak<Inner>, channel: Arc<FrameChannel>) {
    let reason = loop {
        let frame = match channel.recv().await {
            Ok(frame) => frame,
            Err(e) => break Status::unavailable(format!("connection lost: {e}")),
        };
        let Some(inner) = inner.upgrade() else {
            // Every handle of the client is gone: nobody waits for this frame.
            channel.conn().close();
            return;
        };
        let (id, event) = match frame.kind {
            None => continue,
            Some(Kind::Grant(g)) => (g.id, ServerEvent::Grant(g)),
            Some(Kind::Response(mut r)) => {
                inner.add_slots(std::mem::take(&mut r.slots));
                (r.id, ServerEvent::Response(r))
            }
            Some(Kind::Revoke(r)) => {
                inner.remote.end().on_revoke(r.offers);
                continue;
            }
            Some(Kind::Revoked(r)) => {
                inner.remote.end().on_revoked(r.offers);
                continue;
            }
            Some(Kind::Messages(m)) => match inner.stream_of(m.id) {
                Some(cell) => match cell.messages(m) {
                    Ok(()) => continue,
                    Err(v) => break violation(v),
                },
                None => continue, // a call the client gave up on, answered since
            },
            Some(Kind::Credit(c)) => match inner.stream_of(c.id) {
                Some(cell) => match cell.credit(c.bytes) {
                    Ok(()) => continue,
                    Err(v) => break violation(v),
                },
                None => continue,
            },
            Some(Kind::Chunks(c)) if c.offers.is_empty() => match inner.stream_of(c.id) {
                Some(cell) => match cell.used(c.used) {
                    Ok(()) => continue,
                    Err(v) => break violation(v),
                },
                None => continue,
            },
            Some(Kind::Pong(pong)) => {
                if let Some(tx) = lock(&inner.pings).remove(&pong.id) {
                    let _ = tx.send(());
                }
                continue;
            }
            Some(Kind::Goaway(status)) => {
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
                *lock(&inner.closed) = Some(said);
                inner.over.store(true, Ordering::Release);
                inner.gone.notify_waiters();
                continue;
            }
            Some(_) => {
                break Status::internal("protocol violation: unexpected frame from the server")
            }
        };
        let mut calls = lock(&inner.calls);
        match event {
            ServerEvent::Response(response) => {
                if let Some(entry) = calls.remove(&id) {
                    if let Some(cell) = entry.stream {
                        cell.respond(response);
                    } else if let Some(tx) = entry.events {
                        tx.send(ServerEvent::Response(response));
                    }
                    // An abandoned call's windows: the server answered, so it is done with
                    // them (their memory may serve again).
                    if !entry.hold.is_empty() {
                        entry.hold.into_iter().for_each(Grant::release);
                    }
                }
            }
            ServerEvent::Grant(_) => {
                if let Some(Entry {
                    events: Some(tx), ..
                }) = calls.get(&id)
                {
                    tx.send(event);
                }
            }
        }
    };
    channel.conn().close();
    if let Some(inner) = inner.upgrade() {
        inner.end(reason);
        inner.end_calls();
    }
}
