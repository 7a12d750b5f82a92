//! The server side of streaming calls (the client side is in `client/stream.rs`; the rules in
//! `protocol::stream`): the handler gets its streams, and the call answers once it returned.
//!
//! - Message streams: the handler reads the client's messages ([`MessageStream`], fed by the
//!   connection loop within this server's window) and writes its own into a [`MessageSink`];
//!   what it queued is sent before the response, which ends the server's stream.
//! - Bulk write streams: the handler takes the payload's chunks ([`Chunks`]), read from the
//!   client's windows as it asks for them.
//! - Bulk read streams: the handler sends chunks ([`ChunkSink`]), written into the client's
//!   windows; the response follows the last one and says how many bytes the stream had.

use tokio::time::Instant;

use super::call::{ok, take_request, Call};
use crate::service::ServerCall;
use crate::status::Status;
use crate::stream::{ChunkSink, Chunks, MessageSink, MessageStream, Reader, ServerStream};

use crate::protocol::frames::ResponseFrame;

fn cell(call: &Call) -> Result<std::sync::Arc<crate::stream::StreamCell>, Status> {
    call.stream
        .clone()
        .ok_or_else(|| Status::internal("a streaming call without its streams"))
}

/// A call of a message-streaming endpoint.
pub(super) async fn messages(call: &mut Call) -> Result<ResponseFrame, Status> {
    let cell = cell(call)?;
    let ep = call.route.endpoint;
    let requests = ep
        .streams_requests()
        .then(|| MessageStream::new(cell.clone(), call.conn.session.clone(), call.id, ep));
    let mut sink = ep.streams_responses().then(|| {
        MessageSink::new(
            cell.clone(),
            call.conn.session.clone(),
            call.id,
            ep,
            call.conn.negotiated.peer_stream_window,
            call.conn.transfer_timeout,
        )
    });
    let request = take_request(call)?;
    let answered = call
        .route
        .service
        .call(
            call.route.index,
            ServerCall::Streaming {
                request,
                requests,
                responses: sink.as_mut(),
            },
        )
        .await;
    // What the handler queued leaves before its answer, an error included.
    if let Some(sink) = sink.as_mut() {
        sink.flush().await?;
    }
    Ok(ok(call.id, answered?, None))
}

/// A call of a bulk stream endpoint.
pub(super) async fn bulk(
    call: &mut Call,
    deadline: Option<Instant>,
) -> Result<ResponseFrame, Status> {
    let stream = ServerStream {
        cell: cell(call)?,
        session: call.conn.session.clone(),
        id: call.id,
        endpoint: call.route.endpoint,
        pool: call.route.pool.clone(),
        buffer_wait: call.conn.buffer_wait,
        transfer_timeout: call.conn.transfer_timeout,
        deadline,
        peer: call.conn.info.peer.clone(),
    };
    let request = take_request(call)?;
    if call.route.endpoint.op.is_inbound() {
        let chunks = match call.payload_len {
            0 => Chunks::from_bytes(bytes::Bytes::new()),
            len => Chunks::reading(len, Reader::new(stream)),
        };
        let metadata = call
            .route
            .service
            .call(
                call.route.index,
                ServerCall::InboundStream { request, chunks },
            )
            .await?;
        return Ok(ok(call.id, metadata, None));
    }
    let mut sink = ChunkSink::new(stream);
    let metadata = call
        .route
        .service
        .call(
            call.route.index,
            ServerCall::OutboundStream {
                request,
                sink: &mut sink,
            },
        )
        .await
        .map_err(|status| super::call::handlers_overflow(&call.route.endpoint, status))?;
    let sent = sink.finish().await?;
    let mut response = ok(call.id, metadata, None);
    response.pushed_len = sent;
    Ok(response)
}
