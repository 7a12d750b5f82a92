//! The example binaries' TLS, as their flags set it up: demo certificates written by
//! `tls-certs`, a server with `--tls-cert --tls-key --tls-client-ca`, a client with `--tls-ca
//! --tls-cert --tls-key`, every endpoint of the doca-cpp service over `tls://`.

use std::path::PathBuf;

use bytes::Bytes;
use examples::buffers::PathBuffers;
use examples::generated::doca_cpp::{DocaCppEndpointsClient, DocaCppEndpointsServer};
use examples::tls::{ClientTlsArgs, DemoCerts, ServerTlsArgs};
use rdma_rpc_core::{Client, Server};

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn the_example_flags_serve_and_call_over_mutual_tls() {
    let dir = TempDir(std::env::temp_dir().join(format!("rdma-rpc-tls-{}", std::process::id())));
    DemoCerts::generate().unwrap().write_to(&dir.0).unwrap();
    let file = |name: &str| Some(dir.0.join(name));

    let server_args = ServerTlsArgs {
        tls_cert: file("server.pem"),
        tls_key: file("server.key"),
        tls_client_ca: file("ca.pem"),
        tls_client_optional: false,
        tls_client_crl: None,
    };
    let addr = "tls://127.0.0.1:0";
    let (transport, server_tls) = server_args
        .transports(addr)
        .unwrap()
        .expect("a TLS transport");
    let server = Server::builder()
        .transport(transport)
        .add_service(DocaCppEndpointsServer::new(PathBuffers::default()))
        .bind(addr)
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());

    let client_args = ClientTlsArgs {
        tls_ca: file("ca.pem"),
        tls_cert: file("client.pem"),
        tls_key: file("client.key"),
        tls_server_name: None,
        tls_crl: None,
    };
    let transport = client_args
        .transport(&addr)
        .unwrap()
        .expect("a TLS transport");
    let client = Client::builder().transport(transport).connect(&addr).await;
    let client = DocaCppEndpointsClient::new(client.unwrap());
    let message = Bytes::from_static(b"over tls://");
    client.rdma_ep0_send((), message.clone()).await.unwrap();
    assert_eq!(client.rdma_ep0_receive(()).await.unwrap().1, message);
    let block = Bytes::from(vec![7u8; 1 << 20]);
    client.rdma_ep1_write((), block.clone()).await.unwrap();
    assert_eq!(client.rdma_ep1_read(()).await.unwrap().1, block);

    // Without its certificate the client is refused, and told why.
    let no_cert = ClientTlsArgs {
        tls_cert: None,
        tls_key: None,
        ..client_args.clone()
    };
    let transport = no_cert.transport(&addr).unwrap().expect("a TLS transport");
    let err = Client::builder()
        .transport(transport)
        .connect(&addr)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("requires a client certificate"),
        "{err}"
    );

    // The server's files read again (what the example server does on SIGHUP), now with the
    // demo list that revokes the client's certificate: a new connection of the client is
    // refused, the one it has goes on.
    let revoking = ServerTlsArgs {
        tls_client_crl: file("client-revoked.crl"),
        ..server_args.clone()
    };
    revoking.reload(&server_tls).unwrap();
    let transport = client_args
        .transport(&addr)
        .unwrap()
        .expect("a TLS transport");
    // (In TLS 1.3 the client hears of the refusal on its first use of the connection.)
    let err = match Client::builder().transport(transport).connect(&addr).await {
        Err(e) => e.to_string(),
        Ok(again) => DocaCppEndpointsClient::new(again)
            .rdma_ep0_send((), message.clone())
            .await
            .unwrap_err()
            .to_string(),
    };
    assert!(err.contains("revoked"), "{err}");
    client.rdma_ep0_send((), message.clone()).await.unwrap();
    // Files that do not load leave the settings as they were.
    let broken = ServerTlsArgs {
        tls_key: file("client-revoked.crl"),
        ..server_args.clone()
    };
    assert!(broken
        .reload(&server_tls)
        .unwrap_err()
        .contains("client-revoked.crl"));

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
/// without its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_flags_put_a_doca_side_channel_in_mutual_tls() {
    let dir =
        TempDir(std::env::temp_dir().join(format!("rdma-rpc-oob-tls-{}", std::process::id())));
    DemoCerts::generate().unwrap().write_to(&dir.0).unwrap();
    let file = |name: &str| Some(dir.0.join(name));
    let server_args = ServerTlsArgs {
        tls_cert: file("server.pem"),
        tls_key: file("server.key"),
        tls_client_ca: file("ca.pem"),
        tls_client_optional: false,
        tls_client_crl: None,
    };
    let addr = "doca+oob://127.0.0.1:0";
    let transport = server_args.transport(addr).unwrap().expect("a transport");
    let server = Server::builder()
        .transport(transport)
        .add_service(DocaCppEndpointsServer::new(PathBuffers::default()))
        .bind(addr)
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());

    let client_args = ClientTlsArgs {
        tls_ca: file("ca.pem"),
        tls_cert: file("client.pem"),
        tls_key: file("client.key"),
        tls_server_name: None,
        tls_crl: None,
    };
    let transport = client_args.transport(&addr).unwrap().expect("a transport");
    let client = Client::builder().transport(transport).connect(&addr).await;
    let client = DocaCppEndpointsClient::new(client.unwrap());
    let message = Bytes::from_static(b"over doca+oob:// with its side channel in TLS");
    client.rdma_ep0_send((), message.clone()).await.unwrap();
    assert_eq!(client.rdma_ep0_receive(()).await.unwrap().1, message);
    let block = Bytes::from(vec![9u8; 1 << 20]);
    client.rdma_ep1_write((), block.clone()).await.unwrap();
    assert_eq!(client.rdma_ep1_read(()).await.unwrap().1, block);

    let no_cert = ClientTlsArgs {
        tls_cert: None,
        tls_key: None,
        ..client_args.clone()
    };
    let transport = no_cert.transport(&addr).unwrap().expect("a transport");
    let err = Client::builder()
        .transport(transport)
        .connect(&addr)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("requires a client certificate"),
        "{err}"
    );
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
