#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Builder setters, one per configuration field: `name(value)` sets `self.config.name`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.config.$name = value;
                self
            }
        )*
    };
}

mod bounded;
mod call_box;
pub mod client;
#[doc(hidden)] // The paths of code generated before `typed`; see `typed`.
pub mod codegen;
mod encoded;
pub mod error;
pub mod health;
mod ids;
pub mod interceptor;
pub mod memory;
pub mod metadata;
pub mod observe;
#[cfg(feature = "doca")]
mod prefetch;
pub mod protocol;
pub mod remote;
pub mod server;
pub mod service;
mod session;
pub mod status;
pub mod stream;
pub mod transport;
pub mod typed;

pub use bytes::Bytes;
pub use client::{CallOptions, Client, ClientBuilder, ClientConfig, ClientStats};
pub use client::{Download, ReadStream};
pub use error::{Error, Result};
/// The `Stream` trait (of `futures-core`) that streaming handlers return and clients send:
/// any `Stream` works (`tokio-stream`, `futures`, `async-stream`, a hand-written one).
pub use futures_core::Stream;
pub use memory::{
    Access, Buffer, BufferPool, MemoryRegion, RegisteredBuf, SharedBuf, SharedRegion,
};
pub use metadata::Metadata;
/// The prost crate, the version generated messages derive `prost::Message` with: a message
/// written by hand derives it through this path too
/// (`#[derive(rdma_rpc_core::prost::Message)]` with
/// `#[prost(prost_path = "::rdma_rpc_core::prost")]`), and a handler that checks its response
/// against its limit calls `prost::Message::encoded_len`.
pub use prost;
pub use remote::{Offer, RegionOffer, RemoteBuf, RemoteMemory, Share};
pub use server::{
    BoundServer, ConnectionCount, ConnectionInfo, PoolInfo, Server, ServerBuilder, ServerConfig,
    ServerHandle,
};
pub use service::{
    CallContext, EndpointDef, IntoRequest, IntoStreamingRequest, OpKind, RawRequest, Request,
    ServerCall, Service, StreamKind,
};
pub use status::{Code, Status};
pub use stream::{ChunkSink, Chunks, MessageSink, MessageStream, Streaming};
pub use transport::PeerIdentity;

/// Generates a service's code from a spec file at compile time, without a build script:
/// `rdma_rpc_core::spec!("specs/kv_store.yaml");` (the path is relative to the crate's
/// `Cargo.toml`). Expands to the same items as the build-script generator; the crate
/// rebuilds when the spec changes.
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use rdma_rpc_macros::spec;

/// Includes the Rust code `rdma-rpc-codegen` generated in a build script for the spec file
/// with this stem (`include_spec!("kv_store")` for `specs/kv_store.yaml`).
#[macro_export]
macro_rules! include_spec {
    ($stem:literal) => {
        include!(concat!(env!("OUT_DIR"), "/", $stem, ".rs"));
    };
}

#[cfg(test)]
mod tests;
