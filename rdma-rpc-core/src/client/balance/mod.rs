//! Several servers behind one [`Client`], as tonic's `Channel::balance_list` and
//! `balance_channel`: each call goes to one server that is ready, servers that are down or
//! draining get none, and lost servers are dialled again in the background.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use rdma_rpc_core::client::balance::{Addresses, Dns};
//! use rdma_rpc_core::Client;
//!
//! // A list that can change while the client runs.
//! let servers = Addresses::new(["tcp://10.0.0.2:7470", "tcp://10.0.0.3:7470"]);
//! let client = Client::builder().connect_balanced(servers.clone()).await?;
//! servers.insert("tcp://10.0.0.4:7470");
//! servers.remove("tcp://10.0.0.2:7470");
//!
//! // Every A and AAAA record of a name, looked up again every 10 s.
//! let storage = Client::builder()
//!     .connect_balanced(Dns::new("tcp://storage.internal:7470")?.every(Duration::from_secs(10)))
//!     .await?;
//! // Generated clients take either as they take any client: `KvStoreClient::new(client)`.
//! for server in storage.servers() {
//!     println!("{} {:?}, {} calls", server.addr, server.state, server.calls);
//! }
//! # Ok(()) }
//! ```
//!
//! - **Choosing**: power of two choices over the servers ready at the time of the call: of the
//!   next two in turn, the one with more room in its in-flight window (the first on a tie).
//!   Calls one after another go round the servers; concurrent calls avoid a busy or slow one.
//! - **Ready** means connected and not told to go away. A server that sends a goaway (it
//!   is shutting down and drains its calls) is skipped from that moment; its calls in flight
//!   still get their responses.
//! - **Reconnecting**: each server has a task that dials it, and dials again when its
//!   connection is lost, with the backoff of [`ClientConfig::reconnect`] and its siblings;
//!   calls never wait for a server that is backing off.
//! - **No server ready**: calls wait while a server is connecting (bounded by the call's
//!   deadline and [`ClientConfig::connect_timeout`]); otherwise they fail at once with
//!   `UNAVAILABLE`, whose message names each server and why it is not ready (the same message
//!   for every call of the wait) and whose [`Status::retry_after`] is the time until the next
//!   attempt.
//! - **No retries**: a call goes to one server and is never repeated on another. One in flight
//!   on a server that went away fails with `UNAVAILABLE` and may or may not have run, as with
//!   one server; repeat calls that are idempotent yourself.
//! - **Changes**: a [`Resolver`] names the servers, and the client follows its answers:
//!   [`Addresses`] (a list you change), [`Dns`] (every record of a name, looked up again at an
//!   interval), or a discovery service's client (etcd, Consul, Kubernetes endpoints) that
//!   implements the trait. A server that leaves the list gets no new calls; its calls in
//!   flight finish.
//! - **Remote memory** is per connection: [`Client::pick`] gives one server's client, to make
//!   an offer and the call that carries it to the same server.
//!
//! [`ClientConfig::reconnect`]: super::ClientConfig::reconnect
//! [`ClientConfig::connect_timeout`]: super::ClientConfig::connect_timeout

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::reconnect::{jitter, Backoff};
use super::{dial, lock, Client, ClientBuilder, ClientConfig, Counters, Inner, Shared};
use crate::error::{Error, Result};
use crate::interceptor::{Chain, ClientInterceptor};
use crate::status::Status;
use crate::transport::{transport_for, Transport};

mod resolve;

pub use resolve::{Addresses, Dns, Resolver};

/// How one server of a client of several is doing ([`Client::servers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStatus {
    /// Its address, as the resolver named it.
    pub addr: String,
    /// Whether calls go to it.
    pub state: ServerState,
    /// Calls sent to it so far (while it is listed, across its reconnections).
    pub calls: u64,
    /// Calls in flight on its connection now.
    pub in_flight: usize,
}

/// Whether a server gets calls.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerState {
    /// A connection is being made: calls wait for it when no other server is ready.
    Connecting,
    /// Connected: calls go to it.
    Ready,
    /// Not connected, or draining (it sent a goaway): why. It is dialled again after a
    /// backoff unless reconnection is off.
    Down {
        /// Why it is down, with the last error.
        why: String,
    },
}

impl Client {
    /// How each server is doing: for a client of several servers
    /// ([`ClientBuilder::connect_balanced`]) one entry per server listed now; for a client of
    /// one, one entry.
    pub fn servers(&self) -> Vec<ServerStatus> {
        if let Some(balance) = &self.shared.balance {
            return balance.servers();
        }
        let inner = self.current();
        let addr = match &self.shared.redial {
            Some(redial) => redial.addr.clone(),
            None => inner.peer().to_owned(),
        };
        vec![ServerStatus {
            addr,
            state: match inner.lost() {
                None => ServerState::Ready,
                Some(why) => ServerState::Down {
                    why: why.message().to_owned(),
                },
            },
            calls: self.stats().calls,
            in_flight: in_flight(&inner),
        }]
    }

    /// The client of one server, chosen as a call would be: calls made with it all go to that
    /// server (it reconnects to it alone). For what must reach one server: an offer of
    /// [`remote_memory`](Client::remote_memory) and the call that carries it, or calls that
    /// must be seen in order. A client of one server returns itself. Counters
    /// ([`stats`](Client::stats)) are shared with this client.
    pub async fn pick(&self) -> Result<Client, Status> {
        match &self.shared.balance {
            None => Ok(self.clone()),
            Some(balance) => balance
                .take(true)
                .await
                .map(|(server, _)| server.client.get().cloned().expect("a ready server")),
        }
    }
}

#[cfg(test)]
impl Client {
    /// Waits until the servers' statuses satisfy `what` (woken by each change of a server's
    /// state or of the list).
    pub(crate) async fn until_servers(&self, what: impl Fn(&[ServerStatus]) -> bool) {
        let balance = self
            .shared
            .balance
            .as_ref()
            .expect("a client of several servers");
        loop {
            let changed = balance.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if what(&balance.servers()) {
                return;
            }
            changed.await;
        }
    }
}

/// Calls in flight on a connection.
fn in_flight(inner: &Inner) -> usize {
    inner.in_flight()
}

/// What every server's client is made with.
struct Template {
    transport: Option<Arc<dyn Transport>>,
    config: ClientConfig,
    interceptors: Chain<dyn ClientInterceptor>,
    counters: Arc<Counters>,
}

/// The servers of a client of several, and how calls choose among them.
pub(crate) struct Balancer {
    /// In the resolver's order.
    servers: Mutex<Vec<Arc<Server>>>,
    /// Woken when a server's state or the list changes: calls that found no server ready but
    /// one connecting wait for it.
    changed: Arc<Notify>,
    /// Advanced by each call: where the next call starts looking.
    turn: AtomicUsize,
    template: Arc<Template>,
    /// The task that follows the resolver.
    resolver: OnceLock<AbortHandle>,
    closed: AtomicBool,
}

/// One server of a client of several.
struct Server {
    addr: String,
    /// What its task is doing; whether it is ready is read from its connection.
    state: Mutex<State>,
    /// Its own client, once it first connected (it reconnects by itself).
    client: OnceLock<Client>,
    /// Calls sent to it.
    calls: AtomicU64,
    /// The task that keeps it connected.
    task: OnceLock<AbortHandle>,
}

#[derive(Debug, Clone)]
enum State {
    Connecting,
    /// Connected once its task last looked.
    Up,
    Down {
        why: String,
        retry_at: Option<Instant>,
    },
}

/// Why no server could take a call, and whether one may soon.
enum NotReady {
    /// A server is connecting (or its task has yet to see its connection lost): wait.
    Wait,
    /// None is: fail now.
    Fail(Status),
}

impl Server {
    /// Its connection, if it is ready: connected and not told to go away.
    fn ready(&self) -> Option<Arc<Inner>> {
        let inner = self.client.get()?.current();
        inner.lost().is_none().then_some(inner)
    }

    fn set(&self, state: State, changed: &Notify) {
        *lock(&self.state) = state;
        changed.notify_waiters();
    }

    fn status(&self) -> ServerStatus {
        let inner = self.client.get().map(Client::current);
        let state = match (&*lock(&self.state), inner.as_ref().and_then(|i| i.lost())) {
            (State::Down { why, .. }, _) => ServerState::Down { why: why.clone() },
            (State::Connecting, _) => ServerState::Connecting,
            (State::Up, Some(why)) => ServerState::Down {
                why: why.message().to_owned(),
            },
            (State::Up, None) => ServerState::Ready,
        };
        ServerStatus {
            addr: self.addr.clone(),
            state,
            calls: self.calls.load(Ordering::Relaxed),
            in_flight: inner.as_deref().map_or(0, in_flight),
        }
    }
}

/// Power of two choices, in turn: of the two servers next in turn among those ready (`room`
/// is `Some` free places of its in-flight window for each), the one with more room, the first
/// on a tie. Calls one after another thus go round the ready servers.
fn choose(room: &[Option<usize>], turn: usize) -> Option<usize> {
    let ready = room.iter().filter(|r| r.is_some()).count();
    if ready == 0 {
        return None;
    }
    let nth = |k: usize| {
        room.iter()
            .enumerate()
            .filter(|(_, r)| r.is_some())
            .nth(k % ready)
            .map(|(i, _)| i)
    };
    let first = nth(turn)?;
    let second = nth(turn + 1)?;
    Some(if room[second] > room[first] {
        second
    } else {
        first
    })
}

impl Balancer {
    /// A connection for one call: of a ready server, waiting while none is but one connects.
    pub(super) async fn pick(&self) -> Result<Arc<Inner>, Status> {
        let (server, inner) = self.take(true).await?;
        server.calls.fetch_add(1, Ordering::Relaxed);
        Ok(inner)
    }

    /// A ready server and its connection; `advance` moves the turn on (the next one looks
    /// from the next server).
    async fn take(&self, advance: bool) -> Result<(Arc<Server>, Arc<Inner>), Status> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before looking: a change between the two still wakes this.
            changed.as_mut().enable();
            match self.try_take(advance) {
                Ok(taken) => return Ok(taken),
                Err(NotReady::Wait) => changed.await,
                Err(NotReady::Fail(status)) => return Err(status),
            }
        }
    }

    fn try_take(&self, advance: bool) -> std::result::Result<(Arc<Server>, Arc<Inner>), NotReady> {
        if self.closed.load(Ordering::Acquire) {
            return Err(NotReady::Fail(Status::unavailable("closed by this client")));
        }
        let servers = lock(&self.servers);
        let ready: Vec<Option<Arc<Inner>>> = servers.iter().map(|s| s.ready()).collect();
        let room: Vec<Option<usize>> = ready.iter().map(|r| r.as_ref().map(|i| i.room())).collect();
        let turn = if advance {
            self.turn.fetch_add(1, Ordering::Relaxed)
        } else {
            self.turn.load(Ordering::Relaxed)
        };
        if let Some(at) = choose(&room, turn) {
            let server = servers[at].clone();
            let inner = ready[at].clone().expect("chosen among the ready");
            return Ok((server, inner));
        }
        let pending = servers.iter().any(|s| match &*lock(&s.state) {
            State::Connecting => true,
            // Lost, and its task has yet to see it: it is about to dial.
            State::Up => true,
            State::Down { .. } => false,
        });
        if pending {
            return Err(NotReady::Wait);
        }
        let (reasons, retry_after) = unready(&servers, Instant::now());
        let status = Status::unavailable(format!("no server is ready: {reasons}"));
        Err(NotReady::Fail(match retry_after {
            Some(wait) => status.with_retry_after(wait),
            None => status,
        }))
    }

    /// A ready server's connection, if there is one (nothing counted, nothing waited for).
    pub(super) fn ready_one(&self) -> Option<Arc<Inner>> {
        lock(&self.servers).iter().find_map(|s| s.ready())
    }

    pub(super) fn servers(&self) -> Vec<ServerStatus> {
        lock(&self.servers).iter().map(|s| s.status()).collect()
    }

    /// Follows a new answer of the resolver: servers no longer named get no new calls (their
    /// calls in flight finish), servers newly named are dialled.
    fn set(&self, addrs: Vec<String>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut servers = lock(&self.servers);
        let mut old = std::mem::take(&mut *servers);
        let mut added = Vec::new();
        for addr in addrs {
            if servers.iter().any(|s| s.addr == addr) {
                continue; // named twice
            }
            match old.iter().position(|s| s.addr == addr) {
                Some(at) => servers.push(old.swap_remove(at)),
                None => {
                    servers.push(self.start(addr.clone()));
                    added.push(addr);
                }
            }
        }
        drop(servers);
        let removed: Vec<&str> = old.iter().map(|s| s.addr.as_str()).collect();
        if !added.is_empty() || !removed.is_empty() {
            tracing::info!(?added, ?removed, "servers changed");
        }
        for server in &old {
            server.stop();
        }
        self.changed.notify_waiters();
    }

    /// A server at `addr`, with the task that keeps it connected.
    fn start(&self, addr: String) -> Arc<Server> {
        let server = Arc::new(Server {
            addr,
            state: Mutex::new(State::Connecting),
            client: OnceLock::new(),
            calls: AtomicU64::new(0),
            task: OnceLock::new(),
        });
        let task = tokio::spawn(keep_connected(
            server.clone(),
            self.template.clone(),
            self.changed.clone(),
        ));
        let _ = server.task.set(task.abort_handle());
        server
    }

    /// Closes every server's client and stops following the resolver.
    pub(super) fn close(&self) {
        for server in self.stop_all() {
            if let Some(client) = server.client.get() {
                client.close();
            }
        }
    }

    /// As [`close`](Balancer::close), and resolves once every server has the goodbye.
    pub(super) async fn shutdown(&self) {
        let mut goodbyes = tokio::task::JoinSet::new();
        for server in self.stop_all() {
            // Each a client of one server: its goodbye, as its `shutdown` says it.
            if let Some(inner) = server.client.get().and_then(Client::begin_close) {
                let session = inner.session.clone();
                goodbyes
                    .spawn(async move { session.finish(super::connection::GOODBYE_WAIT).await });
            }
        }
        while goodbyes.join_next().await.is_some() {}
    }

    fn stop_all(&self) -> Vec<Arc<Server>> {
        self.closed.store(true, Ordering::Release);
        if let Some(task) = self.resolver.get() {
            task.abort();
        }
        let servers = lock(&self.servers).clone();
        for server in &servers {
            server.stop();
        }
        self.changed.notify_waiters();
        servers
    }
}

impl Server {
    /// Stops dialling it. Its connection stays for the calls in flight; the last one to end
    /// drops it, which says goodbye to the server.
    fn stop(&self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        if let Some(task) = self.resolver.get() {
            task.abort();
        }
        for server in lock(&self.servers).iter() {
            server.stop();
        }
    }
}

/// Each server not ready and why (`addr: why; ...`), and the time until the soonest next
/// attempt among those backing off.
fn unready(servers: &[Arc<Server>], now: Instant) -> (String, Option<Duration>) {
    if servers.is_empty() {
        return ("the resolver named none".to_owned(), None);
    }
    let mut retry_after: Option<Duration> = None;
    let mut reasons = Vec::with_capacity(servers.len());
    for server in servers {
        let why = match &*lock(&server.state) {
            State::Down { why, retry_at } => {
                if let Some(at) = retry_at {
                    let wait = at.saturating_duration_since(now);
                    retry_after = Some(retry_after.map_or(wait, |w| w.min(wait)));
                }
                why.clone()
            }
            State::Connecting => "connecting".to_owned(),
            State::Up => "connection lost".to_owned(),
        };
        reasons.push(format!("{}: {why}", server.addr));
    }
    (reasons.join("; "), retry_after)
}

/// Keeps one server connected: dials it until it answers, then dials again (through its
/// client's reconnection, with its backoff) each time the connection is lost or the server
/// says goodbye. Ends when reconnection is off and the server is down, or when stopped.
async fn keep_connected(server: Arc<Server>, template: Arc<Template>, changed: Arc<Notify>) {
    let addr = server.addr.as_str();
    let config = &template.config;
    let transport = match &template.transport {
        Some(transport) => transport.clone(),
        None => match transport_for(addr) {
            Ok(transport) => transport,
            Err(e) => {
                let why = e.to_string();
                return server.set(
                    State::Down {
                        why,
                        retry_at: None,
                    },
                    &changed,
                );
            }
        },
    };
    let mut backoff = Backoff::new(config.reconnect_backoff, config.reconnect_backoff_max);
    let client = loop {
        match dial(&transport, addr, config, &template.counters).await {
            Ok(inner) => {
                break Client::single(
                    inner,
                    addr,
                    transport,
                    config.clone(),
                    template.interceptors.clone(),
                    template.counters.clone(),
                )
            }
            Err(e) => {
                let wait = backoff.failed(Instant::now(), e.to_string(), jitter());
                tracing::warn!(addr, error = %e, next_attempt_in = ?wait, "connecting failed");
                let retry_at = config.reconnect.then(|| Instant::now() + wait);
                let why = format!("connecting failed: {e}");
                server.set(State::Down { why, retry_at }, &changed);
                if !config.reconnect {
                    return;
                }
                tokio::time::sleep(wait).await;
                server.set(State::Connecting, &changed);
            }
        }
    };
    tracing::debug!(addr, "connected");
    let _ = server.client.set(client.clone());
    loop {
        server.set(State::Up, &changed);
        client.current().ended().await;
        server.set(State::Connecting, &changed);
        loop {
            match client.connection().await {
                Ok(_) => break,
                Err(status) => {
                    let retry_after = status.retry_after();
                    let retry_at = retry_after.map(|wait| Instant::now() + wait);
                    let why = status.message().to_owned();
                    server.set(State::Down { why, retry_at }, &changed);
                    // Without a wait, the client will not dial again (reconnection is off).
                    let Some(wait) = retry_after else { return };
                    tokio::time::sleep(wait).await;
                    server.set(State::Connecting, &changed);
                }
            }
        }
    }
}

/// Shortest wait before asking a resolver again after it failed.
const MIN_RESOLVE_WAIT: Duration = Duration::from_millis(100);

/// Asks the resolver again and again, and follows its answers.
async fn follow(mut resolver: impl Resolver, balancer: Weak<Balancer>, config: ClientConfig) {
    let mut backoff = Backoff::new(
        config.reconnect_backoff.max(MIN_RESOLVE_WAIT),
        config.reconnect_backoff_max,
    );
    loop {
        let answer = resolver.resolve().await;
        let Some(balancer) = balancer.upgrade() else {
            return; // the client is gone
        };
        match answer {
            Ok(addrs) => {
                backoff.succeeded();
                balancer.set(addrs);
            }
            Err(e) => {
                drop(balancer);
                let wait = backoff.failed(Instant::now(), e.to_string(), jitter());
                tracing::warn!(error = %e, next_attempt_in = ?wait, "resolving the servers failed; keeping those known");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// [`ClientBuilder::connect_balanced`].
pub(super) async fn connect(builder: ClientBuilder, mut resolver: impl Resolver) -> Result<Client> {
    builder.check()?;
    let first = resolver.resolve().await?;
    let ClientBuilder {
        config,
        transport,
        interceptors,
    } = builder;
    let counters = Arc::new(Counters::default());
    let balancer = Arc::new(Balancer {
        servers: Mutex::new(Vec::new()),
        changed: Arc::new(Notify::new()),
        turn: AtomicUsize::new(0),
        template: Arc::new(Template {
            transport,
            config: config.clone(),
            interceptors: interceptors.clone(),
            counters: counters.clone(),
        }),
        resolver: OnceLock::new(),
        closed: AtomicBool::new(false),
    });
    balancer.set(first);
    let inner = match balancer.take(false).await {
        Ok((_, inner)) => inner,
        Err(_) => {
            let (reasons, _) = unready(&lock(&balancer.servers), Instant::now());
            return Err(Error::NoServer { reasons });
        }
    };
    let following = tokio::spawn(follow(resolver, Arc::downgrade(&balancer), config.clone()));
    let _ = balancer.resolver.set(following.abort_handle());
    Ok(Client {
        shared: Shared::new(inner, None, counters, interceptors, config, Some(balancer)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_one_after_another_go_round_the_ready_servers() {
        let room = [Some(8), None, Some(8), Some(8)];
        let picked: Vec<_> = (0..6).map(|turn| choose(&room, turn).unwrap()).collect();
        assert_eq!(picked, [0, 2, 3, 0, 2, 3]);
    }

    #[test]
    fn of_two_in_turn_the_one_with_more_room_wins() {
        // Server 0 is busy: turns that offer it beside another choose the other.
        let room = [Some(1), Some(8), Some(8)];
        let picked: Vec<_> = (0..3).map(|turn| choose(&room, turn).unwrap()).collect();
        assert_eq!(picked, [1, 1, 2]);
        assert_eq!(
            choose(&[Some(3)], 7),
            Some(0),
            "one server takes every call"
        );
    }

    #[test]
    fn no_ready_server_is_no_choice() {
        assert_eq!(choose(&[], 0), None);
        assert_eq!(choose(&[None, None], 5), None);
    }

    #[test]
    fn unready_servers_are_each_named_with_the_soonest_retry() {
        let now = Instant::now();
        let server = |addr: &str, state| {
            Arc::new(Server {
                addr: addr.to_owned(),
                state: Mutex::new(state),
                client: OnceLock::new(),
                calls: AtomicU64::new(0),
                task: OnceLock::new(),
            })
        };
        let servers = [
            server(
                "tcp://a:1",
                State::Down {
                    why: "connecting failed: refused".into(),
                    retry_at: Some(now + Duration::from_millis(300)),
                },
            ),
            server(
                "tcp://b:1",
                State::Down {
                    why: "the server closed the connection: the server is shutting down".into(),
                    retry_at: Some(now + Duration::from_millis(100)),
                },
            ),
        ];
        let (reasons, retry) = unready(&servers, now);
        assert_eq!(
            reasons,
            "tcp://a:1: connecting failed: refused; tcp://b:1: the server closed the \
             connection: the server is shutting down"
        );
        assert_eq!(retry, Some(Duration::from_millis(100)));
        assert_eq!(unready(&[], now).0, "the resolver named none");
    }
}
