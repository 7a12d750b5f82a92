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
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::post::{Sent, Unsent};
use super::{Client, Inner};
use crate::encoded::Encoded;
use crate::protocol::call::{self, Offered, ResultAt};
use crate::protocol::connection::ServerEvent;
use crate::protocol::frames::MetadataEntry;
use crate::service::EndpointDef;
use crate::status::Status;

/// What [`Client::send_at_once`] did with a call.
pub(super) enum AtOnce<'a> {
    /// Sent: wait for its response.
    Sent(SentCall<'a>),
    /// Not sent, nothing taken: the request message, payload and metadata, for the general
    /// path.
    Waits(Encoded, Bytes, Vec<MetadataEntry>),
}

impl Client {
    /// Sends a call of an inbound `endpoint` now, in plain code, if it can go as one request
    /// with its payload inline on the current connection and the window has room: see the
    /// module's documentation. `waker` is the caller's (the call starts to wait for its
    /// response under the lock it is sent under); `started`, when the call started, if its
    /// deadline or the metrics need it.
    #[allow(clippy::too_many_arguments)] // the call's parts, each moved once
    pub(super) fn send_at_once<'a>(
        &self,
        endpoint: &'a EndpointDef,
        mut message: Encoded,
        data: Option<Bytes>,
        mut frames: Vec<MetadataEntry>,
        timeout: Option<Duration>,
        started: Option<Instant>,
        waker: Waker,
    ) -> Result<AtOnce<'a>, Status> {
        let mut data = data.unwrap_or_default();
        if self.shared.balance.is_some() {
            return Ok(AtOnce::Waits(message, data, frames));
        }
        let inner = self.current();
        if inner.lost().is_some() {
            // The general path redials, or says why it cannot.
            return Ok(AtOnce::Waits(message, data, frames));
        }
        call::check_request(endpoint, message.len(), data.len())?;
        let inline = call::inline(
            data.len(),
            message.len() + call::metadata_len(&frames),
            &inner.negotiated,
            inner.session.peer_max_frame(),
        );
        if !inline {
            return Ok(AtOnce::Waits(message, data, frames));
        }
        let deadline = timeout
            .zip(started)
            .map(|(limit, at)| (at + limit).into_std());
        let unsent = Unsent {
            message: &mut message,
            data: &mut data,
            call_metadata: &mut frames,
        };
        match inner.try_send_inline(endpoint, deadline, timeout, unsent, waker)? {
            Some(Sent {
                id,
                reader_elsewhere,
            }) => Ok(AtOnce::Sent(SentCall {
                inner,
                endpoint,
                timeout,
                id,
                reader_elsewhere,
                done: false,
            })),
            None => Ok(AtOnce::Waits(message, data, frames)),
        }
    }
}

/// A call [`Client::send_at_once`] sent, waiting for its response. Its deadline is watched by
/// its connection's timer (given when the call opened): no timer of its own. Dropped before
/// its response, it tells the server the caller gave up (as `call::CallGuard` does).
pub(super) struct SentCall<'a> {
    inner: Arc<Inner>,
    endpoint: &'a EndpointDef,
    /// The call's own timeout, for the error when it passes.
    timeout: Option<Duration>,
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
        let response = match event {
            Some(ServerEvent::Response(response)) => response,
            None => return Poll::Ready(Err(this.inner.closed_status())),
            Some(ServerEvent::DeadlinePassed) => {
                let limit = this.timeout.unwrap_or_default();
                return Poll::Ready(Err(super::call::past_timeout(endpoint, limit)));
            }
            Some(ServerEvent::Grant(_)) => {
                return Poll::Ready(Err(call::violation(
                    endpoint,
                    "granted a window for a payload sent inline",
                )))
            }
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
