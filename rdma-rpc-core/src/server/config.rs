//! A server's settings ([`ServerConfig`]): every limit, size and timeout, with its default.

use std::time::Duration;

/// Limits and sizes of a server. Every limit is enforced before memory is allocated for the
/// thing it limits; errors name the limit.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Most connections served at once; further clients get an error and are closed.
    /// Default 1024.
    pub max_connections: usize,
    /// Connections one peer (one IP address) may hold at once; 0 for no limit. Over RDMA CM
    /// the peer's address is not known and only `max_connections` applies. Default 128.
    pub max_connections_per_peer: usize,
    /// Closes a handshaken connection that has no call in flight and sent no frame for this
    /// long (the client sees `UNAVAILABLE`). `None` keeps idle connections open; set it on a
    /// server that untrusted clients reach, so idle sockets cannot hold every connection
    /// slot (clients reconnect on their next call). Default `None`.
    pub idle_timeout: Option<Duration>,
    /// Most calls in flight per connection. Default 128.
    pub max_in_flight: u32,
    /// Size of each receive posted for control frames: the largest frame a client may send.
    /// Default 16 KiB.
    pub max_frame: usize,
    /// Most receives posted per connection for control frames (the client's credits). A
    /// connection starts with `initial_receives` (4) and doubles them whenever its client says
    /// it waited for a credit, until it has this many: an idle connection, or one with a call
    /// at a time, holds 4 × `max_frame` (64 KiB), one that pipelines what its depth needs.
    /// Default 64.
    pub recv_credits: u32,
    /// Receives a connection posts when it opens, before any growth: at least 4 and at most
    /// `recv_credits`. A service that knows how many frames its clients keep in flight sets
    /// it and `recv_credits` to that many, so the receives (and over DOCA the staging
    /// receives behind them, registered) are in place from the first call and nothing grows
    /// mid-run; every idle connection then holds that many. Default 4.
    pub initial_receives: u32,
    /// Send payloads and receive results up to this size travel inside control frames
    /// instead of through RDMA. Default 8 KiB.
    pub inline_threshold: u32,
    /// Memory registered per endpoint path at start: the pool holds
    /// `pool_budget / buffer_size` buffers, clamped to `[min_buffers, max_buffers]`.
    /// Default 64 MiB.
    pub pool_budget: usize,
    /// Fewest buffers per path. Default 2.
    pub min_buffers: usize,
    /// Most buffers per path. Default 256.
    pub max_buffers: usize,
    /// Write slots per connection: buffers the client may RDMA-write without asking, so a
    /// send or write larger than the inline threshold and at most `slot_size` takes one round
    /// trip. Registered when the connection's first payload too large to travel inline comes
    /// (that call takes the other path and its response brings the slots): `write_slots *
    /// slot_size` bytes per connection that moves such payloads, none for the others (0
    /// turns slots off). Default 4.
    pub write_slots: u32,
    /// Size of each write slot. Default 64 KiB, which is also the most a transport that
    /// cannot revoke windows (DOCA) accepts: there each slot payload is copied before the
    /// handler sees it.
    pub slot_size: usize,
    /// Large send/write payloads that fit no slot: `Some(true)`, the server RDMA-reads them
    /// from a window the client offers in the request (one round trip; the client copies the
    /// payload into registered memory first); `Some(false)`, the server grants a window of a
    /// pool buffer and the client RDMA-writes into it (two round trips, no copy). Default
    /// `None`: pull over transports that cannot revoke a window
    /// ([`Fencing::Unfenced`](crate::transport::Fencing), DOCA), so a client never holds a
    /// descriptor of memory that later serves another connection; grant otherwise.
    /// `Some(false)` over such a transport is refused by [`ServerBuilder::bind`](crate::ServerBuilder::bind).
    pub pull_writes: Option<bool>,
    /// Longest wait for a client to finish an RDMA transfer and ack it, and for a peer to
    /// answer a one-sided operation a handler makes through `RemoteMemory` (a peer that never
    /// answers loses its connection, which frees the memory the operation held). Default
    /// 30 s.
    pub transfer_timeout: Duration,
    /// Longest any call may run on this server, whatever deadline the client set (or none):
    /// past it the handler is stopped (its future dropped) and the client gets
    /// `DEADLINE_EXCEEDED` naming this setting, so no call holds server memory for ever. A
    /// shorter deadline from the client (or, when it sends none, the endpoint's `timeout:` in
    /// the spec) holds first. `None` lets calls without a deadline run for ever. Default 120 s.
    pub max_call_duration: Option<Duration>,
    /// Most of a path's pool one connection holds at once, in percent of its buffers (rounded
    /// up, at least one): a client that keeps its transfers open until `transfer_timeout`
    /// cannot take a whole pool from the other connections. Calls over the share wait for one
    /// of their own connection's buffers, within `buffer_wait`. 1 to 100; default 50.
    pub pool_share_percent: u32,
    /// Longest a call waits for a free buffer of its path's pool before it fails with
    /// `RESOURCE_EXHAUSTED` naming the path (or with `DEADLINE_EXCEEDED` if its own deadline
    /// comes first). A handler that keeps its payload (`Bytes`) holds that buffer. Default 10 s.
    pub buffer_wait: Duration,
    /// Longest wait for a new connection's handshake. Default 10 s.
    pub handshake_timeout: Duration,
    /// On shutdown, longest wait for in-flight calls to finish. Default 30 s.
    pub shutdown_grace: Duration,
    /// Runs each call on the connection's own task until it first waits (run to
    /// completion): a handler that answers without waiting costs no task, no wake-up and no
    /// channel. A call that waits (for a buffer, a transfer, or in the handler) moves at that
    /// point to a task of its own on a multi-threaded runtime; on a current-thread runtime,
    /// where a task would buy nothing, it stays on the connection's task, which polls it
    /// again when it is woken (no spawn: a third fewer instructions for such a call). The
    /// catch: a handler's work (before its first wait, and on a current-thread runtime after
    /// it too) holds up the other calls of its connection, so handlers that compute for long
    /// (more than some microseconds: compression, hashing large blocks) should either move
    /// that work off (`tokio::task::spawn_blocking`) or run with this off, where every call
    /// gets its own task at once and a multi-threaded runtime spreads one connection's calls
    /// over its threads. Default `true`.
    pub inline_handlers: bool,
    /// Bytes of stream messages this server buffers per call before the client must wait
    /// for its handler to take some (message streams; see docs/spec.md). At least two
    /// frames' worth; less is raised to that. Default 256 KiB.
    pub stream_window: u64,
    /// Most pings ([`Client::ping`](crate::Client::ping)) one connection may send per second,
    /// 0 for no limit. Pings are answered by the connection's own task: a client that sends
    /// more loses its connection with `RESOURCE_EXHAUSTED` naming this setting (gRPC's
    /// `too_many_pings`), so a ping flood costs the server no more than this many answers
    /// per connection. Default 100.
    pub max_pings_per_second: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 1024,
            max_connections_per_peer: 128,
            idle_timeout: None,
            max_in_flight: 128,
            max_frame: 16 * 1024,
            recv_credits: 64,
            initial_receives: crate::protocol::INITIAL_RECEIVES,
            inline_threshold: 8 * 1024,
            pool_budget: 64 << 20,
            min_buffers: 2,
            max_buffers: 256,
            write_slots: 4,
            slot_size: 64 << 10,
            pull_writes: None,
            transfer_timeout: Duration::from_secs(30),
            max_call_duration: Some(Duration::from_secs(120)),
            pool_share_percent: 50,
            buffer_wait: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            inline_handlers: true,
            stream_window: 256 << 10,
            max_pings_per_second: 100,
        }
    }
}
