//! A small call sent at once: its whole state, from its send to its response, in one cache
//! line.
//!
//! Most calls of a storage service's control path are small sends: the payload rides in the
//! request, the window has room, and the call is sent in its first poll and then only waits
//! for its response. Written as `async fn`s, the general path (`call.rs`) kept such a call's
//! state in about 1.5 KB of nested futures, each level with its locals at its own offsets: the
//! response resumed the call through lines of it the send had touched a whole round trip
//! earlier, cold with 1,000 connections calling (about 14 of a call's misses, `docs/doca.md`,
//! "Where a call's CPU goes, by layer").
//!
//! [`send_at_once`](Client::send_at_once) sends such a call in plain code, under one lock, and
//! returns a [`SentCall`]: the connection, the call's id and what its response is checked
//! against, nothing more. A call that does not qualify (no room in the window, a payload too
//! large to ride inline, a connection being redialled, a balanced client) is given back whole
//! and takes the general path.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::call::{answer, granted_inline, Answer, Payload, Prepared, Start};
use super::post::{Sent, Unsent};
use super::{CallOptions, Client, Inner};
use crate::call_box::CallBox;
use crate::encoded::Encoded;
use crate::metadata::Metadata;
use crate::protocol::call::{self, Offered, ResultAt};
use crate::service::EndpointDef;
use crate::status::Status;

impl Client {
    /// Sends a call of an inbound `endpoint` now, in plain code, if it can go as one request
    /// with its payload inline on the current connection and the window has room: see the
    /// module's documentation. `waker` is the caller's (the call starts to wait for its
    /// response under the lock it is sent under); `started`, when the call started, if its
    /// deadline or the metrics need it. `None`: nothing was taken (`message`, `data` and
    /// `metadata` are as they were), the call goes the general way.
    #[allow(clippy::too_many_arguments)] // the call's parts, each taken only if it is sent
    pub(super) fn send_at_once<'a>(
        &self,
        endpoint: &'a EndpointDef,
        message: &mut Encoded,
        data: &mut Bytes,
        metadata: &mut Metadata,
        timeout: Option<Duration>,
        started: Option<Instant>,
        waker: &Waker,
    ) -> Result<Option<SentCall<'a>>, Status> {
        if self.shared.balance.is_some() {
            return Ok(None);
        }
        let inner = self.current();
        if inner.lost().is_some() {
            // The general path redials, or says why it cannot.
            return Ok(None);
        }
        call::check_request(endpoint, message.len(), data.len())?;
        let frames = metadata.frames_mut();
        let inline = call::inline(
            data.len(),
            message.len() + call::metadata_len(frames),
            &inner.negotiated,
            inner.session.peer_max_frame(),
        );
        if !inline {
            return Ok(None);
        }
        let deadline = timeout
            .zip(started)
            .map(|(limit, at)| (at + limit).into_std());
        let unsent = Unsent {
            message,
            data,
            call_metadata: frames,
        };
        let sent = inner.try_send_inline(endpoint, deadline, timeout, unsent, waker.clone())?;
        Ok(sent.map(
            |Sent {
                 id,
                 reader_elsewhere,
             }| SentCall {
                inner,
                endpoint,
                timeout,
                started,
                id,
                reader_elsewhere,
                done: false,
            },
        ))
    }
}

/// A call [`Client::send_at_once`] sent, waiting for its response. Its deadline is watched by
/// its connection's timer (given when the call opened): no timer of its own. Dropped before
/// its response, it tells the server the caller gave up (as `call::CallGuard` does).
pub(super) struct SentCall<'a> {
    inner: Arc<Inner>,
    pub(super) endpoint: &'a EndpointDef,
    /// The call's own timeout, for the error when it passes.
    timeout: Option<Duration>,
    /// When the call started, for the metrics.
    pub(super) started: Option<Instant>,
    id: u64,
    /// See [`Sent::reader_elsewhere`]: taken on the first poll.
    reader_elsewhere: bool,
    /// The response arrived: nothing to abandon.
    done: bool,
}

impl Future for SentCall<'_> {
    /// The response message and the result bytes (empty: an inbound call's result is its
    /// message).
    type Output = Result<(Bytes, Bytes), Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let event = match this
            .inner
            .poll_event(this.id, &mut this.reader_elsewhere, cx)
        {
            Poll::Ready(event) => event,
            Poll::Pending => return Poll::Pending,
        };
        let endpoint = this.endpoint;
        let response = match answer(&this.inner, endpoint, this.timeout, event) {
            Ok(Answer::Response(response)) => response,
            Ok(Answer::Grant(_)) => return Poll::Ready(Err(granted_inline(endpoint))),
            Err(status) => return Poll::Ready(Err(status)),
        };
        this.done = true;
        this.inner
            .counters
            .completed
            .fetch_add(1, Ordering::Relaxed);
        // The payload went inline: the call offered no window.
        Poll::Ready(
            call::on_response(endpoint, response, Offered::None).map(|(message, at)| {
                let result = match at {
                    ResultAt::Inline(payload) => payload,
                    ResultAt::Window(_) | ResultAt::Empty => Bytes::new(),
                };
                (message, result)
            }),
        )
    }
}

impl Drop for SentCall<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.inner.abandon(self.id, []);
        }
    }
}

/// A unary call's future, as the typed client and [`Client::call_raw`] return it: on its first
/// poll the call starts ([`Client::start`]); a small send goes at once and waits as a
/// [`SentCall`], any other call is built then, the general way, in a block of its thread's
/// cache (`general`, see `call_box`). `then` (the typed client's decoding) is applied to the
/// result. Its size is what a caller's future holds of it (`call::future_sizes`).
pub(crate) struct TypedCall<'a, T, Then, G> {
    stage: Stage<'a, Then, G>,
    output: PhantomData<fn() -> T>,
}

/// The general path of a call that does not go at once: the call built in a block.
type General<'a, Then, G> = fn(&'a Client, &'a EndpointDef, Prepared, Then) -> CallBox<G>;

/// A call's parts until its first poll.
pub(super) struct Unstarted<'a> {
    pub(super) client: &'a Client,
    pub(super) endpoint: &'a EndpointDef,
    pub(super) message: Encoded,
    pub(super) data: Option<Bytes>,
    pub(super) options: CallOptions,
}

/// Where a [`TypedCall`] is.
enum Stage<'a, Then, G> {
    /// Not polled yet.
    Unstarted {
        call: Unstarted<'a>,
        then: Then,
        general: General<'a, Then, G>,
    },
    /// Sent at once, waiting for its response.
    Sent {
        client: &'a Client,
        call: SentCall<'a>,
        then: Then,
    },
    /// The general way.
    General(CallBox<G>),
    /// Returned its result.
    Over,
}

impl<'a, T, Then, G> TypedCall<'a, T, Then, G>
where
    Then: FnOnce(Bytes, Bytes) -> Result<T, Status> + Unpin,
    G: Future<Output = Result<T, Status>>,
{
    /// `call`, started on its first poll; `general` builds it when it does not go at once.
    pub(super) fn new(call: Unstarted<'a>, then: Then, general: General<'a, Then, G>) -> Self {
        TypedCall {
            stage: Stage::Unstarted {
                call,
                then,
                general,
            },
            output: PhantomData,
        }
    }
}

impl<T, Then, G> Future for TypedCall<'_, T, Then, G>
where
    Then: FnOnce(Bytes, Bytes) -> Result<T, Status> + Unpin,
    G: Future<Output = Result<T, Status>>,
{
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin` (a `CallBox` keeps its future pinned on the heap): the stage
        // is taken out for each poll and put back while the call waits.
        let this = self.get_mut();
        loop {
            match std::mem::replace(&mut this.stage, Stage::Over) {
                Stage::Unstarted {
                    call,
                    then,
                    general,
                } => {
                    let Unstarted {
                        client,
                        endpoint,
                        message,
                        data,
                        options,
                    } = call;
                    let payload = Payload::Data(data);
                    this.stage = match client.start(endpoint, message, payload, options, cx.waker())
                    {
                        Ok(Start::Sent(call)) => Stage::Sent { client, call, then },
                        Ok(Start::Prepared(prepared)) => {
                            Stage::General(general(client, endpoint, prepared, then))
                        }
                        Err(status) => return Poll::Ready(Err(status)),
                    };
                }
                Stage::Sent {
                    client,
                    mut call,
                    then,
                } => {
                    let Poll::Ready(result) = Pin::new(&mut call).poll(cx) else {
                        this.stage = Stage::Sent { client, call, then };
                        return Poll::Pending;
                    };
                    client.count_sent(&call, &result);
                    // Given up here if it failed (see `SentCall`'s drop).
                    drop(call);
                    return Poll::Ready(result.and_then(|(message, bytes)| then(message, bytes)));
                }
                Stage::General(mut call) => {
                    let polled = Pin::new(&mut call).poll(cx);
                    if polled.is_pending() {
                        this.stage = Stage::General(call);
                    }
                    return polled;
                }
                Stage::Over => panic!("a call polled after it returned its result"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SentCall;

    /// What a small send keeps while it waits fits in one cache line.
    #[test]
    fn a_sent_call_fits_a_cache_line() {
        let size = std::mem::size_of::<SentCall<'static>>();
        assert!(size <= 64, "a sent call is {size} bytes");
    }
}
