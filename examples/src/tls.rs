//! TLS for the example binaries: their `--tls-*` flags, and demo certificates made at run time
//! (`tls-certs` writes them to files; the benchmark makes its own in memory).
//!
//! The demo certificates are for trying `tls://` on one machine: a throwaway CA that signs a
//! server certificate for `localhost`, 127.0.0.1 and ::1, and a client certificate
//! (`CN=demo-client`). Nothing here is committed; use your own CA's certificates elsewhere.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertificateRevocationListParams,
    CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::tls::{
    ClientTlsConfig, Identity, Recheck, RevocationLists, Roots, ServerTlsConfig, TlsTransport,
};
use rdma_rpc_core::transport::Transport;

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct CertAndKey {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

impl CertAndKey {
    /// As an rdma-rpc identity.
    pub fn identity(&self) -> rdma_rpc_core::Result<Identity> {
        Identity::from_pem(&self.cert, &self.key)
    }
}

/// A demo CA and the server and client certificates it signed.
#[derive(Debug, Clone)]
pub struct DemoCerts {
    /// The CA's certificate: the root both sides trust.
    pub ca: String,
    /// For `localhost`, 127.0.0.1 and ::1.
    pub server: CertAndKey,
    /// `CN=demo-client`, DNS name `demo-client.local`.
    pub client: CertAndKey,
    /// A revocation list of the CA that revokes the client's certificate, PEM (to try
    /// `--tls-client-crl`).
    pub client_revoked: String,
}

/// The serial number of the demo client's certificate (which `client_revoked` names).
const CLIENT_SERIAL: u64 = 2;

/// A certificate request with a common name and an organisation.
fn params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "rdma-rpc demo");
    params
}

fn dns(name: &str) -> Result<SanType, rcgen::Error> {
    Ok(SanType::DnsName(name.try_into()?))
}

impl DemoCerts {
    /// Makes a fresh CA and certificates (ECDSA P-256).
    pub fn generate() -> Result<DemoCerts, rcgen::Error> {
        let mut ca = params("rdma-rpc demo CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
        let sign = |mut p: CertificateParams, usage| {
            p.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            let cert = p.signed_by(&key, &ca)?;
            Ok::<_, rcgen::Error>(CertAndKey {
                cert: cert.pem(),
                key: key.serialize_pem(),
            })
        };
        let mut server = params("localhost");
        server.subject_alt_names = vec![
            dns("localhost")?,
            SanType::IpAddress([127, 0, 0, 1].into()),
            SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
        ];
        let mut client = params("demo-client");
        client.subject_alt_names = vec![dns("demo-client.local")?];
        client.serial_number = Some(SerialNumber::from(CLIENT_SERIAL));
        let revoked = CertificateRevocationListParams {
            this_update: date_time_ymd(2026, 1, 1),
            next_update: date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from(CLIENT_SERIAL),
                revocation_time: date_time_ymd(2026, 1, 1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        };
        Ok(DemoCerts {
            server: sign(server, ExtendedKeyUsagePurpose::ServerAuth)?,
            client: sign(client, ExtendedKeyUsagePurpose::ClientAuth)?,
            client_revoked: revoked.signed_by(&ca)?.pem()?,
            ca: ca.pem(),
        })
    }

    /// Writes `ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key` and
    /// `client-revoked.crl` into `dir` (made if missing; the keys readable by their owner
    /// only). Returns the files written.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let files = [
            ("ca.pem", &self.ca),
            ("server.pem", &self.server.cert),
            ("server.key", &self.server.key),
            ("client.pem", &self.client.cert),
            ("client.key", &self.client.key),
            ("client-revoked.crl", &self.client_revoked),
        ];
        let mut written = Vec::new();
        for (name, contents) in files {
            let path = dir.join(name);
            write_private(&path, contents, name.ends_with(".key"))?;
            written.push(path);
        }
        Ok(written)
    }

    /// A transport that serves with the server certificate, requires client certificates of
    /// this CA, and connects as the demo client: both ends of a loopback run.
    pub fn transport(&self) -> rdma_rpc_core::Result<TlsTransport> {
        let roots = || Roots::from_pem(&self.ca);
        TlsTransport::new(
            Some(ServerTlsConfig::new(self.server.identity()?).client_roots(roots()?)),
            Some(ClientTlsConfig::new(roots()?).identity(self.client.identity()?)),
        )
    }
}

fn write_private(path: &Path, contents: &str, private: bool) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    std::io::Write::write_all(&mut options.open(path)?, contents.as_bytes())
}

/// The transport an address asks for, and the TLS transport whose settings it uses.
pub type Transports = (Arc<dyn Transport>, TlsTransport);

/// The example server's TLS flags: with a `tls://` address, or a `doca+oob://` one (its side
/// channel in TLS).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerTlsArgs {
    /// The server's certificate chain, PEM (with a tls:// address, or doca+oob:// for a side
    /// channel in TLS).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key, PEM.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mutual TLS), PEM.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// With --tls-client-ca: let in clients without a certificate too.
    #[arg(long, requires = "tls_client_ca")]
    pub tls_client_optional: bool,
    /// With --tls-client-ca: refuse client certificates these revocation lists name, PEM
    /// (the list of every authority that signs).
    #[arg(long, value_name = "FILE", requires = "tls_client_ca")]
    pub tls_client_crl: Option<PathBuf>,
}

impl ServerTlsArgs {
    /// The transport for `addr`: a TLS one for `tls://` (which needs the certificate flags),
    /// a DOCA one whose side channels run TLS for `doca+oob://` with the flags, none otherwise
    /// (the address names it). TLS flags with another scheme are an error.
    pub fn transport(&self, addr: &str) -> Result<Option<Arc<dyn Transport>>, String> {
        Ok(self.transports(addr)?.map(|(transport, _)| transport))
    }

    /// As [`transport`](Self::transport), with the TLS settings' transport, whose settings
    /// [`reload`](Self::reload) replaces (a DOCA transport's side channels share them).
    pub fn transports(&self, addr: &str) -> Result<Option<Transports>, String> {
        let wants = wants_tls(
            addr,
            self.tls_cert.is_some() || self.tls_client_ca.is_some(),
        )?;
        if wants == Wants::Plain {
            return Ok(None);
        }
        let tls = TlsTransport::server(self.config(addr)?).map_err(|e| e.to_string())?;
        Ok(Some((wrap(&tls, wants)?, tls)))
    }

    /// Reads the flags' files again and serves with them from now on (the example server
    /// does on SIGHUP): a renewed certificate, a new revocation list. Then checks the clients
    /// already connected against them and closes the connections of those they refuse (a
    /// certificate the new list revokes, say); what it did is returned. If the files are
    /// unusable the old settings stay and nothing is closed.
    pub fn reload(&self, tls: &TlsTransport) -> Result<Recheck, String> {
        tls.reload_server(self.config("the reload")?)
            .map_err(|e| e.to_string())?;
        Ok(tls.recheck_clients())
    }

    /// The settings the flags name, read from their files now.
    fn config(&self, addr: &str) -> Result<ServerTlsConfig, String> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Err(format!("TLS for {addr} needs --tls-cert and --tls-key"));
        };
        let build = || {
            let mut config = ServerTlsConfig::new(Identity::from_pem_files(cert, key)?);
            if let Some(ca) = &self.tls_client_ca {
                config = config
                    .client_roots(Roots::from_pem_file(ca)?)
                    .client_certificate_optional(self.tls_client_optional);
            }
            if let Some(crl) = &self.tls_client_crl {
                config = config.client_revocations(RevocationLists::from_pem_file(crl)?);
            }
            Ok::<_, rdma_rpc_core::Error>(config)
        };
        build().map_err(|e| e.to_string())
    }
}

/// The example client's TLS flags: with a `tls://` address, or a `doca+oob://` one (its side
/// channel in TLS).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTlsArgs {
    /// The CA that signed the server's certificate, PEM (with a tls:// address, or doca+oob://
    /// for a side channel in TLS).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// This client's certificate chain, PEM, for servers that require one (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// This client's private key, PEM.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The name the server's certificate must carry, if not the host of the address.
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// With --tls-ca: refuse server certificates these revocation lists name, PEM (the list
    /// of every authority that signs).
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    pub tls_crl: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// The transport for `addr`: a TLS one for `tls://` (which needs --tls-ca), a DOCA one
    /// whose side channels run TLS for `doca+oob://` with the flags, none otherwise. TLS flags
    /// with another scheme are an error.
    pub fn transport(&self, addr: &str) -> Result<Option<Arc<dyn Transport>>, String> {
        let wants = wants_tls(addr, self.tls_ca.is_some() || self.tls_cert.is_some())?;
        if wants == Wants::Plain {
            return Ok(None);
        }
        let Some(ca) = &self.tls_ca else {
            return Err(format!(
                "TLS for {addr} needs --tls-ca (the CA of the server's certificate)"
            ));
        };
        let build = || {
            let mut config = ClientTlsConfig::new(Roots::from_pem_file(ca)?);
            if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
                config = config.identity(Identity::from_pem_files(cert, key)?);
            }
            if let Some(name) = &self.tls_server_name {
                config = config.server_name(name.clone());
            }
            if let Some(crl) = &self.tls_crl {
                config = config.revocations(RevocationLists::from_pem_file(crl)?);
            }
            TlsTransport::client(config)
        };
        let tls = build().map_err(|e| e.to_string())?;
        Ok(Some(wrap(&tls, wants)?))
    }
}

/// What an address asks of the TLS flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wants {
    /// No TLS (no flags, and not a `tls://` address).
    Plain,
    /// `tls://`.
    Tls,
    /// `doca+oob://` with TLS flags: its side channel in TLS.
    SideChannel,
}

/// What `addr` asks of the TLS flags; flags with a scheme that has no TLS are a mistake.
fn wants_tls(addr: &str, flags_given: bool) -> Result<Wants, String> {
    if addr.starts_with("tls://") {
        return Ok(Wants::Tls);
    }
    match (addr.starts_with("doca+oob://"), flags_given) {
        (_, false) => Ok(Wants::Plain),
        (true, true) => Ok(Wants::SideChannel),
        (false, true) => Err(format!(
            "--tls-* flags need a tls:// or doca+oob:// address, not {addr}"
        )),
    }
}

/// The transport an address asks for, over `tls`'s settings.
fn wrap(tls: &TlsTransport, wants: Wants) -> Result<Arc<dyn Transport>, String> {
    Ok(match wants {
        Wants::SideChannel => {
            let doca = DocaTransport::new(DocaConfig::from_env()).map_err(|e| e.to_string())?;
            Arc::new(doca.with_side_channel_tls(tls))
        }
        Wants::Tls | Wants::Plain => Arc::new(tls.clone()),
    })
}
