//! The connections a TLS server accepted, held so that new settings can reach them: after
//! [`TlsTransport::reload_server`], [`TlsTransport::recheck_clients`] checks each live
//! connection's client certificate again, as a new handshake would, and closes those the
//! settings now refuse (revoked by a new list, signed by an authority no longer trusted,
//! expired, or missing where one is now required). Without it a revoked client keeps its
//! connection until the connection ends.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;

use super::{read, refusal_error, Side, TlsTransport};
use crate::error::Error;
use crate::transport::PeerIdentity;

/// A connection that can be ended from outside: what a TLS layer keeps of those it accepted
/// (the software transport's, and `doca+oob://`'s whose side channel runs TLS).
pub(crate) trait Revocable: Send + Sync {
    /// Ends the connection with `err`: its outstanding operations fail with it and the peer
    /// sees the connection close.
    fn revoke(&self, err: Error);
}

/// One accepted connection: who it is, and the connection while it lives.
struct Held {
    peer: String,
    identity: Option<Arc<PeerIdentity>>,
    conn: Weak<dyn Revocable>,
}

/// The connections a TLS layer accepted. Ended ones are dropped from it as it would grow, so
/// it holds about as many entries as connections live.
#[derive(Default)]
pub(super) struct Accepted {
    held: Mutex<Vec<Held>>,
}

impl Accepted {
    /// Holds `conn`, accepted from `peer`, who proved `identity` (none: no client certificate).
    pub(super) fn hold(
        &self,
        peer: String,
        identity: Option<Arc<PeerIdentity>>,
        conn: Weak<dyn Revocable>,
    ) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.len() == held.capacity() {
            held.retain(|h| h.conn.strong_count() > 0);
        }
        held.push(Held {
            peer,
            identity,
            conn,
        });
    }

    /// The connections still alive.
    fn live(&self) -> Vec<Live> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|h| h.conn.strong_count() > 0);
        held.iter()
            .filter_map(|h| {
                Some(Live {
                    peer: h.peer.clone(),
                    identity: h.identity.clone(),
                    conn: h.conn.upgrade()?,
                })
            })
            .collect()
    }
}

/// A held connection still alive, taken out of the lock to be checked.
struct Live {
    peer: String,
    identity: Option<Arc<PeerIdentity>>,
    conn: Arc<dyn Revocable>,
}

/// Why `verifier` (none: settings that ask for no client certificate) refuses a client that
/// proved `identity` (none: it presented no certificate), if it does.
pub(super) fn refusal(
    verifier: Option<&Arc<dyn ClientCertVerifier>>,
    identity: Option<&PeerIdentity>,
) -> Option<rustls::Error> {
    let verifier = verifier?;
    let Some((end_entity, intermediates)) = identity.and_then(|id| id.chain().split_first()) else {
        return verifier
            .client_auth_mandatory()
            .then_some(rustls::Error::NoCertificatesPresented);
    };
    let end_entity = CertificateDer::from(end_entity.as_ref());
    let intermediates: Vec<_> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.as_ref()))
        .collect();
    verifier
        .verify_client_cert(&end_entity, &intermediates, UnixTime::now())
        .err()
}

/// What [`TlsTransport::recheck_clients`] did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Recheck {
    /// Connections whose client the settings still accept (they go on untouched).
    pub kept: usize,
    /// Connections closed, each with its client and why.
    pub closed: Vec<ClosedClient>,
}

/// A connection [`TlsTransport::recheck_clients`] closed.
#[derive(Debug)]
#[non_exhaustive]
pub struct ClosedClient {
    /// The client's address (`tls://10.0.0.7:51234`, `doca+oob://…`).
    pub peer: String,
    /// The certificate it had proved (none: it had presented none).
    pub identity: Option<Arc<PeerIdentity>>,
    /// Why the settings refuse it: the error its connection ended with.
    pub reason: Error,
}

impl TlsTransport {
    /// Checks the client of every connection this transport accepted and still holds against
    /// the server settings in force, as a new handshake would, and closes the connections they
    /// refuse: a certificate a revocation list now names, one signed by an authority no longer
    /// among the client roots, one that expired, or none where the settings now require one.
    /// Each closed connection is logged (`WARN`) with why; its calls in flight fail with that
    /// error, and the client sees its connection end (it may connect again, and the new
    /// handshake decides). Connections this transport made as a client are not checked.
    ///
    /// Run it after [`reload_server`](Self::reload_server) so that new lists reach clients
    /// already connected:
    ///
    /// ```no_run
    /// # use rdma_rpc_core::transport::tls::{TlsTransport, ServerTlsConfig};
    /// # fn reload(tls: &TlsTransport, settings: ServerTlsConfig) -> rdma_rpc_core::Result<()> {
    /// tls.reload_server(settings)?;
    /// let recheck = tls.recheck_clients();
    /// for closed in &recheck.closed {
    ///     eprintln!("closed {}: {}", closed.peer, closed.reason);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// A handshake that was under way during the reload is checked against the new settings
    /// as it ends, so none slips between the two calls. Covers `tls://` connections and the
    /// `doca+oob://` connections of DOCA transports whose side channel runs this transport's
    /// TLS (`DocaTransport::with_side_channel_tls`).
    pub fn recheck_clients(&self) -> Recheck {
        let verifier = read(&self.layer.acceptor)
            .as_ref()
            .and_then(|a| a.verifier.clone());
        let mut recheck = Recheck::default();
        // Verified outside the lock: a signature check per connection takes a while.
        for Live {
            peer,
            identity,
            conn,
        } in self.layer.accepted.live()
        {
            match refusal(verifier.as_ref(), identity.as_deref()) {
                None => recheck.kept += 1,
                Some(tls) => {
                    let context = format!(
                        "recheck of {peer}'s client certificate under the current settings"
                    );
                    let reason = refusal_error(&tls, Side::Accepted, context);
                    tracing::warn!(
                        peer = %peer,
                        error = %reason,
                        "closing a connection whose client the TLS settings now refuse"
                    );
                    conn.revoke(reason.duplicate());
                    recheck.closed.push(ClosedClient {
                        peer,
                        identity,
                        reason,
                    });
                }
            }
        }
        recheck
    }
}
