//! Who a peer proved to be: the certificate it presented in a TLS handshake.

use std::fmt;
use std::net::IpAddr;

use bytes::Bytes;

/// The identity a peer proved with its certificate: over `tls://` with client certificates
/// (mutual TLS), the client's, as the server's interceptors
/// ([`IncomingCall::peer_identity`](crate::interceptor::IncomingCall::peer_identity)) and
/// handlers ([`Request::peer_identity`](crate::Request::peer_identity)) see it.
///
/// The transport verified the certificate against the roots it was given before any call
/// was read: what is here is what the peer's CA vouches for. Deciding what an identity may do
/// is the application's (an interceptor that refuses names it does not know, say).
///
/// Other transports (`tcp://`, `mem://`, `doca://`) prove no identity: there it is `None`.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    chain: Vec<Bytes>,
    subject: String,
    common_name: Option<String>,
    dns_names: Vec<String>,
    uris: Vec<String>,
    emails: Vec<String>,
    ip_addresses: Vec<IpAddr>,
}

/// The names a certificate carries, as `PeerIdentity::new` takes them.
#[cfg(feature = "tls")]
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub(crate) subject: String,
    pub(crate) common_name: Option<String>,
    pub(crate) dns_names: Vec<String>,
    pub(crate) uris: Vec<String>,
    pub(crate) emails: Vec<String>,
    pub(crate) ip_addresses: Vec<IpAddr>,
}

impl PeerIdentity {
    /// An identity of a verified certificate chain (end entity first) and the names of its
    /// first certificate.
    #[cfg(feature = "tls")]
    pub(crate) fn new(chain: Vec<Bytes>, names: Names) -> PeerIdentity {
        PeerIdentity {
            chain,
            subject: names.subject,
            common_name: names.common_name,
            dns_names: names.dns_names,
            uris: names.uris,
            emails: names.emails,
            ip_addresses: names.ip_addresses,
        }
    }

    /// The peer's own (end-entity) certificate, DER-encoded: to parse further, or to pin.
    pub fn certificate(&self) -> &[u8] {
        &self.chain[0]
    }

    /// Every certificate the peer presented, DER-encoded, its own first.
    pub fn chain(&self) -> &[Bytes] {
        &self.chain
    }

    /// The certificate's subject as a distinguished name (`CN=client-a, O=Acme`).
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The subject's common name (`client-a`), if it has one.
    pub fn common_name(&self) -> Option<&str> {
        self.common_name.as_deref()
    }

    /// DNS names of the certificate's subject alternative names.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// URIs of the subject alternative names (a SPIFFE ID, `spiffe://example.org/ns/a/sa/b`).
    pub fn uris(&self) -> &[String] {
        &self.uris
    }

    /// E-mail addresses (RFC 822 names) of the subject alternative names.
    pub fn emails(&self) -> &[String] {
        &self.emails
    }

    /// IP addresses of the subject alternative names.
    pub fn ip_addresses(&self) -> &[IpAddr] {
        &self.ip_addresses
    }
}

impl fmt::Debug for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerIdentity")
            .field("subject", &self.subject)
            .field("dns_names", &self.dns_names)
            .field("uris", &self.uris)
            .field("emails", &self.emails)
            .field("ip_addresses", &self.ip_addresses)
            .field("chain_len", &self.chain.len())
            .finish()
    }
}
