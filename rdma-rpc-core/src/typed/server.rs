//! The server side of a typed call: what a [`Service::call`](crate::Service::call) written by
//! hand uses to turn a [`ServerCall`] into a handler's typed arguments and its result into
//! the answer.
//!
//! A `call` matches `(index, call)`: the endpoint's index in the service's table and the
//! [`ServerCall`] variant its operation gets (`Inbound` for send and write, `Outbound` for
//! receive and read, `Streaming` for message streams, `InboundStream` and `OutboundStream`
//! for bulk streams). For each it [`decode_request`]s the message, runs the handler, and
//! answers with the [`encode_message`]d response; a handler that streams its responses hands
//! them to [`send_responses`]; a client's stream of requests becomes a typed request with
//! [`streaming_request`]. Any other pair is a runtime bug, answered by [`mismatched_call`].

use bytes::Bytes;
use futures_core::Stream;

use crate::service::{RawRequest, Request, ServerCall};
use crate::status::Status;
use crate::stream::{MessageSink, MessageStream, Streaming};
use crate::transport::BoxFuture;

/// Decodes a request message: a [`Request`] with the call's metadata, deadline and context.
/// A message that does not decode fails the call with `INVALID_ARGUMENT`.
pub fn decode_request<M: prost::Message + Default>(raw: RawRequest) -> Result<Request<M>, Status> {
    let mut raw = raw;
    let message = M::decode(std::mem::take(&mut raw.message))
        .map_err(|e| Status::invalid_argument(format!("malformed request message: {e}")))?;
    Ok(Request::from_parts(message, raw))
}

/// Encodes a message (a response, or a request on the client side). `()` encodes as no
/// bytes, the message of an endpoint without one.
pub fn encode_message<M: prost::Message>(message: &M) -> Bytes {
    Bytes::from(message.encode_to_vec())
}

/// The answer to a call that matches no endpoint of a service: `INTERNAL`, naming the
/// service, the kind of call and the index. The runtime checks calls against the table the
/// service returned, so reaching this is a bug in the service's `call` or in the runtime.
pub fn mismatched_call<'a>(
    service: &'static str,
    index: usize,
    call: ServerCall<'a>,
) -> BoxFuture<'a, Result<Bytes, Status>> {
    let kind = match call {
        ServerCall::Inbound { .. } => "inbound",
        ServerCall::Outbound { .. } => "outbound",
        ServerCall::Streaming { .. } => "message-streaming",
        ServerCall::InboundStream { .. } => "write-stream",
        ServerCall::OutboundStream { .. } => "read-stream",
    };
    Box::pin(async move {
        Err(Status::internal(format!(
            "service {service} has no {kind} endpoint #{index}"
        )))
    })
}

/// The request of a handler whose client streams its messages: the stream, typed, with the
/// call's metadata, deadline and context.
pub fn streaming_request<M: prost::Message + Default>(
    raw: RawRequest,
    requests: MessageStream,
) -> Request<Streaming<M>> {
    Request::from_parts(Streaming::new(requests), raw)
}

/// Sends a handler's stream of response messages into `sink`, then answers: the answer of a
/// server stream carries no message of its own. An `Err` item ends the call with that
/// status, after the messages before it.
pub async fn send_responses<M, S>(sink: &mut MessageSink, responses: S) -> Result<Bytes, Status>
where
    M: prost::Message,
    S: Stream<Item = Result<M, Status>>,
{
    sink.send_all(responses).await?;
    Ok(Bytes::new())
}
