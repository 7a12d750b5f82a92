//! The software transport inside TLS: `tls://host:port` (rustls, with its `ring` provider).
//!
//! A TLS session sits between the socket and the software transport's packets; the packets,
//! the preamble and everything above them are [`tcp`](super)'s. What TLS adds: the bytes on the
//! wire are encrypted and authenticated (TLS 1.3, or 1.2 with a peer that offers no 1.3), the
//! server proves its name with a certificate signed by a root the client trusts, and with
//! [`ServerTlsConfig::client_roots`] the client proves its identity too (mutual TLS): the
//! server's interceptors and handlers read it as the call's [`PeerIdentity`]
//! ([`IncomingCall::peer_identity`](crate::interceptor::IncomingCall::peer_identity),
//! [`Request::peer_identity`](crate::Request::peer_identity)).
//!
//! ```no_run
//! use std::sync::Arc;
//! use rdma_rpc_core::transport::tls::{ClientTlsConfig, Identity, Roots, ServerTlsConfig, TlsTransport};
//! use rdma_rpc_core::{Client, Server};
//!
//! # async fn run() -> rdma_rpc_core::Result<()> {
//! // The server: its certificate and key, and (mutual TLS) the root its clients' certificates
//! // are signed by.
//! let tls = ServerTlsConfig::new(Identity::from_pem_files("server.pem", "server.key")?)
//!     .client_roots(Roots::from_pem_file("ca.pem")?);
//! let server = Server::builder()
//!     .transport(Arc::new(TlsTransport::server(tls)?))
//!     // .add_service(...)
//!     .bind("tls://0.0.0.0:7470")
//!     .await?;
//!
//! // A client: the root the server's certificate is signed by, and its own identity.
//! let tls = ClientTlsConfig::new(Roots::from_pem_file("ca.pem")?)
//!     .identity(Identity::from_pem_files("client.pem", "client.key")?);
//! let client = Client::builder()
//!     .transport(Arc::new(TlsTransport::client(tls)?))
//!     .connect("tls://server.example:7470")
//!     .await?;
//! # drop((server, client)); Ok(()) }
//! ```
//!
//! Revocation lists ([`RevocationLists`]: [`ServerTlsConfig::client_revocations`],
//! [`ClientTlsConfig::revocations`]) refuse the certificates they name. A running transport
//! takes new settings without a restart ([`TlsTransport::reload_server`],
//! [`TlsTransport::reload_client`]): a renewed certificate, other roots, new lists, for the
//! handshakes that follow; [`TlsTransport::recheck_clients`] then closes the connections of
//! clients already connected that the new settings refuse.
//!
//! Failures name their cause: a certificate file that does not load (its path), a server
//! certificate not signed by a trusted root or not for the name dialled, a client without the
//! certificate the server requires, a peer that does not speak TLS. A handshake that fails on
//! a server ends that connection only (logged within the log budget, like any refused peer).

mod config;
mod recheck;

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;
use rustls::{AlertDescription, CertificateError};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsStream};

pub use config::{ClientTlsConfig, Identity, RevocationLists, Roots, ServerTlsConfig};
pub(crate) use recheck::Revocable;
pub use recheck::{ClosedClient, Recheck};

use super::{Layer, Side, TcpConfig, TcpTransport};
use crate::error::{Error, Result};
use crate::transport::identity::Names;
use crate::transport::{BoxFuture, Connection, Fencing, Listener, PeerIdentity, Transport};
use config::{server_name, Connector};
use recheck::Accepted;

/// The software transport inside TLS: `tls://host:port`. Made for a server
/// ([`server`](Self::server)), a client ([`client`](Self::client)) or a process that is both
/// ([`new`](Self::new)); given to [`ServerBuilder::transport`](crate::ServerBuilder::transport)
/// or [`ClientBuilder::transport`](crate::ClientBuilder::transport). Cheap to clone.
#[derive(Debug, Clone)]
pub struct TlsTransport {
    /// The software transport, with `layer` under its packets.
    tcp: TcpTransport,
    layer: Arc<TlsLayer>,
}

impl TlsTransport {
    /// A transport that serves `tls://` with `server`'s settings.
    pub fn server(server: ServerTlsConfig) -> Result<TlsTransport> {
        TlsTransport::new(Some(server), None)
    }

    /// A transport that connects to `tls://` servers with `client`'s settings.
    pub fn client(client: ClientTlsConfig) -> Result<TlsTransport> {
        TlsTransport::new(None, Some(client))
    }

    /// A transport that serves with `server`'s settings and connects with `client`'s (either
    /// may be absent: that side is then refused). Fails if a certificate, key or root is
    /// unusable, naming which.
    pub fn new(
        server: Option<ServerTlsConfig>,
        client: Option<ClientTlsConfig>,
    ) -> Result<TlsTransport> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let layer = Arc::new(TlsLayer {
            acceptor: RwLock::new(
                server
                    .map(|s| Acceptor::new(&s, &provider, 0))
                    .transpose()?,
            ),
            accepted: Accepted::default(),
            connector: RwLock::new(client.map(|c| c.connector(&provider)).transpose()?),
            provider,
        });
        Ok(TlsTransport {
            tcp: TcpTransport {
                config: Arc::default(),
                layer: Layer::Tls(layer.clone()),
            },
            layer,
        })
    }

    /// The TLS it puts under the software transport's packets (for other transports' TCP
    /// sockets: the side channel of `doca+oob://`).
    #[cfg_attr(not(feature = "doca"), allow(dead_code))]
    pub(crate) fn layer(&self) -> &Arc<TlsLayer> {
        &self.layer
    }

    /// The same transport with the software transport's settings `config`.
    pub fn with_tcp_config(mut self, config: TcpConfig) -> TlsTransport {
        self.tcp.config = Arc::new(config);
        self
    }

    /// Serves with `server`'s settings from now on, without a restart: a renewed certificate,
    /// other client roots, new revocation lists. Handshakes that end after this returns are
    /// held to them; connections already made keep going ([`recheck_clients`](Self::recheck_clients)
    /// then closes those whose client the new settings refuse). Clones of this transport, and
    /// DOCA side channels made with it, share the change. If the settings are unusable (a key
    /// that is not the certificate's, say) this fails, naming why, and the old ones stay.
    pub fn reload_server(&self, server: ServerTlsConfig) -> Result<()> {
        let mut acceptor = write(&self.layer.acceptor);
        let generation = acceptor.as_ref().map_or(0, |a| a.generation + 1);
        *acceptor = Some(Acceptor::new(&server, &self.layer.provider, generation)?);
        Ok(())
    }

    /// Connects with `client`'s settings from now on, as
    /// [`reload_server`](Self::reload_server) serves with new ones.
    pub fn reload_client(&self, client: ClientTlsConfig) -> Result<()> {
        let connector = client.connector(&self.layer.provider)?;
        *write(&self.layer.connector) = Some(connector);
        Ok(())
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl Transport for TlsTransport {
    fn listen(&self, addr: &str) -> BoxFuture<'_, Result<Box<dyn Listener>>> {
        if !self.layer.serves() {
            let err = Error::InvalidArgument(format!(
                "cannot serve {addr}: this TlsTransport has no server certificate (make it \
                 with TlsTransport::server or TlsTransport::new)"
            ));
            return Box::pin(async move { Err(err) });
        }
        self.tcp.listen(addr)
    }

    fn connect(&self, addr: &str) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        if read(&self.layer.connector).is_none() {
            let err = Error::InvalidArgument(format!(
                "cannot connect to {addr}: this TlsTransport has no client settings (make it \
                 with TlsTransport::client or TlsTransport::new)"
            ));
            return Box::pin(async move { Err(err) });
        }
        self.tcp.connect(addr)
    }

    fn fencing(&self) -> Fencing {
        self.tcp.fencing()
    }
}

/// TLS between a socket and the software transport's packets (see `Layer`): the settings of
/// each side, which [`TlsTransport::reload_server`] and [`TlsTransport::reload_client`]
/// replace while handshakes go on (each handshake takes the settings of its start).
pub(crate) struct TlsLayer {
    acceptor: RwLock<Option<Acceptor>>,
    connector: RwLock<Option<Connector>>,
    provider: Arc<CryptoProvider>,
    /// The connections accepted with this layer, for [`TlsTransport::recheck_clients`].
    accepted: Accepted,
}

/// A server's settings in force: the acceptor, the verifier of client certificates it runs
/// (none when it asks for none), and how many reloads came before it.
struct Acceptor {
    tls: TlsAcceptor,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    generation: u64,
}

impl Acceptor {
    fn new(
        server: &ServerTlsConfig,
        provider: &Arc<CryptoProvider>,
        generation: u64,
    ) -> Result<Self> {
        let (tls, verifier) = server.acceptor(provider)?;
        Ok(Acceptor {
            tls,
            verifier,
            generation,
        })
    }
}

impl fmt::Debug for TlsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsLayer")
            .field("serves", &self.serves())
            .field("connects", &read(&self.connector).is_some())
            .finish()
    }
}

impl TlsLayer {
    /// Whether it has a server's settings (a certificate to serve with).
    pub(crate) fn serves(&self) -> bool {
        read(&self.acceptor).is_some()
    }

    /// Holds `conn`, accepted from `peer` who proved `identity` in its handshake, for
    /// [`TlsTransport::recheck_clients`].
    pub(crate) fn hold(
        &self,
        peer: &str,
        identity: Option<Arc<PeerIdentity>>,
        conn: Weak<dyn Revocable>,
    ) {
        self.accepted.hold(peer.to_owned(), identity, conn);
    }

    /// How many reloads of the server's settings came before the ones in force.
    #[cfg(test)]
    pub(crate) fn generation(&self) -> u64 {
        read(&self.acceptor).as_ref().map_or(0, |a| a.generation)
    }

    /// Refuses a client whose handshake ran under settings that a reload replaced while it ran
    /// (`generation`) if the settings now in force refuse it: none slips past
    /// [`TlsTransport::recheck_clients`] by finishing between the reload and the recheck.
    pub(crate) fn still_admitted(
        &self,
        generation: u64,
        identity: Option<&PeerIdentity>,
        peer: &str,
    ) -> Result<()> {
        let acceptor = read(&self.acceptor);
        let Some(now) = acceptor.as_ref().filter(|a| a.generation != generation) else {
            return Ok(());
        };
        match recheck::refusal(now.verifier.as_ref(), identity) {
            None => Ok(()),
            Some(tls) => Err(refusal_error(
                &tls,
                Side::Accepted,
                format!("handshake with {peer}"),
            )),
        }
    }

    /// Runs the handshake on a new socket, within `limit`: the TLS stream, and the identity
    /// the peer proved (a client's certificate, on a server that asks for one).
    pub(crate) async fn handshake(
        &self,
        stream: TcpStream,
        side: Side<'_>,
        peer: &str,
        limit: Duration,
    ) -> Result<(TlsStream<TcpStream>, Option<Arc<PeerIdentity>>)> {
        let handshake = async {
            match side {
                Side::Accepted => {
                    let Some((acceptor, generation)) = read(&self.acceptor)
                        .as_ref()
                        .map(|a| (a.tls.clone(), a.generation))
                    else {
                        return Err(no_side(peer, "serve"));
                    };
                    let stream = acceptor
                        .accept(stream)
                        .await
                        .map_err(|e| handshake_error(e, side, peer))?;
                    let identity = match stream.get_ref().1.peer_certificates() {
                        Some(chain) if !chain.is_empty() => Some(Arc::new(identity(chain, peer)?)),
                        _ => None,
                    };
                    self.still_admitted(generation, identity.as_deref(), peer)?;
                    Ok((TlsStream::from(stream), identity))
                }
                Side::Connected { host } => {
                    let Some(Connector {
                        connector,
                        server_name: named,
                    }) = read(&self.connector).clone()
                    else {
                        return Err(no_side(peer, "connect"));
                    };
                    let name = match named {
                        Some(name) => name,
                        None => server_name(host, &format!("connecting to {peer}"))?,
                    };
                    let stream = connector
                        .connect(name, stream)
                        .await
                        .map_err(|e| handshake_error(e, side, peer))?;
                    Ok((TlsStream::from(stream), None))
                }
            }
        };
        tokio::time::timeout(limit, handshake)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Protocol {
                    peer: peer.to_owned(),
                    reason: format!("no TLS handshake within {limit:?}"),
                })
            })
    }
}

/// A failure after the handshake that TLS caused (a client certificate the server refused is
/// only reported after the client's handshake ends, in TLS 1.3), said as a TLS error.
pub(crate) fn explain(err: Error, side: Side<'_>, peer: &str) -> Error {
    match err {
        Error::Io { source, .. } if rustls_error(&source).is_some() => {
            handshake_error(source, side, peer)
        }
        other => other,
    }
}

fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// A handshake's I/O error: a refusal by TLS (either side's) as [`Error::Tls`] with its cause
/// and what to change; a socket error as it is (a peer that went away).
fn handshake_error(e: std::io::Error, side: Side<'_>, peer: &str) -> Error {
    match rustls_error(&e) {
        Some(tls) => refusal_error(tls, side, format!("handshake with {peer}")),
        None => Error::io(format!("TLS handshake with {peer}"), e),
    }
}

/// A refusal by TLS (in `context`), with its cause and what to change.
fn refusal_error(tls: &rustls::Error, side: Side<'_>, context: String) -> Error {
    let hint = hint(tls, matches!(side, Side::Accepted));
    Error::Tls {
        context,
        reason: if hint.is_empty() {
            tls.to_string()
        } else {
            format!("{tls}: {hint}")
        },
    }
}

/// What to change about a refusal by TLS (empty where there is nothing to add), on a server
/// if `server`.
fn hint(tls: &rustls::Error, server: bool) -> &'static str {
    match tls {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) if server => {
            "the client's certificate is not signed by a root this server trusts \
             (ServerTlsConfig::client_roots)"
        }
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the server's certificate is not signed by a root this client trusts \
             (ClientTlsConfig roots)"
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            "the server's certificate does not name the host dialled: dial a name it carries, \
             or set ClientTlsConfig::server_name"
        }
        rustls::Error::InvalidCertificate(CertificateError::BadSignature) if server => {
            "the client's certificate names an authority this server trusts but is not signed \
             by it (another CA of the same name?)"
        }
        rustls::Error::InvalidCertificate(CertificateError::BadSignature) => {
            "the server's certificate names a root this client trusts but is not signed by it \
             (another CA of the same name?)"
        }
        rustls::Error::AlertReceived(AlertDescription::DecryptError) if server => {
            "the client could not verify this server's certificate (does it trust another CA \
             of the same name?)"
        }
        rustls::Error::InvalidCertRevocationList(_) => {
            "a revocation list given is unusable (not signed by the authority it names, or \
             not for it)"
        }
        rustls::Error::InvalidCertificate(CertificateError::Revoked) if server => {
            "the client's certificate is revoked (a list given to \
             ServerTlsConfig::client_revocations names it)"
        }
        rustls::Error::InvalidCertificate(CertificateError::Revoked) => {
            "the server's certificate is revoked (a list given to ClientTlsConfig::revocations \
             names it)"
        }
        rustls::Error::InvalidCertificate(CertificateError::UnknownRevocationStatus) if server => {
            "no revocation list of an issuer of the client's certificate was given: \
             ServerTlsConfig::client_revocations needs the list of every authority that signs"
        }
        rustls::Error::InvalidCertificate(CertificateError::UnknownRevocationStatus) => {
            "no revocation list of an issuer of the server's certificate was given: \
             ClientTlsConfig::revocations needs the list of every authority that signs"
        }
        rustls::Error::AlertReceived(AlertDescription::CertificateRevoked) if server => {
            "the client refused this server's certificate as revoked"
        }
        rustls::Error::AlertReceived(AlertDescription::CertificateRevoked) => {
            "the server refused this client's certificate as revoked"
        }
        rustls::Error::NoCertificatesPresented => {
            "the client presented no certificate and this server requires one (mutual TLS): \
             give the client an identity (ClientTlsConfig::identity)"
        }
        rustls::Error::AlertReceived(AlertDescription::CertificateRequired) => {
            "the server requires a client certificate (mutual TLS): give this client an \
             identity (ClientTlsConfig::identity)"
        }
        rustls::Error::AlertReceived(
            AlertDescription::UnknownCA | AlertDescription::BadCertificate,
        ) if server => "the client does not trust this server's certificate",
        rustls::Error::AlertReceived(
            AlertDescription::UnknownCA | AlertDescription::BadCertificate,
        ) => "the server does not trust this client's certificate",
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } if server => {
            "the client does not speak TLS (a tcp:// client of a tls:// server, or a doca+oob:// \
             client without side-channel TLS?)"
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the server does not speak TLS (is it serving tcp:// rather than tls://, or \
             doca+oob:// without side-channel TLS?)"
        }
        _ => "",
    }
}

fn no_side(peer: &str, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "cannot {what} {peer}: this TlsTransport has no settings for it"
    ))
}

/// The identity of a verified certificate chain: its first certificate's names.
fn identity(chain: &[CertificateDer<'_>], peer: &str) -> Result<PeerIdentity> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let unreadable = |e: &dyn fmt::Display| Error::Tls {
        context: format!("reading the certificate of {peer}"),
        reason: e.to_string(),
    };
    let (_, cert) = X509Certificate::from_der(&chain[0]).map_err(|e| unreadable(&e))?;
    let mut names = Names {
        subject: cert.subject().to_string(),
        common_name: cert
            .subject()
            .iter_common_name()
            .find_map(|cn| cn.as_str().ok())
            .map(str::to_owned),
        ..Names::default()
    };
    let san = cert
        .subject_alternative_name()
        .map_err(|e| unreadable(&e))?;
    for name in san.iter().flat_map(|san| &san.value.general_names) {
        match name {
            GeneralName::DNSName(dns) => names.dns_names.push((*dns).to_owned()),
            GeneralName::URI(uri) => names.uris.push((*uri).to_owned()),
            GeneralName::RFC822Name(email) => names.emails.push((*email).to_owned()),
            GeneralName::IPAddress(ip) => match *ip {
                &[a, b, c, d] => names.ip_addresses.push([a, b, c, d].into()),
                bytes => {
                    if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
                        names.ip_addresses.push(v6.into());
                    }
                }
            },
            _ => {}
        }
    }
    let chain = chain
        .iter()
        .map(|c| Bytes::copy_from_slice(c.as_ref()))
        .collect();
    Ok(PeerIdentity::new(chain, names))
}
