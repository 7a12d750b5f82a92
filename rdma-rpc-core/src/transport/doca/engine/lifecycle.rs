//! Connection lifecycle: RDMA CM (listen, connect, request, established, failure,
//! disconnection) and out of band (export, connect), and the end of a connection.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use doca_sys as sys;
use tokio::sync::{mpsc, oneshot};

use super::super::sys::{check, Mmap, RdmaAddr};
use super::receive::ConnShared;
use super::task::ConnPtr;
use super::{ConnId, Op, Owner};
use crate::error::{Error, Result};

/// Progress interval for RDMA CM events while listening or connecting.
const CM_POLL_CONNECTING: Duration = Duration::from_millis(2);
/// Progress interval for RDMA CM events (a peer's disconnection) on established connections.
const CM_POLL_ESTABLISHED: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// CM connect or out-of-band export in progress.
    Connecting,
    Live,
    Dead,
}

/// What the owner keeps of one connection.
pub(super) struct OwnedConn {
    /// The DOCA connection; a CM client learns it from its first callback.
    pub(super) raw: Option<ConnPtr>,
    pub(super) phase: Phase,
    /// An RDMA CM connection (its end arrives as a CM event), not an out-of-band one.
    cm: bool,
    disconnected: bool,
    pub(super) peer: String,
    pub(super) shared: Option<Arc<ConnShared>>,
    /// Operations submitted and not completed.
    pub(super) inflight: usize,
    /// Operations waiting for room, in posting order.
    pub(super) backlog: VecDeque<Op>,
    /// Peer mmaps imported from descriptor blobs, once per blob.
    pub(super) remote: HashMap<Bytes, Arc<Mmap>>,
    connect_reply: Option<oneshot::Sender<Result<Arc<ConnShared>>>>,
    _addr: Option<RdmaAddr>,
}

impl OwnedConn {
    fn new(
        cm: bool,
        raw: Option<ConnPtr>,
        peer: String,
        reply: Option<oneshot::Sender<Result<Arc<ConnShared>>>>,
        addr: Option<RdmaAddr>,
    ) -> OwnedConn {
        OwnedConn {
            raw,
            phase: Phase::Connecting,
            cm,
            disconnected: false,
            peer,
            shared: None,
            inflight: 0,
            backlog: VecDeque::new(),
            remote: HashMap::new(),
            connect_reply: reply,
            _addr: addr,
        }
    }

    /// The error operations on this connection get.
    pub(super) fn error(&self, fallback: &str) -> Error {
        self.shared
            .as_ref()
            .map(|s| s.error())
            .unwrap_or_else(|| Error::ConnectionClosed {
                peer: self.peer.clone(),
                reason: fallback.into(),
            })
    }
}

impl Owner {
    pub(super) fn listen(
        &mut self,
        port: u16,
        accepted: mpsc::UnboundedSender<Arc<ConnShared>>,
    ) -> Result<()> {
        // SAFETY: a running context.
        check("doca_rdma_start_listen_to_port", unsafe {
            sys::doca_rdma_start_listen_to_port(self.rdma.raw(), port)
        })?;
        self.listening.push(port);
        self.accepted = Some(accepted);
        self.sink.accepting.set(true);
        Ok(())
    }

    pub(super) fn stop_listen(&mut self, port: u16) {
        self.sink.accepting.set(false);
        self.accepted = None;
        if self.listening.contains(&port) {
            self.listening.retain(|p| *p != port);
            // SAFETY: a running context listening on `port`.
            let _ = unsafe { sys::doca_rdma_stop_listen_to_port(self.rdma.raw(), port) };
        }
    }

    pub(super) fn connect(
        &mut self,
        ip: IpAddr,
        port: u16,
        peer: String,
        reply: oneshot::Sender<Result<Arc<ConnShared>>>,
    ) {
        let addr = match RdmaAddr::new(ip, port) {
            Ok(a) => a,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let id = self.sink.new_id();
        // The connection object appears in the callbacks; its id travels as user data.
        // SAFETY: running context, live address.
        let r = check("doca_rdma_connect_to_addr", unsafe {
            sys::doca_rdma_connect_to_addr(self.rdma.raw(), addr.raw(), sys::doca_data { u64_: id })
        });
        match r {
            Ok(()) => {
                self.conns.insert(
                    id,
                    OwnedConn::new(true, None, peer, Some(reply), Some(addr)),
                );
            }
            Err(e) => {
                self.unclaim();
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Gives back a connection's claim on a shared client context.
    fn unclaim(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.unclaim();
        }
    }

    /// Out of band, step 1: a new connection and the blob the peer needs.
    pub(super) fn export(&mut self) -> Result<(Vec<u8>, ConnId)> {
        let mut blob = ptr::null();
        let mut len = 0usize;
        let mut conn = ptr::null_mut();
        // SAFETY: running context; valid out-pointers.
        let exported = check("doca_rdma_export", unsafe {
            sys::doca_rdma_export(self.rdma.raw(), &mut blob, &mut len, &mut conn)
        });
        if let Err(e) = exported {
            self.unclaim();
            return Err(e);
        }
        // SAFETY: DOCA returned `len` readable bytes, valid while the connection exists;
        // copied at once.
        let bytes = unsafe { std::slice::from_raw_parts(blob.cast::<u8>(), len) }.to_vec();
        let id = self.sink.new_id();
        // SAFETY: a connection of this context, just exported; its tasks are freed before the
        // owner forgets it.
        let raw = unsafe { ConnPtr::new(conn) };
        let Some(raw) = raw else {
            return Err(super::super::sys::doca_error(
                "doca_rdma_export",
                sys::DOCA_ERROR_UNEXPECTED,
            ));
        };
        // As NVIDIA's samples do: the connection's user data is set once it exists.
        // SAFETY: a live connection of this context.
        check("doca_rdma_connection_set_user_data", unsafe {
            sys::doca_rdma_connection_set_user_data(raw.raw(), sys::doca_data { u64_: id })
        })?;
        self.by_raw.insert(raw.key(), id);
        self.conns.insert(
            id,
            OwnedConn::new(false, Some(raw), String::new(), None, None),
        );
        Ok((bytes, id))
    }

    /// Out of band, step 2: connects the exported connection to the peer's blob. The
    /// connection is usable once the peer connected too, which the caller confirms over the
    /// side channel before the first operation.
    pub(super) fn connect_oob(
        &mut self,
        id: ConnId,
        blob: &[u8],
        peer: String,
    ) -> Result<Arc<ConnShared>> {
        let Some(c) = self.conns.get_mut(&id) else {
            return Err(Error::InvalidArgument("unknown export".into()));
        };
        c.peer = peer;
        let raw = c.raw.expect("an exported connection");
        // SAFETY: running context; the connection came from its export; the blob is readable
        // for its length.
        let r = check("doca_rdma_connect", unsafe {
            sys::doca_rdma_connect(self.rdma.raw(), blob.as_ptr().cast(), blob.len(), raw.raw())
        });
        if let Err(e) = r {
            self.fail_conn(id, e.duplicate());
            return Err(e);
        }
        if let Err(e) = self.staging.open(&self.rdma, &self.inv) {
            self.fail_conn(id, e.duplicate());
            return Err(e);
        }
        self.make_live(id).ok_or_else(|| Error::ConnectionClosed {
            peer: String::new(),
            reason: "the transport was dropped".into(),
        })
    }

    pub(super) fn on_requested(&mut self, conn: usize, id: ConnId, accepted: bool) {
        if !accepted {
            return;
        }
        let peer = format!(
            "doca://conn-{id}@{}",
            self.listening
                .first()
                .map_or_else(|| "out-of-band".to_owned(), |p| format!("port {p}"))
        );
        // SAFETY: the connection DOCA delivered to the request callback, accepted on this
        // context.
        let raw = unsafe { ConnPtr::new(conn as *mut sys::doca_rdma_connection) };
        if let Some(raw) = raw {
            self.by_raw.insert(raw.key(), id);
        }
        self.conns
            .insert(id, OwnedConn::new(true, raw, peer, None, None));
    }

    pub(super) fn on_established(&mut self, conn: usize, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if c.raw.is_none() {
                // SAFETY: the connection DOCA delivered to the established callback of this
                // context.
                c.raw = unsafe { ConnPtr::new(conn as *mut sys::doca_rdma_connection) };
                if let Some(raw) = c.raw {
                    self.by_raw.insert(raw.key(), id);
                }
            }
        }
        // Receives go up with the first established connection, as in NVIDIA's samples.
        if let Err(e) = self.staging.open(&self.rdma, &self.inv) {
            self.fail_conn(id, e);
            return;
        }
        let Some(shared) = self.make_live(id) else {
            return;
        };
        let reply = self.conns.get_mut(&id).and_then(|c| c.connect_reply.take());
        let delivered = match reply {
            Some(reply) => reply.send(Ok(shared)).is_ok(),
            None => self
                .accepted
                .as_ref()
                .is_some_and(|tx| tx.send(shared).is_ok()),
        };
        if !delivered {
            self.fail_conn(
                id,
                Error::ConnectionClosed {
                    peer: String::new(),
                    reason: "nobody took the connection".into(),
                },
            );
        }
    }

    pub(super) fn on_failed(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.phase = Phase::Dead;
            if let Some(raw) = c.raw {
                self.live.remove(&raw.key());
            }
            c.disconnected = true;
            let err = Error::ConnectionClosed {
                peer: c.peer.clone(),
                reason: cm_failure_reason().into(),
            };
            if let Some(reply) = c.connect_reply.take() {
                let _ = reply.send(Err(err));
            }
        }
        self.maybe_remove(id);
    }

    pub(super) fn on_disconnected(&mut self, id: ConnId) {
        let peer = self
            .conns
            .get(&id)
            .map(|c| c.peer.clone())
            .unwrap_or_default();
        self.fail_conn(
            id,
            Error::ConnectionClosed {
                peer,
                reason: "closed by the peer".into(),
            },
        );
    }

    /// Makes the application-side state of an established connection.
    fn make_live(&mut self, id: ConnId) -> Option<Arc<ConnShared>> {
        let engine = self.shared.upgrade();
        let c = self.conns.get_mut(&id)?;
        let Some(engine) = engine else {
            // Nobody can use it any more.
            self.fail_conn(
                id,
                Error::ConnectionClosed {
                    peer: String::new(),
                    reason: "the transport was dropped".into(),
                },
            );
            return None;
        };
        // One staging receive for the peer's first message (its Hello may come before this
        // side posted anything); the connection reserves the rest as it posts receives.
        if !engine.receives.reserve(1) {
            let max = engine.receives.max;
            self.fail_conn(
                id,
                Error::LimitExceeded {
                    limit: "DocaConfig::recv_queue_size (staging receives of one DOCA context)",
                    max: max as u64,
                    actual: max as u64 + 1,
                },
            );
            return None;
        }
        c.phase = Phase::Live;
        let shared = ConnShared::new(id, c.peer.clone(), engine);
        c.shared = Some(shared.clone());
        if let Some(raw) = c.raw {
            self.live.insert(raw.key(), shared.clone());
        }
        self.grow_receives();
        Some(shared)
    }

    /// Puts a connection in error: the application side learns it, DOCA disconnects it
    /// (its outstanding tasks complete with errors, the peer gets its disconnection
    /// callback) and its waiting operations fail. Other connections are not touched.
    pub(super) fn fail_conn(&mut self, id: ConnId, err: Error) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(shared) = &c.shared {
            shared.fail(err.duplicate());
        }
        if let Some(reply) = c.connect_reply.take() {
            let _ = reply.send(Err(err.duplicate()));
        }
        c.phase = Phase::Dead;
        if let Some(raw) = c.raw {
            self.live.remove(&raw.key());
        }
        if let (false, Some(raw)) = (c.disconnected, c.raw) {
            c.disconnected = true;
            // SAFETY: a connection of this running context, disconnected once.
            let code = unsafe { sys::doca_rdma_connection_disconnect(raw.raw()) };
            if code != sys::DOCA_SUCCESS && code != sys::DOCA_ERROR_BAD_STATE {
                tracing::debug!(code, "disconnecting a DOCA connection");
            }
        }
        for op in c.backlog.drain(..) {
            op.fail(err.duplicate());
        }
        self.maybe_remove(id);
    }

    /// Forgets a dead connection once none of its operations is in flight.
    pub(super) fn maybe_remove(&mut self, id: ConnId) {
        let remove = self
            .conns
            .get(&id)
            .is_some_and(|c| c.phase == Phase::Dead && c.inflight == 0);
        if remove {
            let Some(c) = self.conns.remove(&id) else {
                return;
            };
            if let Some(raw) = c.raw {
                self.by_raw.remove(&raw.key());
                self.live.remove(&raw.key());
            }
            if let Some(conn) = &c.shared {
                // Its receives stay posted for the context's next connections.
                conn.engine.receives.release(conn.give_back_reserved());
            }
            self.unclaim();
        }
    }

    /// How often to progress for RDMA CM events, which nothing documents to signal the
    /// progress engine's notification handle: often while a connection request or an
    /// establishment may arrive, rarely while only a disconnection may, never without CM.
    pub(super) fn cm_poll(&self) -> Option<Duration> {
        let cm = || self.conns.values().filter(|c| c.cm);
        if !self.listening.is_empty() || cm().any(|c| c.phase == Phase::Connecting) {
            Some(CM_POLL_CONNECTING)
        } else if cm().any(|c| c.phase == Phase::Live) {
            Some(CM_POLL_ESTABLISHED)
        } else {
            None
        }
    }
}

/// Why an RDMA CM connection failed, as far as this side can tell. The software provider
/// connects only within one process (its "device" is memory of this process), which is the
/// likely reason when a server elsewhere is listening.
fn cm_failure_reason() -> &'static str {
    if doca_sys::provider() == doca_sys::Provider::Software {
        "RDMA CM connection failed: nobody listening in this process, or the server is full (doca-sys's \
         software provider connects only within one process: a server in another process is \
         reachable over tcp:// or with a DOCA SDK on RDMA hardware; see doca-sys/README.md)"
    } else {
        "RDMA CM connection failed (nobody listening, or the server is full)"
    }
}
