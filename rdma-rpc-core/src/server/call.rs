//! The server side of one call, for every operation. Read this file to see what happens on
//! a send, receive, write or read request.
//!
//! - send / write (inbound): small payloads arrive inside the request frame. Otherwise the
//!   server takes a buffer of the endpoint's pool, grants the client a write-only window of
//!   exactly the announced length, sends the descriptor, and waits for the client's ack. Then
//!   it revokes the window (the descriptor stops working) and runs the handler on the bytes:
//!   the handler never sees a partial transfer.
//! - receive / read (outbound): the server takes a pool buffer and runs the handler to fill
//!   it. Small results go back inside the response frame. Otherwise the server grants a
//!   read-only window over the filled bytes, sends the descriptor, waits for the client's ack,
//!   revokes the window, and answers; the buffer returns to the pool.
//!
//! Every call ends with exactly one response frame (also when the client cancelled), so both
//! sides agree on what is in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::memory::{Access, BufferPool, RegisteredBuf};
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{GrantFrame, Kind, ResponseFrame, StatusFrame};
use crate::protocol::FRAME_OVERHEAD;
use crate::service::{EndpointDef, RawRequest, ServerCall, Service};
use crate::status::Status;
use crate::transport::Grant;

/// What the client says about a call after the request.
#[derive(Debug)]
pub(super) enum ClientEvent {
    /// The transfer is done.
    Ack,
    /// The client gave up.
    Cancel,
}

/// The calls in flight on one connection, shared by the connection loop (which routes the
/// client's acks and cancels) and the call tasks (which leave it just before answering, so a
/// client that sends its next request on seeing a response is never over the limit).
#[derive(Clone, Default)]
pub(super) struct InFlight(Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<ClientEvent>>>>);

impl InFlight {
    fn calls(&self) -> std::sync::MutexGuard<'_, HashMap<u64, mpsc::UnboundedSender<ClientEvent>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn len(&self) -> usize {
        self.calls().len()
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.calls().contains_key(&id)
    }

    pub(super) fn insert(&self, id: u64, events: mpsc::UnboundedSender<ClientEvent>) {
        self.calls().insert(id, events);
    }

    /// Removes a call; whether it was still there.
    pub(super) fn remove(&self, id: u64) -> bool {
        self.calls().remove(&id).is_some()
    }

    /// Routes a client event to its call, if the call is still in flight.
    pub(super) fn route(&self, id: u64, event: ClientEvent) {
        if let Some(events) = self.calls().get(&id) {
            let _ = events.send(event);
        }
    }
}

/// Everything one call needs.
pub(super) struct Call {
    pub(super) id: u64,
    pub(super) in_flight: InFlight,
    pub(super) channel: Arc<FrameChannel>,
    pub(super) service: Arc<dyn Service>,
    pub(super) index: usize,
    pub(super) endpoint: EndpointDef,
    pub(super) pool: BufferPool,
    pub(super) request: RawRequest,
    pub(super) payload_len: u64,
    pub(super) inline_payload: Option<Bytes>,
    pub(super) events: mpsc::UnboundedReceiver<ClientEvent>,
    /// When the client stops waiting (its deadline), if it set one.
    pub(super) deadline: Option<Instant>,
    /// Longest wait for the client's ack of a transfer.
    pub(super) transfer_timeout: Duration,
    /// Outbound results up to this size go back inside the response frame.
    pub(super) inline_threshold: usize,
}

/// Runs the call to its response frame.
pub(super) async fn run(mut call: Call) {
    let result = if call.endpoint.op.is_inbound() {
        inbound(&mut call).await
    } else {
        outbound(&mut call).await
    };
    let response = match result {
        Ok(done) => done,
        Err(status) => ResponseFrame {
            id: call.id,
            status: Some(StatusFrame::from(&status)),
            metadata: Bytes::new(),
            inline_payload: None,
        },
    };
    call.in_flight.remove(call.id);
    if let Err(e) = call.channel.send(Kind::Response(response)).await {
        tracing::debug!(call = call.id, error = %e, "response not sent: connection gone");
    }
}

fn ok(id: u64, metadata: Bytes, inline_payload: Option<Bytes>) -> ResponseFrame {
    ResponseFrame {
        id,
        status: None,
        metadata,
        inline_payload,
    }
}

/// Send and write: get the bytes, then run the handler on them.
async fn inbound(call: &mut Call) -> Result<ResponseFrame, Status> {
    let data = match call.inline_payload.take() {
        Some(data) => data,
        None if call.payload_len == 0 => Bytes::new(),
        None => {
            let len = call.payload_len as usize;
            let buf = take_buffer(call).await?;
            let grant = call
                .channel
                .conn()
                .grant(buf, 0, len, Access::REMOTE_WRITE)
                .map_err(Status::from)?;
            let mut buf = transfer(call, grant).await?;
            buf.set_len(len);
            buf.freeze()
        }
    };
    let request = call.request.clone();
    let metadata = call
        .service
        .call(call.index, ServerCall::Inbound { request, data })
        .await?;
    Ok(ok(call.id, metadata, None))
}

/// Receive and read: run the handler to fill a buffer, then let the client have the bytes.
async fn outbound(call: &mut Call) -> Result<ResponseFrame, Status> {
    let mut buf = take_buffer(call).await?;
    buf.set_len(0);
    let request = call.request.clone();
    let metadata = call
        .service
        .call(
            call.index,
            ServerCall::Outbound {
                request,
                buf: &mut buf,
            },
        )
        .await?;
    let len = buf.len();
    let fits_frame = metadata.len() + len + FRAME_OVERHEAD <= call.channel.peer_max_frame();
    if len == 0 || (len <= call.inline_threshold && fits_frame) {
        let payload = Bytes::copy_from_slice(buf.as_slice());
        return Ok(ok(call.id, metadata, Some(payload)));
    }
    let grant = call
        .channel
        .conn()
        .grant(buf, 0, len, Access::REMOTE_READ)
        .map_err(Status::from)?;
    // The buffer returns to the pool when `transfer` hands it back and it is dropped.
    transfer(call, grant).await?;
    Ok(ok(call.id, metadata, None))
}

/// A buffer of the endpoint's pool, waiting no longer than the client does.
async fn take_buffer(call: &mut Call) -> Result<RegisteredBuf, Status> {
    let endpoint = call.endpoint;
    let acquire = call.pool.acquire();
    match call.deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, acquire)
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no free buffer for {} {} before the deadline (all {} in use)",
                    endpoint.op,
                    endpoint.path,
                    call.pool.count()
                ))
            }),
        None => Ok(acquire.await),
    }
}

/// Sends the descriptor of `grant`, waits for the client's ack, and revokes the window.
async fn transfer(call: &mut Call, grant: Grant) -> Result<RegisteredBuf, Status> {
    let d = grant.descriptor();
    let frame = GrantFrame {
        id: call.id,
        addr: d.addr,
        len: d.len,
        rkey: d.rkey,
        access: d.access.bits(),
        blob: d.blob.clone(),
    };
    call.channel
        .send(Kind::Grant(frame))
        .await
        .map_err(Status::from)?;
    let mut limit = Instant::now() + call.transfer_timeout;
    if let Some(deadline) = call.deadline {
        limit = limit.min(deadline);
    }
    let event = tokio::time::timeout_at(limit, call.events.recv()).await;
    // Revoke first, whatever happened: from here the descriptor is dead.
    let buf = grant.revoke().await;
    match event {
        Ok(Some(ClientEvent::Ack)) => {
            buf.ok_or_else(|| Status::unavailable("connection closed during the transfer"))
        }
        Ok(Some(ClientEvent::Cancel)) => Err(Status::cancelled("cancelled by the client")),
        Ok(None) => Err(Status::unavailable("connection closed during the transfer")),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "the client did not finish the transfer for {} {} in time",
            call.endpoint.op, call.endpoint.path
        ))),
    }
}
