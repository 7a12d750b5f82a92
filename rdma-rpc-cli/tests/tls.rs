//! The commands that connect, against a `tls://` server of this process that requires client
//! certificates: `--tls-ca`, `--tls-cert`, `--tls-key` and `--tls-crl`, and the refusals of
//! options that do not fit. (A `doca+oob://` server with its side channel in TLS takes the
//! same options, but the DOCA software provider is in-process: no test here reaches it.)

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::run;
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertificateRevocationListParams,
    CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};
use rdma_rpc_core::health::HealthReporter;
use rdma_rpc_core::transport::tls::{Identity, Roots, ServerTlsConfig, TlsTransport};
use rdma_rpc_core::Server;

/// Certificates in a directory of their own, removed when dropped: `ca.pem`, the server's
/// (`localhost`, 127.0.0.1), a client's, and `server-revoked.crl`, a list of the CA that
/// revokes the server's certificate.
struct Certs(PathBuf);

impl Certs {
    fn new() -> Certs {
        let dir = std::env::temp_dir().join(format!("rdma-rpc-cli-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "cli test CA");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let leaf = |name: &str, san: Vec<SanType>, usage, serial: u64| {
            let mut params = CertificateParams::default();
            params.distinguished_name.push(DnType::CommonName, name);
            params.subject_alt_names = san;
            params.extended_key_usages = vec![usage];
            params.serial_number = Some(SerialNumber::from(serial));
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        };
        let localhost = vec![
            SanType::DnsName("localhost".try_into().unwrap()),
            SanType::IpAddress([127, 0, 0, 1].into()),
        ];
        leaf("server", localhost, ExtendedKeyUsagePurpose::ServerAuth, 7);
        leaf("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth, 8);
        let revoked = CertificateRevocationListParams {
            this_update: date_time_ymd(2026, 1, 1),
            next_update: date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from(7u64),
                revocation_time: date_time_ymd(2026, 1, 1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = revoked.signed_by(&ca).unwrap().pem().unwrap();
        std::fs::write(dir.join("server-revoked.crl"), crl).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Certs(dir)
    }

    fn file(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `tls://` server with the health service that requires client certificates of the CA:
/// its address, and what shuts it down.
fn server(certs: &Certs) -> (String, tokio::sync::oneshot::Sender<()>) {
    let identity = Identity::from_pem_files(certs.file("server.pem"), certs.file("server.key"));
    let tls = ServerTlsConfig::new(identity.unwrap())
        .client_roots(Roots::from_pem_file(certs.file("ca.pem")).unwrap());
    let transport = Arc::new(TlsTransport::server(tls).unwrap());
    let builder = Server::builder()
        .transport(transport)
        .add_health(&HealthReporter::new());
    common::serve(builder, "tls://127.0.0.1:0")
}

#[test]
fn the_commands_that_connect_take_the_tls_options() {
    let certs = Certs::new();
    let (addr, _stop) = server(&certs);
    let (ca, cert, key) = (
        certs.file("ca.pem"),
        certs.file("client.pem"),
        certs.file("client.key"),
    );
    let mutual = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];

    let (code, stdout, stderr) = run(&[&["health", &addr][..], &mutual].concat());
    assert_eq!((code, stdout.as_str()), (0, "SERVING\n"), "{stderr}");
    // The options go before the command's own arguments too.
    let (code, stdout, stderr) =
        run(&[&mutual[..], &["ping", &addr, "-c", "2", "-i", "1"]].concat());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("2 pings"), "{stdout}");

    // Without the client's certificate the server refuses it, and the error says why.
    let (code, _, stderr) = run(&["health", &addr, "--tls-ca", &ca]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("requires a client certificate"), "{stderr}");
    // A list that revokes the server's certificate.
    let crl = certs.file("server-revoked.crl");
    let (code, _, stderr) = run(&[&["health", &addr, "--tls-crl", &crl][..], &mutual].concat());
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the server's certificate is revoked"),
        "{stderr}"
    );

    // Options that do not fit: usage errors (2), before anything connects.
    let (code, _, stderr) = run(&["health", &addr]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("needs --tls-ca"), "{stderr}");
    let (code, _, stderr) = run(&["health", "tcp://127.0.0.1:1", "--tls-ca", &ca]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("need a tls:// or doca+oob:// address"),
        "{stderr}"
    );
    // A file that does not load: its name and the cause.
    let (code, _, stderr) = run(&["health", &addr, "--tls-ca", &key]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("client.key") && stderr.contains("no CERTIFICATE"),
        "{stderr}"
    );
}
