//! The writer task of a software-transport connection: packets of the application's side and
//! the reader's answers, batched into the socket under the configured write deadline.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch};

use super::shared::*;
use super::wire::Kind;
use crate::error::Error;
use crate::transport::SendData;

pub(super) async fn writer<W: AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    wr: W,
    mut requests: mpsc::UnboundedReceiver<Packet>,
    mut responses: mpsc::Receiver<Packet>,
    mut closed: watch::Receiver<bool>,
) {
    let mut out = BufWriter::with_capacity(SOCKET_BUFFER, wr);
    loop {
        let first = tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => break,
            p = responses.recv() => p,
            p = requests.recv() => p,
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        let mut result = Ok(());
        let limit = shared.config.stall_timeout;
        while let Some(packet) = next {
            let unsignaled = packet.header.unsignaled;
            result = deadline(limit, write_packet(&mut out, packet)).await;
            if unsignaled {
                shared.unsignaled.fetch_sub(1, Ordering::AcqRel);
            }
            if result.is_err() {
                break;
            }
            next = responses.try_recv().or_else(|_| requests.try_recv()).ok();
        }
        if result.is_ok() {
            result = deadline(limit, out.flush()).await;
        }
        if let Err(e) = result {
            let err = match e.kind() {
                std::io::ErrorKind::TimedOut => Error::Protocol {
                    peer: shared.peer.clone(),
                    reason: format!(
                        "the peer read nothing for {limit:?} (stall_timeout); connection closed"
                    ),
                },
                _ => Error::io(format!("writing to {}", shared.peer), e),
            };
            shared.fail(err);
            return;
        }
    }
    // Closing: deliver the acks of what was delivered and the NAKs that explain why, then
    // end the stream. Read responses and this side's own requests are dropped.
    let last_words = async {
        while let Ok(packet) = responses.try_recv() {
            if matches!(packet.header.kind, Kind::Nak | Kind::Ack) {
                write_packet(&mut out, packet).await?;
            }
        }
        out.flush().await?;
        out.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), last_words).await;
}

/// What the writer sends from: registered memory a peer may still write (a lease of a shared
/// region) is copied first, since the writer borrows its source.
#[inline]
pub(super) fn readable(data: SendData) -> SendData {
    if data.is_exposed() {
        data.readable()
    } else {
        data
    }
}

/// `io` within `limit`, or a `TimedOut` error.
pub(super) async fn deadline(
    limit: Duration,
    io: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    tokio::time::timeout(limit, io)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

pub(super) async fn write_packet<W: AsyncWrite + Unpin>(
    out: &mut BufWriter<W>,
    packet: Packet,
) -> std::io::Result<()> {
    out.write_all(&packet.header.encode()).await?;
    match &packet.payload {
        Payload::None => Ok(()),
        Payload::Data(data) | Payload::Tracked { data, .. } => out.write_all(data.as_slice()).await,
        Payload::Window { guard, offset, len } => {
            let Some(buf) = guard.as_ref() else {
                return Ok(());
            };
            // SAFETY: the read guard keeps the window from being revoked, so the buffer is
            // owned by the window and only read here (writes and atomics take the write lock);
            // `offset + len` was checked against the window, which lies inside the buffer.
            let bytes = unsafe { std::slice::from_raw_parts(buf.ptr_at(*offset), *len) };
            out.write_all(bytes).await
        }
    }
}
