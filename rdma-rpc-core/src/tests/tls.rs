//! The software transport inside TLS (`tls://`): the whole end-to-end suite with client
//! certificates (mutual TLS), and what TLS adds: the identity a client proved, as
//! interceptors and handlers see it, and the peers it refuses (an untrusted server, a client
//! without the certificate required or with one from another CA, a peer that speaks no TLS),
//! each with an error that names the cause. Certificates are made when the tests run.

use std::sync::{Arc, Mutex, OnceLock};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertificateRevocationListParams,
    CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};

// The suite's tests, for `tls_suite!` (as `mem.rs` takes them).
use super::e2e::*;
use super::ends::*;
use super::fast_paths::*;
use super::faults::*;
use super::hostile::*;
use super::malicious::*;
use super::remote::*;
use super::sessions::*;
use super::stream_rules::*;
use super::streams::*;

use super::e2e::{all_operations_all_sizes, inbound, outbound, BLOB_READ, MSG_SEND};
use super::{bounded, Backend, Harness};
use crate::interceptor::IncomingCall;
use crate::transport::tcp::TcpTransport;
use crate::transport::tls::{
    ClientTlsConfig, Identity, RevocationLists, Roots, ServerTlsConfig, TlsTransport,
};
use crate::transport::Transport;
use crate::{Client, Code, Error, PeerIdentity, ServerConfig, Status};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// A certificate and its key, PEM.
struct Pem {
    cert: String,
    key: String,
}

impl Pem {
    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert, &self.key).expect("a test identity")
    }
}

/// Two certificate authorities and what they signed.
struct Pki {
    ca: String,
    /// `localhost` and 127.0.0.1.
    server: Pem,
    /// `CN=client-a`, with a DNS name and a SPIFFE URI.
    client_a: Pem,
    /// `CN=client-b`, same CA.
    client_b: Pem,
    /// Another CA, which the servers and clients here do not trust.
    rogue_ca: String,
    rogue_server: Pem,
    rogue_client: Pem,
    /// Signed by a CA of the same name as the test CA, with a key of its own.
    twin_server: Pem,
    /// Revocation lists (PEM) of the test CA: one that revokes `client-b`, one that revokes
    /// the server's certificate, one that revokes nothing; and one of the other CA.
    revokes_client_b: String,
    revokes_server: String,
    revokes_nothing: String,
    rogue_list: String,
}

/// Serial numbers of the leaf certificates, by name (so that a list can revoke one).
const SERVER_SERIAL: u64 = 1001;
const CLIENT_B_SERIAL: u64 = 1003;

/// A revocation list of `issuer` that revokes `serials`.
fn revocation_list(issuer: &CertifiedIssuer<'static, KeyPair>, serials: &[u64]) -> String {
    let params = CertificateRevocationListParams {
        this_update: date_time_ymd(2026, 1, 1),
        next_update: date_time_ymd(2100, 1, 1),
        crl_number: SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: serials
            .iter()
            .map(|&serial| RevokedCertParams {
                serial_number: SerialNumber::from(serial),
                revocation_time: date_time_ymd(2026, 1, 1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: KeyIdMethod::Sha256,
    };
    params.signed_by(issuer).unwrap().pem().unwrap()
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    names: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
    serial: u64,
) -> Pem {
    let mut params = CertificateParams::default();
    params.serial_number = Some(SerialNumber::from(serial));
    params.distinguished_name.push(DnType::CommonName, name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "rdma-rpc tests");
    params.subject_alt_names = names;
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dns = |n: &str| SanType::DnsName(n.try_into().unwrap());
        let server_names = || vec![dns("localhost"), SanType::IpAddress([127, 0, 0, 1].into())];
        let client = |issuer, name: &str, serial| {
            let names = vec![
                dns(&format!("{name}.example")),
                SanType::URI(format!("spiffe://rdma-rpc.test/{name}").try_into().unwrap()),
            ];
            leaf(
                issuer,
                name,
                names,
                ExtendedKeyUsagePurpose::ClientAuth,
                serial,
            )
        };
        let server = |issuer| {
            let usage = ExtendedKeyUsagePurpose::ServerAuth;
            leaf(issuer, "server", server_names(), usage, SERVER_SERIAL)
        };
        let (good, rogue) = (ca("rdma-rpc test CA"), ca("another CA"));
        Pki {
            ca: good.pem(),
            server: server(&good),
            client_a: client(&good, "client-a", 1002),
            client_b: client(&good, "client-b", CLIENT_B_SERIAL),
            rogue_ca: rogue.pem(),
            rogue_server: server(&rogue),
            rogue_client: client(&rogue, "client-a", 1002),
            twin_server: server(&ca("rdma-rpc test CA")),
            revokes_client_b: revocation_list(&good, &[CLIENT_B_SERIAL]),
            revokes_server: revocation_list(&good, &[SERVER_SERIAL]),
            revokes_nothing: revocation_list(&good, &[]),
            rogue_list: revocation_list(&rogue, &[]),
        }
    })
}

fn roots(pem: &str) -> Roots {
    Roots::from_pem(pem).expect("test roots")
}

/// A server that requires client certificates of the test CA.
fn mtls_server() -> ServerTlsConfig {
    ServerTlsConfig::new(pki().server.identity()).client_roots(roots(&pki().ca))
}

/// A client of the test CA, as `client-a`.
fn client_a() -> ClientTlsConfig {
    ClientTlsConfig::new(roots(&pki().ca)).identity(pki().client_a.identity())
}

fn backend_with(server: ServerTlsConfig, client: ClientTlsConfig) -> Backend {
    served_by(&TlsTransport::new(Some(server), Some(client)).expect("TLS transport"))
}

/// `tls` on loopback (a clone: the test keeps `tls` to reload and recheck it).
fn served_by(tls: &TlsTransport) -> Backend {
    Backend {
        transport: Arc::new(tls.clone()),
        bind: "tls://127.0.0.1:0".into(),
    }
}

/// Mutual TLS on loopback: a server of the test CA, its client `client-a`.
fn b() -> Backend {
    backend_with(mtls_server(), client_a())
}

/// The error of connecting to `h` with `transport` (which must fail).
async fn refused_with(transport: Arc<dyn Transport>, addr: &str) -> Error {
    Client::builder()
        .transport(transport)
        .connect(addr)
        .await
        .map(drop)
        .expect_err("the connection must be refused")
}

fn tls_client(config: ClientTlsConfig) -> Arc<dyn Transport> {
    Arc::new(TlsTransport::client(config).expect("TLS client"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_operations_all_sizes_byte_exact() {
    let h = Harness::default_on(&b()).await;
    bounded("all operations over TLS", all_operations_all_sizes(&h)).await;
}

/// Each test of the suite that takes a backend, over `tls://` with client certificates.
macro_rules! tls_suite {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            bounded(stringify!($name), super::$name(&b())).await;
        }
    )*};
}

mod suite {
    use super::*;

    with_suite!(tls_suite);
}

/// What an interceptor saw of the client: its certificate's names.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    common_name: Option<String>,
    subject: String,
    dns_names: Vec<String>,
    uris: Vec<String>,
}

impl Seen {
    fn of(identity: &PeerIdentity) -> Seen {
        Seen {
            common_name: identity.common_name().map(str::to_owned),
            subject: identity.subject().to_owned(),
            dns_names: identity.dns_names().to_vec(),
            uris: identity.uris().to_vec(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_certificate_is_the_identity_interceptors_and_handlers_see() {
    let seen: Arc<Mutex<Vec<Option<Seen>>>> = Arc::default();
    let h = Harness::start_built(&b(), ServerConfig::default(), |builder| {
        let seen = seen.clone();
        // Lets `client-a` in, and nobody else.
        builder.interceptor(move |call: &mut IncomingCall<'_>| {
            let identity = call.peer_identity();
            seen.lock().unwrap().push(identity.map(Seen::of));
            match identity.and_then(PeerIdentity::common_name) {
                Some("client-a") => Ok(()),
                other => Err(Status::new(
                    Code::PermissionDenied,
                    format!("{other:?} may not call"),
                )),
            }
        })
    })
    .await;
    bounded("identity", async {
        let client = h.client().await;
        let resp = inbound(&client, MSG_SEND, 100, 1)
            .await
            .expect("client-a's send");
        assert!(resp.exact);
        let expected = Seen {
            common_name: Some("client-a".into()),
            subject: "CN=client-a, O=rdma-rpc tests".into(),
            dns_names: vec!["client-a.example".into()],
            uris: vec!["spiffe://rdma-rpc.test/client-a".into()],
        };
        assert_eq!(seen.lock().unwrap().pop(), Some(Some(expected.clone())));
        // The handler sees the same identity, with the certificate the client presented.
        let handler_saw = h.service.identity_seen.lock().unwrap().clone();
        let handler_saw = handler_saw.expect("the handler sees the client's identity");
        assert_eq!(Seen::of(&handler_saw), expected);
        let presented = CertificateDer::from_pem_slice(pki().client_a.cert.as_bytes()).unwrap();
        assert_eq!(handler_saw.certificate(), &presented[..]);
        assert_eq!(handler_saw.chain().len(), 1);

        // Every call of the connection carries it: a read too.
        let data = outbound(&client, BLOB_READ, 5000, 2).await.expect("read");
        assert_eq!(data.len(), 5000);
        assert_eq!(seen.lock().unwrap().pop(), Some(Some(expected.clone())));

        // Another client of the same CA connects (TLS lets it in) but the interceptor refuses
        // its calls, naming it; the handler never runs.
        let config = ClientTlsConfig::new(roots(&pki().ca)).identity(pki().client_b.identity());
        let other = Client::builder()
            .transport(tls_client(config))
            .connect(&h.addr)
            .await
            .expect("client-b connects");
        let runs = h
            .service
            .inbound_runs
            .load(std::sync::atomic::Ordering::SeqCst);
        let err = inbound(&other, MSG_SEND, 10, 3).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err}");
        assert!(err.message().contains("client-b"), "{err}");
        let seen_b = seen.lock().unwrap().pop().flatten().expect("client-b seen");
        assert_eq!(seen_b.dns_names, ["client-b.example"]);
        let after = h
            .service
            .inbound_runs
            .load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(after, runs);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_certificates_calls_carry_no_identity() {
    // A server that asks for none, and one that lets clients without one in.
    let servers = [
        ServerTlsConfig::new(pki().server.identity()),
        mtls_server().client_certificate_optional(true),
    ];
    for server in servers {
        let client = ClientTlsConfig::new(roots(&pki().ca));
        let h = Harness::default_on(&backend_with(server, client)).await;
        bounded("no identity", async {
            let client = h.client().await;
            assert!(inbound(&client, MSG_SEND, 64, 1).await.unwrap().exact);
            assert!(h.service.identity_seen.lock().unwrap().is_none());
        })
        .await;
    }
    // An optional certificate that is presented is still the identity.
    let h = Harness::default_on(&backend_with(
        mtls_server().client_certificate_optional(true),
        client_a(),
    ))
    .await;
    bounded("optional identity", async {
        let client = h.client().await;
        outbound(&client, BLOB_READ, 64, 1).await.unwrap();
        let seen = h.service.identity_seen.lock().unwrap().clone();
        assert_eq!(seen.unwrap().common_name(), Some("client-a"));
    })
    .await;
}

/// The refusals of a server at `addr` that requires client certificates of the test CA,
/// each told to the client with its cause: a client that trusts another CA, one without a
/// certificate, one whose certificate another CA signed (`client_of` makes a client transport
/// of the settings).
async fn certificate_refusals(
    client_of: &impl Fn(ClientTlsConfig) -> Arc<dyn Transport>,
    addr: &str,
) {
    let config = ClientTlsConfig::new(roots(&pki().rogue_ca)).identity(pki().client_a.identity());
    let err = refused_with(client_of(config), addr).await;
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("not signed by a root this client trusts"),
        "{text}"
    );
    assert!(text.contains(addr), "{text}");

    let err = refused_with(client_of(ClientTlsConfig::new(roots(&pki().ca))), addr).await;
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        err.to_string().contains("requires a client certificate"),
        "{err}"
    );

    let config = ClientTlsConfig::new(roots(&pki().ca)).identity(pki().rogue_client.identity());
    let err = refused_with(client_of(config), addr).await;
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("does not trust this client's certificate"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_peers_are_told_why_and_the_server_goes_on() {
    let h = Harness::default_on(&b()).await;
    bounded("refusals", async {
        // A client that is in stays in while others are refused.
        let good = h.client().await;
        assert!(inbound(&good, MSG_SEND, 64, 1).await.unwrap().exact);

        certificate_refusals(&tls_client, &h.addr).await;

        // A client that speaks no TLS is refused cleanly, told that the server speaks TLS.
        let plain_addr = h.addr.replacen("tls://", "tcp://", 1);
        let err = refused_with(Arc::new(TcpTransport::new()), &plain_addr).await;
        assert!(err.to_string().contains("TLS"), "{err}");

        // A server name the certificate does not carry.
        let config = client_a().server_name("elsewhere.example");
        let err = refused_with(tls_client(config), &h.addr).await;
        assert!(
            err.to_string().contains("does not name the host dialled"),
            "{err}"
        );

        // None of it touched the connection that was in, and the server takes new ones.
        assert!(inbound(&good, MSG_SEND, 64, 2).await.unwrap().exact);
        let again = h.client().await;
        assert!(inbound(&again, MSG_SEND, 64, 3).await.unwrap().exact);
        assert_eq!(h.count.current(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_of_a_plain_server_is_told_it_speaks_no_tls() {
    let h = Harness::default_on(&super::tcp_backend()).await;
    bounded("TLS client, plain server", async {
        let tls_addr = h.addr.replacen("tcp://", "tls://", 1);
        let err = refused_with(tls_client(client_a()), &tls_addr).await;
        assert!(matches!(err, Error::Tls { .. }), "{err:?}");
        assert!(err.to_string().contains("does not speak TLS"), "{err}");
        // And a server of the wrong CA is refused like any untrusted one.
        let rogue = backend_with(
            ServerTlsConfig::new(pki().rogue_server.identity()),
            ClientTlsConfig::new(roots(&pki().rogue_ca)),
        );
        let rogue = Harness::default_on(&rogue).await;
        let err = refused_with(tls_client(client_a()), &rogue.addr).await;
        assert!(err.to_string().contains("not signed by a root"), "{err}");
    })
    .await;
}

/// A file under the system's temporary directory, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, contents: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("rdma-rpc-tls-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn certificates_that_do_not_load_name_the_file_and_the_cause() {
    let cert = TempFile::new("server.pem", &pki().server.cert);
    let key = TempFile::new("server.key", &pki().server.key);
    let not_pem = TempFile::new("notes.txt", "not a certificate\n");
    let other_key = TempFile::new("client.key", &pki().client_a.key);

    // Files that load.
    let identity = Identity::from_pem_files(&cert.0, &key.0).expect("loads");
    TlsTransport::server(ServerTlsConfig::new(identity)).expect("a server");
    Roots::from_pem_file(&cert.0).expect("a certificate as a root");

    // A path that does not exist: the path and the OS's reason.
    let missing = std::env::temp_dir().join("rdma-rpc-no-such-dir/server.pem");
    let err = Identity::from_pem_files(&missing, &key.0).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains("rdma-rpc-no-such-dir/server.pem"),
        "{err}"
    );
    let err = Roots::from_pem_file(&missing).unwrap_err();
    assert!(
        err.to_string().contains("rdma-rpc-no-such-dir/server.pem"),
        "{err}"
    );

    // A file that holds no certificate, or no key.
    let err = Identity::from_pem_files(&not_pem.0, &key.0).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("notes.txt") && text.contains("no CERTIFICATE"),
        "{text}"
    );
    let err = Identity::from_pem_files(&cert.0, &cert.0).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("server.pem") && text.contains("no PRIVATE KEY"),
        "{text}"
    );

    // A key that is not the certificate's: refused when the transport is made.
    let identity = Identity::from_pem_files(&cert.0, &other_key.0).unwrap();
    let err = TlsTransport::server(ServerTlsConfig::new(identity)).unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("certificate and key"), "{err}");
}

#[tokio::test]
async fn tls_addresses_need_a_tls_transport() {
    let err = crate::transport::transport_for("tls://127.0.0.1:7470").unwrap_err();
    assert!(err.to_string().contains("TlsTransport"), "{err}");
    // A transport for one side only refuses the other, saying so.
    let client_only = tls_client(client_a());
    let err = client_only.listen("tls://127.0.0.1:0").await.unwrap_err();
    assert!(err.to_string().contains("no server certificate"), "{err}");
    let server_only = TlsTransport::server(mtls_server()).unwrap();
    let err = server_only.connect("tls://127.0.0.1:1").await.unwrap_err();
    assert!(err.to_string().contains("no client settings"), "{err}");
    // And a tls:// transport takes no tcp:// address.
    let err = client_only.connect("tcp://127.0.0.1:1").await.unwrap_err();
    assert!(err.to_string().contains("tls://"), "{err}");
}

fn lists(pem: &str) -> RevocationLists {
    RevocationLists::from_pem(pem).expect("test revocation lists")
}

/// The error of a call on a new connection to `addr` with `transport` (which must fail at
/// connect or at that first call: in TLS 1.3 a client learns of a refused certificate only
/// after its own handshake ended).
async fn refused_on_first_use(transport: Arc<dyn Transport>, addr: &str) -> String {
    match Client::builder().transport(transport).connect(addr).await {
        Err(e) => e.to_string(),
        Ok(client) => inbound(&client, MSG_SEND, 64, 9)
            .await
            .expect_err("a refused certificate must fail the first call")
            .to_string(),
    }
}

/// Two authorities of the same name (two runs of a demo CA, say): a certificate of the other
/// one is refused as signed by another key, and told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_ca_of_the_same_name_is_told_apart() {
    let server = ServerTlsConfig::new(pki().twin_server.identity());
    let h = Harness::default_on(&backend_with(server, client_a())).await;
    let err = bounded("twin", refused_with(tls_client(client_a()), &h.addr)).await;
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        err.to_string().contains("another CA of the same name"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_certificates_are_refused_with_the_list_that_names_them() {
    // A server whose list revokes client-b: client-a is in, client-b is told why it is not.
    let server = mtls_server().client_revocations(lists(&pki().revokes_client_b));
    let h = Harness::default_on(&backend_with(server, client_a())).await;
    bounded("revocations", async {
        let a = h.client().await;
        assert!(inbound(&a, MSG_SEND, 64, 1).await.unwrap().exact);
        let config = ClientTlsConfig::new(roots(&pki().ca)).identity(pki().client_b.identity());
        let err = refused_on_first_use(tls_client(config), &h.addr).await;
        assert!(
            err.contains("refused this client's certificate as revoked"),
            "{err}"
        );
        assert!(inbound(&a, MSG_SEND, 64, 2).await.unwrap().exact);

        // A client whose list revokes the server's certificate, and one whose list revokes
        // nothing of it.
        let config = client_a().revocations(lists(&pki().revokes_server));
        let err = refused_with(tls_client(config), &h.addr).await;
        assert!(matches!(err, Error::Tls { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("the server's certificate is revoked"),
            "{err}"
        );
        let config = client_a().revocations(lists(&pki().revokes_nothing));
        let fine = Client::builder()
            .transport(tls_client(config))
            .connect(&h.addr)
            .await
            .expect("a list that revokes nothing of the server's lets it in");
        assert!(inbound(&fine, MSG_SEND, 64, 3).await.unwrap().exact);

        // A list of another authority says nothing of this one's certificates: unknown status,
        // refused (the stricter reading), and said so.
        let config = client_a().revocations(lists(&pki().rogue_list));
        let err = refused_with(tls_client(config), &h.addr).await;
        assert!(
            err.to_string().contains("no revocation list of an issuer"),
            "{err}"
        );
    })
    .await;

    // Lists that cannot be used are refused where they are given.
    let err = TlsTransport::server(
        ServerTlsConfig::new(pki().server.identity())
            .client_revocations(lists(&pki().revokes_nothing)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("needs client_roots"), "{err}");
    let err = RevocationLists::from_pem(&pki().ca).unwrap_err();
    assert!(err.to_string().contains("no X509 CRL block"), "{err}");
    let list = TempFile::new("revoked.crl", &pki().revokes_client_b);
    RevocationLists::from_pem_file(&list.0).expect("a list from a file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloaded_settings_apply_to_new_handshakes_and_connections_made_keep_theirs() {
    let tls = TlsTransport::new(Some(mtls_server()), Some(client_a())).unwrap();
    let h = Harness::default_on(&served_by(&tls)).await;
    bounded("reloads", async {
        let b = Client::builder()
            .transport(client_b())
            .connect(&h.addr)
            .await
            .expect("client-b is in before the reload");
        assert!(inbound(&b, MSG_SEND, 64, 1).await.unwrap().exact);

        // A new list that revokes client-b: its new connections are refused, the one it has
        // goes on, client-a still connects.
        tls.reload_server(mtls_server().client_revocations(lists(&pki().revokes_client_b)))
            .unwrap();
        let err = refused_on_first_use(client_b(), &h.addr).await;
        assert!(err.contains("revoked"), "{err}");
        assert!(inbound(&b, MSG_SEND, 64, 2).await.unwrap().exact);
        let a = h.client().await;
        assert!(inbound(&a, MSG_SEND, 64, 3).await.unwrap().exact);

        // Unusable settings are refused and change nothing.
        let mismatched = Identity::from_pem(&pki().server.cert, &pki().client_a.key).unwrap();
        let err = tls
            .reload_server(ServerTlsConfig::new(mismatched))
            .unwrap_err();
        assert!(err.to_string().contains("certificate and key"), "{err}");
        let again = h.client().await;
        assert!(inbound(&again, MSG_SEND, 64, 4).await.unwrap().exact);

        // A certificate of another authority: clients that trust only the first one refuse
        // the server from the next handshake on; the client side reloads to trust it.
        let rogue =
            ServerTlsConfig::new(pki().rogue_server.identity()).client_roots(roots(&pki().ca));
        tls.reload_server(rogue).unwrap();
        let err = refused_with(tls_client(client_a()), &h.addr).await;
        assert!(
            err.to_string()
                .contains("not signed by a root this client trusts"),
            "{err}"
        );
        let both = format!("{}{}", pki().ca, pki().rogue_ca);
        tls.reload_client(ClientTlsConfig::new(roots(&both)).identity(pki().client_a.identity()))
            .unwrap();
        let reloaded = h.client().await;
        assert!(inbound(&reloaded, MSG_SEND, 64, 5).await.unwrap().exact);
        assert!(inbound(&a, MSG_SEND, 64, 6).await.unwrap().exact);
    })
    .await;
}

/// A client transport of the test CA, as `client-b`.
fn client_b() -> Arc<dyn Transport> {
    tls_client(ClientTlsConfig::new(roots(&pki().ca)).identity(pki().client_b.identity()))
}

/// The common name of the one connection a recheck closed, having checked that its reason
/// contains `why`.
fn closed_one(recheck: &crate::transport::tls::Recheck, why: &str) -> Option<String> {
    assert_eq!(recheck.closed.len(), 1, "{recheck:?}");
    let closed = &recheck.closed[0];
    assert!(closed.reason.to_string().contains(why), "{}", closed.reason);
    closed
        .identity
        .as_ref()
        .and_then(|id| id.common_name().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recheck_closes_the_connections_whose_client_new_settings_refuse() {
    // Client certificates optional at first: client-a and client-b prove theirs, a third
    // client presents none.
    let tls = TlsTransport::new(
        Some(mtls_server().client_certificate_optional(true)),
        Some(client_a()),
    )
    .unwrap();
    let h = Harness::default_on(&served_by(&tls)).await;
    bounded("rechecks", async {
        let a = h.client().await;
        let connect = |transport| Client::builder().transport(transport).connect(&h.addr);
        let b = connect(client_b()).await.expect("client-b is in");
        let anonymous = connect(tls_client(ClientTlsConfig::new(roots(&pki().ca))))
            .await
            .expect("a client without a certificate is in while they are optional");
        for (i, client) in [&a, &b, &anonymous].into_iter().enumerate() {
            assert!(inbound(client, MSG_SEND, 64, i as u32).await.unwrap().exact);
        }

        // Nothing changed: a recheck keeps every connection.
        let recheck = tls.recheck_clients();
        assert!(recheck.closed.is_empty(), "{recheck:?}");
        assert!(recheck.kept >= 3, "{recheck:?}");

        // A list that revokes client-b: its connection ends, with why; the others go on.
        let revokes_b = || mtls_server().client_certificate_optional(true);
        tls.reload_server(revokes_b().client_revocations(lists(&pki().revokes_client_b)))
            .unwrap();
        let recheck = tls.recheck_clients();
        let name = closed_one(&recheck, "the client's certificate is revoked");
        assert_eq!(name.as_deref(), Some("client-b"));
        let err = inbound(&b, MSG_SEND, 64, 4)
            .await
            .expect_err("client-b's connection is closed");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(inbound(&a, MSG_SEND, 64, 5).await.unwrap().exact);
        assert!(inbound(&anonymous, MSG_SEND, 64, 6).await.unwrap().exact);

        // Certificates required from now on: the client that presented none is closed.
        tls.reload_server(mtls_server()).unwrap();
        let recheck = tls.recheck_clients();
        assert_eq!(closed_one(&recheck, "presented no certificate"), None);
        let err = inbound(&anonymous, MSG_SEND, 64, 7)
            .await
            .expect_err("the anonymous client's connection is closed");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(inbound(&a, MSG_SEND, 64, 8).await.unwrap().exact);

        // Another authority's roots only: every client of the test CA is closed.
        tls.reload_server(
            ServerTlsConfig::new(pki().server.identity()).client_roots(roots(&pki().rogue_ca)),
        )
        .unwrap();
        let recheck = tls.recheck_clients();
        assert!(!recheck.closed.is_empty(), "{recheck:?}");
        assert_eq!(recheck.kept, 0, "{recheck:?}");
        assert!(inbound(&a, MSG_SEND, 64, 9).await.is_err());
    })
    .await;
}

/// A handshake that began under settings a reload replaced is held to the new ones as it
/// ends (the check `TlsLayer::handshake` makes after `accept`), so that no client slips in
/// between a reload and `recheck_clients`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_spans_a_reload_is_held_to_the_new_settings() {
    let tls = TlsTransport::new(Some(mtls_server()), Some(client_a())).unwrap();
    let h = Harness::default_on(&served_by(&tls)).await;
    // The identities the two clients prove, as handlers see them.
    let mut seen = Vec::new();
    for transport in [tls_client(client_a()), client_b()] {
        let client = Client::builder()
            .transport(transport)
            .connect(&h.addr)
            .await
            .unwrap();
        assert!(inbound(&client, MSG_SEND, 64, 1).await.unwrap().exact);
        seen.push(h.service.identity_seen.lock().unwrap().take().unwrap());
    }
    let [a, b] = <[PeerIdentity; 2]>::try_from(seen).unwrap();
    let layer = tls.layer();
    let began = layer.generation();
    tls.reload_server(mtls_server().client_revocations(lists(&pki().revokes_client_b)))
        .unwrap();
    let err = layer
        .still_admitted(began, Some(&b), "tls://client-b")
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the client's certificate is revoked"),
        "{err}"
    );
    layer
        .still_admitted(began, Some(&a), "tls://client-a")
        .unwrap();
    // A handshake under the settings in force was checked by them already.
    layer
        .still_admitted(layer.generation(), Some(&b), "tls://client-b")
        .unwrap();
}

/// `doca+oob://` with its side channel in TLS (`DocaTransport::with_side_channel_tls`), on the
/// software provider: the same certificates as `tls://`, the same identity for handlers, the
/// same refusals with their causes.
#[cfg(feature = "doca")]
mod doca_side_channel {
    use super::*;
    use crate::transport::doca::{DocaConfig, DocaTransport};

    /// A DOCA transport whose side channels run TLS with `server` and `client`.
    fn doca_with(
        server: Option<ServerTlsConfig>,
        client: Option<ClientTlsConfig>,
    ) -> DocaTransport {
        let tls = TlsTransport::new(server, client).expect("TLS settings");
        DocaTransport::new(DocaConfig::from_env())
            .expect("a DOCA device")
            .with_side_channel_tls(&tls)
    }

    fn oob_backend(transport: DocaTransport) -> Backend {
        Backend {
            transport: Arc::new(transport),
            bind: "doca+oob://127.0.0.1:0".into(),
        }
    }

    /// A `doca+oob://` server that requires client certificates of the test CA, its client
    /// `client-a`.
    async fn mtls_harness() -> Harness {
        Harness::default_on(&oob_backend(doca_with(
            Some(mtls_server()),
            Some(client_a()),
        )))
        .await
    }

    /// Nothing here did what DOCA documents as undefined or forbidden.
    fn no_contract_violations() {
        let violations = doca_sys::take_contract_violations();
        assert!(violations.is_empty(), "{violations:#?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn side_channels_in_tls_carry_calls_and_the_client_certificate_is_the_identity() {
        let h = mtls_harness().await;
        bounded("calls over doca+oob with side-channel TLS", async {
            let client = h.client().await;
            assert!(inbound(&client, MSG_SEND, 100, 1).await.unwrap().exact);
            let seen = h.service.identity_seen.lock().unwrap().take();
            let seen = seen.expect("the handler sees the client's certificate");
            assert_eq!(seen.common_name(), Some("client-a"));
            assert_eq!(seen.uris(), ["spiffe://rdma-rpc.test/client-a"]);
            // Every call of the connection carries it, a one-sided read's too.
            let data = outbound(&client, BLOB_READ, 100_000, 2)
                .await
                .expect("read");
            assert_eq!(data.len(), 100_000);
            let seen = h.service.identity_seen.lock().unwrap().take();
            assert_eq!(seen.unwrap().common_name(), Some("client-a"));
            // The side channel in TLS is still the liveness signal: the client gone, the
            // server's connection ends.
            drop(client);
            while h.count.current() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        // Without a client certificate (a server that asks for none) a call carries none.
        let h = Harness::default_on(&oob_backend(doca_with(
            Some(ServerTlsConfig::new(pki().server.identity())),
            Some(ClientTlsConfig::new(roots(&pki().ca))),
        )))
        .await;
        bounded("no identity", async {
            let client = h.client().await;
            assert!(inbound(&client, MSG_SEND, 64, 3).await.unwrap().exact);
            assert!(h.service.identity_seen.lock().unwrap().is_none());
        })
        .await;
        no_contract_violations();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_recheck_closes_the_side_channel_connections_of_revoked_clients() {
        let tls = TlsTransport::new(Some(mtls_server()), Some(client_a())).unwrap();
        let server = DocaTransport::new(DocaConfig::from_env())
            .expect("a DOCA device")
            .with_side_channel_tls(&tls);
        let h = Harness::default_on(&oob_backend(server)).await;
        bounded("rechecks over doca+oob", async {
            let a = h.client().await;
            let as_b = ClientTlsConfig::new(roots(&pki().ca)).identity(pki().client_b.identity());
            let b = Client::builder()
                .transport(Arc::new(doca_with(None, Some(as_b))))
                .connect(&h.addr)
                .await
                .expect("client-b is in");
            assert!(inbound(&a, MSG_SEND, 64, 1).await.unwrap().exact);
            assert!(inbound(&b, MSG_SEND, 64, 2).await.unwrap().exact);

            tls.reload_server(mtls_server().client_revocations(lists(&pki().revokes_client_b)))
                .unwrap();
            let recheck = tls.recheck_clients();
            let name = closed_one(&recheck, "the client's certificate is revoked");
            assert_eq!(name.as_deref(), Some("client-b"));
            assert!(recheck.kept >= 1, "{recheck:?}");
            let err = inbound(&b, MSG_SEND, 64, 3)
                .await
                .expect_err("client-b's connection is closed");
            assert_eq!(err.code(), Code::Unavailable, "{err:?}");
            assert!(inbound(&a, MSG_SEND, 64, 4).await.unwrap().exact);
        })
        .await;
        no_contract_violations();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn side_channel_refusals_name_their_cause_and_the_server_goes_on() {
        let h = mtls_harness().await;
        let client_of = |config: ClientTlsConfig| -> Arc<dyn Transport> {
            Arc::new(doca_with(None, Some(config)))
        };
        bounded("refusals", async {
            let good = h.client().await;
            assert!(inbound(&good, MSG_SEND, 64, 1).await.unwrap().exact);

            // The same refusals as over tls://; a certificate the server refuses reaches the
            // client on its first read of the exchange, said as TLS's.
            certificate_refusals(&client_of, &h.addr).await;

            // A client whose side channel is plain is told the server's runs TLS.
            let plain = DocaTransport::new(DocaConfig::from_env()).expect("a DOCA device");
            let err = refused_with(Arc::new(plain), &h.addr).await;
            assert!(err.to_string().contains("with_side_channel_tls"), "{err}");

            // None of it touched the connection that was in, and the server takes new ones;
            // it never counted the refused peers as connections.
            assert!(inbound(&good, MSG_SEND, 64, 2).await.unwrap().exact);
            let again = h.client().await;
            assert!(inbound(&again, MSG_SEND, 64, 3).await.unwrap().exact);
            assert_eq!(h.count.current(), 2);
        })
        .await;

        // A TLS client of a server whose side channel is plain.
        let plain = Harness::default_on(&oob_backend(
            DocaTransport::new(DocaConfig::from_env()).expect("a DOCA device"),
        ))
        .await;
        bounded("a TLS client of a plain side channel", async {
            let err = refused_with(client_of(client_a()), &plain.addr).await;
            assert!(matches!(err, Error::Tls { .. }), "{err:?}");
            assert!(err.to_string().contains("does not speak TLS"), "{err}");
        })
        .await;
        no_contract_violations();
    }

    /// A client whose handshake fails never made a DOCA connection: the place it claimed in
    /// a client context goes back, so refused attempts do not fill contexts (kept, each attempt
    /// here would make a context of its own, with one place per context: checked).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_handshake_gives_its_place_in_a_client_context_back() {
        let h = mtls_harness().await;
        let untrusting = TlsTransport::client(
            ClientTlsConfig::new(roots(&pki().rogue_ca)).identity(pki().client_a.identity()),
        )
        .unwrap();
        let config = DocaConfig {
            client_connections_per_context: 1,
            ..DocaConfig::from_env()
        };
        let client = DocaTransport::new(config)
            .expect("a DOCA device")
            .with_side_channel_tls(&untrusting);
        bounded("refused connects", async {
            for _ in 0..3 {
                let err = client.connect(&h.addr).await.map(drop).unwrap_err();
                assert!(matches!(err, Error::Tls { .. }), "{err:?}");
            }
        })
        .await;
        assert_eq!(client.client_contexts().await, 1);
    }

    #[tokio::test]
    async fn side_channel_tls_needs_the_side_it_is_used_for_and_refuses_rdma_cm() {
        // Client settings only: it cannot serve.
        let client_only = doca_with(None, Some(client_a()));
        let err = client_only
            .listen("doca+oob://127.0.0.1:0")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no server certificate"), "{err}");
        // RDMA CM has no side channel: refused both ways rather than unauthenticated.
        let both = doca_with(Some(mtls_server()), Some(client_a()));
        for err in [
            both.listen("doca://127.0.0.1:0")
                .await
                .map(drop)
                .unwrap_err(),
            both.connect("doca://127.0.0.1:1")
                .await
                .map(drop)
                .unwrap_err(),
        ] {
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(err.to_string().contains("RDMA CM"), "{err}");
        }
    }
}
