//! `--tls-*`: this client's TLS settings, for `tls://` servers and for the side channel of
//! `doca+oob://` servers that run it in TLS. Every command that connects takes them.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::tls::{
    ClientTlsConfig, Identity, RevocationLists, Roots, TlsTransport,
};
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, ClientBuilder};

/// The TLS options of the commands that connect.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct TlsArgs {
    /// The CA that signed the server's certificate, PEM: for a tls:// server, or a
    /// doca+oob:// one whose side channel runs TLS.
    #[arg(long, value_name = "FILE", global = true)]
    tls_ca: Option<PathBuf>,
    /// This client's certificate chain, PEM, for servers that require one (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "tls_key", global = true)]
    tls_cert: Option<PathBuf>,
    /// This client's private key, PEM.
    #[arg(long, value_name = "FILE", requires = "tls_cert", global = true)]
    tls_key: Option<PathBuf>,
    /// The name the server's certificate must carry, if not the host of the address.
    #[arg(long, value_name = "NAME", global = true)]
    tls_server_name: Option<String>,
    /// Refuse server certificates these revocation lists name, PEM.
    #[arg(long, value_name = "FILE", global = true)]
    tls_crl: Option<PathBuf>,
}

/// Makes the clients of a command: over the transport the address names, or the TLS one the
/// options make.
pub(crate) struct Connector {
    transport: Option<Arc<dyn Transport>>,
}

impl Connector {
    /// A client builder that does not reconnect (a command connects once).
    pub(crate) fn builder(&self) -> ClientBuilder {
        let builder = Client::builder().reconnect(false);
        match &self.transport {
            Some(transport) => builder.transport(transport.clone()),
            None => builder,
        }
    }
}

impl TlsArgs {
    fn given(&self) -> bool {
        self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_server_name.is_some()
            || self.tls_crl.is_some()
    }

    /// What connects to `addr`; options that do not fit it print why and give the usage exit
    /// code (2), files that do not load the failure's (1).
    pub(crate) fn connector(&self, addr: &str) -> Result<Connector, ExitCode> {
        let tls = addr.starts_with("tls://");
        let side_channel = addr.starts_with("doca+oob://") && self.given();
        if !tls && !side_channel {
            if self.given() {
                eprintln!(
                    "error: --tls-* options need a tls:// or doca+oob:// address, not {addr}"
                );
                return Err(ExitCode::from(2));
            }
            return Ok(Connector { transport: None });
        }
        let Some(ca) = &self.tls_ca else {
            eprintln!("error: TLS for {addr} needs --tls-ca (the CA of the server's certificate)");
            return Err(ExitCode::from(2));
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
            let tls = TlsTransport::client(config)?;
            Ok::<_, rdma_rpc_core::Error>(if side_channel {
                let doca = DocaTransport::new(DocaConfig::from_env())?;
                Arc::new(doca.with_side_channel_tls(&tls)) as Arc<dyn Transport>
            } else {
                Arc::new(tls)
            })
        };
        match build() {
            Ok(transport) => Ok(Connector {
                transport: Some(transport),
            }),
            Err(e) => Err(crate::fail("the TLS options", &e)),
        }
    }
}
