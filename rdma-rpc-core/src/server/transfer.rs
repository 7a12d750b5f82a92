//! How a call's bytes move on the server, the way `protocol::call` decides: a send or write
//! payload taken from the request, from its write slot, read from the client's window or
//! written by the client through a granted window; a receive or read result returned inline,
//! pushed into the client's window, or pushed after asking for a larger one. The handler runs
//! between the bytes coming and the bytes going.

use bytes::Bytes;
use tokio::time::Instant;

use super::buffers::take_buffer;
use super::call::{handlers_overflow, ok, take_request, Call, ClientEvent, Pending};
use crate::memory::Access;
use crate::observe::logs;
use crate::protocol::call::{
    asked_window, grant as grant_frame, payload_step, pushed as pushed_response, result_step,
    PayloadStep, ResultStep,
};
use crate::protocol::frames::{GrantFrame, Kind, ResponseFrame};
use crate::protocol::mailbox::Mailbox;
use crate::protocol::wait::wait;
use crate::service::ServerCall;
use crate::status::Status;
use crate::transport::{Descriptor, SendData};

fn transfer_failed(e: crate::error::Error) -> Status {
    Status::unavailable(format!("RDMA transfer failed: {e}"))
}

/// Send and write: get the bytes (the way `protocol::call::payload_step` says), then run
/// the handler on them.
pub(super) async fn inbound(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
) -> Result<ResponseFrame, Status> {
    let fencing = call.conn.session.transport().fencing();
    let step = payload_step(
        call.incoming,
        call.payload_len,
        call.source.as_ref(),
        fencing,
    )?;
    let data = match step {
        PayloadStep::Nothing => Bytes::new(),
        PayloadStep::Inline => call.inline_payload.take().unwrap_or_default(),
        PayloadStep::Slot { copy } => from_slot(call, copy).await?,
        // The paths that wait for the client live in futures of their own.
        PayloadStep::Pull(source) => Box::pin(pull(call, events, source)).await?,
        PayloadStep::Grant { len } => Box::pin(through_grant(call, events, len)).await?,
    };
    let request = take_request(call)?;
    let metadata = call
        .route
        .service
        .call(call.route.index, ServerCall::Inbound { request, data })
        .await?;
    Ok(ok(call.id, metadata, None))
}

/// The payload the client wrote into a write slot before it sent the request.
async fn from_slot(call: &mut Call, copy: bool) -> Result<Bytes, Status> {
    let slot = call
        .slot
        .take()
        .ok_or_else(|| Status::internal("a slot call without its slot"))?;
    let mut buf = slot
        .revoke()
        .await
        .ok_or_else(|| Status::unavailable("connection closed"))?;
    buf.set_len(call.payload_len as usize);
    Ok(if copy {
        // The client can still write the slot (the window outlives `revoke`): the handler
        // gets a copy (a raw copy: those bytes are never borrowed), and the slot goes back
        // to the connection at once.
        Bytes::from(buf.to_vec())
    } else {
        buf.freeze()
    })
}

/// The payload read from the window the client offered.
async fn pull(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
    source: Descriptor,
) -> Result<Bytes, Status> {
    let buf = take_buffer(call, events).await?;
    let read = call.conn.session.transport().read(&source, buf);
    // A client that never lets the read complete would keep the pool buffer: after
    // transfer_timeout its connection goes, and with it the read and the buffer (also when
    // the call is stopped meanwhile: the read is watched on).
    let patience = call.conn.transfer_timeout;
    let until = || Instant::now() + patience;
    match crate::bounded::answered_by(call.conn.session.transport(), read, until).await {
        Some(read) => Ok(read.map_err(transfer_failed)?.freeze()),
        None => {
            let status = Status::unavailable(format!(
                "the client's window was not readable within {:?} (transfer_timeout); \
                 connection closed",
                call.conn.transfer_timeout
            ));
            if let Some(line) = logs::line("connection dropped", "transfer_timeout") {
                tracing::warn!(peer = %call.conn.info.peer, reason = status.message(), suppressed = line.suppressed, "connection dropped");
            }
            Err(status)
        }
    }
}

/// The payload the client wrote into a window granted for this call.
async fn through_grant(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
    len: usize,
) -> Result<Bytes, Status> {
    let mut buf = take_buffer(call, events).await?;
    // The server cannot see one-sided writes complete (on RDMA hardware no more than
    // here): a client that acks without writing every byte must find its own zeros, never
    // what the buffer's previous call left in it.
    buf.as_mut_capacity()[..len].fill(0);
    let grant = call
        .conn
        .session
        .transport()
        .grant(buf, 0, len, Access::REMOTE_WRITE)
        .map_err(Status::from)?;
    let frame = grant_frame(call.id, grant.descriptor());
    let reply = ask(call, events, frame).await;
    // Revoke first, whatever happened: from here the descriptor is dead.
    let buf = grant.revoke().await;
    reply?;
    let mut buf = buf.ok_or_else(|| Status::unavailable("connection closed"))?;
    buf.set_len(len);
    Ok(buf.freeze())
}

/// Receive and read: run the handler to fill a buffer, then let the client have the bytes.
pub(super) async fn outbound(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
) -> Result<(ResponseFrame, Option<Pending>), Status> {
    let mut buf = take_buffer(call, events).await?;
    buf.set_len(0);
    let request = take_request(call)?;
    let metadata = call
        .route
        .service
        .call(
            call.route.index,
            ServerCall::Outbound {
                request,
                buf: &mut buf,
            },
        )
        .await
        .map_err(|status| handlers_overflow(&call.route.endpoint, status))?;
    let len = buf.len();
    let conn = &call.conn;
    let step = result_step(
        call.id,
        len,
        metadata.len(),
        &conn.negotiated,
        conn.session.peer_max_frame(),
        call.reply_to.take(),
    );
    let dst = match step {
        ResultStep::Inline => {
            let payload = Bytes::copy_from_slice(buf.as_slice());
            return Ok((ok(call.id, metadata, Some(payload)), None));
        }
        ResultStep::Push(dst) => dst,
        ResultStep::Ask(frame) => asked_window(len, Box::pin(ask(call, events, frame)).await?)?,
    };
    // The write is posted now; the response, sent after it on the same connection, arrives
    // after the bytes (and over TCP the client sends no ACK for it). The buffer returns to
    // the pool when the transport lets go of it.
    let mut pushed = call
        .conn
        .session
        .transport()
        .write_posted(SendData::Registered(buf), &dst);
    // A write the transport refused when it was posted (its queue full) has failed already:
    // answer with that, never with a success whose bytes were not sent.
    let pending = match crate::bounded::poll_once(&mut pushed) {
        Some(Err(e)) => {
            return Err(Status::unavailable(format!(
                "the result of {} bytes could not be pushed: {e}",
                len
            )))
        }
        Some(Ok(())) => None,
        None => Some(pushed),
    };
    Ok((pushed_response(call.id, metadata, len), pending))
}

/// Sends `frame` and waits for the client's ack: its window, if it sent one.
async fn ask(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
    frame: GrantFrame,
) -> Result<Option<Descriptor>, Status> {
    call.grants = call.grants.saturating_add(1);
    call.conn
        .session
        .send(Kind::Grant(frame))
        .map_err(Status::from)?;
    let limit = wait(
        Instant::now(),
        call.conn.transfer_timeout,
        events.limits().deadline.map(|d| d.at),
    )
    .until;
    match tokio::time::timeout_at(limit, events.recv()).await {
        Ok(Some(ClientEvent::Ack(window))) => Ok(window),
        Ok(None) => Err(Status::unavailable("connection closed during the transfer")),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "the client did not finish the transfer for {} {} in time",
            call.route.endpoint.op, call.route.endpoint.path
        ))),
    }
}
