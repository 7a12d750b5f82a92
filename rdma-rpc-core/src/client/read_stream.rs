//! The client's side of a bulk read stream: the chunks the server writes into the windows the
//! call offers, taken in order, each window offered again once its chunk was taken
//! ([`ReadStream`]), and the same with its response typed ([`Download`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;

use super::stream::{outcome, OpenCall};
use crate::protocol::frames::{ChunksFrame, Kind};
use crate::service::EndpointDef;
use crate::status::Status;
use crate::transport::Fencing;

/// The chunks of a bulk read stream on the client, in order, then the server's response
/// message ([`response`](ReadStream::response)). Read it with [`chunk`](ReadStream::chunk) or
/// as a [`Stream`](futures_core::Stream). Each chunk comes out of the window the server wrote
/// (without a copy where the transport fences its windows, else copied once); taking a chunk
/// offers the server a fresh window, so a caller that stops reading stops the server. Dropping
/// the stream before its end cancels the call.
pub struct ReadStream {
    pub(super) call: OpenCall,
    pub(super) endpoint: EndpointDef,
    pub(super) window: usize,
    pub(super) deadline: crate::stream::StreamDeadline,
    pub(super) response: Option<Bytes>,
    pub(super) done: bool,
    pub(super) next: Option<crate::transport::BoxFuture<'static, ChunkOutcome>>,
}

type ChunkOutcome = Result<Option<Bytes>, Status>;

impl std::fmt::Debug for ReadStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadStream")
            .field(
                "endpoint",
                &format_args!("{} {}", self.endpoint.op, self.endpoint.path),
            )
            .field("call", &self.call.id)
            .field("done", &self.done)
            .finish()
    }
}

impl ReadStream {
    /// The next chunk; `Ok(None)` once the server answered (then
    /// [`response`](Self::response) has its message).
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Status> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .transpose()
    }

    /// The server's response message, once every chunk was taken.
    pub fn response(&self) -> Option<&Bytes> {
        self.response.as_ref()
    }

    /// Every chunk into `dst` from its start (a lease, say), then the response message and
    /// `dst` holding the stream's bytes. A stream larger than `dst` fails with
    /// `OUT_OF_RANGE`, and the call is cancelled.
    pub(crate) async fn into_buffer(
        mut self,
        mut dst: crate::memory::RegisteredBuf,
    ) -> Result<(Bytes, crate::memory::RegisteredBuf), Status> {
        let mut len = 0usize;
        while let Some(chunk) = self.chunk().await? {
            if len + chunk.len() > dst.capacity() {
                return Err(Status::out_of_range(format!(
                    "the result of {} {} has more than the {} bytes of the buffer given",
                    self.endpoint.op,
                    self.endpoint.path,
                    dst.capacity()
                )));
            }
            dst.copy_in(len, &chunk);
            len += chunk.len();
        }
        dst.set_len(len);
        Ok((self.response.take().unwrap_or_default(), dst))
    }

    /// Every chunk in one buffer (its memory is the stream's length), and the response
    /// message.
    pub(crate) async fn collect(mut self) -> Result<(Bytes, Bytes), Status> {
        let mut all = bytes::BytesMut::new();
        let mut single = None;
        while let Some(chunk) = self.chunk().await? {
            match single.take() {
                None if all.is_empty() => single = Some(chunk),
                None => all.extend_from_slice(&chunk),
                Some(first) => {
                    all.extend_from_slice(&first);
                    all.extend_from_slice(&chunk);
                }
            }
        }
        let data = single.unwrap_or_else(|| all.freeze());
        Ok((self.response.take().unwrap_or_default(), data))
    }

    fn step(&mut self, cx: &mut Context<'_>) -> Poll<ChunkOutcome> {
        // The revocation of a window (and its next offer) runs in a future of its own.
        if let Some(next) = self.next.as_mut() {
            let outcome = std::task::ready!(next.as_mut().poll(cx));
            self.next = None;
            return Poll::Ready(outcome);
        }
        let done = match std::task::ready!(self.call.cell.poll_used(cx)) {
            Err(status) => return Poll::Ready(Err(status)),
            Ok(done) => done,
        };
        let Some(done) = done else {
            // The server answered: every chunk is in.
            let response = match self.call.cell.poll_response(cx) {
                Poll::Ready(response) => response,
                Poll::Pending => return Poll::Pending,
            };
            let received = self.call.cell.received();
            return Poll::Ready(outcome(response?).and_then(|(message, pushed)| {
                if pushed != received {
                    return Err(Status::internal(format!(
                        "protocol violation: the server announced {pushed} bytes of the stream \
                         of {} {}, {received} arrived",
                        self.endpoint.op, self.endpoint.path
                    )));
                }
                self.response = Some(message);
                Ok(None)
            }));
        };
        let Some(window) = self.call.windows.remove(&done.window.id) else {
            return Poll::Ready(Err(Status::internal("a reported window is not held")));
        };
        let fenced = self.call.inner.session.transport().fencing() == Fencing::Revocable;
        let copies = self.call.inner.copies.clone();
        let len = done.len as usize;
        // A fresh window in place of the one the chunk is in.
        let offer = self.call.offer(None, self.window);
        let session = self.call.inner.session.clone();
        let id = self.call.id;
        self.next = Some(Box::pin(async move {
            let offer = offer?;
            let mut buf = window
                .revoke_written(len)
                .await
                .ok_or_else(|| Status::unavailable("the connection ended with a chunk"))?;
            buf.set_len(len);
            let chunk = if fenced {
                buf.freeze()
            } else {
                // The server can still write the window: the caller gets a copy.
                copies.copy_out(&buf)
            };
            session
                .send(Kind::Chunks(ChunksFrame {
                    id,
                    offers: vec![offer],
                    used: Vec::new(),
                }))
                .map_err(Status::from)?;
            Ok(Some(chunk))
        }));
        self.step(cx)
    }
}

impl Stream for ReadStream {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(outcome) = self.step(cx) {
            return Poll::Ready(match outcome {
                Ok(Some(chunk)) => Some(Ok(chunk)),
                Ok(None) => {
                    self.done = true;
                    None
                }
                Err(status) => {
                    self.done = true;
                    Some(Err(status))
                }
            });
        }
        let this = &mut *self;
        this.deadline.poll_end(cx, &this.endpoint, &mut this.done)
    }
}

/// A bulk read on the client with its response typed: the chunks as they arrive
/// ([`chunk`](Download::chunk), or as a [`Stream`](futures_core::Stream)), then the server's
/// response message ([`response`](Download::response)). What generated clients return from
/// their `*_stream` methods of read streams.
pub struct Download<R> {
    raw: ReadStream,
    _response: std::marker::PhantomData<fn() -> R>,
}

impl<R> std::fmt::Debug for Download<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Download").field(&self.raw).finish()
    }
}

impl<R: prost::Message + Default> Download<R> {
    /// Decodes the response of `raw` as `R`.
    pub fn new(raw: ReadStream) -> Download<R> {
        Download {
            raw,
            _response: std::marker::PhantomData,
        }
    }

    /// The next chunk; `Ok(None)` once the server answered.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Status> {
        self.raw.chunk().await
    }

    /// The server's response, once every chunk was taken (`None` before).
    pub fn response(&self) -> Option<Result<R, Status>> {
        let bytes = self.raw.response()?.clone();
        Some(
            R::decode(bytes)
                .map_err(|e| Status::internal(format!("malformed response message: {e}"))),
        )
    }

    /// The untyped stream.
    pub fn into_raw(self) -> ReadStream {
        self.raw
    }
}

impl<R: prost::Message + Default> Stream for Download<R> {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.raw).poll_next(cx)
    }
}
