//! The application side of DOCA connections and listeners.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use super::engine::{AtomicOp, Cmd, ConnShared, EngineShared, Local, Op};
use super::reg::mmap_for;
use super::sys::Mmap;
use super::window::{local_bits, DocaWindow, Windows};
use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf, SharedRegion};
use crate::transport::{
    check_grant_range, BoxFuture, Connection, Descriptor, Fencing, Grant, Listener, PeerIdentity,
    RecvCompletion, SendData, ShareGuard,
};

/// A DOCA RDMA connection. See the [module docs](super).
pub struct DocaConnection {
    shared: Arc<ConnShared>,
    next_key: AtomicU32,
    /// What fenced windows are served from (bounce memory, shares).
    windows: Windows,
    /// Who the peer proved to be in the side channel's TLS handshake (`doca+oob://` with
    /// side-channel TLS and a client certificate).
    identity: Option<Arc<PeerIdentity>>,
}

impl fmt::Debug for DocaConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocaConnection")
            .field("peer", &self.shared.peer)
            .field("failed", &self.shared.current_error().is_some())
            .finish()
    }
}

impl Drop for DocaConnection {
    fn drop(&mut self) {
        self.close();
    }
}

fn failed_now<T: Send + 'static>(err: Error) -> BoxFuture<'static, Result<T>> {
    Box::pin(async move { Err(err) })
}

impl DocaConnection {
    /// `bounce_budget`: bytes of bounce memory its fenced windows may register
    /// ([`DocaConfig::bounce_budget`](super::DocaConfig::bounce_budget)).
    pub(super) fn new(shared: Arc<ConnShared>, bounce_budget: usize) -> DocaConnection {
        let windows = Windows::new(shared.engine.dev.clone(), bounce_budget);
        DocaConnection {
            shared,
            next_key: AtomicU32::new(1),
            windows,
            identity: None,
        }
    }

    /// The same connection, its peer known as `identity`.
    pub(super) fn with_identity(mut self, identity: Option<Arc<PeerIdentity>>) -> DocaConnection {
        self.identity = identity;
        self
    }

    /// What a side channel's TLS layer holds of this connection to end it on a recheck.
    #[cfg(feature = "tls")]
    pub(super) fn revocable(&self) -> std::sync::Weak<dyn crate::transport::tcp::tls::Revocable> {
        let shared: Arc<dyn crate::transport::tcp::tls::Revocable> = self.shared.clone();
        Arc::downgrade(&shared)
    }

    fn engine(&self) -> &Arc<EngineShared> {
        &self.shared.engine
    }

    /// Messages that arrived before a receive was posted for them, kept until one is.
    #[cfg(test)]
    pub(super) fn early_messages(&self) -> usize {
        self.shared.early_messages()
    }

    /// Operations of this connection's context submitted by their posting task.
    #[cfg(test)]
    pub(super) fn direct_posts(&self) -> u64 {
        self.engine().direct_posts()
    }

    /// Where the owner expects this connection's next message to be copied (0: nowhere).
    #[cfg(test)]
    pub(super) fn next_receive(&self) -> usize {
        self.shared.next_receive()
    }

    /// The most events this connection's context owner handled together.
    #[cfg(test)]
    pub(super) fn largest_batch(&self) -> usize {
        self.engine().largest_batch()
    }

    /// Idle tasks of this connection's context owner, and how often it allocated a new one
    /// (see `EngineShared::idle_tasks`).
    #[cfg(test)]
    pub(super) fn idle_tasks(&self) -> Option<(usize, u64)> {
        self.engine().idle_tasks()
    }

    /// Stops this connection's context here (see `EngineShared::stop_owner_here`).
    #[cfg(test)]
    pub(super) fn stop_owner_here(&self) -> Option<bool> {
        self.engine().stop_owner_here()
    }

    /// Takes the seat of this connection's context owner, as its task does while it
    /// progresses (`None` in busy-poll mode, which has none).
    #[cfg(test)]
    pub(super) fn hold_seat(&self) -> Option<impl Drop + '_> {
        self.engine().hold_seat()
    }

    /// Source memory: registered buffers as they are, other bytes copied into a registered
    /// staging buffer of the transport's pool.
    fn source(&self, data: SendData) -> Result<Local> {
        let (buf, staged) = match data {
            SendData::Registered(buf) => (buf, false),
            SendData::Bytes(bytes) => match crate::memory::frozen_view(&bytes) {
                // Frozen bytes of a memory region: sent from where they are.
                Some(view) => (view, false),
                None => return self.staged(&bytes),
            },
            #[allow(unreachable_patterns)]
            _ => return Err(Error::InvalidArgument("unsupported send data".into())),
        };
        let mmap = mmap_for(&self.engine().dev, &buf, local_bits(&buf))?;
        Ok(Local { buf, mmap, staged })
    }

    /// Submits an unsignaled send from `src`; a source that could not be made fails the
    /// connection, as a failed unsignaled send does.
    fn post_unsignaled(&self, src: Result<Local>, imm: Option<u32>) -> Result<()> {
        match src {
            Ok(src) => self.submit(Op::Send {
                src,
                imm,
                done: None,
            }),
            Err(e) => {
                self.engine().send(Cmd::Close {
                    id: self.shared.id,
                    err: Error::ConnectionClosed {
                        peer: self.shared.peer.clone(),
                        reason: format!("a message could not be posted: {e}"),
                    },
                });
                Err(e)
            }
        }
    }

    /// A copy of `bytes` in a registered staging buffer of the transport's pool.
    fn staged(&self, bytes: &[u8]) -> Result<Local> {
        let mut buf = self.engine().staging.acquire(bytes.len())?;
        buf.fill_from(bytes)?;
        // A one-off buffer (past the staging budget) has no pool and no slab.
        let staged = buf.is_pooled();
        let mmap = mmap_for(&self.engine().dev, &buf, local_bits(&buf))?;
        Ok(Local { buf, mmap, staged })
    }

    /// What the peer gets for a window of `len` bytes at `addr`, exported by `mmap`.
    fn descriptor(&self, addr: u64, len: usize, access: Access, mmap: &Mmap) -> Descriptor {
        Descriptor {
            addr,
            len: len as u64,
            rkey: self.next_key.fetch_add(1, Ordering::Relaxed),
            access,
            blob: mmap.export().clone(),
        }
    }

    /// A grant of `buf[offset..offset + len]` with `access` is possible on this connection.
    fn can_grant(
        &self,
        buf: &RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<()> {
        check_grant_range(buf, offset, len, access)?;
        match self.shared.current_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn writable(&self, buf: RegisteredBuf) -> Result<Local> {
        if !buf.access().contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "the destination buffer needs Access::LOCAL_WRITE".into(),
            ));
        }
        let mmap = mmap_for(&self.engine().dev, &buf, Access::LOCAL_WRITE)?;
        Ok(Local {
            buf,
            mmap,
            staged: false,
        })
    }

    fn post<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Op,
    ) -> BoxFuture<'static, Result<T>> {
        let (tx, rx) = oneshot::channel();
        if let Err(e) = self.submit(make(tx)) {
            return failed_now(e);
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            match rx.await {
                Ok(result) => result,
                Err(_) => Err(shared.error()),
            }
        })
    }

    /// Posts `op` on the context (submitted by this task when it can, see
    /// `EngineShared::post`), unless the connection already failed.
    fn submit(&self, op: Op) -> Result<()> {
        if let Some(e) = self.shared.current_error() {
            return Err(e);
        }
        self.engine().post(self.shared.id, op);
        Ok(())
    }
}

impl Connection for DocaConnection {
    fn peer(&self) -> &str {
        &self.shared.peer
    }

    fn peer_identity(&self) -> Option<Arc<PeerIdentity>> {
        self.identity.clone()
    }

    fn post_recv(&self, buf: RegisteredBuf) -> Result<()> {
        if !buf.access().contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "receive buffers need Access::LOCAL_WRITE".into(),
            ));
        }
        self.shared.post_recv(buf)
    }

    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<RecvCompletion>> {
        self.shared
            .completions
            .poll_next(cx, || self.shared.error())
    }

    fn send(&self, data: SendData, imm: Option<u32>) -> BoxFuture<'static, Result<()>> {
        match self.source(data) {
            Ok(src) => self.post(|done| Op::Send {
                src,
                imm,
                done: Some(done),
            }),
            Err(e) => failed_now(e),
        }
    }

    /// As `send`, with no channel for its completion and no future: a frame of the protocol
    /// costs no allocation of its own. A failure the owner sees fails the connection, as any
    /// failed operation does; one found here (no staging buffer, no mmap) fails it too, so
    /// a lost frame never goes unnoticed.
    fn send_unsignaled(&self, data: SendData, imm: Option<u32>) -> Result<()> {
        self.post_unsignaled(self.source(data), imm)
    }

    fn send_frame(&self, frame: &[u8]) -> Result<()> {
        self.post_unsignaled(self.staged(frame), None)
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
        let dst = dst.clone();
        match self.source(src) {
            Ok(src) => self.post(|done| Op::Write {
                src,
                dst,
                imm,
                done: Some(done),
            }),
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
        let src = src.clone();
        match self.writable(dst) {
            Ok(dst) => self.post(|done| Op::Read { src, dst, done }),
            Err(e) => failed_now(e),
        }
    }

    fn compare_and_swap(
        &self,
        dst: &Descriptor,
        expected: u64,
        new: u64,
    ) -> BoxFuture<'static, Result<u64>> {
        self.atomic(dst, AtomicOp::CompareAndSwap { expected, new })
    }

    fn fetch_and_add(&self, dst: &Descriptor, add: u64) -> BoxFuture<'static, Result<u64>> {
        self.atomic(dst, AtomicOp::FetchAndAdd { add })
    }

    fn grant(
        &self,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant> {
        self.can_grant(&buf, offset, len, access)?;
        // One mmap per region and set of rights, exported once: the peer gets exactly the
        // rights of this grant, over the whole region (DOCA cannot narrow an export).
        let mmap = mmap_for(&self.engine().dev, &buf, access | local_bits(&buf))?;
        let descriptor = self.descriptor(buf.addr() + offset as u64, len, access, &mmap);
        let handle = DocaWindow {
            buf: Mutex::new(Some(buf)),
            mmap: None,
        };
        Ok(Grant::new(descriptor, Box::new(handle)))
    }

    fn fencing(&self) -> Fencing {
        // An export stays valid while its mmap lives; DOCA has no per-request revocation.
        Fencing::Unfenced
    }

    fn grant_fenced(
        &self,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant> {
        self.can_grant(&buf, offset, len, access)?;
        self.windows
            .fenced(buf, offset, len, access, true, |addr, mmap| {
                self.descriptor(addr, len, access, mmap)
            })
    }

    fn reserve_fenced(&self, len: usize, count: usize, access: Access) -> Result<()> {
        if let Some(e) = self.shared.current_error() {
            return Err(e);
        }
        self.windows.reserve(len, count, access)
    }

    fn reserve_sends(&self, len: usize, count: usize) -> Result<()> {
        let engine = self.engine();
        if let Some(slab) = engine.staging.reserve(len, count)? {
            super::reg::mmap_of(&engine.dev, &slab, Access::LOCAL_WRITE)?;
        }
        Ok(())
    }

    fn grant_result(&self, buf: RegisteredBuf, len: usize) -> Result<Grant> {
        let access = Access::REMOTE_WRITE;
        self.can_grant(&buf, 0, len, access)?;
        self.windows
            .fenced(buf, 0, len, access, false, |addr, mmap| {
                self.descriptor(addr, len, access, mmap)
            })
    }

    fn share(&self, region: &SharedRegion, access: Access) -> Result<ShareGuard> {
        if let Some(e) = self.shared.current_error() {
            return Err(e);
        }
        self.windows.share(region, access)
    }

    fn close(&self) {
        self.shared.fail_and_close(Error::ConnectionClosed {
            peer: self.shared.peer.clone(),
            reason: "closed locally".into(),
        });
    }

    fn closed(&self) -> BoxFuture<'_, Error> {
        Box::pin(async move {
            let mut rx = self.shared.closed.subscribe();
            let _ = rx.wait_for(|closed| *closed).await;
            self.shared.error()
        })
    }
}

impl DocaConnection {
    fn atomic(&self, dst: &Descriptor, op: AtomicOp) -> BoxFuture<'static, Result<u64>> {
        let result = match self
            .engine()
            .staging
            .acquire(8)
            .and_then(|b| self.writable(b))
        {
            Ok(r) => r,
            Err(e) => return failed_now(e),
        };
        let dst = dst.clone();
        self.post(|done| Op::Atomic {
            dst,
            op,
            result,
            done,
        })
    }
}

/// An RDMA CM listener: one context accepting many connections.
pub(super) struct CmListener {
    pub(super) engine: Arc<EngineShared>,
    pub(super) port: u16,
    pub(super) local: String,
    pub(super) accepted: tokio::sync::Mutex<mpsc::UnboundedReceiver<Arc<ConnShared>>>,
    pub(super) bounce_budget: usize,
}

impl fmt::Debug for CmListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocaListener")
            .field("local", &self.local)
            .finish()
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        self.engine.send(Cmd::StopListen { port: self.port });
    }
}

impl Listener for CmListener {
    fn accept(&self) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        Box::pin(async move {
            match self.accepted.lock().await.recv().await {
                Some(shared) => Ok(Arc::new(DocaConnection::new(shared, self.bounce_budget))
                    as Arc<dyn Connection>),
                None => Err(Error::ConnectionClosed {
                    peer: self.local.clone(),
                    reason: "listener stopped".into(),
                }),
            }
        })
    }

    fn local_addr(&self) -> String {
        self.local.clone()
    }
}

#[cfg(feature = "tls")]
impl crate::transport::tcp::tls::Revocable for ConnShared {
    fn revoke(&self, err: Error) {
        self.fail_and_close(err);
    }
}
