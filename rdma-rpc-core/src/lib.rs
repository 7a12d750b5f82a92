#![doc = include_str!("../README.md")]

pub mod client;
#[doc(hidden)]
pub mod codegen;
pub mod error;
pub mod memory;
pub mod protocol;
pub mod server;
pub mod service;
pub mod status;
pub mod transport;

pub use client::{Client, ClientBuilder, ClientConfig, ClientStats};
pub use error::{Error, Result};
pub use memory::{Access, BufferPool, RegisteredBuf};
pub use server::{BoundServer, Server, ServerBuilder, ServerConfig};
pub use service::{EndpointDef, IntoRequest, OpKind, RawRequest, Request, ServerCall, Service};
pub use status::{Code, Status};

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
