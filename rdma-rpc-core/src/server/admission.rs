//! Admission: which connections a server takes, counted exactly.
//!
//! A connection is admitted (and counted) when it is accepted, before anything is allocated
//! for it, and stops counting the moment its task ends, so the count a new connection is
//! checked against is never stale. A refused connection is told why over a minimal channel
//! (two receives of 1 KiB instead of the full receive pool), for at most a second, and at most
//! [`MAX_REFUSING`] at a time; beyond that it is closed without a reason.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::ServerConfig;
use crate::status::Status;

/// Refused connections being told why at once; more are closed without a reason.
pub(super) const MAX_REFUSING: usize = 64;

/// Counts the connections of one server.
pub(super) struct Admission {
    live: watch::Sender<usize>,
    per_peer: Mutex<HashMap<String, usize>>,
    refusing: Arc<Semaphore>,
}

/// A connection counted by its server until dropped.
pub(super) struct Admitted {
    admission: Arc<Admission>,
    peer: Option<String>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("peer", &self.peer)
            .finish()
    }
}

/// The peer part of a transport address (`tcp://10.0.0.7:40102` → `10.0.0.7`), or `None`
/// where the transport does not know it (RDMA CM connections).
fn peer_host(peer: &str) -> Option<String> {
    let rest = peer.split_once("://").map_or(peer, |(_, r)| r);
    rest.parse::<SocketAddr>().ok().map(|a| a.ip().to_string())
}

impl Admission {
    pub(super) fn new() -> Arc<Admission> {
        Arc::new(Admission {
            live: watch::channel(0).0,
            per_peer: Mutex::new(HashMap::new()),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
        })
    }

    fn per_peer(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.per_peer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `peer`, or says which limit refuses it.
    pub(super) fn admit(
        self: &Arc<Self>,
        peer: &str,
        config: &ServerConfig,
    ) -> Result<Admitted, Status> {
        let host = peer_host(peer);
        let mut per_peer = self.per_peer();
        if *self.live.borrow() >= config.max_connections {
            return Err(Status::resource_exhausted(format!(
                "the server is at its connection limit (max_connections = {})",
                config.max_connections
            )));
        }
        if let Some(host) = &host {
            let held = per_peer.get(host).copied().unwrap_or(0);
            if config.max_connections_per_peer > 0 && held >= config.max_connections_per_peer {
                return Err(Status::resource_exhausted(format!(
                    "{host} holds {held} connections, the most one peer may \
                     (max_connections_per_peer = {})",
                    config.max_connections_per_peer
                )));
            }
            *per_peer.entry(host.clone()).or_default() += 1;
        }
        self.live.send_modify(|n| *n += 1);
        Ok(Admitted {
            admission: self.clone(),
            peer: host,
        })
    }

    /// A permit to tell one refused connection why, if not too many are being told now.
    pub(super) fn refusing(&self) -> Option<OwnedSemaphorePermit> {
        self.refusing.clone().try_acquire_owned().ok()
    }

    pub(super) fn count(&self) -> ConnectionCount {
        ConnectionCount(self.live.subscribe())
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(host) = &self.peer {
            let mut per_peer = self.admission.per_peer();
            if let Some(n) = per_peer.get_mut(host) {
                *n -= 1;
                if *n == 0 {
                    per_peer.remove(host);
                }
            }
        }
        self.admission.live.send_modify(|n| *n -= 1);
    }
}

/// How many connections a server holds now (handshaking ones included; refused ones not).
/// From [`BoundServer::connection_count`](super::BoundServer::connection_count).
#[derive(Debug, Clone)]
pub struct ConnectionCount(watch::Receiver<usize>);

impl ConnectionCount {
    /// The number now.
    pub fn current(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until the number satisfies `pred` (at once if it does now). Returns the number,
    /// or `None` once the server is gone.
    pub async fn wait_for(&mut self, mut pred: impl FnMut(usize) -> bool) -> Option<usize> {
        self.0.wait_for(|n| pred(*n)).await.ok().map(|n| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_keyed_by_ip() {
        assert_eq!(
            peer_host("tcp://10.0.0.7:40102").as_deref(),
            Some("10.0.0.7")
        );
        assert_eq!(peer_host("doca+oob://[::1]:7470").as_deref(), Some("::1"));
        assert_eq!(peer_host("doca://conn-3@port 7470"), None);
    }

    #[test]
    fn limits_are_checked_and_the_count_is_exact() {
        let config = ServerConfig {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..ServerConfig::default()
        };
        let a = Admission::new();
        let one = a.admit("tcp://10.0.0.1:1", &config).unwrap();
        let two = a.admit("tcp://10.0.0.1:2", &config).unwrap();
        let refused = a.admit("tcp://10.0.0.1:3", &config).unwrap_err();
        assert!(refused.message().contains("max_connections_per_peer = 2"));
        let three = a.admit("tcp://10.0.0.2:1", &config).unwrap();
        let full = a.admit("tcp://10.0.0.3:1", &config).unwrap_err();
        assert!(full.message().contains("max_connections = 3"));
        assert_eq!(a.count().current(), 3);
        drop((one, two, three));
        assert_eq!(a.count().current(), 0);
        assert!(a.per_peer().is_empty());
        let _again = a.admit("tcp://10.0.0.1:4", &config).unwrap();
    }
}
