//! Application-level RDMA: memory one side offers to its peer as a [`RemoteBuf`], and the
//! one-sided operations the peer runs against it (read, write, compare-and-swap,
//! fetch-and-add), from or into its own registered memory.
//!
//! ```no_run
//! # async fn run(client: rdma_rpc_core::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use rdma_rpc_core::{Access, MemoryRegion};
//!
//! // Register once, at start-up.
//! let region = MemoryRegion::new(64 << 20)?;
//! // Offer 4 KiB of it for one call: the server reads the block straight from here.
//! let block = region.lease(0, 4096)?;
//! let offer = client.remote_memory().offer(block, Access::REMOTE_READ)?;
//! let handle = offer.handle(); // put it in the request message (a `remote_buffer` field)
//! // ... the call ...
//! let block = offer.revoke().await; // the peer has stopped using it
//! # drop((handle, block)); Ok(()) }
//! ```
//!
//! # Lifetimes
//! [`RemoteMemory::lend`] offers memory for one piece of work, usually one call, and revokes
//! it when that is done: the default. An [`Offer`] made with [`RemoteMemory::offer`] lives
//! until [`Offer::revoke`] or until it is dropped. Revoking is a handshake:
//! the peer refuses new uses of the handle at once, finishes the uses in flight, confirms,
//! and only then is the window taken down and the memory given back. Dropping an offer takes
//! the window down at once, without waiting: a use in flight then fails, and on RDMA such a
//! failure ends the connection. A handle works only on the connection it was offered on, and
//! only within its window and rights; every other use fails with a status and sends nothing.
//!
//! # What enforces what, and what it costs
//! The holder's runtime checks every use before it goes to the wire (connection, revocation,
//! bounds, rights, alignment). The offerer's transport enforces the same window and rights
//! on every access, against a peer that does not run this runtime, with no memory registered
//! per offer:
//! - the software transports (`tcp://`, `mem://`) check each access against the window and
//!   forget it at revocation;
//! - over DOCA, which cannot fence a window per request, an offer of a [`RegisteredBuf`](crate::memory::RegisteredBuf) is
//!   served from the connection's bounce memory (registered once, reachable by this peer
//!   only): its bytes are copied in when offered and the peer's writes copied back when it is
//!   revoked, so the peer never reaches the buffer itself;
//! - an offer of a [`SharedBuf`](crate::SharedBuf), a lease of a
//!   [`SharedRegion`] shared with this connection
//!   ([`RemoteMemory::share`]), uses the region's own registration: no copy, and the peer
//!   reaches the whole region (with the shared rights) until the share ends; that is the
//!   trust the application chose when it shared it.
//!
//! `docs/security.md` says, per mode, what a hostile peer reaches and for how long.
//!
//! # A write, then the response
//! A handler that puts its result into the caller's buffer can post the write
//! ([`RemoteMemory::write_posted`]) and return its response at once: the response goes after
//! the write on the same connection, and an RDMA reliable connection delivers a send after the
//! bytes of every write posted before it, so the caller has the bytes when it has the
//! response. Over TCP the peer then sends no acknowledgement for the write, and the handler
//! waits only until its bytes are handed to the socket; over `mem://` every write is done
//! when posted; over DOCA the write still completes first (its source memory must stay until
//! then). A revocation of the buffer is confirmed after the posted write too, on the same
//! connection, so the offerer takes the window down only once the bytes are in.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::memory::{Access, Buffer, SharedRegion};
use crate::protocol::handles::{AccessKind, HandleView, Refusal};
use crate::protocol::wait::wait;
use crate::session::Session;
use crate::status::Status;
use crate::transport::{BoxFuture, Descriptor, SendData};

mod offer;

use offer::check_remote;
pub use offer::{Offer, RegionOffer, Share};

/// How long [`Offer::revoke`] waits for the peer to confirm before it takes the window down
/// anyway (a peer that never confirms loses the window all the same).
pub const REVOKE_PATIENCE: Duration = Duration::from_secs(2);

/// A window of a peer's memory, offered to this side: what a `remote_buffer` field of a
/// message carries. Use it with the [`RemoteMemory`] of the connection it came on.
///
/// It says where the window is, how long it is and what it allows; the peer's runtime and its
/// transport decide whether a use is allowed, so a forged or altered handle reaches nothing
/// that was not offered.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct RemoteBuf {
    #[prost(uint64, tag = "1")]
    addr: u64,
    #[prost(uint64, tag = "2")]
    len: u64,
    #[prost(uint32, tag = "3")]
    rkey: u32,
    #[prost(uint32, tag = "4")]
    access: u32,
    /// Transport data (DOCA: the mmap export).
    #[prost(bytes = "bytes", tag = "5")]
    blob: Bytes,
    /// The offerer's id of the offer on its connection.
    #[prost(uint64, tag = "6")]
    offer: u64,
    /// The offerer's token of that connection.
    #[prost(uint64, tag = "7")]
    connection: u64,
}

impl RemoteBuf {
    /// Length of the window in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the window has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What the window allows: some of [`Access::REMOTE_READ`], [`Access::REMOTE_WRITE`] and
    /// [`Access::REMOTE_ATOMIC`].
    pub fn access(&self) -> Access {
        Access::from_bits_truncate(self.access)
    }

    /// The handle of `len` bytes at `offset` of this window (to hand a part of it on, or to
    /// use offsets relative to a part). Fails if the range leaves the window.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteBuf, Status> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteBuf {
                addr: self.addr.wrapping_add(offset),
                len,
                ..self.clone()
            }),
            _ => Err(Status::out_of_range(format!(
                "bytes {offset}+{len} of a remote buffer of {} bytes",
                self.len
            ))),
        }
    }

    /// A handle nobody offered: a forgery, for tests of what the holder's runtime does with a
    /// handle of a peer that lies or never answers.
    #[cfg(test)]
    pub(crate) fn forged(addr: u64, len: u64, access: Access, offer: u64, connection: u64) -> Self {
        RemoteBuf {
            addr,
            len,
            rkey: 7,
            access: access.bits(),
            blob: Bytes::new(),
            offer,
            connection,
        }
    }

    /// The same handle claiming `len` bytes: a forgery, for tests of the offerer's fence.
    #[cfg(test)]
    pub(crate) fn with_len(&self, len: u64) -> RemoteBuf {
        RemoteBuf {
            len,
            ..self.clone()
        }
    }

    fn view(&self) -> HandleView {
        HandleView {
            offer: self.offer,
            connection: self.connection,
            descriptor: Descriptor {
                addr: self.addr,
                len: self.len,
                rkey: self.rkey,
                access: self.access(),
                blob: self.blob.clone(),
            },
        }
    }
}

/// A new connection token: random, never 0.
pub(crate) fn new_token() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    RandomState::new().hash_one(n) | 1
}

/// Why a use of a peer's handle was refused, as the caller hears it.
fn refused(refusal: Refusal, offer: u64) -> Status {
    match refusal {
        Refusal::OtherConnection => Status::failed_precondition(
            "this remote buffer was offered on another connection; a handle works only on the \
             connection it came from",
        ),
        Refusal::Revoked => Status::failed_precondition(format!(
            "remote buffer (offer {offer}) was revoked by its owner"
        )),
        Refusal::OutOfRange {
            offset,
            len,
            window,
        } => Status::out_of_range(format!(
            "bytes {offset}+{len} are outside the remote buffer of {window} bytes"
        )),
        Refusal::NotPermitted { need, granted } => Status::permission_denied(format!(
            "the remote buffer grants {granted:?}, this use needs {need:?}"
        )),
        Refusal::Misaligned => Status::invalid_argument(
            "atomic operations need an 8-byte aligned offset in the remote buffer",
        ),
    }
}

/// One use of a peer's offer in flight; when the last one ends, a confirmation the peer
/// waits for goes out.
struct InFlight {
    session: Arc<Session>,
    offer: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.session.lock().proto.end_use(self.offer);
    }
}

/// What one side of a connection can do with remote memory: [`offer`](Self::offer) its own,
/// and read, write or update the peer's through the [`RemoteBuf`]s the peer offered. From
/// [`Client::remote_memory`](crate::Client::remote_memory) on the client, from
/// [`Request::remote_memory`](crate::Request::remote_memory) in a handler. Cheap to clone.
///
/// Every one-sided operation ends with a status: by the call's deadline (in a handler) or the
/// connection's transfer timeout (`transfer_timeout` of the server's or the client's config),
/// whichever comes first. A peer that has not answered by then loses its connection (as on
/// RDMA, where an access that never completes fails the queue pair), which completes the
/// operation and frees the memory it held. The same holds when a handler is stopped (its call
/// cancelled) while an operation is in flight.
#[derive(Clone)]
pub struct RemoteMemory {
    session: Arc<Session>,
    /// Longest wait for the peer to answer a one-sided operation.
    transfer_timeout: Duration,
    /// The call this belongs to (a handler's), whose deadline bounds its operations.
    call: Option<crate::service::CallContext>,
}

impl fmt::Debug for RemoteMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteMemory")
            .field("peer", &self.session.peer())
            .finish_non_exhaustive()
    }
}

impl RemoteMemory {
    pub(crate) fn new(session: Arc<Session>, transfer_timeout: Duration) -> RemoteMemory {
        RemoteMemory {
            session,
            transfer_timeout,
            call: None,
        }
    }

    /// The same connection's remote memory for a handler's `call`: its one-sided operations
    /// end by the call's deadline.
    pub(crate) fn for_call(&self, call: crate::service::CallContext) -> RemoteMemory {
        RemoteMemory {
            session: self.session.clone(),
            transfer_timeout: self.transfer_timeout,
            call: Some(call),
        }
    }

    /// Checks a use of `handle` and counts it in flight until the guard is dropped.
    fn begin(
        &self,
        handle: &RemoteBuf,
        offset: u64,
        len: u64,
        kind: AccessKind,
    ) -> Result<(Descriptor, InFlight), Status> {
        let descriptor = self
            .session
            .lock()
            .proto
            .begin_use(&handle.view(), offset, len, kind)
            .map_err(|r| refused(r, handle.offer))?;
        let guard = InFlight {
            session: self.session.clone(),
            offer: handle.offer,
        };
        Ok((descriptor, guard))
    }

    /// Awaits a one-sided operation `what` no longer than the call's deadline or the
    /// transfer timeout, whichever comes first: past it the peer loses its connection, which
    /// completes the operation with an error and frees what it held. If the caller stops
    /// waiting first (its call was stopped), the operation is watched the same way by a task
    /// of its own.
    async fn bounded<T: Send + 'static>(
        &self,
        what: &'static str,
        op: BoxFuture<'static, crate::Result<T>>,
    ) -> Result<T, Status> {
        let conn = self.session.transport().clone();
        let mut deadline_first = false;
        let until = || {
            let bound = wait(
                tokio::time::Instant::now(),
                self.transfer_timeout,
                self.call.as_ref().and_then(|c| c.deadline_at()),
            );
            deadline_first = bound.deadline_first;
            bound.until
        };
        let answered = crate::bounded::answered_by(&conn, op, until).await;
        match answered {
            Some(done) => done.map_err(Status::from),
            None => {
                let patience = self.transfer_timeout;
                Err(if deadline_first {
                    Status::deadline_exceeded(format!(
                        "the peer did not answer the {what} of its remote buffer before the \
                         call's deadline; its connection was closed"
                    ))
                } else {
                    Status::unavailable(format!(
                        "the peer did not answer the {what} of its remote buffer within \
                         {patience:?} (transfer_timeout); its connection was closed"
                    ))
                })
            }
        }
    }

    /// Whether `handle` was offered by this connection's peer (and so is usable here, until
    /// revoked): for a service that keeps long-lived handles from several connections, such
    /// as whole regions offered once ([`Share::offer_all`]), to find the one of the
    /// connection a request came on.
    pub fn holds(&self, handle: &RemoteBuf) -> bool {
        self.session.lock().proto.offered_here(handle.connection)
    }

    /// Shares all of `region` with this connection's peer with `access` (some of
    /// [`Access::REMOTE_READ`], [`Access::REMOTE_WRITE`] and [`Access::REMOTE_ATOMIC`]), until
    /// the returned [`Share`] is dropped: offers of its leases on this connection, results
    /// landed in them and reads into them then register nothing and copy nothing.
    ///
    /// Over DOCA this registers and exports the whole region for this connection once (do it
    /// at start-up, as NVIDIA's storage application exports its I/O memory at
    /// `init_storage`), and the peer can reach all of the region with `access` until the share
    /// ends, whatever the holder's runtime allows: share only with a peer you trust with the
    /// whole region. Over the software transports nothing is registered and every offer stays
    /// fenced to its own window.
    pub fn share(&self, region: &SharedRegion, access: Access) -> Result<Share, Status> {
        check_remote(access, Access::ALL, "the region")?;
        let guard = self
            .session
            .transport()
            .share(region, access)
            .map_err(Status::from)?;
        Ok(Share {
            _guard: guard,
            region: region.clone(),
            memory: self.clone(),
            access,
        })
    }

    /// Registers now the memory that `count` offers (or lends) of `len` bytes with `access`
    /// held at once on this connection will use, so that none of them registers later: call
    /// it at start-up with the concurrency the application will have (NVIDIA's storage
    /// application sizes its per-transaction buffers at `init_storage` the same way). Past
    /// it, offers still work and register their memory the first time they need more (about
    /// once per doubling of the offers held at once). Over DOCA this is the connection's
    /// bounce memory for offers of [`RegisteredBuf`](crate::memory::RegisteredBuf)s; over the software transports, and for
    /// leases of a region shared with this connection, nothing is needed and nothing is done.
    pub fn reserve(&self, len: usize, count: usize, access: Access) -> Result<(), Status> {
        check_remote(access, Access::ALL, "reserved memory")?;
        self.session
            .transport()
            .reserve_fenced(len, count, access)
            .map_err(Status::from)
    }

    /// Offers all of `buf` to the peer with `access`: some of [`Access::REMOTE_READ`],
    /// [`Access::REMOTE_WRITE`] and [`Access::REMOTE_ATOMIC`], within the rights `buf` was
    /// registered with. `buf` is usually a lease of a [`MemoryRegion`](crate::MemoryRegion)
    /// (the peer reaches these bytes and no others, until the offer is revoked or dropped),
    /// or of a [`SharedRegion`] shared with this connection (no copy; see the [module
    /// docs](self) for what the peer then reaches).
    pub fn offer<B: Buffer>(&self, buf: B, access: Access) -> Result<Offer<B>, Status> {
        let buf = crate::memory::into_registered(buf);
        check_remote(access, buf.access(), "the buffer")?;
        let len = buf.capacity();
        let grant = self
            .session
            .transport()
            .grant_fenced(buf, 0, len, access)
            .map_err(Status::from)?;
        let (offer, connection) = self.session.lock().proto.new_offer();
        let d = grant.descriptor();
        let handle = RemoteBuf {
            addr: d.addr,
            len: d.len,
            rkey: d.rkey,
            access: access.bits(),
            blob: d.blob.clone(),
            offer,
            connection,
        };
        Ok(Offer {
            handle,
            grant: Some(grant),
            session: self.session.clone(),
            kind: std::marker::PhantomData,
        })
    }

    /// Offers `buf` for the length of one piece of work, usually one call: runs `work` with
    /// the handle, then revokes the offer, and returns what `work` returned with the buffer
    /// (`None` if the connection ended and dropped it). The default lifetime of a remote
    /// buffer; [`offer`](Self::offer) is for offers that outlive a call.
    ///
    /// ```no_run
    /// # async fn run(client: rdma_rpc_core::Client, region: rdma_rpc_core::MemoryRegion)
    /// # -> Result<(), rdma_rpc_core::Status> {
    /// use rdma_rpc_core::Access;
    /// let block = region.lease(0, 4096).map_err(rdma_rpc_core::Status::from)?;
    /// let (answer, block) = client
    ///     .remote_memory()
    ///     .lend(block, Access::REMOTE_READ, |handle| async move {
    ///         // put `handle` in a request message and make the call
    ///         # drop(handle);
    ///         Ok::<_, rdma_rpc_core::Status>(())
    ///     })
    ///     .await?;
    /// # drop((answer, block)); Ok(()) }
    /// ```
    pub async fn lend<B, F, Fut, T>(
        &self,
        buf: B,
        access: Access,
        work: F,
    ) -> Result<(T, Option<B>), Status>
    where
        B: Buffer,
        F: FnOnce(RemoteBuf) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let offer = self.offer(buf, access)?;
        let done = work(offer.handle()).await;
        Ok((done, offer.revoke().await))
    }

    /// Reads `dst.capacity()` bytes at `offset` of the peer's window into `dst` (its length
    /// is set to them) and gives `dst` back. On failure `dst` is dropped. `dst` is registered
    /// memory of this side: a pool buffer, a lease of a region (registered once, on its first
    /// use), never a buffer made for the call (that would register memory per call).
    pub async fn read<B: Buffer>(
        &self,
        remote: &RemoteBuf,
        offset: u64,
        dst: B,
    ) -> Result<B, Status> {
        let dst = crate::memory::into_registered(dst);
        let len = dst.capacity() as u64;
        let (d, _use) = self.begin(remote, offset, len, AccessKind::Read)?;
        let read = self.session.transport().read(&d, dst);
        self.bounded("read", read)
            .await
            .map(crate::memory::from_registered)
    }

    /// Writes `src` at `offset` of the peer's window; done when the bytes are in the peer's
    /// memory.
    pub async fn write(
        &self,
        remote: &RemoteBuf,
        offset: u64,
        src: impl Into<SendData>,
    ) -> Result<(), Status> {
        self.write_to(remote, offset, src.into(), false).await
    }

    /// Writes `src` at `offset` of the peer's window without waiting for the peer: done when
    /// the write is posted ahead of everything this connection sends after it and `src` is
    /// no longer read. The peer has the bytes before anything sent after them arrives, so
    /// the usual pattern, a handler that writes its result into the caller's buffer and then
    /// returns its response, needs no round trip of its own for the write: the response
    /// tells the caller the bytes landed (RDMA's ordering of a write and a later send on one
    /// queue pair).
    ///
    /// What [`write`](Self::write) reports as this call's error (the peer revoked the buffer
    /// meanwhile), a posted write reports by failing the connection: what was sent after it
    /// never arrives, and the caller's call fails with the connection. Over TCP the peer
    /// sends no acknowledgement for it; over `mem://` every write is done when posted; over
    /// DOCA this is [`write`](Self::write), whose completion the source memory must wait for.
    ///
    /// ```no_run
    /// # async fn run(memory: rdma_rpc_core::RemoteMemory, handle: rdma_rpc_core::RemoteBuf,
    /// #     block: rdma_rpc_core::Bytes) -> Result<(), rdma_rpc_core::Status> {
    /// // In a handler: the result goes into the caller's buffer, then the response follows.
    /// memory.write_posted(&handle, 0, block).await?;
    /// # Ok(()) }
    /// ```
    pub async fn write_posted(
        &self,
        remote: &RemoteBuf,
        offset: u64,
        src: impl Into<SendData>,
    ) -> Result<(), Status> {
        self.write_to(remote, offset, src.into(), true).await
    }

    /// [`write`](Self::write), or with `posted` [`write_posted`](Self::write_posted).
    async fn write_to(
        &self,
        remote: &RemoteBuf,
        offset: u64,
        src: SendData,
        posted: bool,
    ) -> Result<(), Status> {
        let (d, _use) = self.begin(remote, offset, src.len() as u64, AccessKind::Write)?;
        let conn = self.session.transport();
        let write = if posted {
            conn.write_posted(src, &d)
        } else {
            conn.write(src, &d, None)
        };
        self.bounded("write", write).await
    }

    /// Atomically: if the 8 bytes at `offset` (8-byte aligned) equal `expected`, they become
    /// `new`. Returns the value they had.
    pub async fn compare_and_swap(
        &self,
        remote: &RemoteBuf,
        offset: u64,
        expected: u64,
        new: u64,
    ) -> Result<u64, Status> {
        let (d, _use) = self.begin(remote, offset, 8, AccessKind::Atomic)?;
        let cas = self.session.transport().compare_and_swap(&d, expected, new);
        self.bounded("compare-and-swap", cas).await
    }

    /// Atomically adds `add` to the 8 bytes at `offset` (8-byte aligned). Returns the value
    /// they had.
    pub async fn fetch_and_add(
        &self,
        remote: &RemoteBuf,
        offset: u64,
        add: u64,
    ) -> Result<u64, Status> {
        let (d, _use) = self.begin(remote, offset, 8, AccessKind::Atomic)?;
        let faa = self.session.transport().fetch_and_add(&d, add);
        self.bounded("fetch-and-add", faa).await
    }
}
