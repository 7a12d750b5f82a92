//! What names the servers of a balanced client: the [`Resolver`] trait, a list that changes
//! while the client runs ([`Addresses`]), and the records of a DNS name ([`Dns`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, Result};

/// Names the servers of a client
/// ([`ClientBuilder::connect_balanced`](crate::client::ClientBuilder::connect_balanced)).
/// Implement it for a discovery service's client: etcd (a get, then a watch of the prefix),
/// Consul (blocking queries), Kubernetes (a watch of the service's endpoints).
pub trait Resolver: Send + 'static {
    /// The servers' addresses (`tcp://10.0.0.2:7470`), all of them. The first call answers
    /// at once; each later call waits until there is something to say (a change, or the time
    /// to look again) and answers with the whole set again, changed or not.
    ///
    /// An error leaves the servers as they are; the client asks again after a backoff (at
    /// least 100 ms). The first call's error fails
    /// [`connect_balanced`](crate::client::ClientBuilder::connect_balanced).
    fn resolve(&mut self) -> impl Future<Output = Result<Vec<String>>> + Send;
}

/// A list of server addresses that can change while the client runs; clones share it. As a
/// [`Resolver`] it answers with the list each time it changes.
#[derive(Debug)]
pub struct Addresses {
    list: Arc<watch::Sender<Vec<String>>>,
    seen: watch::Receiver<Vec<String>>,
    answered: bool,
}

impl Clone for Addresses {
    fn clone(&self) -> Self {
        Addresses {
            list: self.list.clone(),
            seen: self.list.subscribe(),
            answered: false,
        }
    }
}

impl Addresses {
    /// A list of these addresses.
    pub fn new<S: Into<String>>(addrs: impl IntoIterator<Item = S>) -> Addresses {
        let (list, seen) = watch::channel(addrs.into_iter().map(Into::into).collect());
        Addresses {
            list: Arc::new(list),
            seen,
            answered: false,
        }
    }

    /// Replaces the whole list.
    pub fn set<S: Into<String>>(&self, addrs: impl IntoIterator<Item = S>) {
        self.list
            .send_replace(addrs.into_iter().map(Into::into).collect());
    }

    /// Adds `addr`, unless it is listed already.
    pub fn insert(&self, addr: impl Into<String>) {
        let addr = addr.into();
        self.list.send_if_modified(|list| {
            let new = !list.contains(&addr);
            if new {
                list.push(addr);
            }
            new
        });
    }

    /// Removes `addr`; whether it was listed.
    pub fn remove(&self, addr: &str) -> bool {
        self.list.send_if_modified(|list| {
            let before = list.len();
            list.retain(|a| a != addr);
            list.len() != before
        })
    }

    /// The list now.
    pub fn get(&self) -> Vec<String> {
        self.list.borrow().clone()
    }
}

impl Resolver for Addresses {
    async fn resolve(&mut self) -> Result<Vec<String>> {
        if self.answered && self.seen.changed().await.is_err() {
            // Cannot happen: this holds the sender.
            std::future::pending::<()>().await;
        }
        self.answered = true;
        Ok(self.seen.borrow_and_update().clone())
    }
}

/// Every address a DNS name has (A and AAAA records), looked up again at an interval: a
/// [`Resolver`] for `scheme://name:port`, which answers `scheme://ip:port` for each address
/// (`tcp://10.0.0.2:7470`, `tcp://[fd00::2]:7470`), the scheme kept.
///
/// The addresses dialled carry no name: over `tls://`, name the certificate's subject with
/// `ClientTlsConfig::server_name`.
#[derive(Debug, Clone)]
pub struct Dns {
    name: String,
    scheme: String,
    host: String,
    port: u16,
    every: Duration,
    answered: bool,
}

impl Dns {
    /// Resolves `addr`, `scheme://name:port`, every 30 s (see [`every`](Dns::every)).
    pub fn new(addr: &str) -> Result<Dns> {
        let invalid = |reason: &str| Error::InvalidAddress {
            addr: addr.to_owned(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = addr
            .split_once("://")
            .ok_or_else(|| invalid("no scheme: write tcp://name:port"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| invalid("no port: write scheme://name:port"))?;
        let port = port
            .parse()
            .map_err(|_| invalid("the port is not a number from 0 to 65535"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(invalid("no name"));
        }
        Ok(Dns {
            name: addr.to_owned(),
            scheme: scheme.to_owned(),
            host: host.to_owned(),
            port,
            every: Duration::from_secs(30),
            answered: false,
        })
    }

    /// Looks the name up again this often. Default 30 s.
    pub fn every(mut self, every: Duration) -> Dns {
        self.every = every;
        self
    }
}

impl Resolver for Dns {
    async fn resolve(&mut self) -> Result<Vec<String>> {
        if self.answered {
            tokio::time::sleep(self.every).await;
        }
        self.answered = true;
        let found = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| Error::Resolve {
                name: self.name.clone(),
                source: Box::new(e),
            })?;
        let addrs = with_scheme(&self.scheme, found);
        if addrs.is_empty() {
            return Err(Error::Resolve {
                name: self.name.clone(),
                source: "the name has no address records".into(),
            });
        }
        Ok(addrs)
    }
}

/// `scheme://ip:port` for each address, sorted, each once.
fn with_scheme(scheme: &str, found: impl Iterator<Item = SocketAddr>) -> Vec<String> {
    let mut found: Vec<SocketAddr> = found.collect();
    found.sort();
    found.dedup();
    found
        .into_iter()
        .map(|addr| format!("{scheme}://{addr}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_keep_their_scheme_and_each_address_once() {
        let found = [
            "10.0.0.3:7470",
            "[fd00::2]:7470",
            "10.0.0.2:7470",
            "10.0.0.3:7470",
        ]
        .map(|a| a.parse::<SocketAddr>().unwrap());
        assert_eq!(
            with_scheme("tls", found.into_iter()),
            [
                "tls://10.0.0.2:7470",
                "tls://10.0.0.3:7470",
                "tls://[fd00::2]:7470"
            ]
        );
        let dns = Dns::new("tcp://[::1]:9").unwrap();
        assert_eq!((dns.host.as_str(), dns.port), ("::1", 9));
        for bad in [
            "storage:7470",
            "tcp://storage",
            "tcp://storage:http",
            "tcp://:1",
        ] {
            let err = Dns::new(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidAddress { .. }), "{bad}: {err}");
        }
    }
}
