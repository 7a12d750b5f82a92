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

mod call;
mod copies;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use crate::error::{Error, Result};
use crate::memory::StagingPools;
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{GrantFrame, Hello, Kind, ResponseFrame, SlotFrame};
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
    /// Most receives posted for control frames: 4 at first, one more with each frame
    /// received until this many. Default 64.
    pub recv_credits: u32,
    /// Send payloads up to this size travel inside the request frame. Default 8 KiB (the
    /// server may lower it).
    pub inline_threshold: u32,
    /// Deadline of calls that set none and whose endpoint has none. Default: none.
    pub default_timeout: Option<Duration>,
    /// Longest wait for the connection and handshake. Default 10 s.
    pub connect_timeout: Duration,
    /// Memory kept registered for results (the windows receive and read calls offer) and
    /// pulled payloads, per power-of-two size class; buffers beyond it are allocated per call.
    /// Over DOCA it also bounds the plain buffers kept warm for the copies of pushed results.
    /// Default 64 MiB.
    pub staging_budget: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_in_flight: 128,
            max_frame: 16 * 1024,
            recv_credits: 64,
            inline_threshold: 8 * 1024,
            default_timeout: None,
            connect_timeout: Duration::from_secs(10),
            staging_budget: 64 << 20,
        }
    }
}

/// Builds a [`Client`].
#[derive(Debug, Default)]
pub struct ClientBuilder {
    config: ClientConfig,
    transport: Option<Arc<dyn Transport>>,
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

    setters! {
        /// See [`ClientConfig::max_in_flight`].
        max_in_flight: u32,
        /// See [`ClientConfig::max_frame`].
        max_frame: usize,
        /// See [`ClientConfig::recv_credits`].
        recv_credits: u32,
        /// See [`ClientConfig::inline_threshold`].
        inline_threshold: u32,
        /// See [`ClientConfig::connect_timeout`].
        connect_timeout: Duration,
        /// See [`ClientConfig::staging_budget`].
        staging_budget: usize,
    }

    /// Connects and runs the handshake.
    pub async fn connect(self, addr: &str) -> Result<Client> {
        let min_receives = crate::protocol::credits::MIN_RECEIVES;
        if self.config.max_frame < 2 * crate::protocol::FRAME_OVERHEAD
            || self.config.recv_credits < min_receives
        {
            return Err(Error::InvalidArgument(format!(
                "max_frame must be at least {} bytes and recv_credits at least {min_receives}",
                2 * crate::protocol::FRAME_OVERHEAD
            )));
        }
        let transport = match self.transport {
            Some(t) => t,
            None => transport_for(addr)?,
        };
        let limit = self.config.connect_timeout;
        let config = self.config;
        tokio::time::timeout(limit, async move {
            let conn = transport.connect(addr).await?;
            Client::handshake(conn, config).await
        })
        .await
        .map_err(|_| Error::ConnectionClosed {
            peer: addr.to_owned(),
            reason: format!("no connection and handshake within {limit:?}"),
        })?
    }
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
    in_flight: Arc<Semaphore>,
    next_id: AtomicU64,
    completed: AtomicU64,
    transfers: AtomicU64,
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
    config: ClientConfig,
    /// The task reading the connection (set once, right after construction).
    driver: OnceLock<AbortHandle>,
}

impl Inner {
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
        self.channel.conn().close();
    }
}

/// A connection to a server. Clones share the connection; calls run concurrently.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("peer", &self.inner.channel.conn().peer())
            .field(
                "in_flight_available",
                &self.inner.in_flight.available_permits(),
            )
            .finish()
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

    /// The server's address.
    pub fn peer(&self) -> &str {
        self.inner.channel.conn().peer()
    }

    /// This connection's remote memory: offer client memory to the server (the handles go
    /// in request messages), and use the remote buffers the server offers.
    pub fn remote_memory(&self) -> RemoteMemory {
        self.inner.remote.clone()
    }

    /// Counters of this connection (shared by clones).
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            calls: self.inner.completed.load(Ordering::Relaxed),
            transfers: self.inner.transfers.load(Ordering::Relaxed),
        }
    }

    /// Whether the connection is over: closed here, or lost or ended by the server once this
    /// client has seen it (a failed call has). New calls then fail at once, with the reason. A
    /// client does not reconnect; make a new one.
    pub fn is_closed(&self) -> bool {
        lock(&self.inner.closed).is_some()
    }

    /// Closes the connection: calls in flight end with [`Code::Unavailable`](crate::Code).
    pub fn close(&self) {
        lock(&self.inner.closed)
            .get_or_insert_with(|| Status::unavailable("closed by this client"));
        self.inner.channel.conn().close();
    }

    async fn handshake(
        conn: Arc<dyn crate::transport::Connection>,
        config: ClientConfig,
    ) -> Result<Client> {
        let initial = crate::protocol::INITIAL_RECEIVES.min(config.recv_credits);
        let token = crate::remote::new_token();
        let channel = Arc::new(FrameChannel::growing(
            conn,
            initial,
            config.recv_credits,
            config.max_frame,
            true,
        )?);
        channel
            .send_priority(Kind::Hello(Hello {
                version: PROTOCOL_VERSION,
                max_frame: config.max_frame as u32,
                credits: initial,
                max_credits: config.recv_credits,
                max_in_flight: config.max_in_flight,
                inline_threshold: config.inline_threshold,
                token,
                ..Default::default()
            }))
            .await?;
        let peer = channel.conn().peer().to_owned();
        let ack = match channel.recv().await?.kind {
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
        let remote = RemoteMemory::new(End::new(channel.clone(), token, ack.token));
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
            in_flight: Arc::new(Semaphore::new(max_in_flight as usize)),
            next_id: AtomicU64::new(1),
            completed: AtomicU64::new(0),
            transfers: AtomicU64::new(0),
            config,
            driver: OnceLock::new(),
        });
        // Spawned once `inner` exists: a driver started inside `Arc::new_cyclic` could read a
        // frame (a credit update, a goaway) before its weak reference upgrades, and would
        // take that for a client that is gone.
        let driver = tokio::spawn(drive(Arc::downgrade(&inner), channel));
        let _ = inner.driver.set(driver.abort_handle());
        Ok(Client { inner })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
            Some(Kind::Goaway(status)) => {
                let status = Status::from(status);
                tracing::debug!(%status, "server said goodbye");
                // Calls in flight still get their responses; new calls are refused.
                *lock(&inner.closed) = Some(Status::new(
                    status.code(),
                    format!("the server closed the connection: {}", status.message()),
                ));
                continue;
            }
            Some(_) => {
                break Status::internal("protocol violation: unexpected frame from the server")
            }
        };
        let mut calls = lock(&inner.calls);
        match event {
            ServerEvent::Response(_) => {
                if let Some(entry) = calls.remove(&id) {
                    if let Some(tx) = entry.events {
                        tx.send(event);
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
        lock(&inner.closed).get_or_insert(reason);
        // Dropping the entries ends every waiting call (it sees its channel close).
        lock(&inner.calls).clear();
    }
}
