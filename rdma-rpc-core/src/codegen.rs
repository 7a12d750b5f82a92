//! What generated code uses. Not a public API: it changes with the generator.

pub use std::future::Future;
pub use std::sync::Arc;

pub use bytes::Bytes;
pub use prost;

pub use crate::client::Client;
pub use crate::error::Error;
pub use crate::memory::{Buffer, RegisteredBuf};
pub use crate::remote::RemoteBuf;
pub use crate::service::{
    EndpointDef, IntoRequest, OpKind, RawRequest, Request, ServerCall, Service, StreamKind,
};
pub use crate::status::{Code, Status};
pub use crate::transport::BoxFuture;

/// Decodes a request message.
pub fn decode_request<M: prost::Message + Default>(raw: RawRequest) -> Result<Request<M>, Status> {
    let mut raw = raw;
    let message = M::decode(std::mem::take(&mut raw.message))
        .map_err(|e| Status::invalid_argument(format!("malformed request message: {e}")))?;
    Ok(Request::from_parts(message, raw))
}

/// Encodes a response message.
pub fn encode_message<M: prost::Message>(message: &M) -> Bytes {
    Bytes::from(message.encode_to_vec())
}

/// The answer to a call that matches no endpoint of a service (a runtime bug if reached).
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

/// A send or write call: moves `data` to the server and returns the decoded response.
pub async fn call_inbound<Req, Resp>(
    client: &Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
    data: Bytes,
) -> Result<Resp, Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let (message, options) = request.into_call();
    let message = encode_message(&message);
    let (response, _) = client
        .call_raw(endpoint, message, Some(data), options)
        .await?;
    Resp::decode(response).map_err(|e| Status::internal(format!("malformed response message: {e}")))
}

/// A receive or read call whose bytes land in `dst`: returns the decoded response and `dst`
/// holding them.
pub async fn call_outbound_into<Req, Resp, B>(
    client: &Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
    dst: B,
) -> Result<(Resp, B), Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
    B: Buffer,
{
    let (message, options) = request.into_call();
    let message = encode_message(&message);
    let (response, dst) = client
        .call_raw_into(endpoint, message, dst, options)
        .await?;
    let response = Resp::decode(response)
        .map_err(|e| Status::internal(format!("malformed response message: {e}")))?;
    Ok((response, dst))
}

/// A receive or read call: returns the decoded response and the bytes the server sent.
pub async fn call_outbound<Req, Resp>(
    client: &Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
) -> Result<(Resp, Bytes), Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let (message, options) = request.into_call();
    let message = encode_message(&message);
    let (response, data) = client.call_raw(endpoint, message, None, options).await?;
    let response = Resp::decode(response)
        .map_err(|e| Status::internal(format!("malformed response message: {e}")))?;
    Ok((response, data))
}
