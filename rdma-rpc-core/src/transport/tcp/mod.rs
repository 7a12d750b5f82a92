//! The software transport: RDMA semantics over TCP, for machines without RDMA hardware.
//!
//! Each connection is one TCP stream carrying packets with a fixed header (see `wire.rs`).
//! A reader task per connection plays the part of the RDMA NIC on the receiving side: it
//! places sends into posted receives, and serves one-sided writes, reads and atomics from the
//! windows this side granted, with no application code involved. A writer task sends
//! whatever packets are queued together, once the tasks that were ready when it woke have run
//! (so that what they queue joins the batch): over plain TCP in one vectored write (`writev`)
//! per batch of up to 64, payloads from where they are; over TLS through a buffer. Payloads move
//! between the socket and registered memory without staging copies.
//!
//! Addresses: `tcp://host:port` or `host:port`. With the `tls` feature, `tls` runs the same
//! packets inside TLS (`tls://host:port`): a layer between the socket and the packets, so
//! everything above is this transport's.

mod conn;
mod responder;
mod shared;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub mod tls;
mod wire;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::common::QueuedListener;
use super::{BoxFuture, Connection, Fencing, Listener, Transport};
use crate::error::{Error, Result};
use writer::Writes;

pub use conn::TcpConnection;

/// Settings of the software transport.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TcpConfig {
    /// How long a send waits for the peer to post a receive before failing with receiver not
    /// ready (RDMA's RNR retries). Default 500 ms.
    pub rnr_timeout: Duration,
    /// Largest single send, write or read, in bytes. Checked before anything is allocated or
    /// read. Default 1 GiB.
    pub max_message: u64,
    /// Most operations outstanding on one connection (its send queue depth): one more is
    /// refused when posted. Default 4096.
    pub max_outstanding: usize,
    /// Most unsignaled sends and posted writes waiting for the socket on one connection: past
    /// it the connection fails, as a peer that does not read would otherwise make this side
    /// queue without bound. Default 4096.
    pub max_queued_sends: usize,
    /// Time allowed for the connection preamble, and over `tls://` for the TLS handshake
    /// before it. Default 10 s.
    pub handshake_timeout: Duration,
    /// Longest one packet may stall on the socket, in either direction, before the
    /// connection fails: a peer that stops reading, or stops sending in the middle of a
    /// packet (while it holds a window), loses its connection instead of holding this side's
    /// memory. Default 30 s.
    pub stall_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            rnr_timeout: Duration::from_millis(500),
            max_message: 1 << 30,
            max_outstanding: 4096,
            max_queued_sends: 4096,
            handshake_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(30),
        }
    }
}

/// What a socket carries the packets in: itself (`tcp://`), or a TLS session (`tls://`).
#[derive(Debug, Clone, Default)]
enum Layer {
    #[default]
    Plain,
    #[cfg(feature = "tls")]
    Tls(Arc<tls::TlsLayer>),
}

impl Layer {
    fn scheme(&self) -> &'static str {
        match self {
            Layer::Plain => "tcp",
            #[cfg(feature = "tls")]
            Layer::Tls(_) => "tls",
        }
    }
}

/// Which end of a new socket this side is: TLS needs to know (and a client, the name it
/// expects the server's certificate to carry).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side<'a> {
    Accepted,
    Connected {
        /// The host dialled (what a server's certificate must name).
        #[cfg_attr(not(feature = "tls"), allow(dead_code))]
        host: &'a str,
    },
}

/// The software transport. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct TcpTransport {
    config: Arc<TcpConfig>,
    layer: Layer,
}

impl TcpTransport {
    /// A transport with default settings.
    pub fn new() -> TcpTransport {
        TcpTransport::default()
    }

    /// A transport with the given settings.
    pub fn with_config(config: TcpConfig) -> TcpTransport {
        TcpTransport {
            config: Arc::new(config),
            layer: Layer::Plain,
        }
    }

    /// Its settings.
    pub fn config(&self) -> &TcpConfig {
        &self.config
    }

    /// Connects to `addr` and returns the concrete connection type.
    pub async fn connect_tcp(&self, addr: &str) -> Result<Arc<TcpConnection>> {
        let scheme = self.layer.scheme();
        let hostport = strip_scheme(addr, scheme)?;
        let stream = TcpStream::connect(hostport)
            .await
            .map_err(|e| Error::io(format!("connecting to {addr}"), e))?;
        let host = host_of(hostport);
        let peer = format!("{scheme}://{hostport}");
        establish(
            &self.layer,
            &self.config,
            stream,
            peer,
            Side::Connected { host },
        )
        .await
    }
}

/// Turns a socket into a connection: TLS first if the layer says so, then the preamble, then
/// the connection's tasks.
async fn establish(
    layer: &Layer,
    config: &Arc<TcpConfig>,
    stream: TcpStream,
    peer: String,
    side: Side<'_>,
) -> Result<Arc<TcpConnection>> {
    stream
        .set_nodelay(true)
        .map_err(|e| Error::io(format!("setting TCP_NODELAY for {peer}"), e))?;
    let limit = config.handshake_timeout;
    match layer {
        Layer::Plain => {
            let _ = side; // Plain TCP is the same at both ends.
            let stream = preamble(stream, &peer, limit).await?;
            let halves = stream.into_split();
            Ok(TcpConnection::start(
                halves,
                peer,
                None,
                config.clone(),
                Writes::Vectored,
            ))
        }
        #[cfg(feature = "tls")]
        Layer::Tls(tls) => {
            let (stream, identity) = tls.handshake(stream, side, &peer, limit).await?;
            let stream = preamble(stream, &peer, limit)
                .await
                .map_err(|e| tls::explain(e, side, &peer))?;
            let halves = tokio::io::split(stream);
            // TLS seals each write separately: small packets are gathered in a buffer first.
            let conn = TcpConnection::start(
                halves,
                peer.clone(),
                identity.clone(),
                config.clone(),
                Writes::Buffered,
            );
            if matches!(side, Side::Accepted) {
                tls.hold(&peer, identity, conn.revocable());
            }
            Ok(conn)
        }
    }
}

/// The host of `host:port` (without the brackets of an IPv6 address).
fn host_of(hostport: &str) -> &str {
    let host = hostport.rsplit_once(':').map_or(hostport, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Accepts `SCHEME://host:port` and `host:port`.
pub(crate) fn strip_scheme<'a>(addr: &'a str, scheme: &str) -> Result<&'a str> {
    let rest = match addr.split_once("://") {
        Some((given, rest)) if given == scheme => rest,
        Some((given, _)) => {
            return Err(Error::InvalidAddress {
                addr: addr.to_owned(),
                reason: format!("this transport takes {scheme}:// addresses, not {given}://"),
            })
        }
        None => addr,
    };
    if rest
        .rsplit_once(':')
        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(Error::InvalidAddress {
            addr: addr.to_owned(),
            reason: format!("expected host:port (for example {scheme}://127.0.0.1:7470)"),
        });
    }
    Ok(rest)
}

async fn preamble<S>(mut stream: S, peer: &str, limit: Duration) -> Result<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut theirs = [0u8; wire::MAGIC.len()];
    let exchange = async {
        stream.write_all(&wire::MAGIC).await?;
        stream.flush().await?;
        // By hand rather than `read_exact`: what came before an early close tells who the
        // peer is (a TLS server's alert).
        let mut got = 0;
        while got < theirs.len() {
            match stream.read(&mut theirs[got..]).await? {
                0 => break,
                n => got += n,
            }
        }
        Ok::<_, std::io::Error>(got)
    };
    match tokio::time::timeout(limit, exchange).await {
        Err(_) => Err(Error::Protocol {
            peer: peer.to_owned(),
            reason: format!("no transport preamble within {limit:?}"),
        }),
        Ok(Err(e)) => Err(Error::io(format!("transport preamble with {peer}"), e)),
        // Closed before the whole preamble, with nothing wrong in what came: gone, not hostile.
        Ok(Ok(got)) if got < theirs.len() && wire::MAGIC.starts_with(&theirs[..got]) => {
            Err(Error::io(
                format!("transport preamble with {peer}"),
                std::io::ErrorKind::UnexpectedEof.into(),
            ))
        }
        Ok(Ok(got)) if theirs[..got] != wire::MAGIC => Err(Error::Protocol {
            peer: peer.to_owned(),
            reason: wire::not_a_preamble(&theirs[..got]).into(),
        }),
        Ok(Ok(_)) => Ok(stream),
    }
}

impl Transport for TcpTransport {
    fn listen(&self, addr: &str) -> BoxFuture<'_, Result<Box<dyn Listener>>> {
        let addr = addr.to_owned();
        Box::pin(async move {
            let scheme = self.layer.scheme();
            let listener = TcpListener::bind(strip_scheme(&addr, scheme)?)
                .await
                .map_err(|e| Error::io(format!("listening on {addr}"), e))?;
            let local = listener
                .local_addr()
                .map_err(|e| Error::io("reading the listener's address", e))?;
            let (config, layer) = (self.config.clone(), self.layer.clone());
            let local = format!("{scheme}://{local}");
            let listener = QueuedListener::start(listener, local, move |stream, from| {
                let (config, layer) = (config.clone(), layer.clone());
                async move {
                    let peer = format!("{scheme}://{from}");
                    let conn = establish(&layer, &config, stream, peer, Side::Accepted).await?;
                    Ok(conn as Arc<dyn Connection>)
                }
            });
            Ok(Box::new(listener) as Box<dyn Listener>)
        })
    }

    fn connect(&self, addr: &str) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        let addr = addr.to_owned();
        Box::pin(async move { Ok(self.connect_tcp(&addr).await? as Arc<dyn Connection>) })
    }

    fn fencing(&self) -> Fencing {
        Fencing::Revocable
    }
}

#[cfg(test)]
mod tests;

/// A socket that speaks the software transport's wire format by hand, for tests of peers
/// that lie at the transport level (answer nothing, stall, never acknowledge).
#[cfg(test)]
pub(crate) mod raw_peer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::wire::{Header, Kind, HEADER_LEN, MAGIC};

    /// The kind of a read request packet.
    pub(crate) const READ_REQUEST: u8 = Kind::ReadReq as u8;

    /// The kind of a send packet (a control frame).
    pub(crate) const SEND: u8 = Kind::Send as u8;

    /// The kind of a write packet (a pushed result).
    pub(crate) const WRITE: u8 = Kind::Write as u8;

    /// A packet as it came: its kind, whether it asks for no acknowledgement, its payload.
    pub(crate) struct Packet {
        pub(crate) kind: u8,
        pub(crate) unsignaled: bool,
        pub(crate) payload: Vec<u8>,
    }

    pub(crate) struct RawPeer {
        stream: TcpStream,
        next_op: u64,
    }

    impl RawPeer {
        /// Connects and exchanges the preamble.
        pub(crate) async fn connect(addr: &str) -> RawPeer {
            let mut stream = TcpStream::connect(addr.trim_start_matches("tcp://"))
                .await
                .unwrap();
            stream.write_all(&MAGIC).await.unwrap();
            let mut magic = [0u8; 8];
            stream.read_exact(&mut magic).await.unwrap();
            RawPeer { stream, next_op: 1 }
        }

        /// An unsignaled send of `payload` into the peer's next posted receive.
        pub(crate) async fn send(&mut self, payload: &[u8]) {
            let mut header = Header::new(Kind::Send, self.next_op);
            self.next_op += 1;
            header.unsignaled = true;
            header.len = payload.len() as u64;
            self.stream.write_all(&header.encode()).await.unwrap();
            self.stream.write_all(payload).await.unwrap();
        }

        /// The next packet's kind (see [`READ_REQUEST`]) and payload; `None` once the peer
        /// closed.
        pub(crate) async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
            self.next_packet().await.map(|p| (p.kind, p.payload))
        }

        /// The next packet; `None` once the peer closed.
        pub(crate) async fn next_packet(&mut self) -> Option<Packet> {
            let mut raw = [0u8; HEADER_LEN];
            self.stream.read_exact(&mut raw).await.ok()?;
            let header = Header::decode(&raw).unwrap();
            let len = if header.kind.carries_payload() {
                header.len as usize
            } else {
                0
            };
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload).await.ok()?;
            Some(Packet {
                kind: header.kind as u8,
                unsignaled: header.unsignaled,
                payload,
            })
        }
    }
}
