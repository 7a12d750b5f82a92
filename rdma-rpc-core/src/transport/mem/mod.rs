//! The in-process transport: RDMA semantics between two ends in one process, with no socket
//! and no task in between, to measure (and test) the framework alone.
//!
//! The two ends of a connection share its state. Every operation is carried out by the
//! thread that posts it: a send copies into the peer's next posted receive and wakes the task
//! waiting in the peer's `recv`; a write, read or atomic copies into or out of a window the
//! peer granted, after the peer's window table checked key, rights and bounds. Such an
//! operation has completed when the method returns (its future is ready at once). Only a
//! send that finds no posted receive waits, up to `rnr_timeout`, and every later operation of
//! its sender queues behind it. The semantics are those of the software transport over TCP
//! (see [`tcp`](super::tcp)), including [`Fencing::Revocable`] windows.
//!
//! The ends may run on different runtimes and threads: nothing is spawned, waiting tasks are
//! woken through their wakers, and the receiver-not-ready deadline is kept by one timer
//! thread for the process.
//!
//! Addresses: `mem://NAME` names a listener in a process-wide registry. `mem://` (or
//! `mem://0`, like port 0) binds a fresh name; [`Listener::local_addr`] says which. A name is
//! free again once its listener is dropped.

mod conn;
mod link;
mod rnr;
mod window;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::ready;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::{BoxFuture, Connection, Fencing, Listener, Transport};
use crate::error::{Error, Result};
use link::{lock, End};

pub use conn::MemConnection;

/// Settings of the in-process transport.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MemConfig {
    /// How long a send waits for the peer to post a receive before failing with receiver not
    /// ready (RDMA's RNR retries); the receiving end's setting applies. Default 500 ms.
    pub rnr_timeout: Duration,
    /// Largest single send, write or read, in bytes; checked when the operation is posted.
    /// Default 1 GiB.
    pub max_message: u64,
    /// Most operations of one end waiting behind a send that found no posted receive (its
    /// send queue depth): one more is refused when posted, and an unsignaled send that would
    /// be one more ends the connection (nothing else would report it). Operations that find a
    /// receive, or need none, complete when posted and never count. Default 4096.
    pub max_outstanding: usize,
    /// Most connections waiting for [`Listener::accept`] on one listener: past it, connecting
    /// fails. Default 1024.
    pub backlog: usize,
}

impl Default for MemConfig {
    fn default() -> Self {
        MemConfig {
            rnr_timeout: Duration::from_millis(500),
            max_message: 1 << 30,
            max_outstanding: 4096,
            backlog: 1024,
        }
    }
}

/// The in-process transport. Cheap to clone; every instance reaches the same registry of
/// names, so a client and a server may each make their own.
#[derive(Debug, Clone, Default)]
pub struct MemTransport {
    config: Arc<MemConfig>,
}

impl MemTransport {
    /// A transport with default settings.
    pub fn new() -> MemTransport {
        MemTransport::default()
    }

    /// A transport with the given settings (they apply to the ends this transport makes).
    pub fn with_config(config: MemConfig) -> MemTransport {
        MemTransport {
            config: Arc::new(config),
        }
    }

    /// Its settings.
    pub fn config(&self) -> &MemConfig {
        &self.config
    }

    /// Binds `addr` (`mem://NAME`, or `mem://` for a fresh name) and returns the concrete
    /// listener type.
    pub fn listen_mem(&self, addr: &str) -> Result<MemListener> {
        let wanted = parse(addr)?;
        let mut names = lock(&REGISTRY);
        let name = match wanted {
            Some(name) => {
                if is_bound(&names, name) {
                    return Err(refused(
                        std::io::ErrorKind::AddrInUse,
                        format!("listening on {addr}: the name is already bound in this process"),
                    ));
                }
                name.to_owned()
            }
            None => loop {
                let n = NEXT_NAME.fetch_add(1, Ordering::Relaxed);
                let name = format!("auto-{n}");
                if !is_bound(&names, &name) {
                    break name;
                }
            },
        };
        let inner = Arc::new(Accepting {
            addr: format!("mem://{name}"),
            config: self.config.clone(),
            backlog: Mutex::new(Backlog {
                waiting: VecDeque::new(),
                open: true,
            }),
            ready: Notify::new(),
            accepted: AtomicU64::new(1),
        });
        names.insert(name.clone(), Arc::downgrade(&inner));
        Ok(MemListener { name, inner })
    }

    /// Connects to `addr` (`mem://NAME`) and returns the concrete connection type. Connecting
    /// completes at once: the listener's side waits for [`Listener::accept`].
    pub fn connect_mem(&self, addr: &str) -> Result<Arc<MemConnection>> {
        let Some(name) = parse(addr)? else {
            return Err(Error::InvalidAddress {
                addr: addr.to_owned(),
                reason: "connecting needs the listener's name: mem://NAME".into(),
            });
        };
        let listener = lock(&REGISTRY).get(name).and_then(Weak::upgrade);
        let Some(listener) = listener else {
            return Err(refused(
                std::io::ErrorKind::ConnectionRefused,
                format!("connecting to {addr}: no listener is bound to that name in this process"),
            ));
        };
        let n = listener.accepted.fetch_add(1, Ordering::Relaxed);
        let (ours, theirs) = MemConnection::pair([
            End::new(listener.addr.clone(), self.config.clone()),
            End::new(format!("{}#{n}", listener.addr), listener.config.clone()),
        ]);
        {
            let mut backlog = lock(&listener.backlog);
            if !backlog.open {
                // The listener is being dropped: refused, as if it had gone a moment earlier.
                drop(backlog);
                return Err(refused(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("connecting to {addr}: the listener closed"),
                ));
            }
            let max = listener.config.backlog;
            if backlog.waiting.len() >= max {
                return Err(Error::LimitExceeded {
                    limit: "backlog",
                    max: max as u64,
                    actual: backlog.waiting.len() as u64 + 1,
                });
            }
            backlog.waiting.push_back(Arc::new(theirs));
        }
        listener.ready.notify_one();
        Ok(Arc::new(ours))
    }
}

impl Transport for MemTransport {
    fn listen(&self, addr: &str) -> BoxFuture<'_, Result<Box<dyn Listener>>> {
        let listener = self
            .listen_mem(addr)
            .map(|l| Box::new(l) as Box<dyn Listener>);
        Box::pin(ready(listener))
    }

    fn connect(&self, addr: &str) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        let conn = self.connect_mem(addr).map(|c| c as Arc<dyn Connection>);
        Box::pin(ready(conn))
    }

    fn fencing(&self) -> Fencing {
        Fencing::Revocable
    }
}

/// An error like the operating system's for a socket (so callers can tell a name nobody
/// listens on from a broken connection), saying why in its message.
fn refused(kind: std::io::ErrorKind, why: String) -> Error {
    Error::io(why.clone(), std::io::Error::new(kind, why))
}

/// Listeners by name; an entry whose listener was dropped is dead (and replaced when bound).
static REGISTRY: Mutex<BTreeMap<String, Weak<Accepting>>> = Mutex::new(BTreeMap::new());

/// Whether a live listener holds `name`.
fn is_bound(names: &BTreeMap<String, Weak<Accepting>>, name: &str) -> bool {
    names.get(name).is_some_and(|l| l.strong_count() > 0)
}

/// Numbers fresh names (`mem://auto-N`).
static NEXT_NAME: AtomicU64 = AtomicU64::new(1);

/// The name of `mem://NAME`; `None` for `mem://` and `mem://0` (a fresh name).
fn parse(addr: &str) -> Result<Option<&str>> {
    let name = match addr.split_once("://") {
        Some(("mem", name)) => name,
        Some((scheme, _)) => {
            return Err(Error::InvalidAddress {
                addr: addr.to_owned(),
                reason: format!("the in-process transport takes mem:// addresses, not {scheme}://"),
            })
        }
        None => {
            return Err(Error::InvalidAddress {
                addr: addr.to_owned(),
                reason: "the in-process transport takes mem://NAME addresses".into(),
            })
        }
    };
    if name.is_empty() || name == "0" {
        return Ok(None);
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '#')
    {
        return Err(Error::InvalidAddress {
            addr: addr.to_owned(),
            reason: "a mem:// name has no whitespace, control characters or `#`".into(),
        });
    }
    Ok(Some(name))
}

/// What connecting ends find in the registry.
struct Accepting {
    /// `mem://NAME`.
    addr: String,
    config: Arc<MemConfig>,
    backlog: Mutex<Backlog>,
    /// A connection was queued.
    ready: Notify,
    /// Numbers accepted connections (their peer address is `mem://NAME#N`).
    accepted: AtomicU64,
}

struct Backlog {
    waiting: VecDeque<Arc<MemConnection>>,
    /// `false` once the listener is dropped.
    open: bool,
}

/// A bound `mem://` name. Dropping it frees the name and closes the connections nobody
/// accepted.
pub struct MemListener {
    name: String,
    inner: Arc<Accepting>,
}

impl fmt::Debug for MemListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemListener")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl Drop for MemListener {
    fn drop(&mut self) {
        {
            let mut names = lock(&REGISTRY);
            let ours = names
                .get(&self.name)
                .is_some_and(|l| std::ptr::eq(l.as_ptr(), Arc::as_ptr(&self.inner)));
            if ours {
                names.remove(&self.name);
            }
        }
        let waiting = {
            let mut backlog = lock(&self.inner.backlog);
            backlog.open = false;
            std::mem::take(&mut backlog.waiting)
        };
        // Their peers see the connections close.
        drop(waiting);
    }
}

impl Listener for MemListener {
    fn accept(&self) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        Box::pin(async move {
            loop {
                let notified = self.inner.ready.notified();
                tokio::pin!(notified);
                // Registered before the check: a connection queued in between still wakes it.
                notified.as_mut().enable();
                if let Some(conn) = lock(&self.inner.backlog).waiting.pop_front() {
                    return Ok(conn as Arc<dyn Connection>);
                }
                notified.await;
            }
        })
    }

    fn local_addr(&self) -> String {
        self.inner.addr.clone()
    }
}

#[cfg(test)]
mod tests;
