//! Interceptors: code that runs for every call, before it leaves a client or before a
//! server's handler sees it. They read and set [`Metadata`] (add a token, check it) and may
//! refuse a call with a [`Status`].
//!
//! ```
//! use rdma_rpc_core::{Client, Code, Server, Status};
//! use rdma_rpc_core::interceptor::{IncomingCall, OutgoingCall};
//!
//! // Every call of this client carries a token ...
//! let client = Client::builder().interceptor(|call: &mut OutgoingCall<'_>| {
//!     call.metadata_mut().insert("authorization", "Bearer 0123");
//!     Ok(())
//! });
//! // ... and this server answers UNAUTHENTICATED to calls without it.
//! let server = Server::builder().interceptor(|call: &mut IncomingCall<'_>| {
//!     match call.metadata().get_str("authorization") {
//!         Some("Bearer 0123") => Ok(()),
//!         _ => Err(Status::new(Code::Unauthenticated, "no valid token")),
//!     }
//! });
//! ```
//!
//! Interceptors run in the order they were added, on the task that makes (client) or reads
//! (server) the call, so they must not block. A refusal ends the call with its status: on a
//! client before anything is sent, on a server before the handler runs (logged at `WARN`,
//! the first few of each code and then one line per interval with the count left out;
//! `rdma_rpc_server_calls_refused_total` counts every one).
//! They are plain functions rather than tower layers: a call's bytes move by RDMA between
//! windows both ends hold, which a layer that owns the request and response could not
//! express; what interceptors see is what can change (metadata) or decide (refuse).

use std::sync::Arc;

use crate::metadata::Metadata;
use crate::service::EndpointDef;
use crate::status::Status;
use crate::transport::PeerIdentity;

/// A call about to leave a client.
#[derive(Debug)]
pub struct OutgoingCall<'a> {
    pub(crate) endpoint: &'a EndpointDef,
    pub(crate) metadata: &'a mut Metadata,
}

impl OutgoingCall<'_> {
    /// The endpoint called.
    pub fn endpoint(&self) -> &EndpointDef {
        self.endpoint
    }

    /// The call's metadata.
    pub fn metadata(&self) -> &Metadata {
        self.metadata
    }

    /// The call's metadata, to add to.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        self.metadata
    }
}

/// A call that reached a server, before its handler.
#[derive(Debug)]
pub struct IncomingCall<'a> {
    pub(crate) service: &'static str,
    pub(crate) endpoint: &'a EndpointDef,
    pub(crate) peer: &'a str,
    pub(crate) peer_identity: Option<&'a PeerIdentity>,
    pub(crate) metadata: &'a mut Metadata,
}

impl IncomingCall<'_> {
    /// The name of the service called.
    pub fn service(&self) -> &'static str {
        self.service
    }

    /// The endpoint called.
    pub fn endpoint(&self) -> &EndpointDef {
        self.endpoint
    }

    /// The client's address.
    pub fn peer(&self) -> &str {
        self.peer
    }

    /// Who the client proved to be: its certificate, over `tls://` with client certificates
    /// (mutual TLS); `None` otherwise. See [`PeerIdentity`].
    pub fn peer_identity(&self) -> Option<&PeerIdentity> {
        self.peer_identity
    }

    /// The metadata the client sent.
    pub fn metadata(&self) -> &Metadata {
        self.metadata
    }

    /// The metadata, to change what the handler sees (an identity a token resolved to, say).
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        self.metadata
    }
}

/// Runs before each call leaves a client. Closures `Fn(&mut OutgoingCall<'_>) -> Result<(),
/// Status>` are interceptors.
pub trait ClientInterceptor: Send + Sync + 'static {
    /// Looks at (and may change) the call; an error ends it with that status.
    fn intercept(&self, call: &mut OutgoingCall<'_>) -> Result<(), Status>;
}

impl<F> ClientInterceptor for F
where
    F: Fn(&mut OutgoingCall<'_>) -> Result<(), Status> + Send + Sync + 'static,
{
    fn intercept(&self, call: &mut OutgoingCall<'_>) -> Result<(), Status> {
        self(call)
    }
}

/// Runs before a server's handler for each call. Closures `Fn(&mut IncomingCall<'_>) ->
/// Result<(), Status>` are interceptors.
pub trait ServerInterceptor: Send + Sync + 'static {
    /// Looks at (and may change) the call; an error answers it with that status.
    fn intercept(&self, call: &mut IncomingCall<'_>) -> Result<(), Status>;
}

impl<F> ServerInterceptor for F
where
    F: Fn(&mut IncomingCall<'_>) -> Result<(), Status> + Send + Sync + 'static,
{
    fn intercept(&self, call: &mut IncomingCall<'_>) -> Result<(), Status> {
        self(call)
    }
}

/// Interceptors of one end, in order.
pub(crate) struct Chain<I: ?Sized>(Vec<Arc<I>>);

impl<I: ?Sized> Clone for Chain<I> {
    fn clone(&self) -> Self {
        Chain(self.0.clone())
    }
}

impl<I: ?Sized> Default for Chain<I> {
    fn default() -> Self {
        Chain(Vec::new())
    }
}

impl<I: ?Sized> std::fmt::Debug for Chain<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} interceptor(s)", self.0.len())
    }
}

impl<I: ?Sized> Chain<I> {
    pub(crate) fn push(&mut self, interceptor: Arc<I>) {
        self.0.push(interceptor);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Chain<dyn ClientInterceptor> {
    pub(crate) fn run(&self, call: &mut OutgoingCall<'_>) -> Result<(), Status> {
        self.0.iter().try_for_each(|i| i.intercept(call))
    }
}

impl Chain<dyn ServerInterceptor> {
    pub(crate) fn run(&self, call: &mut IncomingCall<'_>) -> Result<(), Status> {
        self.0.iter().try_for_each(|i| i.intercept(call))
    }
}
