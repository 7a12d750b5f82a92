//! One software-transport connection: the posting side (operations the application starts)
//! and the serving side (the reader task acting as the peer-facing half of an RDMA NIC).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedRwLockReadGuard, RwLock};
use tokio::task::AbortHandle;

use super::wire::{Header, Kind, NakReason, HEADER_LEN};
use super::TcpConfig;
use crate::error::{AccessViolation, Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::common::RecvQueue;
use crate::transport::{
    check_grant_range, BoxFuture, Connection, Descriptor, Fencing, Grant, PeerIdentity,
    RecvCompletion, RecvOpcode, Revoke, SendData, WindowHandle,
};

/// Socket buffer sizes of the reader and the writer: small packets are batched through them,
/// payloads larger than them go straight between the socket and registered memory. Every
/// connection holds both for its life, so they stay small (2 × 32 KiB per end).
const SOCKET_BUFFER: usize = 32 * 1024;
/// Queue of packets the reader produces (acks, read responses): when full, the reader stops
/// reading, which pushes back on the peer through TCP.
const RESPONSE_QUEUE: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A window's buffer. `None` once revoked.
type Slot = Arc<RwLock<Option<RegisteredBuf>>>;

struct Window {
    slot: Slot,
    /// Advertised address of the window's first byte.
    base: u64,
    len: u64,
    access: Access,
    /// Offset of the window in its buffer.
    offset: usize,
}

enum Pending {
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
    fn fail(self, err: Error) {
        // A dropped receiver means the caller stopped waiting: nothing to tell.
        let _ = match self {
            Pending::Ack(tx) => tx.send(Err(err)).map_err(drop),
            Pending::Read { done, .. } => done.send(Err(err)).map_err(drop),
            Pending::Atomic(tx) => tx.send(Err(err)).map_err(drop),
        };
    }
}

struct State {
    /// The first error; once set the connection is dead.
    error: Option<Error>,
    pending: HashMap<u64, Pending>,
    posted: VecDeque<RegisteredBuf>,
}

enum Payload {
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

struct Packet {
    header: Header,
    payload: Payload,
}

struct Shared {
    peer: String,
    /// Who the peer proved to be (its TLS certificate), if it did.
    identity: Option<Arc<PeerIdentity>>,
    config: Arc<TcpConfig>,
    state: Mutex<State>,
    windows: Mutex<HashMap<u32, Window>>,
    /// A receive was posted (one permit per post).
    posted: Notify,
    /// Operations this side starts.
    requests: mpsc::UnboundedSender<Packet>,
    /// Packets the reader produces in answer to the peer.
    responses: mpsc::Sender<Packet>,
    completions: RecvQueue,
    closed: watch::Sender<bool>,
    reader: OnceLock<AbortHandle>,
    next_op: AtomicU64,
    next_key: AtomicU32,
    key_salt: u32,
    /// Unsignaled sends queued for the writer and not yet written.
    unsignaled: AtomicUsize,
}

impl Shared {
    fn error(&self) -> Error {
        match &lock(&self.state).error {
            Some(e) => e.duplicate(),
            None => Error::ConnectionClosed {
                peer: self.peer.clone(),
                reason: "the operation was dropped".into(),
            },
        }
    }

    fn is_failed(&self) -> bool {
        lock(&self.state).error.is_some()
    }

    /// Puts the connection in error: every outstanding operation completes with `err` (once),
    /// posted receives are flushed, windows are closed, and the tasks stop.
    fn fail(&self, err: Error) {
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
    fn post(&self, mut header: Header, payload: Payload, pending: Pending) -> Result<()> {
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
    fn post_unsignaled(&self, header: Header, payload: Payload) -> Result<()> {
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

    fn check_len(&self, len: u64) -> Result<()> {
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
    fn lookup(
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
                pending: HashMap::new(),
                posted: VecDeque::new(),
            }),
            windows: Mutex::new(HashMap::new()),
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
        });
        let closed_rx = shared.closed.subscribe();
        tokio::spawn(writer(shared.clone(), wr, req_rx, resp_rx, closed_rx));
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
        let len = src.len() as u64;
        if len > dst.len {
            return failed_now(Error::InvalidArgument(format!(
                "write of {len} bytes into a descriptor of {} bytes",
                dst.len
            )));
        }
        if let Err(e) = self.shared.check_len(len) {
            return failed_now(e);
        }
        let mut header = Header::new(Kind::Write, 0);
        header.imm = imm;
        header.rkey = dst.rkey;
        header.addr = dst.addr;
        header.len = len;
        let (tx, rx) = oneshot::channel();
        let (payload, let_go) = tracked(src);
        match self.shared.post(header, payload, Pending::Ack(tx)) {
            Ok(()) => wait_released(&self.shared, rx, let_go),
            Err(e) => failed_now(e),
        }
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

async fn writer<W: AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    wr: W,
    mut requests: mpsc::UnboundedReceiver<Packet>,
    mut responses: mpsc::Receiver<Packet>,
    mut closed: watch::Receiver<bool>,
) {
    let mut out = BufWriter::with_capacity(SOCKET_BUFFER, wr);
    loop {
        let first = tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => break,
            p = responses.recv() => p,
            p = requests.recv() => p,
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        let mut result = Ok(());
        let limit = shared.config.stall_timeout;
        while let Some(packet) = next {
            let unsignaled = packet.header.unsignaled;
            result = deadline(limit, write_packet(&mut out, packet)).await;
            if unsignaled {
                shared.unsignaled.fetch_sub(1, Ordering::AcqRel);
            }
            if result.is_err() {
                break;
            }
            next = responses.try_recv().or_else(|_| requests.try_recv()).ok();
        }
        if result.is_ok() {
            result = deadline(limit, out.flush()).await;
        }
        if let Err(e) = result {
            let err = match e.kind() {
                std::io::ErrorKind::TimedOut => Error::Protocol {
                    peer: shared.peer.clone(),
                    reason: format!(
                        "the peer read nothing for {limit:?} (stall_timeout); connection closed"
                    ),
                },
                _ => Error::io(format!("writing to {}", shared.peer), e),
            };
            shared.fail(err);
            return;
        }
    }
    // Closing: deliver the acks of what was delivered and the NAKs that explain why, then
    // end the stream. Read responses and this side's own requests are dropped.
    let last_words = async {
        while let Ok(packet) = responses.try_recv() {
            if matches!(packet.header.kind, Kind::Nak | Kind::Ack) {
                write_packet(&mut out, packet).await?;
            }
        }
        out.flush().await?;
        out.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), last_words).await;
}

/// What the writer sends from: registered memory a peer may still write (a lease of a shared
/// region) is copied first, since the writer borrows its source.
#[inline]
fn readable(data: SendData) -> SendData {
    if data.is_exposed() {
        data.readable()
    } else {
        data
    }
}

/// `io` within `limit`, or a `TimedOut` error.
async fn deadline(
    limit: Duration,
    io: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    tokio::time::timeout(limit, io)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

async fn write_packet<W: AsyncWrite + Unpin>(
    out: &mut BufWriter<W>,
    packet: Packet,
) -> std::io::Result<()> {
    out.write_all(&packet.header.encode()).await?;
    match &packet.payload {
        Payload::None => Ok(()),
        Payload::Data(data) | Payload::Tracked { data, .. } => out.write_all(data.as_slice()).await,
        Payload::Window { guard, offset, len } => {
            let Some(buf) = guard.as_ref() else {
                return Ok(());
            };
            // SAFETY: the read guard keeps the window from being revoked, so the buffer is
            // owned by the window and only read here (writes and atomics take the write lock);
            // `offset + len` was checked against the window, which lies inside the buffer.
            let bytes = unsafe { std::slice::from_raw_parts(buf.ptr_at(*offset), *len) };
            out.write_all(bytes).await
        }
    }
}

/// The serving loop; returns why the connection ended.
async fn serve<R: AsyncRead + Unpin>(shared: &Arc<Shared>, mut rd: BufReader<R>) -> Error {
    let mut raw = [0u8; HEADER_LEN];
    loop {
        if let Err(e) = rd.read_exact(&mut raw).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::ConnectionClosed {
                    peer: shared.peer.clone(),
                    reason: "closed by the peer".into(),
                }
            } else {
                Error::io(format!("reading from {}", shared.peer), e)
            };
        }
        let header = match Header::decode(&raw) {
            Ok(h) => h,
            Err(reason) => return protocol(shared, reason),
        };
        if let Err(e) = handle(shared, &mut rd, header).await {
            return e;
        }
    }
}

fn protocol(shared: &Shared, reason: impl Into<String>) -> Error {
    Error::Protocol {
        peer: shared.peer.clone(),
        reason: reason.into(),
    }
}

async fn respond(shared: &Shared, header: Header, payload: Payload) -> Result<()> {
    shared
        .responses
        .send(Packet { header, payload })
        .await
        .map_err(|_| Error::ConnectionClosed {
            peer: shared.peer.clone(),
            reason: "writer stopped".into(),
        })
}

/// Sends a NAK for `req` and returns the error that ends the connection.
async fn nak(shared: &Shared, req: &Header, reason: NakReason, extra: u64, err: Error) -> Error {
    let mut header = Header::new(Kind::Nak, req.op_id);
    header.status = reason.code();
    header.rkey = req.rkey;
    header.addr = req.addr;
    header.arg0 = req.len;
    header.arg1 = extra;
    let _ = respond(shared, header, Payload::None).await;
    err
}

async fn ack(shared: &Shared, req: &Header) -> Result<()> {
    respond(shared, Header::new(Kind::Ack, req.op_id), Payload::None).await
}

/// Waits (bounded by the RNR timeout) for a posted receive.
async fn take_posted(shared: &Shared, req: &Header) -> Result<RegisteredBuf> {
    let deadline = tokio::time::Instant::now() + shared.config.rnr_timeout;
    loop {
        if let Some(buf) = lock(&shared.state).posted.pop_front() {
            return Ok(buf);
        }
        if tokio::time::timeout_at(deadline, shared.posted.notified())
            .await
            .is_err()
        {
            let retry_ms = shared.config.rnr_timeout.as_millis() as u64;
            let err = Error::ReceiverNotReady { retry_ms };
            return Err(nak(shared, req, NakReason::ReceiverNotReady, 0, err).await);
        }
    }
}

/// Reads `len` payload bytes into `buf` at `offset`, within `limit` (`TimedOut` otherwise:
/// a peer that stops in the middle of a payload must not hold the buffer, or a window's
/// lock, forever).
///
/// # Safety
/// The caller owns `buf` exclusively (or holds its window's write lock), and
/// `offset + len <= buf.capacity()`.
async unsafe fn read_into<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    buf: &RegisteredBuf,
    offset: usize,
    len: usize,
    limit: Duration,
) -> std::io::Result<()> {
    // SAFETY: guaranteed by the caller.
    let dst = unsafe { std::slice::from_raw_parts_mut(buf.ptr_at(offset), len) };
    deadline(limit, async { rd.read_exact(dst).await.map(drop) }).await
}

async fn handle<R: AsyncRead + Unpin>(
    shared: &Arc<Shared>,
    rd: &mut BufReader<R>,
    h: Header,
) -> Result<()> {
    let limit = shared.config.stall_timeout;
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::TimedOut => Error::Protocol {
            peer: shared.peer.clone(),
            reason: format!(
                "a payload of {} bytes stalled for {limit:?} (stall_timeout); connection closed",
                h.len
            ),
        },
        _ => Error::io(format!("reading from {}", shared.peer), e),
    };
    if (h.kind.carries_payload() || h.kind == Kind::ReadReq) && h.len > shared.config.max_message {
        let err = Error::LimitExceeded {
            limit: "max_message",
            max: shared.config.max_message,
            actual: h.len,
        };
        return Err(nak(shared, &h, NakReason::InvalidRequest, 0, err).await);
    }
    match h.kind {
        Kind::Send => {
            let mut buf = take_posted(shared, &h).await?;
            if h.len > buf.capacity() as u64 {
                let capacity = buf.capacity() as u64;
                let err = Error::ReceiveTooSmall {
                    len: h.len,
                    capacity,
                };
                return Err(nak(shared, &h, NakReason::ReceiveTooSmall, capacity, err).await);
            }
            let len = h.len as usize;
            // SAFETY: the posted buffer is owned by this task; `len <= capacity` checked above.
            unsafe { read_into(rd, &buf, 0, len, limit) }
                .await
                .map_err(io)?;
            buf.set_len(len);
            let opcode = if h.imm.is_some() {
                RecvOpcode::SendWithImm
            } else {
                RecvOpcode::Send
            };
            // Ack before the application can see the data (and possibly close): a delivered
            // message is never reported as failed to the sender.
            if !h.unsignaled {
                ack(shared, &h).await?;
            }
            shared.completions.push(RecvCompletion {
                buf,
                opcode,
                imm: h.imm,
                write_len: 0,
            });
            Ok(())
        }
        Kind::Write => {
            let violation = |v| Error::Protocol {
                peer: shared.peer.clone(),
                reason: format!(
                    "its write of {} bytes to key {:#x} at {:#x} was refused: {v}",
                    h.len, h.rkey, h.addr
                ),
            };
            let (slot, offset) = match shared.lookup(h.rkey, h.addr, h.len, Access::REMOTE_WRITE) {
                Ok(found) => found,
                Err(v) => return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await),
            };
            let guard = slot.write_owned().await;
            let Some(buf) = guard.as_ref() else {
                let v = AccessViolation::UnknownKey;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            };
            // SAFETY: the write guard gives exclusive access to the window's buffer (the
            // owner gave it up when granting); `lookup` checked the range against the window.
            unsafe { read_into(rd, buf, offset, h.len as usize, limit) }
                .await
                .map_err(io)?;
            drop(guard);
            if let Some(imm) = h.imm {
                let mut buf = take_posted(shared, &h).await?;
                buf.set_len(0);
                ack(shared, &h).await?;
                shared.completions.push(RecvCompletion {
                    buf,
                    opcode: RecvOpcode::WriteWithImm,
                    imm: Some(imm),
                    write_len: h.len,
                });
                return Ok(());
            }
            ack(shared, &h).await
        }
        Kind::ReadReq => {
            let violation = |v| Error::Protocol {
                peer: shared.peer.clone(),
                reason: format!(
                    "its read of {} bytes from key {:#x} at {:#x} was refused: {v}",
                    h.len, h.rkey, h.addr
                ),
            };
            let (slot, offset) = match shared.lookup(h.rkey, h.addr, h.len, Access::REMOTE_READ) {
                Ok(found) => found,
                Err(v) => return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await),
            };
            let guard = slot.read_owned().await;
            if guard.is_none() {
                let v = AccessViolation::UnknownKey;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            }
            let mut header = Header::new(Kind::ReadResp, h.op_id);
            header.len = h.len;
            let payload = Payload::Window {
                guard,
                offset,
                len: h.len as usize,
            };
            respond(shared, header, payload).await
        }
        Kind::Cas | Kind::Faa => {
            let violation = |v| Error::Protocol {
                peer: shared.peer.clone(),
                reason: format!(
                    "its atomic on key {:#x} at {:#x} was refused: {v}",
                    h.rkey, h.addr
                ),
            };
            if !h.addr.is_multiple_of(8) {
                let v = AccessViolation::Misaligned;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            }
            let (slot, offset) = match shared.lookup(h.rkey, h.addr, 8, Access::REMOTE_ATOMIC) {
                Ok(found) => found,
                Err(v) => return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await),
            };
            let guard = slot.write_owned().await;
            let Some(buf) = guard.as_ref() else {
                let v = AccessViolation::UnknownKey;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            };
            // SAFETY: exclusive access under the write guard; the 8 bytes are inside the
            // window (checked by `lookup`) and 8-aligned (the buffer is page-aligned and the
            // address is 8-aligned).
            let old = unsafe {
                let p = buf.ptr_at(offset).cast::<u64>();
                let old = p.read();
                let new = match h.kind {
                    Kind::Cas if old == h.arg0 => h.arg1,
                    Kind::Cas => old,
                    _ => old.wrapping_add(h.arg0),
                };
                p.write(new);
                old
            };
            drop(guard);
            let mut header = Header::new(Kind::AtomicResp, h.op_id);
            header.arg0 = old;
            respond(shared, header, Payload::None).await
        }
        Kind::ReadResp => {
            let pending = lock(&shared.state).pending.remove(&h.op_id);
            let Some(Pending::Read { dst, len, done }) = pending else {
                return Err(protocol(
                    shared,
                    format!("read response for unknown operation {}", h.op_id),
                ));
            };
            if h.len != len {
                let _ = done;
                return Err(protocol(
                    shared,
                    format!("read response of {} bytes for a read of {len}", h.len),
                ));
            }
            let mut dst = dst;
            // SAFETY: `dst` was moved into the pending read and is owned by this task now;
            // `len <= capacity` was checked when the read was posted.
            unsafe { read_into(rd, &dst, 0, len as usize, limit) }
                .await
                .map_err(io)?;
            dst.set_len(len as usize);
            let _ = done.send(Ok(dst));
            Ok(())
        }
        Kind::Ack | Kind::AtomicResp => {
            let pending = lock(&shared.state).pending.remove(&h.op_id);
            match (h.kind, pending) {
                (Kind::Ack, Some(Pending::Ack(tx))) => {
                    let _ = tx.send(Ok(()));
                    Ok(())
                }
                (Kind::AtomicResp, Some(Pending::Atomic(tx))) => {
                    let _ = tx.send(Ok(h.arg0));
                    Ok(())
                }
                (kind, _) => Err(protocol(
                    shared,
                    format!("{kind:?} for unknown operation {}", h.op_id),
                )),
            }
        }
        Kind::Nak => {
            let err = match NakReason::from_code(h.status) {
                NakReason::Access(violation) => Error::RemoteAccess {
                    rkey: h.rkey,
                    addr: h.addr,
                    len: h.arg0,
                    violation,
                },
                NakReason::ReceiverNotReady => Error::ReceiverNotReady {
                    retry_ms: shared.config.rnr_timeout.as_millis() as u64,
                },
                NakReason::ReceiveTooSmall => Error::ReceiveTooSmall {
                    len: h.arg0,
                    capacity: h.arg1,
                },
                NakReason::InvalidRequest => {
                    protocol(shared, "the peer rejected a request as invalid")
                }
            };
            // The operation fails with the reason; the connection goes to error with it.
            let pending = lock(&shared.state).pending.remove(&h.op_id);
            if let Some(op) = pending {
                op.fail(err.duplicate());
            }
            Err(err)
        }
    }
}
