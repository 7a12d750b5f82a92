//! The application side of DOCA connections and listeners.

use crate::transport::common::QueuedListener;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::engine::{AtomicOp, Cmd, ConnShared, EngineShared, Local, Op};
use super::reg::mmap_for;
use super::sys::Mmap;
use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::{
    check_grant_range, BoxFuture, Connection, Descriptor, Fencing, Grant, Listener, RecvCompletion,
    SendData, WindowHandle,
};

/// A DOCA RDMA connection. See the [module docs](super).
pub struct DocaConnection {
    shared: Arc<ConnShared>,
    next_key: AtomicU32,
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

fn local_bits(buf: &RegisteredBuf) -> Access {
    Access::from_bits_truncate(buf.access().bits() & Access::LOCAL_WRITE.bits())
}

impl DocaConnection {
    pub(super) fn new(shared: Arc<ConnShared>) -> DocaConnection {
        DocaConnection {
            shared,
            next_key: AtomicU32::new(1),
        }
    }

    fn engine(&self) -> &Arc<EngineShared> {
        &self.shared.engine
    }

    /// Source memory: registered buffers as they are, other bytes copied into a registered
    /// staging buffer of the transport's pool.
    fn source(&self, data: SendData) -> Result<Local> {
        let buf = match data {
            SendData::Registered(buf) => buf,
            SendData::Bytes(bytes) => match crate::memory::frozen_view(&bytes) {
                // Frozen bytes of a memory region: sent from where they are.
                Some(view) => view,
                None => {
                    let mut buf = self.engine().staging.acquire(bytes.len())?;
                    buf.fill_from(&bytes)?;
                    buf
                }
            },
            #[allow(unreachable_patterns)]
            _ => return Err(Error::InvalidArgument("unsupported send data".into())),
        };
        let mmap = mmap_for(&self.engine().dev, &buf, local_bits(&buf))?;
        Ok(Local { buf, mmap })
    }

    /// What the peer gets for a window of `buf` exported by `mmap`.
    fn descriptor(
        &self,
        buf: &RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
        mmap: &Mmap,
    ) -> Descriptor {
        Descriptor {
            addr: buf.addr() + offset as u64,
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
        Ok(Local { buf, mmap })
    }

    fn post<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Op,
    ) -> BoxFuture<'static, Result<T>> {
        if let Some(e) = self.shared.current_error() {
            return failed_now(e);
        }
        let (tx, rx) = oneshot::channel();
        self.engine().send(Cmd::Op {
            id: self.shared.id,
            op: make(tx),
        });
        let shared = self.shared.clone();
        Box::pin(async move {
            match rx.await {
                Ok(result) => result,
                Err(_) => Err(shared.error()),
            }
        })
    }
}

impl Connection for DocaConnection {
    fn peer(&self) -> &str {
        &self.shared.peer
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
            Ok(src) => self.post(|done| Op::Send { src, imm, done }),
            Err(e) => failed_now(e),
        }
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
                done,
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
        let descriptor = self.descriptor(&buf, offset, len, access, &mmap);
        let handle = DocaWindow {
            buf: Mutex::new(Some(buf)),
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
        // An mmap of the window alone, exported once: the peer reaches exactly these bytes
        // with exactly these rights, and destroying the mmap at revocation makes its later
        // accesses fail (doca-api.md, `doca_mmap_destroy`: imports of a destroyed mmap stop
        // working). The whole region's mmap is never exported for it.
        // SAFETY: the window lies within `buf` (checked above), whose memory the window
        // handle keeps alive (it owns `buf`) for longer than the mmap, which it drops first.
        let mmap = unsafe {
            Mmap::local(
                &self.engine().dev,
                buf.ptr_at(offset),
                len.max(1),
                (access | local_bits(&buf)).bits(),
            )
        }?;
        let descriptor = self.descriptor(&buf, offset, len, access, &mmap);
        let handle = FencedWindow {
            mmap: Mutex::new(Some(mmap)),
            buf: Mutex::new(Some(buf)),
        };
        Ok(Grant::new(descriptor, Box::new(handle)))
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

/// The transport half of a DOCA [`Grant`].
///
/// DOCA cannot revoke an exported mmap per request: revoking gives the buffer back at once,
/// and a peer that kept the descriptor can still reach the region's memory with the granted
/// rights (see the module docs).
struct DocaWindow {
    buf: Mutex<Option<RegisteredBuf>>,
}

impl fmt::Debug for DocaWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocaWindow").finish_non_exhaustive()
    }
}

impl WindowHandle for DocaWindow {
    fn revoke(self: Box<Self>) -> BoxFuture<'static, Option<RegisteredBuf>> {
        let buf = self.buf.lock().unwrap_or_else(|e| e.into_inner()).take();
        Box::pin(async move { buf })
    }
}

/// A window with an mmap of its own: revoking destroys the mmap, then gives the buffer back.
struct FencedWindow {
    mmap: Mutex<Option<Mmap>>,
    buf: Mutex<Option<RegisteredBuf>>,
}

impl FencedWindow {
    fn fence(&self) -> Option<RegisteredBuf> {
        // The mmap goes first: the memory must outlive its registration.
        drop(self.mmap.lock().unwrap_or_else(|e| e.into_inner()).take());
        self.buf.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl fmt::Debug for FencedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedWindow").finish_non_exhaustive()
    }
}

impl Drop for FencedWindow {
    fn drop(&mut self) {
        drop(self.fence());
    }
}

impl WindowHandle for FencedWindow {
    fn revoke(self: Box<Self>) -> BoxFuture<'static, Option<RegisteredBuf>> {
        let buf = self.fence();
        Box::pin(async move { buf })
    }
}

/// An RDMA CM listener: one context accepting many connections.
pub(super) struct CmListener {
    pub(super) engine: Arc<EngineShared>,
    pub(super) port: u16,
    pub(super) local: String,
    pub(super) accepted: tokio::sync::Mutex<mpsc::UnboundedReceiver<Arc<ConnShared>>>,
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
                Some(shared) => Ok(Arc::new(DocaConnection::new(shared)) as Arc<dyn Connection>),
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

/// Magic of the out-of-band exchange: name and version of this side channel.
const OOB_MAGIC: [u8; 8] = *b"RDRPCdx1";
/// Sent by each side once its connection is connected and its receives are posted.
const OOB_READY: u8 = 0x52;

/// Largest connection blob accepted from a peer.
const MAX_BLOB: usize = 64 * 1024;

/// Exchanges connection blobs over `stream` and connects the exported connection.
pub(super) async fn oob_connect(
    engine: &Arc<EngineShared>,
    mut stream: TcpStream,
    peer: String,
    limit: Duration,
) -> Result<DocaConnection> {
    let (blob, id) = engine.ask(|reply| Cmd::Export { reply }).await?;
    let exchange = async {
        stream.write_all(&OOB_MAGIC).await?;
        stream.write_u32(blob.len() as u32).await?;
        stream.write_all(&blob).await?;
        let mut magic = [0u8; 8];
        stream.read_exact(&mut magic).await?;
        if magic != OOB_MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the peer is not an rdma-rpc DOCA out-of-band endpoint",
            ));
        }
        let len = stream.read_u32().await? as usize;
        if len > MAX_BLOB {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "connection blob too large",
            ));
        }
        let mut theirs = vec![0u8; len];
        stream.read_exact(&mut theirs).await?;
        Ok(theirs)
    };
    let theirs = match tokio::time::timeout(limit, exchange).await {
        Ok(Ok(theirs)) => theirs,
        Ok(Err(e)) => {
            let err = Error::io(format!("out-of-band exchange with {peer}"), e);
            engine.send(Cmd::Close {
                id,
                err: err.duplicate(),
            });
            return Err(err);
        }
        Err(_) => {
            let err = Error::Protocol {
                peer: peer.clone(),
                reason: format!("no out-of-band exchange within {limit:?}"),
            };
            engine.send(Cmd::Close {
                id,
                err: err.duplicate(),
            });
            return Err(err);
        }
    };
    let shared = engine
        .ask(|reply| Cmd::ConnectOob {
            id,
            blob: theirs,
            peer: peer.clone(),
            reply,
        })
        .await?;
    // Both sides must have called `doca_rdma_connect` (and posted their receives) before
    // either sends: on hardware a send to a queue pair that is not ready yet is dropped and
    // retried until the connection fails. Each side says so over the side channel and waits
    // for the other.
    let confirm = async {
        stream.write_all(&[OOB_READY]).await?;
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await?;
        if byte[0] != OOB_READY {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the peer did not confirm its side of the connection",
            ));
        }
        Ok(())
    };
    let confirmed = match tokio::time::timeout(limit, confirm).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::io(
            format!("out-of-band confirmation with {peer}"),
            e,
        )),
        Err(_) => Err(Error::Protocol {
            peer: peer.clone(),
            reason: format!("the peer did not confirm its connection within {limit:?}"),
        }),
    };
    if let Err(e) = confirmed {
        shared.fail_and_close(e.duplicate());
        return Err(e);
    }
    // The side channel stays open as the liveness signal DOCA's out-of-band mode lacks: when
    // either side ends the connection it closes the socket and the other fails too.
    let weak = Arc::downgrade(&shared);
    let mut closed = shared.closed.subscribe();
    tokio::spawn(async move {
        let mut byte = [0u8; 1];
        tokio::select! {
            _ = closed.wait_for(|c| *c) => {}
            _ = stream.read(&mut byte) => {
                if let Some(shared) = weak.upgrade() {
                    // Through the owner, which first takes the messages the peer sent
                    // before it closed: the side channel must not overtake them.
                    shared.engine.send(Cmd::Close {
                        id: shared.id,
                        err: Error::ConnectionClosed {
                            peer: shared.peer.clone(),
                            reason: "closed by the peer".into(),
                        },
                    });
                }
            }
        }
    });
    Ok(DocaConnection::new(shared))
}

/// An out-of-band listener: a TCP side channel on which each accepted socket exchanges
/// connection blobs for one connection of the listener's context.
pub(super) fn oob_listener(
    listener: TcpListener,
    local: String,
    engine: Arc<EngineShared>,
    limit: Duration,
) -> QueuedListener {
    QueuedListener::start(listener, local, move |stream, from| {
        let engine = engine.clone();
        async move {
            let peer = format!("doca+oob://{from}");
            let conn = oob_connect(&engine, stream, peer, limit).await?;
            Ok(Arc::new(conn) as Arc<dyn Connection>)
        }
    })
}
