//! What both halves of a software-transport connection share: the connection's state (its
//! first error, operations waiting for their answer, posted receives), the windows it granted,
//! and the packets between the application's side, the writer and the reader.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedRwLockReadGuard, RwLock};
use tokio::task::AbortHandle;

use super::wire::Header;
use super::TcpConfig;
use crate::error::{AccessViolation, Error, Result};
use crate::ids::IdMap;
use crate::memory::{Access, RegisteredBuf};
use crate::transport::common::RecvQueue;
use crate::transport::{PeerIdentity, SendData};

/// Socket buffer sizes of the reader (and of the writer over TLS): small packets are batched
/// through them, payloads larger than them go straight between the socket and registered
/// memory. Every connection holds them for its life, so they stay small (32 KiB each).
pub(super) const SOCKET_BUFFER: usize = 32 * 1024;
/// Queue of packets the reader produces (acks, read responses): when full, the reader stops
/// reading, which pushes back on the peer through TCP.
pub(super) const RESPONSE_QUEUE: usize = 256;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A window's buffer. `None` once revoked.
pub(super) type Slot = Arc<RwLock<Option<RegisteredBuf>>>;

pub(super) struct Window {
    pub(super) slot: Slot,
    /// Advertised address of the window's first byte.
    pub(super) base: u64,
    pub(super) len: u64,
    pub(super) access: Access,
    /// Offset of the window in its buffer.
    pub(super) offset: usize,
}

pub(super) enum Pending {
    /// A send or a write: completes on ACK.
    Ack(oneshot::Sender<Result<()>>),
    /// A read: the response payload goes into `dst`.
    Read {
        dst: RegisteredBuf,
        len: u64,
        done: oneshot::Sender<Result<RegisteredBuf>>,
    },
    /// An atomic: completes with the previous value.
    Atomic(oneshot::Sender<Result<u64>>),
}

impl Pending {
    pub(super) fn fail(self, err: Error) {
        // A dropped receiver means the caller stopped waiting: nothing to tell.
        let _ = match self {
            Pending::Ack(tx) => tx.send(Err(err)).map_err(drop),
            Pending::Read { done, .. } => done.send(Err(err)).map_err(drop),
            Pending::Atomic(tx) => tx.send(Err(err)).map_err(drop),
        };
    }
}

pub(super) struct State {
    /// The first error; once set the connection is dead.
    pub(super) error: Option<Error>,
    pub(super) pending: IdMap<u64, Pending>,
    pub(super) posted: VecDeque<RegisteredBuf>,
}

pub(super) enum Payload {
    None,
    Data(SendData),
    /// Data whose operation completes only once the writer let go of it (the sender is
    /// dropped with the packet): when `write` or `send` of registered memory completes, the
    /// memory is the caller's again (a lease can be taken anew at once).
    Tracked {
        data: SendData,
        _released: oneshot::Sender<()>,
    },
    /// Bytes of a granted window, kept from revocation by the guard until written.
    Window {
        guard: OwnedRwLockReadGuard<Option<RegisteredBuf>>,
        offset: usize,
        len: usize,
    },
}

pub(super) struct Packet {
    pub(super) header: Header,
    pub(super) payload: Payload,
}

pub(super) struct Shared {
    pub(super) peer: String,
    /// Who the peer proved to be (its TLS certificate), if it did.
    pub(super) identity: Option<Arc<PeerIdentity>>,
    pub(super) config: Arc<TcpConfig>,
    pub(super) state: Mutex<State>,
    pub(super) windows: Mutex<IdMap<u32, Window>>,
    /// A receive was posted (one permit per post).
    pub(super) posted: Notify,
    /// Operations this side starts.
    pub(super) requests: mpsc::UnboundedSender<Packet>,
    /// Packets the reader produces in answer to the peer.
    pub(super) responses: mpsc::Sender<Packet>,
    pub(super) completions: RecvQueue,
    pub(super) closed: watch::Sender<bool>,
    pub(super) reader: OnceLock<AbortHandle>,
    pub(super) next_op: AtomicU64,
    pub(super) next_key: AtomicU32,
    pub(super) key_salt: u32,
    /// Unsignaled sends queued for the writer and not yet written.
    pub(super) unsignaled: AtomicUsize,
    /// Times the reader found no posted receive for the peer's send and waited for one (for
    /// tests that must see a send wait before they post its receive).
    #[cfg(test)]
    pub(super) rnr_waits: AtomicUsize,
    /// Batches the writer wrote (for tests of how packets are batched).
    #[cfg(test)]
    pub(super) writes: AtomicUsize,
    /// ACKs the reader queued (for tests of what is acknowledged).
    #[cfg(test)]
    pub(super) acks: AtomicUsize,
}

impl Shared {
    pub(super) fn error(&self) -> Error {
        match &lock(&self.state).error {
            Some(e) => e.duplicate(),
            None => Error::ConnectionClosed {
                peer: self.peer.clone(),
                reason: "the operation was dropped".into(),
            },
        }
    }

    pub(super) fn is_failed(&self) -> bool {
        lock(&self.state).error.is_some()
    }

    /// Puts the connection in error: every outstanding operation completes with `err` (once),
    /// posted receives are flushed, windows are closed, and the tasks stop.
    pub(super) fn fail(&self, err: Error) {
        let (pending, posted) = {
            let mut st = lock(&self.state);
            if st.error.is_some() {
                return;
            }
            tracing::debug!(peer = %self.peer, error = %err, "connection in error");
            st.error = Some(err.duplicate());
            (
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.posted),
            )
        };
        lock(&self.windows).clear();
        for (_, op) in pending {
            op.fail(err.duplicate());
        }
        drop(posted);
        self.completions.close();
        self.closed.send_replace(true);
        if let Some(reader) = self.reader.get() {
            reader.abort();
        }
    }

    /// Registers an operation and queues its packet.
    pub(super) fn post(
        &self,
        mut header: Header,
        payload: Payload,
        pending: Pending,
    ) -> Result<()> {
        let op_id = self.next_op.fetch_add(1, Ordering::Relaxed);
        header.op_id = op_id;
        {
            let mut st = lock(&self.state);
            if let Some(e) = &st.error {
                return Err(e.duplicate());
            }
            if st.pending.len() >= self.config.max_outstanding {
                return Err(Error::LimitExceeded {
                    limit: "max_outstanding",
                    max: self.config.max_outstanding as u64,
                    actual: st.pending.len() as u64 + 1,
                });
            }
            st.pending.insert(op_id, pending);
        }
        if self.requests.send(Packet { header, payload }).is_err() {
            // The writer is gone: the connection is failing; `fail` completes the op.
            self.fail(Error::ConnectionClosed {
                peer: self.peer.clone(),
                reason: "writer stopped".into(),
            });
        }
        Ok(())
    }

    /// Queues a packet that expects no answer.
    pub(super) fn post_unsignaled(&self, header: Header, payload: Payload) -> Result<()> {
        if let Some(e) = &lock(&self.state).error {
            return Err(e.duplicate());
        }
        let queued = self.unsignaled.fetch_add(1, Ordering::AcqRel) + 1;
        if queued > self.config.max_queued_sends {
            // The peer does not read what was sent: fail the connection, never queue more.
            let err = Error::Protocol {
                peer: self.peer.clone(),
                reason: format!(
                    "the peer reads nothing: {} sends wait for the socket \
                     (max_queued_sends = {}); connection closed",
                    queued - 1,
                    self.config.max_queued_sends
                ),
            };
            self.fail(err.duplicate());
            return Err(err);
        }
        if self.requests.send(Packet { header, payload }).is_err() {
            self.fail(Error::ConnectionClosed {
                peer: self.peer.clone(),
                reason: "writer stopped".into(),
            });
            return Err(self.error());
        }
        Ok(())
    }

    pub(super) fn check_len(&self, len: u64) -> Result<()> {
        if len > self.config.max_message {
            return Err(Error::LimitExceeded {
                limit: "max_message",
                max: self.config.max_message,
                actual: len,
            });
        }
        Ok(())
    }

    /// Finds the window an access names and checks rights and bounds.
    pub(super) fn lookup(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(Slot, usize), AccessViolation> {
        let windows = lock(&self.windows);
        let w = windows.get(&rkey).ok_or(AccessViolation::UnknownKey)?;
        if !w.access.contains(need) {
            return Err(AccessViolation::NotPermitted);
        }
        let start = addr
            .checked_sub(w.base)
            .ok_or(AccessViolation::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(AccessViolation::OutOfBounds)?;
        if end > w.len {
            return Err(AccessViolation::OutOfBounds);
        }
        Ok((w.slot.clone(), w.offset + start as usize))
    }
}

#[cfg(feature = "tls")]
impl super::tls::Revocable for Shared {
    fn revoke(&self, err: Error) {
        self.fail(err);
    }
}
