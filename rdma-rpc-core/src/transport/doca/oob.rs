//! The out-of-band mode (`doca+oob://`): a TCP side channel per connection, over which both
//! sides exchange the blobs of `doca_rdma_export`, call `doca_rdma_connect`, confirm, and then
//! keep the socket open as the connection's liveness signal.
//!
//! With side-channel TLS ([`DocaTransport::with_side_channel_tls`](super::DocaTransport::with_side_channel_tls))
//! the socket's TLS handshake comes first, before the context makes a connection for the peer:
//! the blobs travel encrypted, each side knows whose queue pair it connects to, and a client
//! certificate (mutual TLS) becomes the connection's [`PeerIdentity`].

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::conn::DocaConnection;
use super::engine::{Cmd, EngineShared};
use crate::error::{Error, Result};
use crate::transport::common::QueuedListener;
#[cfg(feature = "tls")]
use crate::transport::tcp::tls::TlsLayer;
use crate::transport::tcp::Side;
use crate::transport::{Connection, PeerIdentity};

/// A side channel's byte stream: the socket itself, or TLS over it.
pub(super) trait SideStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> SideStream for S {}

/// What the side channels of a transport's `doca+oob://` connections run in: the plain
/// socket, or TLS with the settings of a [`TlsTransport`](crate::transport::tls::TlsTransport).
#[derive(Clone, Default)]
pub(super) struct SideChannel {
    #[cfg(feature = "tls")]
    tls: Option<Arc<TlsLayer>>,
}

impl SideChannel {
    #[cfg(feature = "tls")]
    pub(super) fn tls(layer: Arc<TlsLayer>) -> SideChannel {
        SideChannel { tls: Some(layer) }
    }

    /// Whether the side channel runs TLS.
    pub(super) fn secured(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Why a listener of `addr` cannot serve, if it cannot: TLS settings without a server
    /// certificate.
    pub(super) fn cannot_serve(&self, addr: &str) -> Option<Error> {
        #[cfg(feature = "tls")]
        if self.tls.as_ref().is_some_and(|t| !t.serves()) {
            return Some(Error::InvalidArgument(format!(
                "cannot serve {addr}: the side channel's TlsTransport has no server \
                 certificate (make it with TlsTransport::server or TlsTransport::new)"
            )));
        }
        let _ = addr;
        None
    }

    /// The side channel over `stream`, this side being `side`: the socket itself, or the TLS
    /// stream after a handshake within `limit`, with the identity the peer proved in it.
    pub(super) async fn open(
        &self,
        stream: TcpStream,
        side: Side<'_>,
        peer: &str,
        limit: Duration,
    ) -> Result<(Box<dyn SideStream>, Option<Arc<PeerIdentity>>)> {
        // A few small messages each way: none should wait for the peer's ACK of the last
        // (Nagle), the TLS handshake's flights least of all.
        stream
            .set_nodelay(true)
            .map_err(|e| Error::io(format!("setting TCP_NODELAY for {peer}"), e))?;
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            let (stream, identity) = tls.handshake(stream, side, peer, limit).await?;
            return Ok((Box::new(stream), identity));
        }
        let _ = (side, limit);
        Ok((Box::new(stream), None))
    }

    /// Hands `conn`, accepted from `peer` over this side channel, to its TLS layer (if any)
    /// for rechecks of its client (`TlsTransport::recheck_clients`).
    pub(super) fn hold(&self, peer: &str, conn: &DocaConnection) {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            tls.hold(peer, conn.peer_identity(), conn.revocable());
        }
        let _ = (peer, conn);
    }

    /// `err`, which the exchange over an opened side channel ended with, said as the TLS
    /// error it is where TLS caused it (a client certificate the server refused shows on the
    /// client's first read, in TLS 1.3).
    pub(super) fn explain(&self, err: Error, side: Side<'_>, peer: &str) -> Error {
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return crate::transport::tcp::tls::explain(err, side, peer);
        }
        let _ = (side, peer);
        err
    }
}

/// Magic of the out-of-band exchange: name and version of this side channel.
const OOB_MAGIC: [u8; 8] = *b"RDRPCdx1";
/// Sent by each side once its connection is connected and its receives are posted.
const OOB_READY: u8 = 0x52;

/// Largest connection blob accepted from a peer.
const MAX_BLOB: usize = 64 * 1024;

/// Exchanges connection blobs over `stream` and connects the exported connection, whose peer
/// proved `identity` in the side channel's TLS handshake.
pub(super) async fn oob_connect(
    engine: &Arc<EngineShared>,
    mut stream: Box<dyn SideStream>,
    peer: &str,
    limit: Duration,
    bounce_budget: usize,
    identity: Option<Arc<PeerIdentity>>,
) -> Result<DocaConnection> {
    let peer = peer.to_owned();
    let (blob, id) = engine.ask(|reply| Cmd::Export { reply }).await?;
    let exchange = async {
        // One write: a peer that refuses the magic (a side channel in TLS) closes at once, and
        // a second write would only find the socket reset.
        let mut ours = Vec::with_capacity(OOB_MAGIC.len() + 4 + blob.len());
        ours.extend_from_slice(&OOB_MAGIC);
        ours.extend_from_slice(&(blob.len() as u32).to_be_bytes());
        ours.extend_from_slice(&blob);
        let sent = async {
            stream.write_all(&ours).await?;
            stream.flush().await
        }
        .await;
        // By hand rather than `read_exact`: what came before an early close tells who the
        // peer is (a side channel that runs TLS answers with an alert and closes).
        let mut magic = [0u8; 8];
        let mut got = 0;
        while got < magic.len() {
            match stream.read(&mut magic[got..]).await {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if got == 0 => return Err(sent.err().unwrap_or(e)),
                Err(_) => break,
            }
        }
        if magic[..got] != OOB_MAGIC {
            let kind = if OOB_MAGIC.starts_with(&magic[..got]) {
                // Closed before the whole magic, with nothing wrong in what came.
                std::io::ErrorKind::UnexpectedEof
            } else {
                std::io::ErrorKind::InvalidData
            };
            return Err(std::io::Error::new(kind, not_our_magic(&magic[..got])));
        }
        sent?;
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
        stream.flush().await?;
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
    Ok(DocaConnection::new(shared, bounce_budget).with_identity(identity))
}

/// Why `theirs`, the first bytes a peer sent on the side channel (fewer than [`OOB_MAGIC`] if
/// it then closed), is not the exchange's magic: a peer that runs TLS is named, since that is
/// the likely mistake.
fn not_our_magic(theirs: &[u8]) -> &'static str {
    match theirs {
        [0x16, 0x03, ..] => {
            "the peer's side channel runs TLS and this side's does not: give this transport \
             side-channel TLS (DocaTransport::with_side_channel_tls)"
        }
        [0x15, 0x03, ..] => {
            "the peer answered with a TLS alert: its side channel runs TLS, give this \
             transport side-channel TLS (DocaTransport::with_side_channel_tls)"
        }
        [] => "the peer closed the side channel before the exchange",
        _ => "the peer is not an rdma-rpc DOCA out-of-band endpoint",
    }
}

/// An out-of-band listener: a TCP side channel on which each accepted socket (inside `side`'s
/// TLS, if set) exchanges connection blobs for one connection of the listener's context.
pub(super) fn oob_listener(
    listener: TcpListener,
    local: String,
    engine: Arc<EngineShared>,
    side: SideChannel,
    limit: Duration,
    bounce_budget: usize,
) -> QueuedListener {
    QueuedListener::start(listener, local, move |stream, from| {
        let (engine, side) = (engine.clone(), side.clone());
        async move {
            let peer = format!("doca+oob://{from}");
            // The handshake first: a peer that fails it gets no DOCA connection.
            let (stream, identity) = side.open(stream, Side::Accepted, &peer, limit).await?;
            let conn = oob_connect(&engine, stream, &peer, limit, bounce_budget, identity)
                .await
                .map_err(|e| side.explain(e, Side::Accepted, &peer))?;
            side.hold(&peer, &conn);
            Ok(Arc::new(conn) as Arc<dyn Connection>)
        }
    })
}
