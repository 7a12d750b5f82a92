//! The settings of [`TlsTransport`](super::TlsTransport): identities, roots, revocation lists,
//! and what a server and a client make of them (rustls configurations).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::{Error, Result};

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

/// Certificate revocation lists (CRLs, RFC 5280) of the authorities one side trusts: a
/// certificate a list names is refused in the handshake.
///
/// Given to a side, they are checked for every certificate of the peer's chain: each one's
/// issuer must have a list among them, or the certificate is refused as of unknown status
/// (give the list of every authority that signs, intermediates included). A list past its
/// next update still counts. Lists change without a restart with
/// [`TlsTransport::reload_server`](super::TlsTransport::reload_server) and
/// [`reload_client`](super::TlsTransport::reload_client).
#[derive(Clone)]
pub struct RevocationLists(Vec<CertificateRevocationListDer<'static>>);

impl RevocationLists {
    /// From PEM text holding one or more `X509 CRL` blocks.
    pub fn from_pem(pem: impl AsRef<[u8]>) -> Result<RevocationLists> {
        revocation_lists(pem.as_ref(), "the revocation lists")
    }

    /// From a PEM file holding one or more `X509 CRL` blocks. An error names the file.
    pub fn from_pem_file(path: impl AsRef<Path>) -> Result<RevocationLists> {
        let (what, pem) = read(path.as_ref())?;
        revocation_lists(&pem, &what)
    }
}

impl fmt::Debug for RevocationLists {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RevocationLists")
            .field(&self.0.len())
            .finish()
    }
}

/// A server's TLS settings: its identity and, for mutual TLS, the roots of its clients'.
#[derive(Debug, Clone)]
pub struct ServerTlsConfig {
    identity: Identity,
    client_roots: Option<Roots>,
    client_certificate_optional: bool,
    client_revocations: Option<RevocationLists>,
}

impl ServerTlsConfig {
    /// A server that proves itself with `identity` and asks clients for nothing.
    pub fn new(identity: Identity) -> ServerTlsConfig {
        ServerTlsConfig {
            identity,
            client_roots: None,
            client_certificate_optional: false,
            client_revocations: None,
        }
    }

    /// Mutual TLS: every client must present a certificate signed by one of `roots`, and its
    /// calls carry it as their [`PeerIdentity`](crate::transport::PeerIdentity). A client
    /// without one is refused in the handshake.
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

    /// With [`client_roots`](Self::client_roots): refuse clients whose certificate one of
    /// `lists` revokes (see [`RevocationLists`] for what must be given).
    pub fn client_revocations(mut self, lists: RevocationLists) -> ServerTlsConfig {
        self.client_revocations = Some(lists);
        self
    }

    /// The acceptor of these settings, and the verifier of client certificates it runs (none
    /// when it asks clients for no certificate), which rechecks of live connections run again.
    pub(super) fn acceptor(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<(TlsAcceptor, Option<Arc<dyn ClientCertVerifier>>)> {
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| setup_error("the server's configuration", e))?;
        let mut checks = None;
        let builder = match &self.client_roots {
            None if self.client_revocations.is_some() => {
                return Err(Error::InvalidArgument(
                    "ServerTlsConfig::client_revocations needs client_roots: a server that \
                     asks clients for no certificate has none to check"
                        .into(),
                ))
            }
            None => builder.with_no_client_auth(),
            Some(roots) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    roots.store("the client roots")?,
                    provider.clone(),
                );
                let verifier = match &self.client_revocations {
                    Some(lists) => verifier.with_crls(lists.0.iter().cloned()),
                    None => verifier,
                };
                let verifier = if self.client_certificate_optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                let verifier = verifier.build().map_err(|e| Error::Tls {
                    context: "loading the client roots and revocation lists".into(),
                    reason: e.to_string(),
                })?;
                checks = Some(verifier.clone());
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(self.identity.chain.clone(), self.identity.key.clone_key())
            .map_err(|e| setup_error("the server's certificate and key", e))?;
        Ok((TlsAcceptor::from(Arc::new(config)), checks))
    }
}

/// A client's TLS settings: the roots it trusts and, for mutual TLS, its identity.
#[derive(Debug, Clone)]
pub struct ClientTlsConfig {
    roots: Roots,
    identity: Option<Identity>,
    server_name: Option<String>,
    revocations: Option<RevocationLists>,
}

impl ClientTlsConfig {
    /// A client that accepts servers whose certificate is signed by one of `roots` and names
    /// the host it dials.
    pub fn new(roots: Roots) -> ClientTlsConfig {
        ClientTlsConfig {
            roots,
            identity: None,
            server_name: None,
            revocations: None,
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

    /// Refuse servers whose certificate one of `lists` revokes (see [`RevocationLists`] for
    /// what must be given).
    pub fn revocations(mut self, lists: RevocationLists) -> ClientTlsConfig {
        self.revocations = Some(lists);
        self
    }

    pub(super) fn connector(&self, provider: &Arc<CryptoProvider>) -> Result<Connector> {
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| setup_error("the client's configuration", e))?;
        let roots = self.roots.store("the roots")?;
        let builder = match &self.revocations {
            None => builder.with_root_certificates(roots),
            Some(lists) => {
                let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .with_crls(lists.0.iter().cloned())
                    .build()
                    .map_err(|e| Error::Tls {
                        context: "loading the roots and revocation lists".into(),
                        reason: e.to_string(),
                    })?;
                builder.with_webpki_verifier(verifier)
            }
        };
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

/// What a client connects with: its TLS configuration and the name the server must carry.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) connector: TlsConnector,
    /// Overrides the host dialled.
    pub(super) server_name: Option<ServerName<'static>>,
}

fn setup_error(what: &str, e: rustls::Error) -> Error {
    Error::Tls {
        context: format!("loading {what}"),
        reason: e.to_string(),
    }
}

/// The name a server's certificate must carry, from a host or an explicit setting.
pub(super) fn server_name(name: &str, context: &str) -> Result<ServerName<'static>> {
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

/// Every revocation list of a PEM text; at least one.
fn revocation_lists(pem: &[u8], what: &str) -> Result<RevocationLists> {
    let lists = CertificateRevocationListDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| pem_error(e, what, "X509 CRL"))?;
    if lists.is_empty() {
        return Err(pem_error(pem::Error::NoItemsFound, what, "X509 CRL"));
    }
    Ok(RevocationLists(lists))
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
