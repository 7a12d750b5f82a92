//! Who may call whom, with the framework's own tools: a shared secret per tier carried in each
//! call's metadata (a client interceptor adds it, a server interceptor checks it).
//!
//! Two secrets, so that each tier takes calls from the tier above it only:
//! - the **target secret**, known to the targets and their service: targets refuse control and
//!   I/O from anyone else (an initiator, or any client that reaches their port);
//! - the **service secret**, known to the service and its initiator.
//!
//! A call without the secret is refused with `UNAUTHENTICATED`, one with a wrong secret with
//! `PERMISSION_DENIED`, before any handler runs; the server logs each refusal (`WARN`). The
//! secret travels in the clear in the call's metadata: on a network others can read, run the
//! transport over a link they cannot (the secret keeps out callers, not eavesdroppers).

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use rdma_rpc_core::interceptor::{IncomingCall, OutgoingCall};
use rdma_rpc_core::{Code, Status};

/// The metadata key the secret travels under.
pub const SECRET_KEY: &str = "storage-secret";

/// Environment variable of the service secret (the initiator presents it, the service checks
/// it).
pub const SERVICE_SECRET_ENV: &str = "STORAGE_SERVICE_SECRET";

/// Environment variable of the target secret (the service presents it, the targets check it).
pub const TARGET_SECRET_ENV: &str = "STORAGE_TARGET_SECRET";

/// A shared secret. Its `Debug` output never shows it.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A given secret: at least 16 bytes.
    pub fn new(secret: &str) -> Result<Secret, String> {
        if secret.len() < 16 {
            return Err(format!(
                "a secret of {} bytes is too short to keep anyone out: use at least 16",
                secret.len()
            ));
        }
        Ok(Secret(secret.into()))
    }

    /// A fresh random secret (128 bits), for parts started together in one process.
    pub fn random() -> Secret {
        let word = |n: u64| RandomState::new().hash_one(n);
        Secret(format!("{:016x}{:016x}", word(1), word(2)).into())
    }

    /// The secret from a flag's value if given, else from environment variable `env`; an
    /// error naming both when neither is set.
    pub fn from_flag_or_env(
        flag: Option<&str>,
        flag_name: &str,
        env: &str,
    ) -> Result<Secret, String> {
        match flag {
            Some(value) => Secret::new(value).map_err(|e| format!("{flag_name}: {e}")),
            None => match std::env::var(env) {
                Ok(value) => Secret::new(&value).map_err(|e| format!("{env}: {e}")),
                Err(_) => Err(format!(
                    "no secret: set {env} or pass {flag_name} (the same on both ends)"
                )),
            },
        }
    }

    /// A client interceptor that puts the secret in every call.
    pub fn present(
        &self,
    ) -> impl Fn(&mut OutgoingCall<'_>) -> Result<(), Status> + Send + Sync + 'static {
        // Made once: each call's metadata shares these bytes.
        let secret = bytes::Bytes::copy_from_slice(self.0.as_bytes());
        move |call| {
            call.metadata_mut()
                .insert_static(SECRET_KEY, secret.clone());
            Ok(())
        }
    }

    /// A server interceptor that answers calls without this secret with `UNAUTHENTICATED` and
    /// calls with another one with `PERMISSION_DENIED`; `who` names the callers it expects
    /// (in the refusal).
    pub fn require(
        &self,
        who: &'static str,
    ) -> impl Fn(&mut IncomingCall<'_>) -> Result<(), Status> + Send + Sync + 'static {
        let secret = self.0.clone();
        move |call| match call.metadata().get(SECRET_KEY) {
            None => Err(Status::new(
                Code::Unauthenticated,
                format!(
                    "{} takes calls from {who} only: this call carries no {SECRET_KEY}",
                    call.endpoint().path
                ),
            )),
            Some(given) if same(given, secret.as_bytes()) => Ok(()),
            Some(_) => Err(Status::new(
                Code::PermissionDenied,
                format!(
                    "{} takes calls from {who} only: wrong {SECRET_KEY}",
                    call.endpoint().path
                ),
            )),
        }
    }
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_checked_and_never_shown() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        let s = Secret::random();
        assert_eq!(s.0.len(), 32);
        assert_ne!(s.0, Secret::random().0, "fresh each time");
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert!(Secret::new("short").unwrap_err().contains("at least 16"));
        let err =
            Secret::from_flag_or_env(None, "--secret", "STORAGE_TEST_UNSET_SECRET").unwrap_err();
        assert!(
            err.contains("STORAGE_TEST_UNSET_SECRET") && err.contains("--secret"),
            "{err}"
        );
    }
}
