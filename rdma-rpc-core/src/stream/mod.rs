//! Streams: calls that move more than one buffer or one message.
//!
//! - **Bulk streams** (write and read endpoints with `stream: { max_len }` in the spec): a
//!   payload of any size up to `max_len` moves through the endpoint's registered buffers in
//!   chunks of at most `buffer_size`, several in flight, with backpressure both ways. A write
//!   stream's handler takes the chunks as they arrive ([`Chunks`]); a read stream's handler
//!   sends them ([`ChunkSink`]). Clients send any `Bytes` (without a copy when they were frozen
//!   from a memory region over a transport that fences) and receive as a stream
//!   ([`ReadStream`](crate::client::ReadStream)), whole, or into a caller's buffer.
//! - **Message streams** (send and receive endpoints with `request: { stream: .. }` and/or
//!   `response: { stream: .. }`): many typed messages in one call, either way or both, as
//!   tonic's client, server and bidirectional streaming. The receiving side reads a
//!   [`Streaming`] (encoded: [`MessageStream`]); the sending side writes into a
//!   [`MessageSink`], which packs messages into frames within the receiver's window.
//!
//! The protocol (frames, windows, the rules a peer must keep) is in docs/protocol.md and
//! `protocol::stream`.

mod bulk_server;
mod cell;
mod chunks;
mod messages;

pub use bulk_server::ChunkSink;
pub(crate) use bulk_server::{Reader, ServerStream};
pub(crate) use cell::{Setup, StreamCell};
pub use chunks::Chunks;
pub use messages::{MessageSink, MessageStream, Streaming};

/// A stream's deadline on the client: the call's, for a stream the caller holds after the
/// call returned it.
pub(crate) struct StreamDeadline(Option<std::pin::Pin<Box<tokio::time::Sleep>>>);

impl StreamDeadline {
    pub(crate) fn at(deadline: Option<tokio::time::Instant>) -> StreamDeadline {
        StreamDeadline(deadline.map(|at| Box::pin(tokio::time::sleep_until(at))))
    }

    /// What a stream's `poll_next` returns when nothing else is ready: its deadline's status
    /// once passed (the stream is then `done`), else `Pending` (woken at the deadline).
    pub(crate) fn poll_end<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        endpoint: &crate::service::EndpointDef,
        done: &mut bool,
    ) -> std::task::Poll<Option<Result<T, crate::status::Status>>> {
        match self.passed(cx, endpoint) {
            Some(status) => {
                *done = true;
                std::task::Poll::Ready(Some(Err(status)))
            }
            None => std::task::Poll::Pending,
        }
    }

    /// The status of a stream of `endpoint` past its deadline, once it passed (the task is
    /// woken then).
    pub(crate) fn passed(
        &mut self,
        cx: &mut std::task::Context<'_>,
        endpoint: &crate::service::EndpointDef,
    ) -> Option<crate::status::Status> {
        let sleep = self.0.as_mut()?;
        std::future::Future::poll(sleep.as_mut(), cx)
            .is_ready()
            .then(|| {
                crate::status::Status::deadline_exceeded(format!(
                    "{} {} did not complete within its deadline",
                    endpoint.op, endpoint.path
                ))
            })
    }
}
