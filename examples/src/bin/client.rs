//! A standalone client of the doca-cpp endpoints: runs each endpoint once with byte-for-byte
//! verification against a server started with the `server` example.
//!
//! `cargo run --release -p examples --bin client -- [ADDRESS] [WRITE_BYTES]
//! [--tls-ca FILE [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME] [--tls-crl FILE]]`
//! (default `tcp://127.0.0.1:7470` and 1 MiB; a `tls://` address needs the CA of the server's
//! certificate, and a client certificate if the server requires one; the same flags with a
//! `doca+oob://` address put its side channel in TLS).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use examples::generated::doca_cpp::DocaCppEndpointsClient;
use examples::report::size;
use examples::tls::ClientTlsArgs;
use rdma_rpc_core::transport::Transport;

async fn run(
    addr: &str,
    len: usize,
    transport: Option<Arc<dyn Transport>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let builder = rdma_rpc_core::Client::builder();
    let builder = match transport {
        Some(t) => builder.transport(t),
        None => builder,
    };
    let client = DocaCppEndpointsClient::new(builder.connect(addr).await?);
    println!("connected to {}", client.inner().peer());

    let message = Bytes::from_static(b"hello from the rdma-rpc client");
    let t = Instant::now();
    client.rdma_ep0_send((), message.clone()).await?;
    println!(
        "send    /rdma/ep0  {:>9}  {:?}",
        size(message.len()),
        t.elapsed()
    );
    let t = Instant::now();
    let ((), back) = client.rdma_ep0_receive(()).await?;
    println!(
        "receive /rdma/ep0  {:>9}  {:?}",
        size(back.len()),
        t.elapsed()
    );
    if back != message {
        return Err("receive returned other bytes than were sent".into());
    }

    let block: Bytes = (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let t = Instant::now();
    client.rdma_ep1_write((), block.clone()).await?;
    println!("write   /rdma/ep1  {:>9}  {:?}", size(len), t.elapsed());
    let t = Instant::now();
    let ((), back) = client.rdma_ep1_read(()).await?;
    println!(
        "read    /rdma/ep1  {:>9}  {:?}",
        size(back.len()),
        t.elapsed()
    );
    if back != block {
        return Err("read returned other bytes than were written".into());
    }
    println!("all four endpoints verified byte for byte");
    Ok(())
}

/// The doca-cpp example client: one call of each of the server's four endpoints, checked.
#[derive(Debug, clap::Parser)]
#[command(name = "client")]
struct Args {
    /// The server.
    #[arg(value_name = "ADDRESS", default_value = "tcp://127.0.0.1:7470")]
    addr: String,
    /// Bytes written to and read back from /rdma/ep1.
    #[arg(value_name = "WRITE_BYTES", default_value_t = 1 << 20)]
    len: usize,
    #[command(flatten)]
    tls: ClientTlsArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    examples::logging::init();
    let transport = match args.tls.transport(&args.addr) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("client: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args.addr, args.len, transport).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("client: {e}");
            ExitCode::FAILURE
        }
    }
}
