//! Typed calls for services and clients written by hand: the API generated code calls.
//!
//! `rdma-rpc-codegen` turns a spec into a service trait, a `<Service>Server<T>` that
//! implements [`Service`](crate::Service) for it, and a `<Service>Client`; their bodies are
//! calls into this module, as tonic's generated code calls `tonic::client::Grpc` and
//! `tonic::server::Grpc`. A service without a spec (or one that wants to do something the
//! generator does not) is written the same way:
//!
//! - an endpoint table, `&'static [EndpointDef]`: the path, operation, buffer size, method
//!   name, timeout and stream kind of each endpoint;
//! - a server: a type that implements [`Service`](crate::Service), whose `call` matches the
//!   endpoint's index and [`ServerCall`](crate::ServerCall) and uses [`server`] to decode the
//!   request message and encode the response;
//! - a client: a wrapper of a [`Client`](crate::Client) whose methods call [`client`], one
//!   function per call shape.
//!
//! Messages are prost messages; derive them through [`prost`], the version this
//! crate uses, with `#[prost(prost_path = "::rdma_rpc_core::prost")]` (or depend on the same
//! prost yourself).
//!
//! # Example
//!
//! A service with one `send` endpoint, its server and its client, over the in-process
//! transport:
//!
//! ```
//! use rdma_rpc_core::transport::BoxFuture;
//! use rdma_rpc_core::typed::{client, server};
//! use rdma_rpc_core::{
//!     Bytes, Client, EndpointDef, IntoRequest, OpKind, Request, Server, ServerCall, Service,
//!     Status, StreamKind,
//! };
//!
//! /// The request and response message.
//! #[derive(Clone, PartialEq, rdma_rpc_core::prost::Message)]
//! #[prost(prost_path = "::rdma_rpc_core::prost")]
//! pub struct Note {
//!     #[prost(string, tag = "1")]
//!     pub text: String,
//! }
//!
//! /// The endpoint table: entry `i` is what `call` runs for index `i`.
//! pub const ENDPOINTS: &[EndpointDef] = &[EndpointDef {
//!     path: "/notes",
//!     op: OpKind::Send,
//!     buffer_size: 64 << 10,
//!     method: "post",
//!     timeout_ms: Some(1000),
//!     stream: StreamKind::Unary,
//! }];
//!
//! /// The server: a note and its bytes in, the note with the byte count back.
//! #[derive(Debug)]
//! pub struct NotesServer;
//!
//! impl Service for NotesServer {
//!     fn name(&self) -> &'static str {
//!         "Notes"
//!     }
//!
//!     fn endpoints(&self) -> &'static [EndpointDef] {
//!         ENDPOINTS
//!     }
//!
//!     fn call<'a>(
//!         &'a self,
//!         index: usize,
//!         call: ServerCall<'a>,
//!     ) -> BoxFuture<'a, Result<Bytes, Status>> {
//!         match (index, call) {
//!             (0, ServerCall::Inbound { request, data }) => Box::pin(async move {
//!                 let request = server::decode_request::<Note>(request)?;
//!                 let text = format!("{} ({} bytes)", request.get_ref().text, data.len());
//!                 Ok(server::encode_message(&Note { text }))
//!             }),
//!             (index, call) => server::mismatched_call("Notes", index, call),
//!         }
//!     }
//! }
//!
//! /// The client: one method per endpoint.
//! #[derive(Debug, Clone)]
//! pub struct NotesClient(Client);
//!
//! impl NotesClient {
//!     pub async fn post(
//!         &self,
//!         request: impl IntoRequest<Note>,
//!         data: Bytes,
//!     ) -> Result<Note, Status> {
//!         client::call_inbound(&self.0, &ENDPOINTS[0], request.into_request(), data).await
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Server::builder()
//!     .add_service(NotesServer)
//!     .bind("mem://typed-notes")
//!     .await?;
//! tokio::spawn(server.serve());
//! let notes = NotesClient(Client::connect("mem://typed-notes").await?);
//! let note = Note { text: "hello".into() };
//! let reply = notes.post(note, Bytes::from_static(b"four")).await?;
//! assert_eq!(reply.text, "hello (4 bytes)");
//! # Ok(())
//! # }
//! ```
//!
//! `examples/src/hand_written.rs` writes the doca-cpp example spec's service this way, every
//! operation included, and `rdma_rpc_core::health` is a service written on this module.

pub mod client;
pub mod server;
