//! One software-transport connection, the posting side: [`TcpConnection`], the operations the
//! application starts, and the windows it grants. The writer task is in `writer.rs`, the
//! reader (the peer-facing half of an RDMA NIC) in `responder.rs`, what they share in
//! `shared.rs`.

use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::{mpsc, oneshot, watch, Notify, RwLock};

use super::responder::serve;
use super::shared::*;
use super::wire::{Header, Kind};
use super::writer::{readable, writer, Writes};
use super::TcpConfig;
use crate::error::{Error, Result};
use crate::ids::IdMap;
use crate::memory::{Access, RegisteredBuf};
use crate::transport::common::RecvQueue;
use crate::transport::{
    check_grant_range, BoxFuture, Connection, Descriptor, Fencing, Grant, PeerIdentity,
    RecvCompletion, Revoke, SendData, WindowHandle,
};

/// One end of a software-transport connection (`tcp://`, and `tls://` inside TLS): RDMA's
/// reliable connection over one TCP stream.
///
/// Get one from [`TcpTransport::connect_tcp`](super::TcpTransport::connect_tcp), or as an
/// `Arc<dyn Connection>` from [`Transport::connect`](crate::transport::Transport::connect) and
/// [`Listener::accept`](crate::transport::Listener::accept); the runtime's clients and servers
/// make theirs that way. Everything it does is the [`Connection`] trait's:
///
/// - two-sided [`send`](Connection::send)s land in receives the peer posted with
///   [`post_recv`](Connection::post_recv), in order; a send that finds none waits up to
///   [`TcpConfig::rnr_timeout`](super::TcpConfig) and then fails the connection, as receiver
///   not ready does on RDMA;
/// - one-sided [`write`](Connection::write), [`read`](Connection::read) and atomics reach a
///   window the peer [`grant`](Connection::grant)ed: the peer's reader task plays its NIC,
///   checks key, bounds and rights, and moves the bytes between the socket and the window's
///   registered memory with no handler running and no staging copy;
/// - windows are [`Fencing::Revocable`]: once revoked, the key is forgotten and later
///   accesses fail without touching memory.
///
/// Two tasks carry it, a reader and a writer that batches packets into the socket; an error
/// on either (or a peer that breaks the rules) puts the connection in error, and every
/// operation posted on it completes with that error. Dropping the last handle closes it.
/// [`Connection::peer_identity`] is the client certificate's identity over mutual TLS,
/// `None` otherwise.
pub struct TcpConnection {
    shared: Arc<Shared>,
}

impl fmt::Debug for TcpConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpConnection")
            .field("peer", &self.shared.peer)
            .field("failed", &self.shared.is_failed())
            .finish()
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        self.close();
    }
}

impl TcpConnection {
    /// Starts the connection's reader and writer on the two halves of a stream that already
    /// passed the preamble (a TCP socket's, or a TLS session's over one).
    pub(super) fn start<R, W>(
        (rd, wr): (R, W),
        peer: String,
        identity: Option<Arc<PeerIdentity>>,
        config: Arc<TcpConfig>,
        writes: Writes,
    ) -> Arc<Self>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let (resp_tx, resp_rx) = mpsc::channel(RESPONSE_QUEUE);
        let (closed, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            peer,
            identity,
            config,
            state: Mutex::new(State {
                error: None,
                pending: IdMap::default(),
                posted: VecDeque::new(),
            }),
            windows: Mutex::new(IdMap::default()),
            posted: Notify::new(),
            requests: req_tx,
            responses: resp_tx,
            completions: RecvQueue::new(),
            closed,
            reader: OnceLock::new(),
            next_op: AtomicU64::new(1),
            next_key: AtomicU32::new(1),
            key_salt: RandomState::new().hash_one(0u8) as u32,
            unsignaled: AtomicUsize::new(0),
            #[cfg(test)]
            rnr_waits: AtomicUsize::new(0),
            #[cfg(test)]
            writes: AtomicUsize::new(0),
            #[cfg(test)]
            acks: AtomicUsize::new(0),
        });
        let closed_rx = shared.closed.subscribe();
        tokio::spawn(writer(
            shared.clone(),
            wr,
            writes,
            req_rx,
            resp_rx,
            closed_rx,
        ));
        let reader_task = tokio::spawn({
            let shared = shared.clone();
            async move {
                let err = serve(&shared, BufReader::with_capacity(SOCKET_BUFFER, rd)).await;
                shared.fail(err);
            }
        });
        // Set once, right after spawning; `fail` before this point finds no handle and the
        // reader then stops on its own (its socket half is shut by the writer).
        let _ = shared.reader.set(reader_task.abort_handle());
        if shared.is_failed() {
            reader_task.abort();
        }
        Arc::new(TcpConnection { shared })
    }

    /// What a TLS layer holds of this connection to end it on a recheck.
    #[cfg(feature = "tls")]
    pub(super) fn revocable(&self) -> std::sync::Weak<dyn super::tls::Revocable> {
        let shared: Arc<dyn super::tls::Revocable> = self.shared.clone();
        Arc::downgrade(&shared)
    }

    /// Times a send of the peer found no posted receive here and waited for one.
    #[cfg(test)]
    pub(super) fn rnr_waits(&self) -> usize {
        self.shared.rnr_waits.load(Ordering::Relaxed)
    }

    /// Batches of packets the writer wrote to the socket.
    #[cfg(test)]
    pub(super) fn writes(&self) -> usize {
        self.shared.writes.load(Ordering::Relaxed)
    }

    /// ACKs this side's reader queued for the peer's operations.
    #[cfg(test)]
    pub(super) fn acks(&self) -> usize {
        self.shared.acks.load(Ordering::Relaxed)
    }

    /// The header of a write of `src` to `dst`, once its length is checked against both.
    fn write_header(&self, src: &SendData, dst: &Descriptor) -> Result<Header> {
        let len = src.len() as u64;
        if len > dst.len {
            return Err(Error::InvalidArgument(format!(
                "write of {len} bytes into a descriptor of {} bytes",
                dst.len
            )));
        }
        self.shared.check_len(len)?;
        let mut header = Header::new(Kind::Write, 0);
        header.rkey = dst.rkey;
        header.addr = dst.addr;
        header.len = len;
        Ok(header)
    }

    fn new_key(&self) -> u32 {
        // Keys are unpredictable-looking but never reused within a connection's first 2^32
        // grants; a stale key finds no window.
        self.shared.next_key.fetch_add(1, Ordering::Relaxed) ^ self.shared.key_salt
    }
}

fn failed_now<T: Send + 'static>(err: Error) -> BoxFuture<'static, Result<T>> {
    Box::pin(async move { Err(err) })
}

/// The payload of an operation whose completion waits for the writer to let go of its source
/// too (see [`Payload::Tracked`]), and what to await for that.
fn tracked(data: SendData) -> (Payload, oneshot::Receiver<()>) {
    let (released, let_go) = oneshot::channel();
    let payload = Payload::Tracked {
        data: readable(data),
        _released: released,
    };
    (payload, let_go)
}

/// As [`wait`], and then until the writer dropped the operation's source.
fn wait_released(
    shared: &Arc<Shared>,
    rx: oneshot::Receiver<Result<()>>,
    let_go: oneshot::Receiver<()>,
) -> BoxFuture<'static, Result<()>> {
    let done = wait(shared, rx);
    Box::pin(async move {
        let result = done.await;
        // Resolves (with an error: nothing is ever sent) when the packet is dropped.
        let _ = let_go.await;
        result
    })
}

fn wait<T: Send + 'static>(
    shared: &Arc<Shared>,
    rx: oneshot::Receiver<Result<T>>,
) -> BoxFuture<'static, Result<T>> {
    let shared = shared.clone();
    Box::pin(async move {
        match rx.await {
            Ok(result) => result,
            Err(_) => Err(shared.error()),
        }
    })
}

impl Connection for TcpConnection {
    fn peer(&self) -> &str {
        &self.shared.peer
    }

    fn peer_identity(&self) -> Option<Arc<PeerIdentity>> {
        self.shared.identity.clone()
    }

    fn fencing(&self) -> Fencing {
        // A revoked window's key is forgotten: later accesses are refused.
        Fencing::Revocable
    }

    fn post_recv(&self, buf: RegisteredBuf) -> Result<()> {
        if !buf.access().contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "receive buffers need Access::LOCAL_WRITE".into(),
            ));
        }
        {
            let mut st = lock(&self.shared.state);
            if let Some(e) = &st.error {
                return Err(e.duplicate());
            }
            st.posted.push_back(buf);
        }
        self.shared.posted.notify_one();
        Ok(())
    }

    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<RecvCompletion>> {
        self.shared
            .completions
            .poll_next(cx, || self.shared.error())
    }

    fn send(&self, data: SendData, imm: Option<u32>) -> BoxFuture<'static, Result<()>> {
        if let Err(e) = self.shared.check_len(data.len() as u64) {
            return failed_now(e);
        }
        let mut header = Header::new(Kind::Send, 0);
        header.imm = imm;
        header.len = data.len() as u64;
        let (tx, rx) = oneshot::channel();
        if matches!(data, SendData::Registered(_)) {
            let (payload, let_go) = tracked(data);
            return match self.shared.post(header, payload, Pending::Ack(tx)) {
                Ok(()) => wait_released(&self.shared, rx, let_go),
                Err(e) => failed_now(e),
            };
        }
        match self
            .shared
            .post(header, Payload::Data(readable(data)), Pending::Ack(tx))
        {
            Ok(()) => wait(&self.shared, rx),
            Err(e) => failed_now(e),
        }
    }

    fn send_unsignaled(&self, data: SendData, imm: Option<u32>) -> Result<()> {
        self.shared.check_len(data.len() as u64)?;
        let mut header = Header::new(Kind::Send, 0);
        header.imm = imm;
        header.unsignaled = true;
        header.len = data.len() as u64;
        self.shared
            .post_unsignaled(header, Payload::Data(readable(data)))
    }

    fn write(
        &self,
        src: SendData,
        dst: &Descriptor,
        imm: Option<u32>,
    ) -> BoxFuture<'static, Result<()>> {
        let mut header = match self.write_header(&src, dst) {
            Ok(header) => header,
            Err(e) => return failed_now(e),
        };
        header.imm = imm;
        let (tx, rx) = oneshot::channel();
        let (payload, let_go) = tracked(src);
        match self.shared.post(header, payload, Pending::Ack(tx)) {
            Ok(()) => wait_released(&self.shared, rx, let_go),
            Err(e) => failed_now(e),
        }
    }

    /// An unsignaled write packet: the peer's reader lands it before it reads the next
    /// packet and sends no ACK; done when the writer has written it to the socket.
    fn write_posted(&self, src: SendData, dst: &Descriptor) -> BoxFuture<'static, Result<()>> {
        let mut header = match self.write_header(&src, dst) {
            Ok(header) => header,
            Err(e) => return failed_now(e),
        };
        header.unsignaled = true;
        let (payload, let_go) = tracked(src);
        if let Err(e) = self.shared.post_unsignaled(header, payload) {
            return failed_now(e);
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            // Resolves (with an error: nothing is ever sent) when the packet is dropped,
            // written or not: a connection that failed first says so.
            let _ = let_go.await;
            match lock(&shared.state).error.as_ref() {
                Some(e) => Err(e.duplicate()),
                None => Ok(()),
            }
        })
    }

    fn read(
        &self,
        src: &Descriptor,
        dst: RegisteredBuf,
    ) -> BoxFuture<'static, Result<RegisteredBuf>> {
        if src.len > dst.capacity() as u64 {
            return failed_now(Error::InvalidArgument(format!(
                "read of {} bytes into a buffer of {} bytes",
                src.len,
                dst.capacity()
            )));
        }
        if let Err(e) = self.shared.check_len(src.len) {
            return failed_now(e);
        }
        let mut header = Header::new(Kind::ReadReq, 0);
        header.rkey = src.rkey;
        header.addr = src.addr;
        header.len = src.len;
        let (tx, rx) = oneshot::channel();
        let pending = Pending::Read {
            dst,
            len: src.len,
            done: tx,
        };
        match self.shared.post(header, Payload::None, pending) {
            Ok(()) => wait(&self.shared, rx),
            Err(e) => failed_now(e),
        }
    }

    fn compare_and_swap(
        &self,
        dst: &Descriptor,
        expected: u64,
        new: u64,
    ) -> BoxFuture<'static, Result<u64>> {
        let mut header = Header::new(Kind::Cas, 0);
        header.rkey = dst.rkey;
        header.addr = dst.addr;
        header.arg0 = expected;
        header.arg1 = new;
        let (tx, rx) = oneshot::channel();
        match self.shared.post(header, Payload::None, Pending::Atomic(tx)) {
            Ok(()) => wait(&self.shared, rx),
            Err(e) => failed_now(e),
        }
    }

    fn fetch_and_add(&self, dst: &Descriptor, add: u64) -> BoxFuture<'static, Result<u64>> {
        let mut header = Header::new(Kind::Faa, 0);
        header.rkey = dst.rkey;
        header.addr = dst.addr;
        header.arg0 = add;
        let (tx, rx) = oneshot::channel();
        match self.shared.post(header, Payload::None, Pending::Atomic(tx)) {
            Ok(()) => wait(&self.shared, rx),
            Err(e) => failed_now(e),
        }
    }

    fn grant(
        &self,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant> {
        check_grant_range(&buf, offset, len, access)?;
        if self.shared.is_failed() {
            return Err(self.shared.error());
        }
        let base = buf.addr() + offset as u64;
        let rkey = self.new_key();
        let slot: Slot = Arc::new(RwLock::new(Some(buf)));
        lock(&self.shared.windows).insert(
            rkey,
            Window {
                slot: slot.clone(),
                base,
                len: len as u64,
                access,
                offset,
            },
        );
        let descriptor = Descriptor {
            addr: base,
            len: len as u64,
            rkey,
            access,
            blob: Bytes::new(),
        };
        let handle = TcpWindow {
            shared: Arc::downgrade(&self.shared),
            rkey,
            slot,
        };
        Ok(Grant::new(descriptor, Box::new(handle)))
    }

    fn close(&self) {
        self.shared.fail(Error::ConnectionClosed {
            peer: self.shared.peer.clone(),
            reason: "closed locally".into(),
        });
    }

    fn closed(&self) -> BoxFuture<'_, Error> {
        Box::pin(async move {
            let mut rx = self.shared.closed.subscribe();
            // The sender lives in `shared`, which we hold: `wait_for` cannot fail.
            let _ = rx.wait_for(|closed| *closed).await;
            self.shared.error()
        })
    }
}

/// The transport half of a software-transport [`Grant`].
struct TcpWindow {
    shared: Weak<Shared>,
    rkey: u32,
    slot: Slot,
}

impl fmt::Debug for TcpWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl Drop for TcpWindow {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared.windows).remove(&self.rkey);
        }
    }
}

impl WindowHandle for TcpWindow {
    fn revoke(self: Box<Self>, _: Revoke) -> BoxFuture<'static, Option<RegisteredBuf>> {
        let slot = self.slot.clone();
        // Dropping the handle removes the key: no new access can find the window.
        drop(self);
        Box::pin(async move {
            // Waits for accesses that found the window before it was removed.
            slot.write_owned().await.take()
        })
    }
}
