//! Errors of the runtime and of the transports.

use std::fmt;

/// The result type of the transports and the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a one-sided operation was refused by the peer that owns the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccessViolation {
    /// No window with this key exists on this connection (never granted, revoked, or granted
    /// to another connection).
    UnknownKey,
    /// The range lies outside the granted window.
    OutOfBounds,
    /// The window does not grant this kind of access (for example a write into a read-only
    /// window).
    NotPermitted,
    /// An atomic operation on an address that is not 8-byte aligned.
    Misaligned,
}

impl AccessViolation {
    pub(crate) fn code(self) -> u32 {
        match self {
            AccessViolation::UnknownKey => 1,
            AccessViolation::OutOfBounds => 2,
            AccessViolation::NotPermitted => 3,
            AccessViolation::Misaligned => 4,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => AccessViolation::UnknownKey,
            2 => AccessViolation::OutOfBounds,
            3 => AccessViolation::NotPermitted,
            4 => AccessViolation::Misaligned,
            _ => return None,
        })
    }
}

impl fmt::Display for AccessViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessViolation::UnknownKey => "unknown or revoked memory key",
            AccessViolation::OutOfBounds => "range outside the granted window",
            AccessViolation::NotPermitted => "access not granted by the window",
            AccessViolation::Misaligned => "atomic address not 8-byte aligned",
        })
    }
}

/// An error of a transport operation or of the runtime.
///
/// Errors that end a connection say so in [`Error::is_connection_fatal`]; every operation that
/// was outstanding on that connection completes with [`Error::ConnectionClosed`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An address could not be parsed or names an unknown transport.
    #[error("invalid address `{addr}`: {reason}")]
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An operating-system I/O call failed. Its message carries the cause (`connecting to
    /// tcp://host:1: Connection refused`), which is also its `source`.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The connection is closed or in error; the operation did not (or not fully) happen.
    #[error("connection to {peer} closed: {reason}")]
    ConnectionClosed {
        /// The peer's address.
        peer: String,
        /// Why the connection ended (the first error seen on it).
        reason: String,
    },
    /// The peer refused a one-sided operation; the connection is now in error.
    #[error("remote access error on key {rkey:#x} at {addr:#x}+{len}: {violation}")]
    RemoteAccess {
        /// The memory key used.
        rkey: u32,
        /// The remote address used.
        addr: u64,
        /// The length of the access.
        len: u64,
        /// Why it was refused.
        violation: AccessViolation,
    },
    /// A send found no posted receive on the peer within the retry budget (RDMA's
    /// receiver-not-ready); the connection is now in error.
    #[error("receiver not ready: the peer posted no receive within {retry_ms} ms")]
    ReceiverNotReady {
        /// How long the transport retried.
        retry_ms: u64,
    },
    /// A message was larger than the receive buffer the peer had posted; the connection is now
    /// in error.
    #[error("message of {len} bytes does not fit the posted receive of {capacity} bytes")]
    ReceiveTooSmall {
        /// Bytes sent.
        len: u64,
        /// Capacity of the posted receive buffer.
        capacity: u64,
    },
    /// A bounded resource of this side is all in use; `what` names the setting that bounds
    /// it, `detail` what was asked and the ways out.
    #[error("{what} exhausted: {detail}")]
    Exhausted {
        /// The setting that bounds the resource.
        what: &'static str,
        /// What was asked, and what to do.
        detail: String,
    },
    /// A limit was hit; `limit` names it.
    #[error("limit `{limit}` exceeded: {actual} > {max}")]
    LimitExceeded {
        /// Which limit (as named in the configuration).
        limit: &'static str,
        /// The configured maximum.
        max: u64,
        /// The value that exceeded it.
        actual: u64,
    },
    /// Bytes written into a buffer do not fit it (`RegisteredBuf::fill_from`): in a handler,
    /// a result larger than its endpoint's buffer, which is the handler's error, not the
    /// client's.
    #[error("{len} bytes do not fit a buffer of {capacity} bytes")]
    DoesNotFit {
        /// Bytes to write.
        len: u64,
        /// The buffer's capacity.
        capacity: u64,
    },
    /// A local argument is invalid (a buffer too small, a range outside a buffer, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The peer broke the wire protocol (malformed or unexpected frame).
    #[error("protocol violation by {peer}: {reason}")]
    Protocol {
        /// The peer's address.
        peer: String,
        /// What was wrong.
        reason: String,
    },
    /// The peer speaks an incompatible protocol version.
    #[error("unsupported protocol version {theirs} (this build speaks {ours})")]
    VersionMismatch {
        /// Our version.
        ours: u32,
        /// The peer's version.
        theirs: u32,
    },
    /// TLS could not be set up (`tls://`): a certificate, key or root that does not load, or
    /// a handshake that either side refused (a certificate not signed by a trusted root, or
    /// not for the name dialled; a client without the certificate the server requires; a peer
    /// that does not speak TLS). `reason` names the cause and, where it can, what to change.
    #[error("TLS {context}: {reason}")]
    Tls {
        /// What was being done (`handshake with tls://10.0.0.2:7470`, `loading server.pem`).
        context: String,
        /// Why it failed.
        reason: String,
    },
    /// A client of several servers found none it could connect to (each is named, with why).
    #[error("no server is ready: {reasons}")]
    NoServer {
        /// Each server and why it is not ready, or why there is none.
        reasons: String,
    },
    /// A [`Resolver`](crate::client::balance::Resolver) could not name the servers (a DNS
    /// name without records, a discovery service that does not answer).
    #[error("resolving {name}: {source}")]
    Resolve {
        /// What was resolved (`tcp://storage.internal:7470`).
        name: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The DOCA provider reported an error.
    #[error("DOCA call {call} failed: {name}")]
    Doca {
        /// The C function that failed.
        call: &'static str,
        /// The DOCA error name.
        name: String,
        /// The raw `doca_error_t` value.
        code: i32,
    },
}

impl Error {
    /// Whether this error ended (or was caused by the end of) the connection it occurred on.
    pub fn is_connection_fatal(&self) -> bool {
        matches!(
            self,
            Error::ConnectionClosed { .. }
                | Error::RemoteAccess { .. }
                | Error::ReceiverNotReady { .. }
                | Error::ReceiveTooSmall { .. }
                | Error::Protocol { .. }
                | Error::VersionMismatch { .. }
                | Error::Io { .. }
        )
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A copy of this error for fanning one connection failure out to many operations.
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Error::InvalidAddress { addr, reason } => Error::InvalidAddress {
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::Io { context, source } => Error::Io {
                context: context.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::ConnectionClosed { peer, reason } => Error::ConnectionClosed {
                peer: peer.clone(),
                reason: reason.clone(),
            },
            Error::RemoteAccess {
                rkey,
                addr,
                len,
                violation,
            } => Error::RemoteAccess {
                rkey: *rkey,
                addr: *addr,
                len: *len,
                violation: *violation,
            },
            Error::ReceiverNotReady { retry_ms } => Error::ReceiverNotReady {
                retry_ms: *retry_ms,
            },
            Error::ReceiveTooSmall { len, capacity } => Error::ReceiveTooSmall {
                len: *len,
                capacity: *capacity,
            },
            Error::LimitExceeded { limit, max, actual } => Error::LimitExceeded {
                limit,
                max: *max,
                actual: *actual,
            },
            Error::Exhausted { what, detail } => Error::Exhausted {
                what,
                detail: detail.clone(),
            },
            Error::DoesNotFit { len, capacity } => Error::DoesNotFit {
                len: *len,
                capacity: *capacity,
            },
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::Protocol { peer, reason } => Error::Protocol {
                peer: peer.clone(),
                reason: reason.clone(),
            },
            Error::VersionMismatch { ours, theirs } => Error::VersionMismatch {
                ours: *ours,
                theirs: *theirs,
            },
            Error::Tls { context, reason } => Error::Tls {
                context: context.clone(),
                reason: reason.clone(),
            },
            Error::NoServer { reasons } => Error::NoServer {
                reasons: reasons.clone(),
            },
            Error::Resolve { name, source } => Error::Resolve {
                name: name.clone(),
                source: source.to_string().into(),
            },
            Error::Doca { call, name, code } => Error::Doca {
                call,
                name: name.clone(),
                code: *code,
            },
        }
    }
}
