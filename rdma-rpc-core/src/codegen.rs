//! The paths code generated before [`typed`](crate::typed) existed refers to
//! (`::rdma_rpc_core::codegen::...`), kept so that such code still compiles. Hidden and
//! frozen: generated code now names the crate root, [`typed::client`](crate::typed::client)
//! and [`typed::server`](crate::typed::server), and so should code written by hand.

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
pub use crate::typed::client::{
    call_bidi_stream, call_client_stream, call_inbound, call_outbound, call_outbound_into,
    call_read_stream, call_server_stream,
};
pub use crate::typed::server::{
    decode_request, encode_message, mismatched_call, send_responses, streaming_request,
};
pub use futures_core::Stream;
