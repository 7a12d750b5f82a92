//! The raw TCP baselines, measured in the same run as everything else: a 64-byte ping-pong
//! round trip on loopback (in blocks, between the measurements it is compared with), and a
//! bulk stream of 4 MiB writes. The serving side runs on the `server` runtime, like the
//! rdma-rpc and gRPC servers.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Binds a loopback listener on the server runtime and runs `serve` there.
async fn on_server<F, Fut, T>(
    server: &Handle,
    serve: F,
) -> std::io::Result<(std::net::SocketAddr, oneshot::Receiver<std::io::Result<T>>)>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<T>> + Send,
    T: Send + 'static,
{
    let (addr_tx, addr_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    server.spawn(async move {
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => {
                let _ = addr_tx.send(Err(e));
                return;
            }
        };
        let _ = addr_tx.send(listener.local_addr());
        let _ = done_tx.send(serve(listener).await);
    });
    let addr = addr_rx.await.map_err(std::io::Error::other)??;
    Ok((addr, done_rx))
}

/// A raw TCP ping-pong connection that stays open, so that its round trips can be measured
/// in blocks between the measurements they are compared with: on a noisy machine a baseline
/// taken once, minutes away from its comparison, drifts with the machine.
#[derive(Debug)]
pub struct PingPong {
    stream: TcpStream,
    out: Vec<u8>,
    back: Vec<u8>,
    echo: oneshot::Receiver<std::io::Result<()>>,
}

impl PingPong {
    /// Connects to an echo server of `size`-byte messages started on the `server` runtime.
    pub async fn open(server: &Handle, size: usize) -> std::io::Result<PingPong> {
        let (addr, echo) = on_server(server, move |listener| async move {
            let (mut s, _) = listener.accept().await?;
            s.set_nodelay(true)?;
            let mut buf = vec![0u8; size];
            loop {
                match s.read_exact(&mut buf).await {
                    Ok(_) => s.write_all(&buf).await?,
                    // The client closed its side: every round was answered.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })
        .await?;
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(PingPong {
            stream,
            out: vec![7u8; size],
            back: vec![0u8; size],
            echo,
        })
    }

    /// Round-trip latencies of `rounds` ping-pongs.
    pub async fn rounds(&mut self, rounds: usize) -> std::io::Result<Vec<Duration>> {
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            self.stream.write_all(&self.out).await?;
            self.stream.read_exact(&mut self.back).await?;
            times.push(start.elapsed());
        }
        Ok(times)
    }

    /// Closes the connection and waits for the echo server to see the end of it.
    pub async fn close(mut self) -> std::io::Result<()> {
        self.stream.shutdown().await?;
        self.echo.await.map_err(std::io::Error::other)?
    }
}

/// Bytes per second of a stream of `count` writes of `chunk` bytes, from writer to reader,
/// timed until the reader has every byte.
pub async fn bulk_stream(server: &Handle, chunk: usize, count: usize) -> std::io::Result<f64> {
    let total = chunk * count;
    let (addr, sink) = on_server(server, move |listener| async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; chunk];
        let mut got = 0;
        while got < total {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        s.write_all(&[1]).await?;
        Ok(got)
    })
    .await?;
    let mut s = TcpStream::connect(addr).await?;
    let data = vec![5u8; chunk];
    let start = Instant::now();
    for _ in 0..count {
        s.write_all(&data).await?;
    }
    let mut done = [0u8; 1];
    s.read_exact(&mut done).await?;
    let secs = start.elapsed().as_secs_f64();
    let got = sink.await.map_err(std::io::Error::other)??;
    Ok(got as f64 / secs)
}
