//! The client side of a typed call: one function per call shape, over a [`Client`].
//!
//! Each takes the endpoint (an entry of the service's `&'static [EndpointDef]` table, so the
//! client knows its path, operation, buffer size, timeout and stream kind) and a typed
//! [`Request`]; it encodes the request message (prost), runs the call through
//! [`Client`]'s raw calls and decodes the response message. A response that does not decode
//! fails the call with `INTERNAL`.
//!
//! | endpoint | function |
//! | --- | --- |
//! | `send`, `write` (and a bulk write stream) | [`call_inbound`] |
//! | `receive`, `read` (and a bulk read stream, whole) | [`call_outbound`], [`call_outbound_into`] |
//! | bulk read stream, chunk by chunk | [`call_read_stream`] |
//! | server streaming | [`call_server_stream`] |
//! | client streaming | [`call_client_stream`] |
//! | bidirectional streaming | [`call_bidi_stream`] |
//!
//! How the bytes move is the runtime's choice, per call: a payload up to the connection's
//! inline threshold (8 KiB by default) travels inside the request frame; a larger one is
//! RDMA-written into one of the connection's write slots when one is free, else offered in a
//! read-only window the server pulls from by RDMA read (or, when the server does not pull,
//! written into a window it grants: two round trips). A result up to the inline threshold
//! comes back inside the response frame; a larger one is RDMA-written by the server into a
//! window the client offered with the request (a second round trip if it did not fit).
//!
//! A call on an endpoint without payload passes `Bytes::new()` to [`call_inbound`] or drops
//! the empty bytes [`call_outbound`] returns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;

use super::server::encode_message;
use crate::client::{Client, Download, RequestStream};
use crate::encoded::Encoded;
use crate::memory::Buffer;
use crate::service::{EndpointDef, Request};
use crate::status::Status;
use crate::stream::Streaming;

/// Decodes a response message.
fn decode_response<M: prost::Message + Default>(bytes: Bytes) -> Result<M, Status> {
    M::decode(bytes).map_err(|e| Status::internal(format!("malformed response message: {e}")))
}

/// A send or write call (a bulk write stream too): moves `data` to the server with the
/// request and returns the decoded response. An endpoint without payload takes
/// `Bytes::new()`.
///
/// ```no_run
/// # async fn f(client: &rdma_rpc_core::Client, table: &'static [rdma_rpc_core::EndpointDef])
/// # -> Result<(), rdma_rpc_core::Status> {
/// use rdma_rpc_core::{typed, Bytes, Request};
/// let (): () = typed::client::call_inbound(
///     client,
///     &table[0],
///     Request::new(()),
///     Bytes::from_static(b"bytes"),
/// )
/// .await?;
/// # Ok(()) }
/// ```
pub fn call_inbound<'a, Req, Resp>(
    client: &'a Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
    data: Bytes,
) -> impl Future<Output = Result<Resp, Status>> + 'a
where
    Req: prost::Message,
    Resp: prost::Message + Default + 'a,
{
    let (message, options) = request.into_call();
    let message = Encoded::of(&message);
    client.call_encoded(endpoint, message, Some(data), options, |response, _| {
        decode_response(response)
    })
}

/// A receive or read call (a bulk read stream too, collected whole): returns the decoded
/// response and the bytes the server sent (empty for an endpoint without payload).
pub fn call_outbound<'a, Req, Resp>(
    client: &'a Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
) -> impl Future<Output = Result<(Resp, Bytes), Status>> + 'a
where
    Req: prost::Message,
    Resp: prost::Message + Default + 'a,
{
    let (message, options) = request.into_call();
    let message = Encoded::of(&message);
    client.call_encoded(endpoint, message, None, options, |response, data| {
        Ok((decode_response(response)?, data))
    })
}

/// A receive or read call whose bytes land in `dst`, memory registered once (a lease of a
/// `MemoryRegion` or of a `SharedRegion`): returns the decoded response and `dst` holding
/// them. A result larger than `dst` fails with `OUT_OF_RANGE`.
pub fn call_outbound_into<'a, Req, Resp, B>(
    client: &'a Client,
    endpoint: &'static EndpointDef,
    request: Request<Req>,
    dst: B,
) -> impl Future<Output = Result<(Resp, B), Status>> + 'a
where
    Req: prost::Message,
    Resp: prost::Message + Default + 'a,
    B: Buffer + 'a,
{
    let (message, options) = request.into_call();
    let message = Encoded::of(&message);
    client.call_encoded_into(endpoint, message, dst, options, |response, dst| {
        Ok((decode_response(response)?, dst))
    })
}

/// A bulk read stream as it arrives: its chunks, then its decoded response
/// ([`Download::response`]).
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

/// The server streams its responses (the client sends one request message): its messages,
/// typed, as they arrive.
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

/// The client streams its requests (any `Stream` of messages, wrapped in a [`Request`]) and
/// the server answers once: the decoded response.
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
    decode_response(response)
}

/// Both stream: the client's messages go out from a task of their own; the server's come
/// back, typed, as they arrive.
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

/// Encodes each message of `messages`.
fn encoded<S>(messages: S) -> RequestStream
where
    S: Stream + Send + 'static,
    S::Item: prost::Message,
{
    struct Encoded<S>(Pin<Box<S>>);
    impl<S> Stream for Encoded<S>
    where
        S: Stream,
        S::Item: prost::Message,
    {
        type Item = Bytes;

        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
            self.0
                .as_mut()
                .poll_next(cx)
                .map(|next| next.map(|m| encode_message(&m)))
        }
    }
    Box::pin(Encoded(Box::pin(messages)))
}
