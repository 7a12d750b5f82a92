//! The DOCA RDMA transport (feature `doca`): the transport traits over NVIDIA DOCA RDMA
//! through the raw `doca-sys` bindings. Without RDMA hardware or the DOCA SDK, `doca-sys`
//! links its in-process software provider and everything here runs unchanged
//! (`doca_sys::provider()` tells which one a build uses).
//!
//! # Addresses
//! - `doca://<ip>:<port>`: RDMA CM. A listener is **one** DOCA context that listens on the
//!   port and accepts up to [`DocaConfig::max_connections`] connections; each `connect`
//!   makes its own context with one connection. Port 0 picks a free port.
//! - `doca+oob://<ip>:<port>`: out of band, no RDMA CM. The listener accepts TCP connections
//!   on that address; over each socket both sides exchange the blobs of `doca_rdma_export`
//!   and call `doca_rdma_connect` (the point-to-point mode of NVIDIA's samples). The socket
//!   stays open as the connection's liveness signal, which DOCA's out-of-band mode lacks.
//!   With the `tls` feature, [`DocaTransport::with_side_channel_tls`] runs that socket in TLS
//!   (encrypted, authenticated blobs; a client certificate is the connection's
//!   [`PeerIdentity`](crate::transport::PeerIdentity)).
//!
//! # Structure
//! - `sys`: safe wrappers (device, mmap, buffer inventory and buffers, progress engine, RDMA
//!   context, CM address). Each owns its raw pointer; children hold an `Arc` of their parent.
//! - `reg`: registration of memory: one mmap per [`RegisteredBuf`](crate::RegisteredBuf)
//!   region and set of rights, made on first use, cached in the region's registration slot
//!   and exported once (the export is the descriptor's `blob`).
//! - `engine`: the progress owner of one context, one file per concern (callbacks, setup and
//!   teardown, tasks, data path, connection lifecycle, receive matching). Only the owner
//!   touches the context's DOCA objects; everything else sends it commands through a channel
//!   and gets completions through oneshots. In [`ProgressMode::Event`] (default) it is a tokio
//!   task waiting on the progress engine's notification fd with `AsyncFd` (arm, wait, clear,
//!   progress until nothing happens), which DOCA signals for task completions; while RDMA CM
//!   events may be pending it also progresses periodically (every 2 ms while listening or
//!   connecting, every 50 ms on established CM connections), since nothing documents that CM
//!   events signal the fd. In [`ProgressMode::BusyPoll`] every context of a transport is
//!   connected to the progress engine of the transport's one polling thread, which alone
//!   connects, starts, progresses and stops them. [`ProgressMode::Spin`] is the event-mode
//!   task that, while its context was active less than [`DocaConfig::spin`] ago, progresses
//!   again after yielding to its runtime instead of arming the fd and sleeping. Context setup and teardown, which wait for DOCA state changes,
//!   never block a runtime worker. Tasks are allocated once per type and connection and
//!   reused after completion (DOCA 3.x has setters for every task type, atomics included).
//! - `window`: the windows a connection grants, and how fenced windows are served with no
//!   registration per call (the connection's bounce memory, or a region shared with it).
//! - `conn`: [`DocaConnection`] and the RDMA CM listener; `oob`: the out-of-band side channel
//!   (its exchange, its listener, and TLS around it when set).
//!
//! # Sizes and pinned memory
//! Each context sets its send queue to [`DocaConfig::send_queue_size`] bounded by the
//! device's `doca_rdma_cap_get_max_send_queue_size`, keeps [`DocaConfig::recv_queue_size`]
//! staging receives (bounded by `..._get_max_recv_queue_size`; the receive queue size itself
//! is not set, DOCA supports that only on GPU/DPA data paths), and configures at most 16 Ki
//! tasks per kind. An operation that finds no room (send queue full, or the context out of
//! tasks or buffers) waits in its connection's backlog, in order, instead of failing.
//! Every mmap pins its memory: a server registers its buffer pools (at bind), each context
//! `recv_queue_size * max_recv_size` bytes of staging receives (16 MiB by default), each
//! transport 2 MiB of send staging (more as used, up to [`DocaConfig::staging_budget`]), each
//! connection its write slots and, as used, its bounce memory (up to
//! [`DocaConfig::bounce_budget`] per set of rights), so raise `ulimit -l` (`RLIMIT_MEMLOCK`,
//! e.g. `unlimited` or `LimitMEMLOCK=infinity` in a systemd unit) on RDMA hosts. Nothing is
//! registered per call: [`DocaTransport::counters`] shows it (with the software provider).
//!
//! # How the trait semantics are provided
//! - **Receives.** DOCA's receives belong to the context and match a send from *any* of its
//!   connections. So each context keeps [`DocaConfig::recv_queue_size`] staging receives of
//!   [`DocaConfig::max_recv_size`] bytes posted (from its first established connection on,
//!   as NVIDIA's samples post them), and copies each message into the next
//!   buffer its connection posted with `post_recv` (a copy per message, like an inline
//!   send). A message for a connection with no posted buffer waits
//!   [`DocaConfig::rnr_timeout`], then that connection fails with `ReceiverNotReady`
//!   (receiver side). The one exception is a connection's first message before its
//!   application posted any receive (a peer's handshake reaching a server still accepting the
//!   connection): it waits for that first receive, however long the application takes; a
//!   second one before then has the RNR budget. A message larger than the posted buffer
//!   fails it with `ReceiveTooSmall`. The sender's `send` completes once the peer *context* has the
//!   message; it only sees these two errors as the connection ending. A message larger than
//!   `max_recv_size` fails on both sides (DOCA's own length error).
//! - **Sends and writes** of [`SendData::Bytes`](crate::transport::SendData) are copied into
//!   a registered staging buffer of the transport's pool; registered buffers go as they are.
//!   A send from staging (every protocol frame) takes no `doca_buf` from the inventory once
//!   warm: the context keeps buffers over whole staging slabs and moves their data sections
//!   (`doca_buf_set_data`) to each message.
//! - **One-sided operations** import the peer's mmap from the descriptor's blob once per
//!   connection and blob (`doca_mmap_create_from_export`), never per request. Empty
//!   operations pass no buffers, as DOCA spells "no data".
//! - **Out of band**, after both sides called `doca_rdma_connect`, each confirms over the side
//!   channel before the first operation: on hardware, a send to a queue pair that is not ready
//!   yet is dropped and the connection fails after its retries.
//! - **Errors.** A failed task fails its connection only: the transport disconnects it
//!   (its outstanding tasks complete with errors, the peer gets its disconnection callback or,
//!   out of band, sees the side channel close) while other connections of the context keep
//!   working. NVIDIA's samples stop the whole context instead. Every posted operation
//!   completes exactly once, also on disconnect and context shutdown.
//!
//! # What DOCA can and cannot enforce (compared to the software transport)
//! DOCA connections report [`Fencing::Unfenced`]: a plain window stays reachable after
//! `Grant::revoke`. The protocol copies what a peer could still write (write-slot payloads on
//! the server, pushed results on the client) and refuses configurations that need revocation;
//! fenced windows come from bounce memory or a shared region (see `window` and
//! `docs/doca.md`).
//!
//! A [`Grant`](crate::transport::Grant) is served by the region's mmap for exactly the
//! granted rights (one cached mmap per region and rights set), so:
//! - enforced by the device: the **rights** of the grant (a write into a read-only grant
//!   fails), and **bounds within the region** (nothing outside the registered buffer).
//! - checked locally before posting (a well-behaved peer's NIC would not send): the
//!   descriptor's length and rights, 8-byte alignment of atomics.
//! - **not** enforced: bounds within the region (a peer may reach other bytes of the same
//!   buffer with the same rights), **revocation** (`Grant::revoke` returns the buffer at once,
//!   the export stays valid while the region lives: a stale descriptor keeps working, also
//!   after the buffer went back to its pool), and **per-connection keys** (any connection on
//!   the device that learns the blob can use it). The software transport enforces all
//!   three. Failures reported by the device carry no reason; they surface as
//!   `RemoteAccess { violation: NotPermitted, .. }`.
//! - `RecvCompletion::write_len` of a write with immediate is what DOCA reports as the
//!   receive's result length (0 with the software provider).
//!
//! See `docs/doca.md` for building against a real SDK and running the hardware suite.

mod conn;
mod engine;
mod oob;
mod reg;
mod sys;
mod window;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use conn::DocaConnection;
pub use doca_sys::Counters;
pub use sys::{Capabilities, DeviceInfo};

use super::{BoxFuture, Connection, Fencing, Listener, Transport};
use crate::error::{Error, Result};
use crate::memory::StagingPools;

/// Environment variable naming the device that `doca://` addresses open (IB name or PCI
/// address); without it, the first device with every RDMA capability is used.
pub const DEVICE_ENV: &str = "RDMA_RPC_DOCA_DEVICE";

/// How the progress engine of each context is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProgressMode {
    /// A tokio task waits on the progress engine's notification fd (no CPU while idle).
    #[default]
    Event,
    /// One thread and one progress engine per [`DocaTransport`] (shared by its clones): every
    /// context the transport makes is connected to that engine, and the thread polls it
    /// (`doca_pe_progress`): lowest latency, one core busy while any context has work; after tens of milliseconds without any, the thread naps 50 µs
    /// between rounds. A process that wants more polling threads uses more transports (for
    /// example one per group of connections); each thread should have a core of its own.
    BusyPoll,
    /// As [`ProgressMode::Event`], but an owner whose context did something (a completion, a
    /// message, a command) less than [`DocaConfig::spin`] ago keeps polling its engine on the
    /// runtime that runs it, yielding to the runtime's other tasks between polls, instead of
    /// arming the notification and sleeping. While calls flow no thread sleeps and none wakes
    /// another: busy-poll latency without a dedicated thread, and a runtime thread busy only
    /// while its contexts are active (plus the window after).
    Spin,
}

/// Settings of the DOCA transport.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DocaConfig {
    /// Device to open: IB name (`mlx5_0`) or PCI address (`0000:03:00.0`); `None` opens the
    /// first device with every RDMA capability.
    pub device: Option<String>,
    /// Most connections of one listening context (`doca_rdma_set_max_num_connections`).
    /// Default 1024.
    pub max_connections: u16,
    /// Most connections of one client context: a transport's connects share a context (its
    /// progress engine, inventory and staging receives) until it holds this many, then open
    /// another. In event and spin modes a context is progressed by a task on the runtime it
    /// was made on, so only connects made on that same runtime share it: each runtime of a
    /// thread-per-core application gets contexts of its own, and a connection's completions
    /// are handled on the thread that uses it. (Busy poll progresses every context on its one
    /// polling thread: its connects share contexts whatever their runtime.) Default 256.
    pub client_connections_per_context: u16,
    /// Send queue depth per connection: most operations outstanding on one connection
    /// (more wait in order). Bounded by the device's maximum. Default 512.
    pub send_queue_size: u32,
    /// Most staging receives of one context, bounded by the device's maximum receive queue.
    /// They are registered 64 at a time as the context's connections post receives (each
    /// connection reserves as many as it has posted at its peak), so the pinned memory is
    /// `max_recv_size` per receive in use, not per receive allowed. A connection that would
    /// need more fails to grow (or, at its first receive, to open) with an error naming
    /// this setting. Default 32768.
    pub recv_queue_size: u32,
    /// Size of each staging receive: the largest message a peer may send, at least the
    /// `max_frame` of the servers and clients that use the transport (a larger receive is
    /// refused with an error naming this setting). Default 16 KiB (the default `max_frame`).
    pub max_recv_size: usize,
    /// How long a message waits for the connection's next posted receive before the
    /// connection fails with receiver not ready. Default 500 ms.
    pub rnr_timeout: Duration,
    /// RNR retries of the hardware (`doca_rdma_set_rnr_retry_count`, 0 to 7; 7 retries
    /// forever). Receives cannot run out for a peer that respects its credits, so a send
    /// that finds none is a broken or stalled peer: after these retries its connection fails
    /// instead of stalling for good. Default 6.
    pub rnr_retry_count: u8,
    /// How progress engines are driven. Default [`ProgressMode::Event`].
    pub progress: ProgressMode,
    /// In [`ProgressMode::Spin`], how long an owner keeps polling after its context's last
    /// activity before it waits on the notification fd. Default 50 µs: several round trips
    /// of a NIC, and longer than a thread's wake-up from sleep on most hosts.
    pub spin: Duration,
    /// GID index (RoCE); `None` leaves DOCA's default.
    pub gid_index: Option<u32>,
    /// Time allowed for connecting (CM) or the out-of-band exchange. Default 10 s.
    pub handshake_timeout: Duration,
    /// Budget in bytes of the staging buffers kept for copying `SendData::Bytes`. Default
    /// 64 MiB.
    pub staging_budget: usize,
    /// Budget in bytes of each connection's bounce memory: the registered buffers that serve
    /// fenced windows (remote buffer offers, results landed in a caller's buffer) of memory not
    /// shared with the connection, registered on first use and reused. A fenced window that
    /// finds every buffer of its size in use fails with `RESOURCE_EXHAUSTED` naming this
    /// setting (nothing is registered per call). Default 64 MiB; pinned only as used.
    pub bounce_budget: usize,
}

impl Default for DocaConfig {
    fn default() -> Self {
        DocaConfig {
            device: None,
            max_connections: 1024,
            client_connections_per_context: 256,
            send_queue_size: 512,
            recv_queue_size: 32 * 1024,
            max_recv_size: 16 * 1024,
            rnr_timeout: Duration::from_millis(500),
            rnr_retry_count: 6,
            progress: ProgressMode::Event,
            spin: Duration::from_micros(50),
            gid_index: None,
            handshake_timeout: Duration::from_secs(10),
            staging_budget: 64 << 20,
            bounce_budget: 64 << 20,
        }
    }
}

impl DocaConfig {
    /// The defaults, with the device taken from `RDMA_RPC_DOCA_DEVICE` when set.
    pub fn from_env() -> DocaConfig {
        DocaConfig {
            device: std::env::var(DEVICE_ENV).ok().filter(|d| !d.is_empty()),
            ..DocaConfig::default()
        }
    }

    /// The same settings with progress engines driven as `mode` says.
    ///
    /// ```no_run
    /// use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport, ProgressMode};
    /// let transport = DocaTransport::new(DocaConfig::from_env().with_progress(ProgressMode::BusyPoll));
    /// ```
    pub fn with_progress(mut self, mode: ProgressMode) -> DocaConfig {
        self.progress = mode;
        self
    }

    /// The same settings with spin-mode owners polling for `window` after their context's
    /// last activity (see [`DocaConfig::spin`]).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport, ProgressMode};
    /// let config = DocaConfig::from_env()
    ///     .with_progress(ProgressMode::Spin)
    ///     .with_spin(Duration::from_micros(200));
    /// let transport = DocaTransport::new(config);
    /// ```
    pub fn with_spin(mut self, window: Duration) -> DocaConfig {
        self.spin = window;
        self
    }
}

/// Staging buffers of a transport registered when it is made: (size, count), 1 MiB each, for
/// control messages and small payloads copied from `Bytes`.
const STAGING_RESERVED: [(usize, usize); 2] = [(4 << 10, 256), (32 << 10, 32)];

/// Every DOCA device with its PCI address and RDMA capabilities.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    sys::list_devices()
}

/// Devices opened by this process, shared by every transport that selects them, so a buffer
/// registered through one transport is usable by another on the same device.
fn open_device(selector: Option<&str>) -> Result<Arc<sys::Device>> {
    static OPEN: Mutex<Option<HashMap<String, Weak<sys::Device>>>> = Mutex::new(None);
    let key = selector.unwrap_or("").to_owned();
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    let map = open.get_or_insert_with(HashMap::new);
    if let Some(dev) = map.get(&key).and_then(Weak::upgrade) {
        return Ok(dev);
    }
    let dev = sys::Device::open(selector)?;
    map.insert(key, Arc::downgrade(&dev));
    Ok(dev)
}

/// The receiver-not-ready budget of the provider, for error messages (0: unknown).
fn provider_rnr_ms() -> u64 {
    if doca_sys::provider() == doca_sys::Provider::Software {
        std::env::var("DOCA_SYS_SW_RNR_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20)
    } else {
        0
    }
}

/// The DOCA RDMA transport. Cheap to clone.
#[derive(Clone)]
pub struct DocaTransport {
    config: Arc<DocaConfig>,
    dev: Arc<sys::Device>,
    staging: Arc<StagingPools>,
    /// Busy-poll mode: the thread every context of this transport (and its clones) joins.
    poller: Option<Arc<engine::Poller>>,
    /// The contexts its connects share, each up to
    /// [`DocaConfig::client_connections_per_context`] connections, with the runtime whose
    /// connects share it (none in busy poll: any runtime's); kept while the transport and
    /// their runtime live, so reconnecting registers nothing new.
    clients: Arc<tokio::sync::Mutex<Vec<ClientContext>>>,
    /// See [`DocaTransport::wakeups`].
    wakeups: Arc<std::sync::atomic::AtomicU64>,
    /// What `doca+oob://` side channels run in (see [`DocaTransport::with_side_channel_tls`]).
    side: oob::SideChannel,
}

impl std::fmt::Debug for DocaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocaTransport")
            .field("device", &self.dev.info().name)
            .field("config", &self.config)
            .finish()
    }
}

/// A client context of a transport, and the runtime whose connects share it.
struct ClientContext {
    /// `None` in busy-poll mode: its polling thread progresses it for every runtime.
    runtime: Option<tokio::runtime::Id>,
    engine: Arc<engine::EngineShared>,
}

struct Parsed {
    oob: bool,
    addr: SocketAddr,
}

fn parse(addr: &str) -> Result<Parsed> {
    let bad = |reason: &str| Error::InvalidAddress {
        addr: addr.to_owned(),
        reason: reason.to_owned(),
    };
    let (oob, rest) = match addr.split_once("://") {
        Some(("doca", rest)) => (false, rest),
        Some(("doca+oob", rest)) => (true, rest),
        _ => {
            return Err(bad(
                "the DOCA transport takes doca://<ip>:<port> or doca+oob://<ip>:<port>",
            ))
        }
    };
    let addr = rest
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| bad("expected <ip>:<port> (for example doca://192.168.1.2:7470)"))?;
    Ok(Parsed { oob, addr })
}

fn scheme(oob: bool) -> &'static str {
    if oob {
        "doca+oob"
    } else {
        "doca"
    }
}

impl DocaTransport {
    /// Opens the configured device.
    pub fn new(config: DocaConfig) -> Result<DocaTransport> {
        let dev = open_device(config.device.as_deref())?;
        let poller = match config.progress {
            ProgressMode::BusyPoll => Some(Arc::new(engine::Poller::spawn()?)),
            ProgressMode::Event | ProgressMode::Spin => None,
        };
        let staging = StagingPools::new(config.staging_budget);
        // Messages and small writes are copied into staging buffers: register a slab of each
        // small size now (one registration each), so a burst of sends registers nothing.
        for (size, count) in STAGING_RESERVED {
            if let Some(slab) = staging.reserve(size, count)? {
                reg::mmap_of(&dev, &slab, crate::memory::Access::LOCAL_WRITE)?;
            }
        }
        Ok(DocaTransport {
            staging: Arc::new(staging),
            config: Arc::new(config),
            dev,
            poller,
            clients: Arc::default(),
            wakeups: Arc::default(),
            side: oob::SideChannel::default(),
        })
    }

    /// The same transport with the side channel of its `doca+oob://` connections inside TLS,
    /// with `tls`'s settings: its server certificate where it listens, its roots (and client
    /// identity) where it connects, as `tls://` uses them.
    ///
    /// The handshake comes before anything else on the socket, and before the DOCA context
    /// makes a connection for the peer, so:
    /// - the connection blobs (queue pair numbers, addresses) travel encrypted and
    ///   authenticated: nobody on the path can point either side at another queue pair;
    /// - a peer that fails the handshake (an untrusted certificate, none where mutual TLS
    ///   requires one, no TLS at all) costs the listener no DOCA resources, and is refused
    ///   with an error that names the cause;
    /// - with mutual TLS ([`ServerTlsConfig::client_roots`](crate::transport::tls::ServerTlsConfig::client_roots))
    ///   the client's certificate is the connection's
    ///   [`PeerIdentity`](crate::transport::PeerIdentity): interceptors and handlers read it
    ///   as over `tls://` ([`Request::peer_identity`](crate::Request::peer_identity)).
    ///
    /// The RDMA traffic itself is not encrypted (see docs/security.md: keep RDMA on a fabric
    /// you trust, or encrypt it in the NIC). `doca+oob://` addresses name an IP, which the
    /// server's certificate must then carry, or set
    /// [`ClientTlsConfig::server_name`](crate::transport::tls::ClientTlsConfig::server_name).
    /// RDMA CM (`doca://`) has no side channel to secure: a transport with side-channel TLS
    /// refuses `doca://` addresses rather than connect them unauthenticated.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
    /// use rdma_rpc_core::transport::tls::{ClientTlsConfig, Identity, Roots, ServerTlsConfig, TlsTransport};
    /// use rdma_rpc_core::Server;
    ///
    /// # async fn run() -> rdma_rpc_core::Result<()> {
    /// let tls = TlsTransport::server(
    ///     ServerTlsConfig::new(Identity::from_pem_files("server.pem", "server.key")?)
    ///         .client_roots(Roots::from_pem_file("ca.pem")?),
    /// )?;
    /// let doca = DocaTransport::new(DocaConfig::default())?.with_side_channel_tls(&tls);
    /// let server = Server::builder()
    ///     .transport(Arc::new(doca))
    ///     // .add_service(...)
    ///     .bind("doca+oob://10.0.0.1:7471")
    ///     .await?;
    /// # drop(server); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn with_side_channel_tls(mut self, tls: &crate::transport::tls::TlsTransport) -> Self {
        self.side = oob::SideChannel::tls(tls.layer().clone());
        self
    }

    /// A `doca://` address given to a transport whose side channels run TLS: refused.
    fn no_cm_with_tls(&self, addr: &str) -> Result<()> {
        if self.side.secured() {
            return Err(Error::InvalidArgument(format!(
                "cannot use {addr}: this DocaTransport runs its side channels in TLS, and RDMA \
                 CM (doca://) has no side channel to authenticate; use doca+oob://, or a \
                 DocaTransport without with_side_channel_tls for RDMA CM"
            )));
        }
        Ok(())
    }

    /// Its settings.
    pub fn config(&self) -> &DocaConfig {
        &self.config
    }

    /// The device it uses.
    pub fn device(&self) -> &DeviceInfo {
        self.dev.info()
    }

    /// What the device's provider counted so far: registrations, pinned bytes, exports,
    /// imports and task submissions (see [`Counters`]), for every user of the device in this
    /// process. `None` with a real DOCA SDK, which counts nothing. Take two readings and
    /// [`Counters::since`] to see what a piece of work cost.
    pub fn counters(&self) -> Option<Counters> {
        doca_sys::counters(&self.dev.info().name)
    }

    async fn engine(&self, max_connections: u16) -> Result<Arc<engine::EngineShared>> {
        engine::start(
            &self.dev,
            &self.config,
            &self.staging,
            max_connections,
            self.poller.as_deref(),
            &self.wakeups,
        )
        .await
    }

    /// How often the event-mode progress owners of this transport's contexts (and its
    /// clones') woke up so far: a notification, a command or a timer each. Take two readings
    /// to see what an idle connection costs ([`ProgressMode::Event`]).
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A client context with room for one more connection, claimed for it: the first of the
    /// transport's with room that connects on this runtime share (see
    /// [`DocaConfig::client_connections_per_context`]), or a new one. Contexts whose progress
    /// ended with their runtime are let go here.
    async fn client_engine(&self) -> Result<Arc<engine::EngineShared>> {
        let runtime = match self.config.progress {
            ProgressMode::BusyPoll => None,
            ProgressMode::Event | ProgressMode::Spin => {
                tokio::runtime::Handle::try_current().ok().map(|h| h.id())
            }
        };
        let mut clients = self.clients.lock().await;
        clients.retain(|c| c.engine.is_running());
        if let Some(c) = clients
            .iter()
            .find(|c| c.runtime == runtime && c.engine.claim())
        {
            return Ok(c.engine.clone());
        }
        let engine = self
            .engine(self.config.client_connections_per_context.max(1))
            .await?;
        if !engine.claim() {
            return Err(Error::InvalidArgument(
                "a new DOCA client context has no room for a connection".into(),
            ));
        }
        clients.push(ClientContext {
            runtime,
            engine: engine.clone(),
        });
        Ok(engine)
    }

    /// How many client contexts the transport keeps (for tests).
    #[cfg(test)]
    pub(crate) async fn client_contexts(&self) -> usize {
        let mut clients = self.clients.lock().await;
        clients.retain(|c| c.engine.is_running());
        clients.len()
    }

    /// Connects to `addr` and returns the concrete connection type.
    pub async fn connect_doca(&self, addr: &str) -> Result<DocaConnection> {
        let p = parse(addr)?;
        if !p.oob {
            self.no_cm_with_tls(addr)?;
        }
        let engine = self.client_engine().await?;
        let limit = self.config.handshake_timeout;
        let peer = format!("{}://{}", scheme(p.oob), p.addr);
        if p.oob {
            let host = p.addr.ip().to_string();
            let side = crate::transport::tcp::Side::Connected { host: &host };
            let opened = async {
                let stream = tokio::time::timeout(limit, tokio::net::TcpStream::connect(p.addr))
                    .await
                    .map_err(|_| Error::Protocol {
                        peer: peer.clone(),
                        reason: format!("no side channel within {limit:?}"),
                    })?
                    .map_err(|e| Error::io(format!("connecting to {addr}"), e))?;
                self.side.open(stream, side, &peer, limit).await
            };
            let (stream, identity) = match opened.await {
                Ok(opened) => opened,
                Err(e) => {
                    // The context never heard of this connection: its claim goes back here.
                    engine.unclaim();
                    return Err(e);
                }
            };
            let bounce = self.config.bounce_budget;
            return oob::oob_connect(&engine, stream, &peer, limit, bounce, identity)
                .await
                .map_err(|e| self.side.explain(e, side, &peer));
        }
        let connect = engine.ask(|reply| engine::Cmd::Connect {
            ip: p.addr.ip(),
            port: p.addr.port(),
            peer: peer.clone(),
            reply,
        });
        match tokio::time::timeout(limit, connect).await {
            Ok(shared) => Ok(DocaConnection::new(shared?, self.config.bounce_budget)),
            Err(_) => Err(Error::ConnectionClosed {
                peer,
                reason: format!("RDMA CM connection not established within {limit:?}"),
            }),
        }
    }

    async fn listen_cm(&self, ip: IpAddr, port: u16) -> Result<conn::CmListener> {
        let engine = self.engine(self.config.max_connections).await?;
        let mut attempts = 0;
        loop {
            // Port 0: take a free port number from the OS (RDMA CM has no "any port").
            let chosen = match port {
                0 => std::net::TcpListener::bind((ip, 0))
                    .and_then(|l| l.local_addr())
                    .map_err(|e| Error::io("picking a free port", e))?
                    .port(),
                p => p,
            };
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let result = engine
                .ask(|reply| engine::Cmd::Listen {
                    port: chosen,
                    accepted: tx,
                    reply,
                })
                .await;
            match result {
                Ok(()) => {
                    return Ok(conn::CmListener {
                        engine,
                        port: chosen,
                        local: format!("doca://{}", SocketAddr::new(ip, chosen)),
                        accepted: tokio::sync::Mutex::new(rx),
                        bounce_budget: self.config.bounce_budget,
                    })
                }
                // The port was taken meanwhile: pick another.
                Err(Error::Doca { .. }) if port == 0 && attempts < 8 => attempts += 1,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Transport for DocaTransport {
    fn listen(&self, addr: &str) -> BoxFuture<'_, Result<Box<dyn Listener>>> {
        let addr = addr.to_owned();
        Box::pin(async move {
            let p = parse(&addr)?;
            if p.oob {
                if let Some(e) = self.side.cannot_serve(&addr) {
                    return Err(e);
                }
                let listener = side_channel_listener(p.addr)
                    .map_err(|e| Error::io(format!("listening on {addr}"), e))?;
                let local = listener
                    .local_addr()
                    .map_err(|e| Error::io("reading the listener's address", e))?;
                let engine = self.engine(self.config.max_connections).await?;
                return Ok(Box::new(oob::oob_listener(
                    listener,
                    format!("doca+oob://{local}"),
                    engine,
                    self.side.clone(),
                    self.config.handshake_timeout,
                    self.config.bounce_budget,
                )) as Box<dyn Listener>);
            }
            self.no_cm_with_tls(&addr)?;
            let listener = self.listen_cm(p.addr.ip(), p.addr.port()).await?;
            Ok(Box::new(listener) as Box<dyn Listener>)
        })
    }

    fn connect(&self, addr: &str) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        let addr = addr.to_owned();
        Box::pin(
            async move { Ok(Arc::new(self.connect_doca(&addr).await?) as Arc<dyn Connection>) },
        )
    }

    fn fencing(&self) -> Fencing {
        Fencing::Unfenced
    }

    fn register_pool(&self, pool: &crate::memory::BufferPool) -> Result<()> {
        for slab in pool.slabs() {
            reg::mmap_of(&self.dev, slab, crate::memory::Access::LOCAL_WRITE)?;
        }
        Ok(())
    }
}

/// Side channels a listener keeps waiting to be accepted: clients that reconnect all at once
/// (a thousand after a failover) must not find the queue full (the kernel caps it at
/// `net.core.somaxconn`).
const SIDE_CHANNEL_BACKLOG: u32 = 4096;

/// The TCP listener of an out-of-band listener, with room for [`SIDE_CHANNEL_BACKLOG`]
/// connections waiting to be accepted.
fn side_channel_listener(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(SIDE_CHANNEL_BACKLOG)
}

/// The transport a `doca://` or `doca+oob://` address names, with [`DocaConfig::from_env`].
pub(crate) fn transport_for(addr: &str) -> Result<Arc<dyn Transport>> {
    parse(addr)?;
    Ok(Arc::new(DocaTransport::new(DocaConfig::from_env())?))
}

#[cfg(test)]
mod tests;
