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
//! Failures name their cause: a certificate file that does not load (its path), a server
//! certificate not signed by a trusted root or not for the name dialled, a client without the
//! certificate the server requires, a peer that does not speak TLS. A handshake that fails on
//! a server ends that connection only (logged within the log budget, like any refused peer).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{AlertDescription, CertificateError, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

use super::{Layer, Side, TcpConfig, TcpTransport};
use crate::error::{Error, Result};
use crate::transport::identity::Names;
use crate::transport::{BoxFuture, Connection, Fencing, Listener, PeerIdentity, Transport};

/// A certificate chain and its private key: a server's identity, or a client's for mutual
/// TLS.
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Identity {
    /// From PEM text: the certificate chain (its own certificate first, then any
    /// intermediates) and the private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(chain: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Result<Identity> {
        Ok(Identity {
            chain: certificates(chain.as_ref(), "the certificate chain")?,
            key: PrivateKeyDer::from_pem_slice(key.as_ref())
                .map_err(|e| pem_error(e, "the private key", "PRIVATE KEY"))?,
        })
    }

    /// From PEM files; see [`from_pem`](Self::from_pem). An error names the file.
    pub fn from_pem_files(chain: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Identity> {
        let (chain, key) = (read(chain.as_ref())?, read(key.as_ref())?);
        Ok(Identity {
            chain: certificates(&chain.1, &chain.0)?,
            key: PrivateKeyDer::from_pem_slice(&key.1)
                .map_err(|e| pem_error(e, &key.0, "PRIVATE KEY"))?,
        })
    }
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// The certificates one side trusts (certificate authorities): a client's for the server's
/// certificate, a server's for its clients' (mutual TLS).
#[derive(Clone)]
pub struct Roots(Vec<CertificateDer<'static>>);

impl Roots {
    /// From PEM text holding one or more certificates.
    pub fn from_pem(pem: impl AsRef<[u8]>) -> Result<Roots> {
        Ok(Roots(certificates(pem.as_ref(), "the roots")?))
    }

    /// From a PEM file holding one or more certificates. An error names the file.
    pub fn from_pem_file(path: impl AsRef<Path>) -> Result<Roots> {
        let (what, pem) = read(path.as_ref())?;
        Ok(Roots(certificates(&pem, &what)?))
    }

    fn store(&self, what: &str) -> Result<Arc<RootCertStore>> {
        let mut store = RootCertStore::empty();
        for cert in &self.0 {
            store.add(cert.clone()).map_err(|e| Error::Tls {
                context: format!("loading {what}"),
                reason: format!("a certificate is not a usable root: {e}"),
            })?;
        }
        Ok(Arc::new(store))
    }
}

impl fmt::Debug for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Roots").field(&self.0.len()).finish()
    }
}

/// A server's TLS settings: its identity and, for mutual TLS, the roots of its clients'.
#[derive(Debug, Clone)]
pub struct ServerTlsConfig {
    identity: Identity,
    client_roots: Option<Roots>,
    client_certificate_optional: bool,
}

impl ServerTlsConfig {
    /// A server that proves itself with `identity` and asks clients for nothing.
    pub fn new(identity: Identity) -> ServerTlsConfig {
        ServerTlsConfig {
            identity,
            client_roots: None,
            client_certificate_optional: false,
        }
    }

    /// Mutual TLS: every client must present a certificate signed by one of `roots`, and its
    /// calls carry it as their [`PeerIdentity`]. A client without one is refused in the
    /// handshake.
    pub fn client_roots(mut self, roots: Roots) -> ServerTlsConfig {
        self.client_roots = Some(roots);
        self
    }

    /// With [`client_roots`](Self::client_roots): also let in clients that present no
    /// certificate (their calls have no identity, for an interceptor to decide on). A
    /// certificate that is presented must still verify.
    pub fn client_certificate_optional(mut self, optional: bool) -> ServerTlsConfig {
        self.client_certificate_optional = optional;
        self
    }

    fn acceptor(&self, provider: &Arc<CryptoProvider>) -> Result<TlsAcceptor> {
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| setup_error("the server's configuration", e))?;
        let builder = match &self.client_roots {
            None => builder.with_no_client_auth(),
            Some(roots) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    roots.store("the client roots")?,
                    provider.clone(),
                );
                let verifier = if self.client_certificate_optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                let verifier = verifier.build().map_err(|e| Error::Tls {
                    context: "loading the client roots".into(),
                    reason: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(self.identity.chain.clone(), self.identity.key.clone_key())
            .map_err(|e| setup_error("the server's certificate and key", e))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// A client's TLS settings: the roots it trusts and, for mutual TLS, its identity.
#[derive(Debug, Clone)]
pub struct ClientTlsConfig {
    roots: Roots,
    identity: Option<Identity>,
    server_name: Option<String>,
}

impl ClientTlsConfig {
    /// A client that accepts servers whose certificate is signed by one of `roots` and names
    /// the host it dials.
    pub fn new(roots: Roots) -> ClientTlsConfig {
        ClientTlsConfig {
            roots,
            identity: None,
            server_name: None,
        }
    }

    /// The certificate and key this client proves itself with, to servers that ask (mutual
    /// TLS).
    pub fn identity(mut self, identity: Identity) -> ClientTlsConfig {
        self.identity = Some(identity);
        self
    }

    /// The name the server's certificate must carry, instead of the host of the address
    /// dialled (to dial an IP address that the certificate does not name, say).
    pub fn server_name(mut self, name: impl Into<String>) -> ClientTlsConfig {
        self.server_name = Some(name.into());
        self
    }

    fn connector(&self, provider: &Arc<CryptoProvider>) -> Result<Connector> {
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| setup_error("the client's configuration", e))?
            .with_root_certificates(self.roots.store("the roots")?);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(identity) => builder
                .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
                .map_err(|e| setup_error("the client's certificate and key", e))?,
        };
        let server_name = self
            .server_name
            .as_deref()
            .map(|name| server_name(name, "setting ClientTlsConfig::server_name"))
            .transpose()?;
        Ok(Connector {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }
}

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
            acceptor: server.map(|s| s.acceptor(&provider)).transpose()?,
            connector: client.map(|c| c.connector(&provider)).transpose()?,
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
        if self.layer.connector.is_none() {
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

struct Connector {
    connector: TlsConnector,
    /// Overrides the host dialled.
    server_name: Option<ServerName<'static>>,
}

/// TLS between a socket and the software transport's packets (see `Layer`).
pub(crate) struct TlsLayer {
    acceptor: Option<TlsAcceptor>,
    connector: Option<Connector>,
}

impl fmt::Debug for TlsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsLayer")
            .field("serves", &self.acceptor.is_some())
            .field("connects", &self.connector.is_some())
            .finish()
    }
}

impl TlsLayer {
    /// Whether it has a server's settings (a certificate to serve with).
    pub(crate) fn serves(&self) -> bool {
        self.acceptor.is_some()
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
                    let Some(acceptor) = &self.acceptor else {
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
                    Ok((TlsStream::from(stream), identity))
                }
                Side::Connected { host } => {
                    let Some(Connector {
                        connector,
                        server_name: named,
                    }) = &self.connector
                    else {
                        return Err(no_side(peer, "connect"));
                    };
                    let name = match named {
                        Some(name) => name.clone(),
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
    let Some(tls) = rustls_error(&e) else {
        return Error::io(format!("TLS handshake with {peer}"), e);
    };
    let server = matches!(side, Side::Accepted);
    let hint = match tls {
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
    };
    Error::Tls {
        context: format!("handshake with {peer}"),
        reason: if hint.is_empty() {
            tls.to_string()
        } else {
            format!("{tls}: {hint}")
        },
    }
}

fn no_side(peer: &str, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "cannot {what} {peer}: this TlsTransport has no settings for it"
    ))
}

fn setup_error(what: &str, e: rustls::Error) -> Error {
    Error::Tls {
        context: format!("loading {what}"),
        reason: e.to_string(),
    }
}

/// The name a server's certificate must carry, from a host or an explicit setting.
fn server_name(name: &str, context: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(name.to_owned()).map_err(|_| Error::Tls {
        context: context.to_owned(),
        reason: format!(
            "`{name}` is neither a DNS name nor an IP address a certificate could carry: set \
             ClientTlsConfig::server_name"
        ),
    })
}

/// A file's name (for errors) and bytes.
fn read(path: &Path) -> Result<(String, Vec<u8>)> {
    let what = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::io(format!("reading {what}"), e))?;
    Ok((what, bytes))
}

/// Every certificate of a PEM text; at least one.
fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| pem_error(e, what, "CERTIFICATE"))?;
    if certs.is_empty() {
        return Err(pem_error(pem::Error::NoItemsFound, what, "CERTIFICATE"));
    }
    Ok(certs)
}

fn pem_error(e: pem::Error, what: &str, block: &str) -> Error {
    Error::Tls {
        context: format!("loading {what}"),
        reason: match e {
            pem::Error::NoItemsFound => format!("no {block} block in it (is it PEM?)"),
            other => format!("not valid PEM: {other}"),
        },
    }
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
