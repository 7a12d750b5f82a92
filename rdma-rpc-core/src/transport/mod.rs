//! Transports: how bytes and one-sided operations move between two peers.
//!
//! The model is RDMA's reliable connection, as DOCA RDMA exposes it:
//!
//! - a [`Listener`] accepts many [`Connection`]s; a [`Transport`] connects by address;
//! - two-sided [`send`](Connection::send) lands in a receive the peer posted in advance with
//!   [`post_recv`](Connection::post_recv) (optionally with 32-bit immediate data); a send that
//!   finds no posted receive waits a bounded time (receiver not ready) and then fails;
//! - one-sided [`write`](Connection::write), [`read`](Connection::read) and atomics act on
//!   peer memory named by a [`Descriptor`], with no code running on the peer: the peer's
//!   transport checks key, bounds and rights and moves the bytes;
//! - memory is exposed one window at a time with [`Connection::grant`]: the window covers one
//!   range of one buffer, for one connection, with the rights asked for, until it is revoked;
//! - every posted operation completes exactly once, with success or an error, also when the
//!   connection drops. Operations are posted when the method is called, not when the returned
//!   future is first polled; dropping the future does not cancel the operation.
//!
//! Any error on one-sided access, receiver-not-ready or a malformed packet puts that
//! connection in error (as an RDMA queue pair moves to the error state); other connections
//! are not affected.
//!
//! Three transports implement the model, chosen by the address's scheme ([`transport_for`]):
//! [`tcp`] (`tcp://host:port`, the software transport), [`mem`] (`mem://NAME`, two ends in
//! one process with no I/O, to measure or test the framework alone) and, with the `doca`
//! feature, `doca` (`doca://`, `doca+oob://`: DOCA RDMA). With the `tls` feature the software
//! transport also runs inside TLS (`tls://host:port`, `tls::TlsTransport`): the same packets,
//! encrypted and authenticated, and the peer's certificate as its [`PeerIdentity`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf, SharedRegion};

mod common;
#[cfg(test)]
pub(crate) mod conformance;
#[cfg(feature = "doca")]
#[cfg_attr(docsrs, doc(cfg(feature = "doca")))]
pub mod doca;
mod identity;
pub mod mem;
pub mod tcp;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub use tcp::tls;

pub use identity::PeerIdentity;

/// A boxed, `Send` future: what the object-safe transport traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// What a peer needs to reach one window of memory with one-sided operations.
#[derive(Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Remote address of the first byte of the window.
    pub addr: u64,
    /// Length of the window in bytes.
    pub len: u64,
    /// The key that names the window on the granting connection.
    pub rkey: u32,
    /// Rights the window grants.
    pub access: Access,
    /// Transport-specific data (DOCA: the mmap export); empty for the software transport.
    pub blob: Bytes,
}

impl Descriptor {
    /// The sub-range `[offset, offset + len)` of this window.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Descriptor> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Descriptor {
                addr: self.addr + offset,
                len,
                rkey: self.rkey,
                access: self.access,
                blob: self.blob.clone(),
            }),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} outside a descriptor of {} bytes",
                self.len
            ))),
        }
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .field("blob_len", &self.blob.len())
            .finish()
    }
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// How a completed receive was filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecvOpcode {
    /// A send: the buffer holds the message.
    Send,
    /// A send with immediate data.
    SendWithImm,
    /// A one-sided write with immediate data: the data went to the window written, the
    /// receive buffer is untouched and only carries the notification.
    WriteWithImm,
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// A completed receive.
#[derive(Debug)]
pub struct RecvCompletion {
    /// The posted buffer; its length is the number of bytes received (0 for a write with
    /// immediate).
    pub buf: RegisteredBuf,
    /// What filled it.
    pub opcode: RecvOpcode,
    /// Immediate data, if the peer sent any.
    pub imm: Option<u32>,
    /// For [`RecvOpcode::WriteWithImm`]: the number of bytes the peer wrote.
    pub write_len: u64,
}

/// Source bytes of a send or a write.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendData {
    /// Bytes from anywhere. The software transport sends them as they are; a hardware
    /// transport copies them into registered memory first (like an inline send).
    Bytes(Bytes),
    /// A registered buffer: its data (`as_slice`) is sent with no copy. It is dropped (and so
    /// returned to its pool) once the operation no longer needs it.
    Registered(RegisteredBuf),
}

impl SendData {
    /// Number of bytes to send.
    pub fn len(&self) -> usize {
        match self {
            SendData::Bytes(b) => b.len(),
            SendData::Registered(b) => b.len(),
        }
    }

    /// Whether there are no bytes to send.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes. Panics for a registered buffer a peer may still write (a lease of a shared
    /// region): transports that read the bytes take a copy of such memory first.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            SendData::Bytes(b) => b,
            SendData::Registered(b) => b.as_slice(),
        }
    }

    /// The same bytes in a form whose slice may be borrowed: a registered buffer a peer may
    /// still write (a lease of a shared region) becomes a copy. For transports that read the
    /// source through [`as_slice`](Self::as_slice) rather than by RDMA.
    #[cold]
    pub(crate) fn readable(self) -> SendData {
        match self {
            SendData::Registered(b) if b.is_exposed() => SendData::Bytes(Bytes::from(b.to_vec())),
            other => other,
        }
    }

    /// Whether the bytes are registered memory a peer may still write (a lease of a shared
    /// region): [`as_slice`](Self::as_slice) refuses those, [`readable`](Self::readable)
    /// copies them.
    #[inline]
    pub(crate) fn is_exposed(&self) -> bool {
        matches!(self, SendData::Registered(b) if b.is_exposed())
    }

    /// Copies the bytes into `dst` (exactly as long), never borrowing registered memory.
    pub(crate) fn copy_to(&self, dst: &mut [u8]) {
        match self {
            SendData::Bytes(b) => dst.copy_from_slice(b),
            SendData::Registered(b) => b.copy_out(0, dst),
        }
    }
}

impl From<Bytes> for SendData {
    fn from(b: Bytes) -> Self {
        SendData::Bytes(b)
    }
}

impl From<RegisteredBuf> for SendData {
    fn from(b: RegisteredBuf) -> Self {
        SendData::Registered(b)
    }
}

impl From<crate::memory::SharedBuf> for SendData {
    /// Sent from where it is (by RDMA over DOCA; the software transports copy it first).
    fn from(b: crate::memory::SharedBuf) -> Self {
        SendData::Registered(crate::memory::into_registered(b))
    }
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// How a window is taken down: what the revoker knows about the peer's use of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revoke {
    /// The peer said it is done with the window (a response, a confirmed revocation). Memory
    /// that stays reachable after revocation (a bounce buffer) may then serve the next window;
    /// otherwise it is discarded, so a late access cannot land in another window's bytes.
    pub peer_done: bool,
    /// For a result window: how many bytes of it the peer wrote (a prefix). `None`: the whole
    /// window counts.
    pub written: Option<usize>,
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// The transport side of a [`Grant`]: revokes the window.
pub trait WindowHandle: Send + Sync + fmt::Debug {
    /// Removes the window, waits until no remote access is still using it, and gives the
    /// buffer back (`None` if the connection already dropped it), holding what the peer
    /// wrote (`how.written` bytes of a result window).
    fn revoke(self: Box<Self>, how: Revoke) -> BoxFuture<'static, Option<RegisteredBuf>>;

    /// Removes the window and drops the buffer: the peer is done with it and nobody wants its
    /// bytes (an abandoned call's window, once the call's response came).
    fn release(self: Box<Self>) {
        drop(self);
    }
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// A window of a buffer exposed to the peer of one connection.
///
/// The buffer is owned by the window until [`revoke`](Grant::revoke) returns it, so local code
/// can never race the peer. Dropping a grant revokes it too; the buffer is then dropped (and
/// returned to its pool) once no remote access uses it any more.
#[derive(Debug)]
pub struct Grant {
    descriptor: Descriptor,
    handle: Box<dyn WindowHandle>,
}

impl Grant {
    /// Made by transports.
    pub fn new(descriptor: Descriptor, handle: Box<dyn WindowHandle>) -> Grant {
        Grant { descriptor, handle }
    }

    /// What the peer needs to reach the window.
    pub fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    /// Revokes the window once the peer is done with it and returns the buffer. From now on
    /// the peer's accesses fail (or, over a transport that cannot fence, never reach the
    /// buffer: see [`Connection::grant_fenced`]).
    pub fn revoke(self) -> BoxFuture<'static, Option<RegisteredBuf>> {
        // The transport's future as it is: an `async fn` here would wrap it (and this grant)
        // in a future of its own, 176 bytes more in every call future that awaits it.
        self.handle.revoke(Revoke {
            peer_done: true,
            written: None,
        })
    }

    /// [`revoke`](Self::revoke) for a result window of which the peer wrote `written` bytes.
    pub fn revoke_written(self, written: usize) -> BoxFuture<'static, Option<RegisteredBuf>> {
        // The transport's future as it is: an `async fn` here would wrap it (and this grant)
        // in a future of its own, 176 bytes more in every call future that awaits it.
        self.handle.revoke(Revoke {
            peer_done: true,
            written: Some(written),
        })
    }

    /// Revokes the window although the peer did not say it is done (it did not confirm in
    /// time): memory it may still reach is not reused.
    pub fn revoke_unconfirmed(self) -> BoxFuture<'static, Option<RegisteredBuf>> {
        // The transport's future as it is: an `async fn` here would wrap it (and this grant)
        // in a future of its own, 176 bytes more in every call future that awaits it.
        self.handle.revoke(Revoke {
            peer_done: false,
            written: None,
        })
    }

    /// Takes the window down and drops the buffer, the peer being done with it.
    pub fn release(self) {
        self.handle.release();
    }
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// A region shared with the peer of one connection ([`Connection::share`]); dropping it ends
/// the share once no window of it is in use.
pub struct ShareGuard(Option<Box<dyn std::any::Any + Send + Sync>>);

impl ShareGuard {
    /// A share that needs nothing kept (the transport fences every window by itself).
    pub fn none() -> ShareGuard {
        ShareGuard(None)
    }

    /// A share whose registration `keep` holds.
    pub fn new(keep: Box<dyn std::any::Any + Send + Sync>) -> ShareGuard {
        ShareGuard(Some(keep))
    }
}

impl fmt::Debug for ShareGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShareGuard")
            .field("registered", &self.0.is_some())
            .finish()
    }
}

/// What a transport can promise about a window once it was revoked: a capability the
/// protocol checks instead of assuming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// [`Grant::revoke`] cuts the peer off: its later accesses fail and touch nothing, so
    /// bytes of a revoked window can be handed out without a copy (the software transport
    /// forgets the key).
    Revocable,
    /// A granted window stays reachable while its memory is registered: the peer that has the
    /// descriptor can still read or write it after `revoke` (DOCA cannot revoke an exported
    /// mmap per request). Bytes a peer could still write are copied before anything hands
    /// them out, and configurations that need revocation are refused.
    Unfenced,
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// One reliable connection with RDMA semantics. See the [module docs](self).
///
/// Operations posted on one connection take effect at the peer in the order they were posted,
/// as on an RDMA reliable connection: a send posted after a write reaches the peer after the
/// write's bytes are in its memory. The protocol relies on it (a request naming a write slot
/// follows the write into the slot; a response follows the write of its result).
pub trait Connection: Send + Sync + fmt::Debug + 'static {
    /// The peer's address, for messages.
    fn peer(&self) -> &str;

    /// Who the peer proved to be in the connection's handshake (its TLS certificate), if the
    /// transport authenticates peers and this one presented a certificate.
    fn peer_identity(&self) -> Option<Arc<PeerIdentity>> {
        None
    }

    /// Posts a receive buffer (needs [`Access::LOCAL_WRITE`]). Receives complete in the order
    /// they were posted.
    fn post_recv(&self, buf: RegisteredBuf) -> Result<()>;

    /// The next completed receive, or `Pending` with the task registered to be woken when
    /// one completes (every waiting task is woken). Fails once the connection is in error and
    /// its completions are drained. A completion is taken only when it is returned, so a
    /// receiver that stops polling loses nothing. Polled by the protocol on its hot path: no
    /// allocation per receive.
    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<RecvCompletion>>;

    /// [`poll_recv`](Self::poll_recv) as a future. Cancel safe: dropping it loses no
    /// completion.
    fn recv(&self) -> BoxFuture<'_, Result<RecvCompletion>> {
        Box::pin(std::future::poll_fn(move |cx| self.poll_recv(cx)))
    }

    /// Sends `data` into the peer's next posted receive; completes when the peer has it.
    fn send(&self, data: SendData, imm: Option<u32>) -> BoxFuture<'static, Result<()>>;

    /// Sends like [`send`](Self::send) but asks for no completion: nothing reports when the
    /// peer has the message. A failure (no posted receive, too small) still puts the
    /// connection in error, which [`recv`](Self::recv) and [`closed`](Self::closed) report.
    /// Transports that can skip the acknowledgement do (RDMA's unsignaled sends).
    fn send_unsignaled(&self, data: SendData, imm: Option<u32>) -> Result<()> {
        drop(self.send(data, imm));
        Ok(())
    }

    /// Sends a copy of `frame` as [`send_unsignaled`](Self::send_unsignaled) does: the
    /// protocol's frames, encoded into memory the protocol reuses as soon as this returns.
    /// Transports that copy what they send anyway (into the peer's posted receive, into
    /// registered staging) copy straight from here, with no allocation and no reference
    /// count; the default copies into bytes of their own first.
    fn send_frame(&self, frame: &[u8]) -> Result<()> {
        self.send_unsignaled(SendData::Bytes(Bytes::copy_from_slice(frame)), None)
    }

    /// Writes `src` into the peer's window at `dst` (which must be at least as long);
    /// completes when the bytes are in the peer's memory. With `imm`, the peer's next posted
    /// receive completes as [`RecvOpcode::WriteWithImm`].
    fn write(
        &self,
        src: SendData,
        dst: &Descriptor,
        imm: Option<u32>,
    ) -> BoxFuture<'static, Result<()>>;

    /// Writes like [`write`](Self::write) without waiting for the peer: completes once the
    /// write is posted ahead of everything this connection sends after it, and the transport
    /// no longer reads `src`. The peer has the bytes in its memory before any later send of
    /// this connection completes there (the order of an RDMA reliable connection's queue
    /// pair: a write and then a send), so a response sent after it tells the peer its data
    /// landed. A refusal at the peer (a revoked window) fails the connection, and with it
    /// whatever was sent after, instead of this operation. Transports that cannot post
    /// without waiting keep this default: the whole [`write`](Self::write).
    fn write_posted(&self, src: SendData, dst: &Descriptor) -> BoxFuture<'static, Result<()>> {
        self.write(src, dst, None)
    }

    /// Reads `src.len` bytes of the peer's window into `dst` (its length is set to the bytes
    /// read). On error the buffer is dropped.
    fn read(
        &self,
        src: &Descriptor,
        dst: RegisteredBuf,
    ) -> BoxFuture<'static, Result<RegisteredBuf>>;

    /// Atomic compare-and-swap on the 8 aligned bytes at `dst.addr`: if they equal `expected`
    /// they become `new`. Returns the previous value.
    fn compare_and_swap(
        &self,
        dst: &Descriptor,
        expected: u64,
        new: u64,
    ) -> BoxFuture<'static, Result<u64>>;

    /// Atomic fetch-and-add on the 8 aligned bytes at `dst.addr`. Returns the previous value.
    fn fetch_and_add(&self, dst: &Descriptor, add: u64) -> BoxFuture<'static, Result<u64>>;

    /// Exposes `buf[offset..offset + len]` to this connection's peer with `access` (a subset
    /// of the buffer's registration rights).
    fn grant(&self, buf: RegisteredBuf, offset: usize, len: usize, access: Access)
        -> Result<Grant>;

    /// Whether [`Grant::revoke`] cuts the peer off (see [`Fencing`]). Every transport says
    /// so explicitly: the protocol's memory safety depends on it.
    fn fencing(&self) -> Fencing;

    /// Like [`grant`](Self::grant), but fenced whatever [`fencing`](Self::fencing) says: once
    /// [`Grant::revoke`] returns (or the grant is dropped), the peer's accesses never reach
    /// `buf` again, and while the window lives the peer reaches no byte of `buf` outside
    /// `buf[offset..offset + len]`. For application memory offered to a peer (remote buffers)
    /// and a caller's own buffer given for a result. Bytes of `buf` the peer does not write
    /// keep their values.
    ///
    /// With no registration per call: a transport that cannot revoke a window (DOCA) serves it
    /// from memory registered once per connection and reachable by this connection's peer
    /// only (bounce buffers: a copy in at grant, a copy back at revocation), or, for a region
    /// the application shared with this connection ([`share`](Self::share)), from the
    /// region's own registration (no copy; the peer then reaches the whole region until the
    /// share ends: the application chose to trust it).
    fn grant_fenced(
        &self,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant> {
        match self.fencing() {
            Fencing::Revocable => self.grant(buf, offset, len, access),
            Fencing::Unfenced => Err(Error::InvalidArgument(
                "this transport cannot fence a granted window".into(),
            )),
        }
    }

    /// Registers now what `count` fenced windows of `len` bytes with `access` held at once
    /// need (DOCA: this connection's bounce memory), so that none registers later. Transports
    /// that register nothing for fenced windows do nothing (the default).
    fn reserve_fenced(&self, len: usize, count: usize, access: Access) -> Result<()> {
        let _ = (len, count, access);
        Ok(())
    }

    /// Registers now what `count` sends of up to `len` bytes of plain (unregistered) bytes,
    /// in flight together, need to be staged (DOCA: buffers of the transport's staging pool),
    /// so that none registers later. For a sender that knows its bound, such as a message
    /// stream (its window over its frame size). Transports that stage nothing do nothing (the
    /// default).
    fn reserve_sends(&self, len: usize, count: usize) -> Result<()> {
        let _ = (len, count);
        Ok(())
    }

    /// A fenced, write-only window of `buf[..len]` for a result the peer writes: as
    /// [`grant_fenced`](Self::grant_fenced), except that the window's bytes start unspecified
    /// and only the prefix the revoker names ([`Grant::revoke_written`]) reaches `buf`
    /// (nothing is copied in first).
    fn grant_result(&self, buf: RegisteredBuf, len: usize) -> Result<Grant> {
        self.grant_fenced(buf, 0, len, Access::REMOTE_WRITE)
    }

    /// Shares `region` with this connection's peer with `access`, until the guard is dropped:
    /// fenced grants of its leases then use the region's own registration (see
    /// [`grant_fenced`](Self::grant_fenced)). A transport that fences every window needs
    /// nothing for it (the default).
    fn share(&self, region: &SharedRegion, access: Access) -> Result<ShareGuard> {
        let _ = (region, access);
        Ok(ShareGuard::none())
    }

    /// Closes the connection: outstanding operations complete with errors, the peer sees the
    /// connection end.
    fn close(&self);

    /// Resolves once the connection is closed or in error, with the reason.
    fn closed(&self) -> BoxFuture<'_, Error>;
}

#[doc(hidden)] // A transport internal: public for rdma-rpc's own crates and tests only.
/// Accepts connections.
pub trait Listener: Send + Sync + fmt::Debug {
    /// The next established connection.
    fn accept(&self) -> BoxFuture<'_, Result<Arc<dyn Connection>>>;

    /// The address peers connect to (with the port the OS chose for port 0).
    fn local_addr(&self) -> String;
}

/// A way to reach peers: the software transport over TCP, or DOCA RDMA.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Listens on `addr`.
    #[doc(hidden)]
    fn listen(&self, addr: &str) -> BoxFuture<'_, Result<Box<dyn Listener>>>;

    /// Connects to `addr`.
    #[doc(hidden)]
    fn connect(&self, addr: &str) -> BoxFuture<'_, Result<Arc<dyn Connection>>>;

    /// What its connections promise about revoked windows ([`Connection::fencing`]).
    fn fencing(&self) -> Fencing;

    /// Registers `pool`'s memory for local use now, so that no call registers it later (DOCA:
    /// one mmap per allocation of the pool). Transports that register nothing do nothing.
    #[doc(hidden)]
    fn register_pool(&self, pool: &crate::memory::BufferPool) -> Result<()> {
        let _ = pool;
        Ok(())
    }
}

/// The transport an address names: `tcp://` is the software transport,
/// `mem://` the in-process transport, `doca://` and `doca+oob://` DOCA RDMA. `tls://` needs
/// certificates, which an address cannot carry: give the server or client a
/// `tls::TlsTransport` (`ServerBuilder::transport`, `ClientBuilder::transport`).
pub fn transport_for(addr: &str) -> Result<Arc<dyn Transport>> {
    match addr.split_once("://").map(|(scheme, _)| scheme) {
        Some("tcp") => Ok(Arc::new(tcp::TcpTransport::new())),
        Some("tls") => Err(Error::InvalidAddress {
            addr: addr.to_owned(),
            reason: if cfg!(feature = "tls") {
                "tls:// needs certificates: pass a transport::tls::TlsTransport to \
                 ServerBuilder::transport or ClientBuilder::transport"
                    .into()
            } else {
                "TLS is not built in (enable rdma-rpc-core's `tls` feature)".into()
            },
        }),
        None => Err(Error::InvalidAddress {
            addr: addr.to_owned(),
            reason: format!(
                "no transport scheme: write tcp://{addr} for the software transport (or \
                 tls://, mem://, doca://, doca+oob://)"
            ),
        }),
        Some("mem") => Ok(Arc::new(mem::MemTransport::new())),
        #[cfg(feature = "doca")]
        Some(scheme) if scheme.starts_with("doca") => doca::transport_for(addr),
        #[cfg(not(feature = "doca"))]
        Some(scheme) if scheme.starts_with("doca") => Err(Error::InvalidAddress {
            addr: addr.to_owned(),
            reason: "the DOCA transport is not built in (enable the `doca` feature)".into(),
        }),
        Some(other) => Err(Error::InvalidAddress {
            addr: addr.to_owned(),
            reason: format!("unknown transport `{other}` (known: tcp, tls, mem, doca, doca+oob)"),
        }),
    }
}

pub(crate) fn check_grant_range(
    buf: &RegisteredBuf,
    offset: usize,
    len: usize,
    access: Access,
) -> Result<()> {
    if offset
        .checked_add(len)
        .is_none_or(|end| end > buf.capacity())
    {
        return Err(Error::InvalidArgument(format!(
            "grant of {offset}+{len} outside a buffer of {} bytes",
            buf.capacity()
        )));
    }
    if !buf.access().contains(access) {
        return Err(Error::InvalidArgument(format!(
            "grant asks for {access:?} but the buffer is registered with {:?}",
            buf.access()
        )));
    }
    Ok(())
}
