//! The server: a builder that takes services, binds an address, and serves connections.
//!
//! ```no_run
//! # async fn run(service: impl rdma_rpc_core::Service) -> Result<(), rdma_rpc_core::Error> {
//! use rdma_rpc_core::Server;
//!
//! Server::builder()
//!     .add_service(service)
//!     .serve("tcp://0.0.0.0:7470")
//!     .await
//! # }
//! ```

mod admission;
mod call;
mod conn;
mod listing;
mod share;
mod slots;
mod stream;

pub use admission::ConnectionCount;
pub(crate) use call::ClientEvent;
pub use listing::{ConnectionInfo, PoolInfo, ServerHandle};

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::interceptor::{Chain, ServerInterceptor};
use crate::memory::{Access, BufferPool};
use crate::observe::logs;
use crate::service::{EndpointDef, OpKind, Service};
use crate::transport::{transport_for, Fencing, Listener, Transport};

/// Limits and sizes of a server. Every limit is enforced before memory is allocated for the
/// thing it limits; errors name the limit.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Most connections served at once; further clients get an error and are closed.
    /// Default 1024.
    pub max_connections: usize,
    /// Connections one peer (one IP address) may hold at once; 0 for no limit. Over RDMA CM
    /// the peer's address is not known and only `max_connections` applies. Default 128.
    pub max_connections_per_peer: usize,
    /// Closes a handshaken connection that has no call in flight and sent no frame for this
    /// long (the client sees `UNAVAILABLE`). `None` keeps idle connections open; set it on a
    /// server that untrusted clients reach, so idle sockets cannot hold every connection
    /// slot (clients reconnect on their next call). Default `None`.
    pub idle_timeout: Option<Duration>,
    /// Most calls in flight per connection. Default 128.
    pub max_in_flight: u32,
    /// Size of each receive posted for control frames: the largest frame a client may send.
    /// Default 16 KiB.
    pub max_frame: usize,
    /// Most receives posted per connection for control frames (the client's credits). A
    /// connection starts with `initial_receives` (4) and adds one with each frame it receives
    /// (other than the handshake and credit updates) until it has this many, so an idle
    /// connection holds 4 × `max_frame` (64 KiB) and a busy one this many. Default 64.
    pub recv_credits: u32,
    /// Receives a connection posts when it opens, before any growth: at least 4 and at most
    /// `recv_credits`. A service that knows how many frames its clients keep in flight sets
    /// it and `recv_credits` to that many, so the receives (and over DOCA the staging
    /// receives behind them, registered) are in place from the first call and nothing grows
    /// mid-run; every idle connection then holds that many. Default 4.
    pub initial_receives: u32,
    /// Send payloads and receive results up to this size travel inside control frames
    /// instead of through RDMA. Default 8 KiB.
    pub inline_threshold: u32,
    /// Memory registered per endpoint path at start: the pool holds
    /// `pool_budget / buffer_size` buffers, clamped to `[min_buffers, max_buffers]`.
    /// Default 64 MiB.
    pub pool_budget: usize,
    /// Fewest buffers per path. Default 2.
    pub min_buffers: usize,
    /// Most buffers per path. Default 256.
    pub max_buffers: usize,
    /// Write slots per connection: buffers the client may RDMA-write without asking, so a
    /// send or write larger than the inline threshold and at most `slot_size` takes one round
    /// trip. Registered when the connection's first payload too large to travel inline comes
    /// (that call takes the other path and its response brings the slots): `write_slots *
    /// slot_size` bytes per connection that moves such payloads, none for the others (0
    /// turns slots off). Default 4.
    pub write_slots: u32,
    /// Size of each write slot. Default 64 KiB, which is also the most a transport that
    /// cannot revoke windows (DOCA) accepts: there each slot payload is copied before the
    /// handler sees it.
    pub slot_size: usize,
    /// Large send/write payloads that fit no slot: `Some(true)`, the server RDMA-reads them
    /// from a window the client offers in the request (one round trip; the client copies the
    /// payload into registered memory first); `Some(false)`, the server grants a window of a
    /// pool buffer and the client RDMA-writes into it (two round trips, no copy). Default
    /// `None`: pull over transports that cannot revoke a window
    /// ([`Fencing::Unfenced`](crate::transport::Fencing), DOCA), so a client never holds a
    /// descriptor of memory that later serves another connection; grant otherwise.
    /// `Some(false)` over such a transport is refused by [`ServerBuilder::bind`].
    pub pull_writes: Option<bool>,
    /// Longest wait for a client to finish an RDMA transfer and ack it, and for a peer to
    /// answer a one-sided operation a handler makes through `RemoteMemory` (a peer that never
    /// answers loses its connection, which frees the memory the operation held). Default
    /// 30 s.
    pub transfer_timeout: Duration,
    /// Longest any call may run on this server, whatever deadline the client set (or none):
    /// past it the handler is stopped (its future dropped) and the client gets
    /// `DEADLINE_EXCEEDED` naming this setting, so no call holds server memory for ever. A
    /// shorter deadline from the client (or, when it sends none, the endpoint's `timeout:` in
    /// the spec) holds first. `None` lets calls without a deadline run for ever. Default 120 s.
    pub max_call_duration: Option<Duration>,
    /// Most of a path's pool one connection holds at once, in percent of its buffers (rounded
    /// up, at least one): a client that keeps its transfers open until `transfer_timeout`
    /// cannot take a whole pool from the other connections. Calls over the share wait for one
    /// of their own connection's buffers, within `buffer_wait`. 1 to 100; default 50.
    pub pool_share_percent: u32,
    /// Longest a call waits for a free buffer of its path's pool before it fails with
    /// `RESOURCE_EXHAUSTED` naming the path (or with `DEADLINE_EXCEEDED` if its own deadline
    /// comes first). A handler that keeps its payload (`Bytes`) holds that buffer. Default 10 s.
    pub buffer_wait: Duration,
    /// Longest wait for a new connection's handshake. Default 10 s.
    pub handshake_timeout: Duration,
    /// On shutdown, longest wait for in-flight calls to finish. Default 30 s.
    pub shutdown_grace: Duration,
    /// Runs each call on the connection's own task until it first waits (run to
    /// completion): a handler that answers without waiting costs no task, no wake-up and no
    /// channel. A call that waits (for a buffer, a transfer, or in the handler) moves to a
    /// task of its own at that point. The catch: a handler's work before its first wait
    /// holds up the other calls of its connection, so handlers that compute for long (more
    /// than some microseconds: compression, hashing large blocks) should either move that
    /// work off (`tokio::task::spawn_blocking`) or run with this off, where every call gets
    /// its own task at once and a multi-threaded runtime spreads one connection's calls over
    /// its threads. Default `true`.
    pub inline_handlers: bool,
    /// Bytes of stream messages this server buffers per call before the client must wait
    /// for its handler to take some (message streams; see docs/spec.md). At least two
    /// frames' worth; less is raised to that. Default 256 KiB.
    pub stream_window: u64,
    /// Most pings ([`Client::ping`](crate::Client::ping)) one connection may send per second,
    /// 0 for no limit. Pings are answered by the connection's own task: a client that sends
    /// more loses its connection with `RESOURCE_EXHAUSTED` naming this setting (gRPC's
    /// `too_many_pings`), so a ping flood costs the server no more than this many answers
    /// per connection. Default 100.
    pub max_pings_per_second: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 1024,
            max_connections_per_peer: 128,
            idle_timeout: None,
            max_in_flight: 128,
            max_frame: 16 * 1024,
            recv_credits: 64,
            initial_receives: crate::protocol::INITIAL_RECEIVES,
            inline_threshold: 8 * 1024,
            pool_budget: 64 << 20,
            min_buffers: 2,
            max_buffers: 256,
            write_slots: 4,
            slot_size: 64 << 10,
            pull_writes: None,
            transfer_timeout: Duration::from_secs(30),
            max_call_duration: Some(Duration::from_secs(120)),
            pool_share_percent: 50,
            buffer_wait: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            inline_handlers: true,
            stream_window: 256 << 10,
            max_pings_per_second: 100,
        }
    }
}

/// Entry point: [`Server::builder`].
#[derive(Debug)]
pub struct Server;

impl Server {
    /// A builder with default settings.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }
}

/// Builds a server. See [`Server::builder`].
#[derive(Default)]
pub struct ServerBuilder {
    config: ServerConfig,
    services: Vec<Arc<dyn Service>>,
    transport: Option<Arc<dyn Transport>>,
    interceptors: Chain<dyn ServerInterceptor>,
    /// The health services added, with their reporters.
    health: Vec<crate::health::HealthServer>,
}

impl fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("config", &self.config)
            .field(
                "services",
                &self.services.iter().map(|s| s.name()).collect::<Vec<_>>(),
            )
            .field("transport", &self.transport)
            .field("interceptors", &self.interceptors)
            .finish()
    }
}

/// Largest write slot over a transport that cannot fence windows: its payload is copied
/// before the handler sees it.
pub(crate) const MAX_UNFENCED_SLOT: usize = 64 << 10;

/// Refuses configurations whose safety needs windows the transport cannot fence.
fn check_fencing(config: &ServerConfig, fencing: Fencing) -> Result<()> {
    if fencing == Fencing::Revocable {
        return Ok(());
    }
    if config.pull_writes == Some(false) {
        return Err(Error::InvalidArgument(
            "pull_writes = Some(false) grants clients windows of shared pool buffers, which this \
             transport cannot revoke (DOCA): a client could keep writing into a buffer that \
             later serves another connection. Use pull_writes = None or Some(true)"
                .into(),
        ));
    }
    if config.write_slots > 0 && config.slot_size > MAX_UNFENCED_SLOT {
        return Err(Error::InvalidArgument(format!(
            "slot_size of {} bytes: over a transport that cannot revoke windows (DOCA) each \
             slot payload is copied before the handler sees it, so slots are limited to {} \
             bytes",
            config.slot_size, MAX_UNFENCED_SLOT
        )));
    }
    Ok(())
}

impl ServerBuilder {
    /// Adds a service (a generated `<Name>Server` adapter, or a hand-written [`Service`]).
    pub fn add_service(mut self, service: impl Service) -> Self {
        self.services.push(Arc::new(service));
        self
    }

    /// Adds the standard health service (see [`health`](crate::health)), serving the
    /// statuses `reporter` sets: when the server binds, each of its services (and the server
    /// as a whole, the empty name) is `SERVING` unless `reporter` says otherwise; once it
    /// starts shutting down, every name is `NOT_SERVING` and watches end. Interceptors apply
    /// to its calls as to any other.
    pub fn add_health(mut self, reporter: &crate::health::HealthReporter) -> Self {
        let health = crate::health::HealthServer::new(reporter.clone());
        self.health.push(health.clone());
        self.add_service(health)
    }

    /// Adds an interceptor: it runs before the handler of each call, after those added
    /// before it; a refusal answers the call with its status (see
    /// [`interceptor`](crate::interceptor)).
    pub fn interceptor(mut self, interceptor: impl ServerInterceptor) -> Self {
        self.interceptors.push(Arc::new(interceptor));
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Uses this transport instead of the one the address scheme names.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    setters! {
        /// See [`ServerConfig::max_connections`].
        max_connections: usize,
        /// See [`ServerConfig::max_connections_per_peer`].
        max_connections_per_peer: usize,
        /// See [`ServerConfig::idle_timeout`].
        idle_timeout: Option<Duration>,
        /// See [`ServerConfig::max_in_flight`].
        max_in_flight: u32,
        /// See [`ServerConfig::max_frame`].
        max_frame: usize,
        /// See [`ServerConfig::recv_credits`].
        recv_credits: u32,
        /// See [`ServerConfig::initial_receives`].
        initial_receives: u32,
        /// See [`ServerConfig::min_buffers`].
        min_buffers: usize,
        /// See [`ServerConfig::max_buffers`].
        max_buffers: usize,
        /// See [`ServerConfig::handshake_timeout`].
        handshake_timeout: Duration,
        /// See [`ServerConfig::inline_threshold`].
        inline_threshold: u32,
        /// See [`ServerConfig::pool_budget`].
        pool_budget: usize,
        /// See [`ServerConfig::write_slots`].
        write_slots: u32,
        /// See [`ServerConfig::slot_size`].
        slot_size: usize,
        /// See [`ServerConfig::pull_writes`].
        pull_writes: Option<bool>,
        /// See [`ServerConfig::transfer_timeout`].
        transfer_timeout: Duration,
        /// See [`ServerConfig::max_call_duration`].
        max_call_duration: Option<Duration>,
        /// See [`ServerConfig::pool_share_percent`].
        pool_share_percent: u32,
        /// See [`ServerConfig::buffer_wait`].
        buffer_wait: Duration,
        /// See [`ServerConfig::shutdown_grace`].
        shutdown_grace: Duration,
        /// See [`ServerConfig::inline_handlers`].
        inline_handlers: bool,
        /// See [`ServerConfig::stream_window`].
        stream_window: u64,
        /// See [`ServerConfig::max_pings_per_second`].
        max_pings_per_second: u32,
    }

    /// Builds the routing table, registers every buffer pool, and binds `addr`.
    pub async fn bind(self, addr: &str) -> Result<BoundServer> {
        let config = self.config;
        let min_receives = crate::protocol::credits::MIN_RECEIVES;
        if config.max_frame < 2 * crate::protocol::FRAME_OVERHEAD
            || config.recv_credits < min_receives
        {
            return Err(Error::InvalidArgument(format!(
                "max_frame must be at least {} bytes and recv_credits at least {min_receives}",
                2 * crate::protocol::FRAME_OVERHEAD
            )));
        }
        crate::protocol::credits::check_initial(config.initial_receives, config.recv_credits)?;
        if config.slot_size > crate::memory::MAX_BUFFER {
            return Err(Error::InvalidArgument(format!(
                "slot_size of {} bytes is over the {} byte limit of one buffer",
                config.slot_size,
                crate::memory::MAX_BUFFER
            )));
        }
        if !(1..=100).contains(&config.pool_share_percent) {
            return Err(Error::InvalidArgument(format!(
                "pool_share_percent of {} is not a share: give 1 to 100 (percent of a path's \
                 buffers one connection may hold)",
                config.pool_share_percent
            )));
        }
        let routes = Routes::build(&self.services, &config)?;
        let transport = match self.transport {
            Some(t) => t,
            None => transport_for(addr)?,
        };
        check_fencing(&config, transport.fencing())?;
        // Pools are registered once, here, not by the calls that first use their buffers.
        for pool in routes.pools() {
            transport.register_pool(pool)?;
        }
        let listener = transport.listen(addr).await?;
        for health in &self.health {
            for service in &self.services {
                if service.name() != crate::health::SERVICE_NAME {
                    health.reporter().serving_unless_set(service.name());
                }
            }
            health.reporter().serving_unless_set("");
        }
        tracing::info!(addr = %listener.local_addr(), "rdma-rpc server listening");
        Ok(BoundServer {
            shared: Arc::new(Shared {
                config,
                routes,
                interceptors: self.interceptors,
                live: listing::Live::default(),
                logs: logs::LogBudget::new(),
                health: self.health.iter().map(|h| h.stopping()).collect(),
            }),
            listener,
            admission: admission::Admission::new(),
        })
    }

    /// Binds `addr` and serves until an error.
    pub async fn serve(self, addr: &str) -> Result<()> {
        self.bind(addr).await?.serve().await
    }

    /// Binds `addr` and serves until `signal` completes, then shuts down gracefully.
    pub async fn serve_with_shutdown(
        self,
        addr: &str,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        self.bind(addr).await?.serve_with_shutdown(signal).await
    }
}

/// Where calls for one (path, operation) go.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) service: Arc<dyn Service>,
    pub(crate) index: usize,
    pub(crate) endpoint: EndpointDef,
    pub(crate) pool: BufferPool,
    /// The calls of the path holding (or taking) one of `pool`'s buffers.
    pub(crate) holders: Holders,
    /// The endpoint's metrics series.
    pub(crate) metrics: Arc<crate::observe::ServerEndpoint>,
}

/// The calls of one path that hold one of its pool buffers, or are taking one. Tells a pool
/// drained by calls in flight (worth waiting for) from one drained by handlers that returned
/// and kept their `data` (not worth waiting for: nothing gives a buffer back).
#[derive(Clone, Default)]
pub(crate) struct Holders(Arc<std::sync::atomic::AtomicUsize>);

/// One holder, counted until dropped.
pub(crate) struct Holding(Arc<std::sync::atomic::AtomicUsize>);

impl Holders {
    pub(crate) fn enter(&self) -> Holding {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Holding(self.0.clone())
    }

    pub(crate) fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The routing table: path → operations, with one buffer pool per path (the operations of a
/// path share its buffers, as in doca-cpp).
pub(crate) struct Routes {
    /// By path, as its bytes: a request's path is looked up as it came, valid UTF-8 or not.
    paths: crate::protocol::PathMap<[Option<Route>; 4]>,
}

fn op_slot(op: OpKind) -> usize {
    op.as_u32() as usize - 1
}

impl Routes {
    /// Every path's pool, once each.
    fn pools(&self) -> Vec<&BufferPool> {
        let mut pools: Vec<&BufferPool> = Vec::new();
        for route in self.paths.values().flatten().flatten() {
            if !pools.iter().any(|p| p.same_pool(&route.pool)) {
                pools.push(&route.pool);
            }
        }
        pools
    }

    fn build(services: &[Arc<dyn Service>], config: &ServerConfig) -> Result<Routes> {
        if services.is_empty() {
            return Err(Error::InvalidArgument(
                "the server has no service: call add_service first".into(),
            ));
        }
        let mut sizes: HashMap<&'static str, u64> = HashMap::new();
        let mut owner: HashMap<(&'static str, OpKind), &'static str> = HashMap::new();
        for service in services {
            for ep in service.endpoints() {
                ep.check().map_err(Error::InvalidArgument)?;
                if let Some(first) = owner.insert((ep.path, ep.op), service.name()) {
                    return Err(Error::InvalidArgument(format!(
                        "endpoint {} {} is registered twice (services {first} and {})",
                        ep.op,
                        ep.path,
                        service.name()
                    )));
                }
                if ep.buffer_size > crate::memory::MAX_BUFFER as u64 {
                    return Err(Error::LimitExceeded {
                        limit: "buffer_size",
                        max: crate::memory::MAX_BUFFER as u64,
                        actual: ep.buffer_size,
                    });
                }
                let size = sizes.entry(ep.path).or_default();
                *size = (*size).max(ep.buffer_size);
            }
        }
        let mut pools = HashMap::new();
        let mut holders: HashMap<&'static str, Holders> = HashMap::new();
        for (path, size) in &sizes {
            let count = (config.pool_budget / (*size).max(1) as usize)
                .clamp(config.min_buffers.max(1), config.max_buffers.max(1));
            let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
            let pool = BufferPool::new(*size as usize, count, access)?;
            pool.observe(path);
            pools.insert(*path, pool);
        }
        let mut paths: crate::protocol::PathMap<[Option<Route>; 4]> = Default::default();
        for service in services {
            for (index, ep) in service.endpoints().iter().enumerate() {
                paths.entry(ep.path.as_bytes()).or_default()[op_slot(ep.op)] = Some(Route {
                    service: service.clone(),
                    index,
                    endpoint: *ep,
                    pool: pools[ep.path].clone(),
                    holders: holders.entry(ep.path).or_default().clone(),
                    metrics: Arc::new(crate::observe::ServerEndpoint::new(service.name(), *ep)),
                });
            }
        }
        Ok(Routes { paths })
    }

    /// One route per path (the operations of a path share its pool).
    pub(crate) fn each_path(&self) -> impl Iterator<Item = &Route> {
        self.paths
            .values()
            .filter_map(|ops| ops.iter().flatten().next())
    }

    /// The route of a request (its path as it came), or the status that explains why there
    /// is none.
    pub(crate) fn find(&self, path: &[u8], op: u32) -> std::result::Result<&Route, crate::Status> {
        // As gRPC answers an unknown method: the server does not implement it. NOT_FOUND is
        // the applications' own (a missing key, a missing block).
        let Some(ops) = self.paths.get(path) else {
            let Ok(path) = std::str::from_utf8(path) else {
                return Err(crate::Status::invalid_argument(
                    "the request's path is not UTF-8",
                ));
            };
            // The path is the client's: shown cut short, never longer than it came.
            return Err(crate::Status::unimplemented(format!(
                "no endpoint at path `{}` on this server",
                crate::observe::logs::shown(path)
            )));
        };
        let Some(op) = OpKind::from_u32(op) else {
            return Err(crate::Status::invalid_argument(format!(
                "unknown operation code {op} (send 1, receive 2, write 3, read 4)"
            )));
        };
        ops[op_slot(op)].as_ref().ok_or_else(|| {
            let supported: Vec<&str> = ops
                .iter()
                .flatten()
                .map(|r| r.endpoint.op.as_str())
                .collect();
            let path = ops.iter().flatten().next().map_or("", |r| r.endpoint.path);
            crate::Status::unimplemented(format!(
                "endpoint {path} has no {op} operation (it supports: {})",
                supported.join(", ")
            ))
        })
    }
}

pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) routes: Routes,
    pub(crate) interceptors: Chain<dyn ServerInterceptor>,
    /// The handshaken connections, for [`ServerHandle::connections`].
    pub(crate) live: listing::Live,
    /// What this server may still log of each kind of line a peer can cause.
    pub(crate) logs: logs::LogBudget,
    /// Set when the server starts shutting down: its health services then say `NOT_SERVING`.
    health: Vec<Arc<watch::Sender<bool>>>,
}

/// A server bound to its address, ready to serve.
pub struct BoundServer {
    shared: Arc<Shared>,
    listener: Box<dyn Listener>,
    admission: Arc<admission::Admission>,
}

impl fmt::Debug for BoundServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundServer")
            .field("local_addr", &self.listener.local_addr())
            .finish()
    }
}

impl BoundServer {
    /// The address clients connect to (with the port chosen for port 0).
    pub fn local_addr(&self) -> String {
        self.listener.local_addr()
    }

    /// The number of connections the server holds, now and as it changes while it serves.
    pub fn connection_count(&self) -> ConnectionCount {
        self.admission.count()
    }

    /// A view of the server that outlives [`serve`](BoundServer::serve): its connections
    /// and the use of its buffer pools.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: self.shared.clone(),
            count: self.admission.count(),
        }
    }

    /// Serves until an error.
    pub async fn serve(self) -> Result<()> {
        self.serve_with_shutdown(std::future::pending()).await
    }

    /// Serves until `signal` completes; then stops accepting, tells clients (a goaway on each
    /// connection: they send new calls elsewhere, and their calls in flight go on), lets
    /// in-flight calls finish (up to [`ServerConfig::shutdown_grace`]), and returns.
    pub async fn serve_with_shutdown(self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut conns = JoinSet::new();
        tokio::pin!(signal);
        loop {
            while conns.try_join_next().is_some() {}
            tokio::select! {
                _ = &mut signal => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(conn) => match self.admission.admit(conn.peer(), &self.shared.config) {
                        Ok(admitted) => {
                            conns.spawn(conn::serve(self.shared.clone(), conn, stop_rx.clone(), admitted));
                        }
                        Err(status) => {
                            if let Some(line) = self.shared.logs.line("connection refused", status.code().as_str()) {
                                tracing::warn!(
                                    peer = conn.peer(),
                                    reason = status.message(),
                                    suppressed = line.suppressed,
                                    "connection refused"
                                );
                            }
                            match self.admission.refusing() {
                                Some(permit) => {
                                    conns.spawn(conn::refuse(self.shared.clone(), conn, status, permit));
                                }
                                // Too many refusals at once: no reason for this one.
                                None => conn.close(),
                            }
                        }
                    },
                    Err(e) => {
                        if let Some(line) = self.shared.logs.line("accept failed", "") {
                            tracing::warn!(error = %e, suppressed = line.suppressed, "accept failed");
                        }
                    }
                },
            }
        }
        tracing::info!(connections = conns.len(), "shutting down");
        for stopping in &self.shared.health {
            stopping.send_replace(true);
        }
        drop(self.listener);
        stop_tx.send_replace(true);
        let drain = async { while conns.join_next().await.is_some() {} };
        if tokio::time::timeout(self.shared.config.shutdown_grace, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                left = conns.len(),
                "shutdown grace expired; closing connections"
            );
            conns.shutdown().await;
        }
        Ok(())
    }
}
