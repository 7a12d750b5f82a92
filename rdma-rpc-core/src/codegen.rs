//! What generated code uses. Not a public API: it changes with the generator.

pub use std::future::Future;
pub use std::sync::Arc;

pub use bytes::Bytes;
pub use prost;

pub use crate::client::Client;
pub use crate::client::{Download, ReadStream};
pub use crate::error::Error;
pub use crate::memory::{Buffer, RegisteredBuf};
pub use crate::remote::RemoteBuf;
pub use crate::service::{
    EndpointDef, IntoRequest, IntoStreamingRequest, OpKind, RawRequest, Request, ServerCall,
    Service, StreamKind,
};
pub use crate::status::{Code, Status};
pub use crate::stream::{ChunkSink, Chunks, MessageSink, MessageStream, Streaming};
pub use crate::transport::BoxFuture;
pub use futures_core::Stream;

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

/// The request of a handler whose client streams its messages: the stream, typed, with the
/// call's metadata, deadline and context.
pub fn streaming_request<M: prost::Message + Default>(
    raw: RawRequest,
    requests: MessageStream,
) -> Request<Streaming<M>> {
    Request::from_parts(Streaming::new(requests), raw)
}

/// Sends a handler's stream of response messages, then answers (the answer of a server
/// stream carries no message of its own).
pub async fn send_responses<M, S>(sink: &mut MessageSink, responses: S) -> Result<Bytes, Status>
where
    M: prost::Message,
    S: Stream<Item = Result<M, Status>>,
{
    sink.send_all(responses).await?;
    Ok(Bytes::new())
}

/// The server streams its responses (the client sends one request message): its messages,
/// typed.
pub async fn call_server_stream<Req, Resp>(
    client: &Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
) -> Result<Streaming<Resp>, Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let (message, options) = request.into_call();
    let stream = client
        .call_raw_server_stream(endpoint, encode_message(&message), None, options)
        .await?;
    Ok(Streaming::new(stream))
}

/// The client streams its requests and the server answers once: the decoded response.
pub async fn call_client_stream<S, Resp>(
    client: &Client,
    endpoint: &'static EndpointDef,
    request: Request<S>,
) -> Result<Resp, Status>
where
    S: Stream + Send + 'static,
    S::Item: prost::Message,
    Resp: prost::Message + Default,
{
    let (requests, options) = request.into_call();
    let response = client
        .call_raw_client_stream(endpoint, encoded(requests), options)
        .await?;
    Resp::decode(response).map_err(|e| Status::internal(format!("malformed response message: {e}")))
}

/// Both stream: the client's messages go out from a task of their own; the server's come back.
pub async fn call_bidi_stream<S, Resp>(
    client: &Client,
    endpoint: &'static EndpointDef,
    request: Request<S>,
) -> Result<Streaming<Resp>, Status>
where
    S: Stream + Send + 'static,
    S::Item: prost::Message,
    Resp: prost::Message + Default,
{
    let (requests, options) = request.into_call();
    let stream = client
        .call_raw_server_stream(endpoint, Bytes::new(), Some(encoded(requests)), options)
        .await?;
    Ok(Streaming::new(stream))
}

/// A bulk read as it arrives: its chunks, then its decoded response.
pub async fn call_read_stream<Req, Resp>(
    client: &Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
) -> Result<Download<Resp>, Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let (message, options) = request.into_call();
    let raw = client
        .call_raw_read_stream(endpoint, encode_message(&message), options)
        .await?;
    Ok(Download::new(raw))
}

/// Encodes each message of `messages`.
fn encoded<S>(messages: S) -> crate::client::RequestStream
where
    S: Stream + Send + 'static,
    S::Item: prost::Message,
{
    struct Encoded<S>(std::pin::Pin<Box<S>>);
    impl<S> Stream for Encoded<S>
    where
        S: Stream,
        S::Item: prost::Message,
    {
        type Item = Bytes;

        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Bytes>> {
            self.0
                .as_mut()
                .poll_next(cx)
                .map(|next| next.map(|m| encode_message(&m)))
        }
    }
    Box::pin(Encoded(Box::pin(messages)))
}
