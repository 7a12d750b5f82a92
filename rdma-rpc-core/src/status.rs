//! The outcome of a call: a [`Code`] in the spirit of gRPC's, and a message.

use std::fmt;

/// Status codes. The numbers are gRPC's, so they read the same in logs and dashboards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// Success.
    Ok = 0,
    /// The caller cancelled the call.
    Cancelled = 1,
    /// An error with no better code.
    Unknown = 2,
    /// The request is malformed, or does not fit the endpoint (wrong operation, too large).
    InvalidArgument = 3,
    /// The deadline passed before the call completed.
    DeadlineExceeded = 4,
    /// No such endpoint (path).
    NotFound = 5,
    /// The entity already exists.
    AlreadyExists = 6,
    /// The caller may not do this.
    PermissionDenied = 7,
    /// A limit was hit (requests in flight, connections, buffers, message size).
    ResourceExhausted = 8,
    /// The system is not in a state that allows the call.
    FailedPrecondition = 9,
    /// The call was aborted (for example the transfer failed).
    Aborted = 10,
    /// Out of range.
    OutOfRange = 11,
    /// The endpoint exists but is not implemented.
    Unimplemented = 12,
    /// A bug or broken invariant on the server.
    Internal = 13,
    /// The peer is unreachable or the connection ended; retrying may help.
    Unavailable = 14,
    /// Unrecoverable data loss.
    DataLoss = 15,
    /// Missing or bad credentials.
    Unauthenticated = 16,
}

impl Code {
    /// The code from its number; unknown numbers are [`Code::Unknown`].
    pub fn from_u32(v: u32) -> Code {
        use Code::*;
        [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ]
        .get(v as usize)
        .copied()
        .unwrap_or(Unknown)
    }

    /// The code's name, as gRPC spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// The error of a call: a code and a message for people.
///
/// Two statuses are equal when their codes and messages are: a message never carries a
/// figure that changes from call to call (a countdown, a time), so that logs and alerts can
/// group errors by it. Such figures have accessors of their own
/// ([`retry_after`](Status::retry_after)).
#[derive(Clone)]
pub struct Status {
    code: Code,
    message: String,
    /// When the client will try again (a reconnection's backoff); not sent on the wire.
    retry_after: Option<std::time::Duration>,
}

impl PartialEq for Status {
    fn eq(&self, other: &Status) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl Eq for Status {}

macro_rules! constructors {
    ($($(#[$doc:meta])* $name:ident => $code:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(message: impl Into<String>) -> Status {
                Status::new(Code::$code, message)
            }
        )*
    };
}

impl Status {
    /// A status with a code and a message.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    constructors! {
        /// [`Code::Cancelled`].
        cancelled => Cancelled,
        /// [`Code::Unknown`].
        unknown => Unknown,
        /// [`Code::InvalidArgument`].
        invalid_argument => InvalidArgument,
        /// [`Code::DeadlineExceeded`].
        deadline_exceeded => DeadlineExceeded,
        /// [`Code::NotFound`].
        not_found => NotFound,
        /// [`Code::AlreadyExists`].
        already_exists => AlreadyExists,
        /// [`Code::PermissionDenied`].
        permission_denied => PermissionDenied,
        /// [`Code::ResourceExhausted`].
        resource_exhausted => ResourceExhausted,
        /// [`Code::FailedPrecondition`].
        failed_precondition => FailedPrecondition,
        /// [`Code::Aborted`].
        aborted => Aborted,
        /// [`Code::OutOfRange`].
        out_of_range => OutOfRange,
        /// [`Code::Unimplemented`].
        unimplemented => Unimplemented,
        /// [`Code::Internal`].
        internal => Internal,
        /// [`Code::Unavailable`].
        unavailable => Unavailable,
        /// [`Code::DataLoss`].
        data_loss => DataLoss,
        /// [`Code::Unauthenticated`].
        unauthenticated => Unauthenticated,
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// How long until the client tries again, when it said so: a call refused at once
    /// (`UNAVAILABLE`) while the client waits out the backoff after a failed reconnection
    /// carries the time left until the next attempt. The message says the same without the
    /// figure, so that it reads the same for every such call.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after
    }

    /// Sets [`retry_after`](Status::retry_after).
    pub(crate) fn with_retry_after(mut self, wait: std::time::Duration) -> Status {
        self.retry_after = Some(wait);
        self
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({}: {:?}", self.code, self.message)?;
        if let Some(wait) = self.retry_after {
            write!(f, ", retry after {wait:?}")?;
        }
        f.write_str(")")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

impl From<crate::Error> for Status {
    fn from(e: crate::Error) -> Status {
        use crate::Error as E;
        let code = match &e {
            E::LimitExceeded { .. } | E::Exhausted { .. } => Code::ResourceExhausted,
            E::InvalidArgument(_) | E::InvalidAddress { .. } => Code::InvalidArgument,
            E::RemoteAccess { .. } => Code::Aborted,
            E::VersionMismatch { .. } => Code::FailedPrecondition,
            E::Protocol { .. } | E::DoesNotFit { .. } => Code::Internal,
            _ => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}
