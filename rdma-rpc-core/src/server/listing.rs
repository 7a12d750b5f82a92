//! What a running server holds, for operators: its connections and the use of its buffer
//! pools ([`ServerHandle`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::{ConnectionCount, Shared};
use crate::session::Session;

/// A view of a running server, cheap to clone: take it from
/// [`BoundServer::handle`](super::BoundServer::handle) before serving.
#[derive(Clone)]
pub struct ServerHandle {
    pub(super) shared: Arc<Shared>,
    pub(super) count: ConnectionCount,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("connections", &self.count.current())
            .finish()
    }
}

/// One handshaken connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionInfo {
    /// A number naming the connection while the server runs (never reused).
    pub id: u64,
    /// The client's address.
    pub peer: String,
    /// When the handshake completed.
    pub since: SystemTime,
    /// Calls in flight now.
    pub calls_in_flight: usize,
    /// Calls answered so far.
    pub calls_answered: u64,
}

/// The buffer pool of one endpoint path.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolInfo {
    /// The path (its operations share the pool).
    pub path: &'static str,
    /// Size of each buffer.
    pub buffer_size: usize,
    /// Buffers in the pool.
    pub buffers: usize,
    /// Buffers taken now: by calls in flight, or kept by handlers that returned (their
    /// `data`).
    pub in_use: usize,
    /// Calls in flight that hold a buffer or wait for one. `in_use` beyond this is kept by
    /// handlers that returned.
    pub held_by_calls: usize,
}

impl ServerHandle {
    /// The number of connections, now and as it changes.
    pub fn connection_count(&self) -> ConnectionCount {
        self.count.clone()
    }

    /// The handshaken connections, oldest first.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        let live = lock(&self.shared.live.conns);
        live.values()
            .map(|c| {
                let locked = c.session.lock();
                ConnectionInfo {
                    id: c.id,
                    peer: c.peer.to_string(),
                    since: c.since,
                    calls_in_flight: locked.proto.calls_in_flight(),
                    calls_answered: locked.proto.answered(),
                }
            })
            .collect()
    }

    /// The use of every path's buffer pool, by path.
    pub fn pools(&self) -> Vec<PoolInfo> {
        let mut pools: Vec<PoolInfo> = self
            .shared
            .routes
            .each_path()
            .map(|route| PoolInfo {
                path: route.endpoint.path,
                buffer_size: route.pool.buf_size(),
                buffers: route.pool.count(),
                in_use: route.pool.count().saturating_sub(route.pool.available()),
                held_by_calls: route.holders.count(),
            })
            .collect();
        pools.sort_by_key(|p| p.path);
        pools
    }
}

/// The handshaken connections of a server.
#[derive(Default)]
pub(crate) struct Live {
    next: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<Listed>>>,
}

/// A connection as listed.
pub(super) struct Listed {
    id: u64,
    peer: Arc<str>,
    since: SystemTime,
    session: Arc<Session>,
}

/// Lists a connection until dropped.
pub(super) struct Listing {
    live: Arc<Shared>,
    entry: Arc<Listed>,
}

impl Live {
    pub(super) fn list(shared: &Arc<Shared>, peer: Arc<str>, session: Arc<Session>) -> Listing {
        let id = shared.live.next.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = Arc::new(Listed {
            id,
            peer,
            since: SystemTime::now(),
            session,
        });
        lock(&shared.live.conns).insert(id, entry.clone());
        Listing {
            live: shared.clone(),
            entry,
        }
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        lock(&self.live.live.conns).remove(&self.entry.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
