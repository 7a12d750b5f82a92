//! The out-of-band mode (`doca+oob://`): a TCP side channel per connection, over which both
//! sides exchange the blobs of `doca_rdma_export`, call `doca_rdma_connect`, confirm, and then
//! keep the socket open as the connection's liveness signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::conn::DocaConnection;
use super::engine::{Cmd, EngineShared};
use crate::error::{Error, Result};
use crate::transport::common::QueuedListener;
use crate::transport::Connection;

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
    bounce_budget: usize,
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
    Ok(DocaConnection::new(shared, bounce_budget))
}

/// An out-of-band listener: a TCP side channel on which each accepted socket exchanges
/// connection blobs for one connection of the listener's context.
pub(super) fn oob_listener(
    listener: TcpListener,
    local: String,
    engine: Arc<EngineShared>,
    limit: Duration,
    bounce_budget: usize,
) -> QueuedListener {
    QueuedListener::start(listener, local, move |stream, from| {
        let engine = engine.clone();
        async move {
            let peer = format!("doca+oob://{from}");
            let conn = oob_connect(&engine, stream, peer, limit, bounce_budget).await?;
            Ok(Arc::new(conn) as Arc<dyn Connection>)
        }
    })
}
