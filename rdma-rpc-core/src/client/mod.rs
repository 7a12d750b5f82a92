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
//!
//! Files: `config.rs` (settings, the builder, dialling), `connection.rs` (one connection: its
//! handshake, the task that reads it, pings, the goodbye), `call.rs` (what a call does), `post.rs`
//! (building and sending a request), `sent.rs` (a small send's own future),
//! `stream.rs` (streaming calls), `reconnect.rs` (the backoff), `balance/` (several
//! servers).

pub mod balance;
mod call;
mod config;
mod connection;
mod copies;
mod post;
mod read_stream;
mod reconnect;
mod sent;
mod stream;

pub use config::{ClientBuilder, ClientConfig};
pub use read_stream::{Download, ReadStream};
pub use stream::RequestStream;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use config::dial;
use connection::Inner;

use crate::error::Result;
use crate::interceptor::{Chain, ClientInterceptor};
use crate::metadata::Metadata;
use crate::remote::RemoteMemory;
use crate::status::Status;
use crate::transport::Transport;

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

/// Counters of a client, kept across reconnections.
#[derive(Debug, Default)]
struct Counters {
    completed: AtomicU64,
    transfers: AtomicU64,
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
///
/// Laid out in this order (`repr(C)`): what every call reads first (the current connection,
/// whether the client is balanced, the interceptors, the default deadline), in the same one or
/// two cache lines; with 1,000 clients calling, each line is a miss per call (left to the
/// compiler, those fields were spread over four).
#[repr(C)]
struct Shared {
    /// For a client of several servers, a connection of one of them, for
    /// [`Client::remote_memory`] when none is ready (a call replaces it once it is lost).
    current: Mutex<Arc<Inner>>,
    /// The servers of a client of several ([`ClientBuilder::connect_balanced`]); each call
    /// takes a connection from them.
    balance: Option<Arc<balance::Balancer>>,
    interceptors: Chain<dyn ClientInterceptor>,
    /// `config.default_timeout`, next to the fields above.
    default_timeout: Option<Duration>,
    /// Closed by [`Client::close`]: never reconnects.
    closed: AtomicBool,
    counters: Arc<Counters>,
    /// How to dial again; `None` when reconnection is off.
    redial: Option<Redial>,
    config: ClientConfig,
    metrics: crate::observe::ClientEndpoints,
}

impl Shared {
    fn new(
        current: Arc<Inner>,
        redial: Option<Redial>,
        counters: Arc<Counters>,
        interceptors: Chain<dyn ClientInterceptor>,
        config: ClientConfig,
        balance: Option<Arc<balance::Balancer>>,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            current: Mutex::new(current),
            balance,
            interceptors,
            default_timeout: config.default_timeout,
            closed: AtomicBool::new(false),
            counters,
            redial,
            config,
            metrics: Default::default(),
        })
    }
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
            .field("peer", &inner.peer())
            .field("in_flight", &inner.in_flight())
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
            shared: Shared::new(inner, redial, counters, interceptors, config, None),
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
        self.current().peer().to_owned()
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
            connection::finish_later(&inner.session);
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
            inner.session.finish(connection::GOODBYE_WAIT).await;
        }
    }

    /// Marks the client closed and ends the calls in flight; the connection to say goodbye
    /// on, if it was still open.
    fn begin_close(&self) -> Option<Arc<Inner>> {
        self.shared.closed.store(true, Ordering::Release);
        let inner = self.current();
        // Once only: a second close finds the goodbye under way.
        inner.leave().then_some(inner)
    }

    /// Measures one round trip to the server's runtime (no handler runs): a ping frame the
    /// server answers at once. Reconnects first if the connection was lost.
    pub async fn ping(&self) -> Result<Duration, Status> {
        let inner = self.connection().await?;
        inner.ping().await
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod layout {
    use std::mem::offset_of;
    use std::time::Duration;

    use super::Shared;

    /// What every call reads of a client's shared state (the current connection, whether it is
    /// balanced, the interceptors, the default deadline) lies within 64 bytes, so within two
    /// cache lines wherever the allocation starts (see [`Shared`]).
    #[test]
    fn what_every_call_reads_of_a_client_is_together() {
        let first = offset_of!(Shared, current);
        let end = offset_of!(Shared, default_timeout) + size_of::<Option<Duration>>();
        assert_eq!(first, 0, "the current connection first");
        assert!(
            end - first <= 64,
            "the hot fields span {} bytes",
            end - first
        );
    }

    /// So does what every call reads of its connection (the session, what the handshake
    /// settled): first, within 48 bytes, which with the reference count each call takes make
    /// 64.
    #[test]
    fn what_every_call_reads_of_a_connection_is_together() {
        use super::connection::Inner;
        use crate::protocol::connection::Negotiated;
        assert_eq!(offset_of!(Inner, session), 0);
        let end = offset_of!(Inner, negotiated) + size_of::<Negotiated>();
        assert!(end <= 48, "the hot fields end at byte {end}");
    }
}
