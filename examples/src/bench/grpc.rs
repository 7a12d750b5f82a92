//! The gRPC baseline: tonic with its defaults, except a maximum message size large enough for
//! the largest payload, serving unary upload and download of the same payloads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tonic::{Request, Response, Status};

/// Bytes going up or down.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    /// The bytes.
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
}

/// A size: what to download, or what was uploaded.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Size {
    /// Number of bytes.
    #[prost(uint64, tag = "1")]
    pub len: u64,
}

#[allow(missing_docs, unreachable_pub, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/bench.Blob.rs"));
}

pub use generated::blob_client::BlobClient;
use generated::blob_server::{Blob, BlobServer};

/// Largest message the baseline accepts (the largest payload plus room).
pub const MAX_MESSAGE: usize = 17 << 20;

struct BlobService {
    source: Bytes,
}

#[tonic::async_trait]
impl Blob for BlobService {
    async fn upload(&self, request: Request<Payload>) -> Result<Response<Size>, Status> {
        let len = request.into_inner().data.len() as u64;
        Ok(Response::new(Size { len }))
    }

    async fn download(&self, request: Request<Size>) -> Result<Response<Payload>, Status> {
        let len = request.into_inner().len as usize;
        if len > self.source.len() {
            return Err(Status::out_of_range("larger than the baseline's source"));
        }
        Ok(Response::new(Payload {
            data: self.source.slice(..len),
        }))
    }
}

/// A running baseline server.
#[derive(Debug)]
pub struct GrpcServer {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the baseline server on a loopback port, on the `server` runtime.
pub async fn start(server: &tokio::runtime::Handle) -> std::io::Result<GrpcServer> {
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let task = server.spawn(async move {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => {
                let _ = addr_tx.send(Err(e));
                return;
            }
        };
        let _ = addr_tx.send(listener.local_addr());
        serve(listener).await;
    });
    let addr = addr_rx.await.map_err(std::io::Error::other)??;
    Ok(GrpcServer { addr, task })
}

async fn serve(listener: tokio::net::TcpListener) {
    let service = BlobServer::new(BlobService {
        source: Bytes::from(vec![3u8; MAX_MESSAGE - 1024]),
    })
    .max_decoding_message_size(MAX_MESSAGE)
    .max_encoding_message_size(MAX_MESSAGE);
    let result = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(tokio_stream_from(listener))
        .await;
    if let Err(e) = result {
        eprintln!("gRPC baseline server stopped: {e}");
    }
}

/// Accepted connections with `TCP_NODELAY`, as tonic's own listener sets by default.
fn tokio_stream_from(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

/// Connects a client with the same message size limit.
pub async fn connect(
    addr: SocketAddr,
) -> Result<BlobClient<tonic::transport::Channel>, tonic::transport::Error> {
    let client = BlobClient::connect(format!("http://{addr}")).await?;
    Ok(client
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// Times one upload of `data`.
pub async fn upload(
    client: &mut BlobClient<tonic::transport::Channel>,
    data: Bytes,
) -> Result<Duration, Status> {
    let start = Instant::now();
    let len = data.len() as u64;
    let size = client.upload(Payload { data }).await?.into_inner();
    if size.len != len {
        return Err(Status::data_loss("upload size mismatch"));
    }
    Ok(start.elapsed())
}

/// Times one download of `len` bytes.
pub async fn download(
    client: &mut BlobClient<tonic::transport::Channel>,
    len: usize,
) -> Result<Duration, Status> {
    let start = Instant::now();
    let payload = client
        .download(Size { len: len as u64 })
        .await?
        .into_inner();
    if payload.data.len() != len {
        return Err(Status::data_loss("download size mismatch"));
    }
    Ok(start.elapsed())
}
