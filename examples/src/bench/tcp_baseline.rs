//! The raw TCP baselines, measured in the same run as everything else: a 64-byte ping-pong
//! round trip on loopback, and a bulk stream of 4 MiB writes. The serving side runs on the
//! `server` runtime, like the rdma-rpc and gRPC servers.

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

/// Round-trip latencies of `rounds` ping-pongs of `size` bytes over one TCP connection.
pub async fn ping_pong(
    server: &Handle,
    size: usize,
    rounds: usize,
) -> std::io::Result<Vec<Duration>> {
    let (addr, echo) = on_server(server, move |listener| async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        for _ in 0..rounds {
            s.read_exact(&mut buf).await?;
            s.write_all(&buf).await?;
        }
        Ok(())
    })
    .await?;
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let out = vec![7u8; size];
    let mut back = vec![0u8; size];
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        s.write_all(&out).await?;
        s.read_exact(&mut back).await?;
        times.push(start.elapsed());
    }
    echo.await.map_err(std::io::Error::other)??;
    Ok(times)
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
