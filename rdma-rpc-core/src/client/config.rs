//! A client's settings ([`ClientConfig`]) and its builder ([`ClientBuilder`]), which dials.

use std::sync::Arc;
use std::time::Duration;

use super::connection::Inner;
use super::{balance, Client, Counters};
use crate::error::{Error, Result};
use crate::interceptor::{Chain, ClientInterceptor};
use crate::transport::{transport_for, Transport};

/// Settings of a client.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Calls this client wants in flight at once; the server may grant fewer. Calls beyond
    /// wait. Default 128.
    pub max_in_flight: u32,
    /// Size of each receive posted for control frames. Default 16 KiB.
    pub max_frame: usize,
    /// Most receives posted for control frames: `initial_receives` (4) at first, doubled
    /// whenever the server says it waited for a credit, until this many. Default 64.
    pub recv_credits: u32,
    /// Receives posted when the connection opens, before any growth: at least 4 and at most
    /// `recv_credits`. A client that keeps a known number of calls in flight sets it and
    /// `recv_credits` that high, so nothing grows (over DOCA: nothing is registered) mid-run.
    /// Default 4.
    pub initial_receives: u32,
    /// Send payloads up to this size travel inside the request frame. Default 8 KiB (the
    /// server may lower it).
    pub inline_threshold: u32,
    /// Deadline of calls that set none and whose endpoint has none. Default: none.
    pub default_timeout: Option<Duration>,
    /// Longest wait for the connection and handshake (also of each reconnection). Default
    /// 10 s.
    pub connect_timeout: Duration,
    /// Dial again when a call finds the connection lost (the server restarted, the network
    /// failed, the server closed an idle connection). Calls in flight at the loss still fail;
    /// see [`Client`]. Default `true`.
    pub reconnect: bool,
    /// Wait after the first failed reconnection; it doubles with each further failure, up to
    /// `reconnect_backoff_max` (less up to a fifth, at random). Default 100 ms.
    pub reconnect_backoff: Duration,
    /// Longest wait between reconnection attempts. Default 5 s.
    pub reconnect_backoff_max: Duration,
    /// Memory kept registered for results (the windows receive and read calls offer) and
    /// pulled payloads, per power-of-two size class; buffers beyond it are allocated per call.
    /// Over DOCA it also bounds the plain buffers kept warm for the copies of pushed results.
    /// Default 64 MiB.
    pub staging_budget: usize,
    /// Longest wait for the server to answer a one-sided operation this client makes through
    /// [`RemoteMemory`](crate::RemoteMemory) (a read of memory a handler lent, say): a server
    /// that has not answered by then loses the connection, which frees what the operation
    /// held. Default 30 s.
    pub transfer_timeout: Duration,
    /// Bytes of stream messages this client buffers per call before the server must wait
    /// for it to take some (message streams; see docs/spec.md). At least two frames' worth;
    /// less is raised to that. Default 256 KiB.
    pub stream_window: u64,
    /// Windows a bulk stream offers the server at once, each of one chunk (the endpoint's
    /// buffer size): how many chunks are in flight, and how much staging memory a stream
    /// holds. Default 4.
    pub stream_depth: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_in_flight: 128,
            max_frame: 16 * 1024,
            recv_credits: 64,
            initial_receives: crate::protocol::INITIAL_RECEIVES,
            inline_threshold: 8 * 1024,
            default_timeout: None,
            connect_timeout: Duration::from_secs(10),
            reconnect: true,
            reconnect_backoff: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            staging_budget: 64 << 20,
            transfer_timeout: Duration::from_secs(30),
            stream_window: 256 << 10,
            stream_depth: 4,
        }
    }
}

/// Builds a [`Client`].
#[derive(Debug, Default)]
pub struct ClientBuilder {
    pub(super) config: ClientConfig,
    pub(super) transport: Option<Arc<dyn Transport>>,
    pub(super) interceptors: Chain<dyn ClientInterceptor>,
}

impl ClientBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: ClientConfig) -> Self {
        self.config = config;
        self
    }

    /// Uses this transport instead of the one the address scheme names.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// See [`ClientConfig::default_timeout`].
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.default_timeout = Some(timeout);
        self
    }

    /// Adds an interceptor: it runs before each call leaves, after those added before it (see
    /// [`interceptor`](crate::interceptor)).
    pub fn interceptor(mut self, interceptor: impl ClientInterceptor) -> Self {
        self.interceptors.push(Arc::new(interceptor));
        self
    }

    setters! {
        /// See [`ClientConfig::max_in_flight`].
        max_in_flight: u32,
        /// See [`ClientConfig::max_frame`].
        max_frame: usize,
        /// See [`ClientConfig::recv_credits`].
        recv_credits: u32,
        /// See [`ClientConfig::initial_receives`].
        initial_receives: u32,
        /// See [`ClientConfig::inline_threshold`].
        inline_threshold: u32,
        /// See [`ClientConfig::connect_timeout`].
        connect_timeout: Duration,
        /// See [`ClientConfig::reconnect`].
        reconnect: bool,
        /// See [`ClientConfig::reconnect_backoff`].
        reconnect_backoff: Duration,
        /// See [`ClientConfig::reconnect_backoff_max`].
        reconnect_backoff_max: Duration,
        /// See [`ClientConfig::staging_budget`].
        staging_budget: usize,
        /// See [`ClientConfig::transfer_timeout`].
        transfer_timeout: Duration,
        /// See [`ClientConfig::stream_window`].
        stream_window: u64,
        /// See [`ClientConfig::stream_depth`].
        stream_depth: usize,
    }

    /// Connects and runs the handshake.
    pub async fn connect(self, addr: &str) -> Result<Client> {
        self.check()?;
        let transport = match self.transport {
            Some(t) => t,
            None => transport_for(addr)?,
        };
        let counters = Arc::new(Counters::default());
        let inner = dial(&transport, addr, &self.config, &counters).await?;
        Ok(Client::single(
            inner,
            addr,
            transport,
            self.config,
            self.interceptors,
            counters,
        ))
    }

    /// Connects to several servers, those `resolver` names (a fixed or changing list:
    /// [`Addresses`](balance::Addresses); every address of a DNS name:
    /// [`Dns`](balance::Dns); or a discovery service's client), and spreads calls over
    /// those ready. Resolves once, dials every server, and returns once one is ready (an
    /// error naming why each failed if none is); the others join as they connect. See
    /// [`balance`].
    pub async fn connect_balanced(self, resolver: impl balance::Resolver) -> Result<Client> {
        balance::connect(self, resolver).await
    }

    /// Checks the settings that a connection needs.
    pub(super) fn check(&self) -> Result<()> {
        let min_receives = crate::protocol::credits::MIN_RECEIVES;
        if self.config.max_frame < 2 * crate::protocol::FRAME_OVERHEAD
            || self.config.recv_credits < min_receives
        {
            return Err(Error::InvalidArgument(format!(
                "max_frame must be at least {} bytes and recv_credits at least {min_receives}",
                2 * crate::protocol::FRAME_OVERHEAD
            )));
        }
        crate::protocol::credits::check_initial(
            self.config.initial_receives,
            self.config.recv_credits,
        )?;
        Ok(())
    }
}

/// Connects to `addr` and runs the handshake, within the connect timeout.
pub(super) async fn dial(
    transport: &Arc<dyn Transport>,
    addr: &str,
    config: &ClientConfig,
    counters: &Arc<Counters>,
) -> Result<Arc<Inner>> {
    let limit = config.connect_timeout;
    tokio::time::timeout(limit, async {
        let conn = transport.connect(addr).await?;
        Inner::handshake(conn, config, counters.clone()).await
    })
    .await
    .map_err(|_| Error::ConnectionClosed {
        peer: addr.to_owned(),
        reason: format!("no connection and handshake within {limit:?}"),
    })?
}
