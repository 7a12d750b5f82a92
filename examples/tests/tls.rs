//! The example binaries' TLS, as their flags set it up: demo certificates written by
//! `tls-certs`, a server with `--tls-cert --tls-key --tls-client-ca`, a client with `--tls-ca
//! --tls-cert --tls-key`, every endpoint of the doca-cpp service over `tls://`, and over
//! `doca+oob://` with its side channel in TLS; a revocation list read again as on SIGHUP.

use std::path::PathBuf;

use bytes::Bytes;
use examples::buffers::PathBuffers;
use examples::generated::doca_cpp::{DocaCppEndpointsClient, DocaCppEndpointsServer};
use examples::tls::{ClientTlsArgs, DemoCerts, ServerTlsArgs};
use rdma_rpc_core::transport::tls::TlsTransport;
use rdma_rpc_core::{Client, Server};

/// Demo certificates in a directory of their own under the system's temporary directory,
/// removed when dropped.
struct Certs(PathBuf);

impl Certs {
    fn new(name: &str) -> Certs {
        let dir = std::env::temp_dir().join(format!("rdma-rpc-{name}-{}", std::process::id()));
        DemoCerts::generate().unwrap().write_to(&dir).unwrap();
        Certs(dir)
    }

    fn file(&self, name: &str) -> Option<PathBuf> {
        Some(self.0.join(name))
    }

    /// The server's flags: its certificate, and client certificates of the demo CA required.
    fn server(&self) -> ServerTlsArgs {
        ServerTlsArgs {
            tls_cert: self.file("server.pem"),
            tls_key: self.file("server.key"),
            tls_client_ca: self.file("ca.pem"),
            tls_client_optional: false,
            tls_client_crl: None,
        }
    }

    /// The client's flags: the demo CA, and the client's certificate.
    fn client(&self) -> ClientTlsArgs {
        ClientTlsArgs {
            tls_ca: self.file("ca.pem"),
            tls_cert: self.file("client.pem"),
            tls_key: self.file("client.key"),
            tls_server_name: None,
            tls_crl: None,
        }
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Serves the doca-cpp endpoints on `addr` with `server`'s flags: the address bound and the
/// TLS settings the flags made (what SIGHUP reloads).
async fn serve(addr: &str, server: &ServerTlsArgs) -> (String, TlsTransport) {
    let (transport, tls) = server.transports(addr).unwrap().expect("a transport");
    let server = Server::builder()
        .transport(transport)
        .add_service(DocaCppEndpointsServer::new(PathBuffers::default()))
        .bind(addr)
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    (addr, tls)
}

/// A client of `addr` with `flags`, or why it could not make a call: in TLS 1.3 a client
/// hears of its refused certificate on its first use of the connection, so one call is made.
async fn client(addr: &str, flags: &ClientTlsArgs) -> Result<DocaCppEndpointsClient, String> {
    let transport = flags.transport(addr).unwrap().expect("a transport");
    let client = Client::builder()
        .transport(transport)
        .connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let client = DocaCppEndpointsClient::new(client);
    client
        .rdma_ep0_send((), Bytes::from_static(b"hello"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(client)
}

/// Every endpoint once, byte-exact.
async fn every_endpoint(client: &DocaCppEndpointsClient, what: &'static str) {
    let message = Bytes::from_static(what.as_bytes());
    client.rdma_ep0_send((), message.clone()).await.unwrap();
    assert_eq!(client.rdma_ep0_receive(()).await.unwrap().1, message);
    let block = Bytes::from(vec![7u8; 1 << 20]);
    client.rdma_ep1_write((), block.clone()).await.unwrap();
    assert_eq!(client.rdma_ep1_read(()).await.unwrap().1, block);
}

#[tokio::test]
async fn the_example_flags_serve_and_call_over_mutual_tls() {
    let certs = Certs::new("tls");
    let (addr, server_tls) = serve("tls://127.0.0.1:0", &certs.server()).await;
    let client_args = certs.client();
    let good = client(&addr, &client_args).await.unwrap();
    every_endpoint(&good, "over tls://").await;

    // Without its certificate the client is refused, and told why.
    let no_cert = ClientTlsArgs {
        tls_cert: None,
        tls_key: None,
        ..client_args.clone()
    };
    let err = client(&addr, &no_cert).await.err().unwrap();
    assert!(err.contains("requires a client certificate"), "{err}");

    // The server's files read again (what the example server does on SIGHUP), now with the
    // demo list that revokes the client's certificate: the connection the client has is
    // closed, and a new one is refused.
    let revoking = ServerTlsArgs {
        tls_client_crl: certs.file("client-revoked.crl"),
        ..certs.server()
    };
    let recheck = revoking.reload(&server_tls).unwrap();
    assert_eq!(recheck.closed.len(), 1, "{recheck:?}");
    assert!(
        recheck.closed[0].reason.to_string().contains("revoked"),
        "{recheck:?}"
    );
    assert!(good
        .rdma_ep0_send((), Bytes::from_static(b"x"))
        .await
        .is_err());
    let err = client(&addr, &client_args).await.err().unwrap();
    assert!(err.contains("revoked"), "{err}");
    // Files that do not load leave the settings as they were.
    let broken = ServerTlsArgs {
        tls_key: certs.file("client-revoked.crl"),
        ..certs.server()
    };
    let err = broken.reload(&server_tls).unwrap_err();
    assert!(err.contains("client-revoked.crl"), "{err}");

    // Flags that do not fit the address are refused before anything runs.
    let err = client_args.transport("tcp://127.0.0.1:7470").unwrap_err();
    assert!(
        err.contains("need a tls:// or doca+oob:// address"),
        "{err}"
    );
    let err = ClientTlsArgs::default().transport(&addr).unwrap_err();
    assert!(err.contains("--tls-ca"), "{err}");
    let err = ServerTlsArgs::default()
        .transport("tls://127.0.0.1:0")
        .unwrap_err();
    assert!(err.contains("--tls-cert and --tls-key"), "{err}");
}

/// The same flags with a `doca+oob://` address: the DOCA transport (software provider) with its
/// side channel in TLS, every endpoint of the doca-cpp service, and the refusal of a client
/// without its certificate or without TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_flags_put_a_doca_side_channel_in_mutual_tls() {
    let certs = Certs::new("oob-tls");
    let (addr, _) = serve("doca+oob://127.0.0.1:0", &certs.server()).await;
    let good = client(&addr, &certs.client()).await.unwrap();
    every_endpoint(&good, "over doca+oob:// with its side channel in TLS").await;

    let no_cert = ClientTlsArgs {
        tls_cert: None,
        tls_key: None,
        ..certs.client()
    };
    let err = client(&addr, &no_cert).await.err().unwrap();
    assert!(err.contains("requires a client certificate"), "{err}");
    // Without flags a doca+oob:// address is the plain side channel (the address names the
    // transport), and the server above refuses it, saying its side channel runs TLS.
    assert!(ClientTlsArgs::default().transport(&addr).unwrap().is_none());
    let plain = rdma_rpc_core::transport::transport_for(&addr).unwrap();
    let err = Client::builder()
        .transport(plain)
        .connect(&addr)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("side-channel TLS"), "{err}");
}
