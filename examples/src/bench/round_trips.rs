//! Round trips beneath the framework, for the many-connection figures' baselines: 64 B
//! messages echoed over a transport alone (the `Connection` trait, no RPC protocol), and
//! between tokio tasks over channels (no rdma-rpc at all). Each client sends one message and
//! waits for its echo, one at a time, all clients at once, as the benchmark's RPC clients do:
//! how much of the cost of many connections is there before the RPC layers begin.

use std::sync::Arc;
use std::time::Instant;

use rdma_rpc_core::memory::Access;
use rdma_rpc_core::transport::{Connection, Transport};
use rdma_rpc_core::RegisteredBuf;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::measure::BenchError;

/// Receives each side keeps posted per connection (the protocol's initial receives).
const RECEIVES: usize = 4;

/// Bytes of each receive (the protocol's default `max_frame`).
const RECEIVE_SIZE: usize = 16 * 1024;

/// The message of every round trip.
const MESSAGE: [u8; 64] = [0x5a; 64];

/// Posts [`RECEIVES`] receives on `conn`.
fn post_receives(conn: &dyn Connection) -> Result<(), BenchError> {
    for _ in 0..RECEIVES {
        conn.post_recv(RegisteredBuf::new(RECEIVE_SIZE, Access::LOCAL_WRITE)?)?;
    }
    Ok(())
}

/// Sends back every message `conn` receives, until it ends. Its receives are posted before
/// it says it is ready (an empty message), and the client sends nothing before that: no
/// message ever waits for a receive, however late this task starts.
async fn echo(conn: Arc<dyn Connection>) {
    if post_receives(&*conn).is_err() || conn.send_frame(&[]).is_err() {
        return;
    }
    while let Ok(done) = conn.recv().await {
        if conn.send_frame(done.buf.as_slice()).is_err() || conn.post_recv(done.buf).is_err() {
            return;
        }
    }
}

/// A server that echoes every message of its connections: it stops accepting (and lets its
/// listener and transport go) when dropped; its connections end as their clients close them.
#[derive(Debug)]
pub struct EchoServer {
    /// Where it listens.
    pub addr: String,
    /// The accepting task (taken by `stop`).
    accepting: Option<tokio::task::JoinHandle<()>>,
}

impl EchoServer {
    /// Lets it serve until the process ends; returns where it listens.
    pub fn detach(mut self) -> String {
        // Dropping a task's handle leaves the task running.
        drop(self.accepting.take());
        std::mem::take(&mut self.addr)
    }

    /// Stops accepting, and returns once the listener is gone.
    pub async fn stop(mut self) {
        if let Some(task) = self.accepting.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        if let Some(task) = &self.accepting {
            task.abort();
        }
    }
}

/// Listens on `bind` with `transport` and echoes every connection's messages, on tasks of the
/// current runtime.
pub async fn echo_server(
    transport: Arc<dyn Transport>,
    bind: &str,
) -> Result<EchoServer, BenchError> {
    let listener = transport.listen(bind).await?;
    let addr = listener.local_addr();
    let accepting = tokio::spawn(async move {
        while let Ok(conn) = listener.accept().await {
            tokio::spawn(echo(conn));
        }
    });
    Ok(EchoServer {
        addr,
        accepting: Some(accepting),
    })
}

/// One round trip on `conn`: [`MESSAGE`] out, its echo back.
async fn round_trip(conn: &dyn Connection) -> Result<(), BenchError> {
    conn.send_frame(&MESSAGE)?;
    let done = conn.recv().await?;
    if done.buf.as_slice() != MESSAGE {
        return Err(format!(
            "an echo of {} bytes differs from the message",
            done.buf.len()
        )
        .into());
    }
    conn.post_recv(done.buf)?;
    Ok(())
}

/// `n` connections of `transport` to the [`echo_server`] at `addr` (connected and made ready,
/// not timed) each make their share of `total` round trips, one at a time, all at once: round
/// trips per second of all of them together. The connections close when it returns.
pub async fn over_transport(
    transport: &Arc<dyn Transport>,
    addr: &str,
    n: usize,
    total: usize,
) -> Result<f64, BenchError> {
    EchoClients::connect(transport, addr, n)
        .await?
        .round_trips_per_second(total)
        .await
}

/// Connections to an [`echo_server`], connected and made ready, kept for as many timed runs as
/// wanted; closed when dropped.
#[derive(Debug)]
pub struct EchoClients(Vec<Arc<dyn Connection>>);

impl EchoClients {
    /// `n` connections of `transport` to the echo server at `addr`, each ready (its receives
    /// posted, the server's ready message received).
    pub async fn connect(
        transport: &Arc<dyn Transport>,
        addr: &str,
        n: usize,
    ) -> Result<EchoClients, BenchError> {
        let mut conns = EchoClients(Vec::with_capacity(n));
        for _ in 0..n {
            let conn = transport.connect(addr).await?;
            post_receives(&*conn)?;
            conns.0.push(conn);
        }
        for conn in &conns.0 {
            let ready = conn.recv().await?;
            conn.post_recv(ready.buf)?;
        }
        Ok(conns)
    }

    /// Each connection makes its share of `total` round trips, one at a time, all at once:
    /// round trips per second of all of them together.
    pub async fn round_trips_per_second(&self, total: usize) -> Result<f64, BenchError> {
        shares_per_second(total, &self.0, |conn, each| async move {
            for _ in 0..each {
                round_trip(&*conn).await?;
            }
            Ok(())
        })
        .await
    }
}

impl Drop for EchoClients {
    fn drop(&mut self) {
        for conn in &self.0 {
            conn.close();
        }
    }
}

/// As [`over_transport`], between `n` client tasks of the current runtime and `n` server
/// tasks on `server`, over tokio channels (a bounded channel of one message each way).
pub async fn over_channels(server: &Handle, n: usize, total: usize) -> Result<f64, BenchError> {
    ChannelClients::spawn(server, n)
        .round_trips_per_second(total)
        .await
}

/// One client's ends of its channels: to its server task, and back.
type Ends = (mpsc::Sender<Vec<u8>>, mpsc::Receiver<Vec<u8>>);

/// Clients of echo tasks over tokio channels (see [`over_channels`]), kept for as many timed
/// runs as wanted; the server tasks end when this is dropped.
#[derive(Debug)]
pub struct ChannelClients(Vec<Arc<tokio::sync::Mutex<Ends>>>);

impl ChannelClients {
    /// `n` clients, each with an echo task of its own on `server`.
    pub fn spawn(server: &Handle, n: usize) -> ChannelClients {
        let mut ends = Vec::with_capacity(n);
        for _ in 0..n {
            let (to_server, mut from_client) = mpsc::channel::<Vec<u8>>(1);
            let (to_client, from_server) = mpsc::channel::<Vec<u8>>(1);
            server.spawn(async move {
                while let Some(message) = from_client.recv().await {
                    if to_client.send(message).await.is_err() {
                        return;
                    }
                }
            });
            ends.push(Arc::new(tokio::sync::Mutex::new((to_server, from_server))));
        }
        ChannelClients(ends)
    }

    /// As [`EchoClients::round_trips_per_second`], over the channels. (Each client's lock is
    /// taken once per run, not per round trip.)
    pub async fn round_trips_per_second(&self, total: usize) -> Result<f64, BenchError> {
        shares_per_second(total, &self.0, |ends, each| async move {
            let (to, from) = &mut *ends.lock().await;
            for _ in 0..each {
                to.send(MESSAGE.to_vec()).await?;
                let echo = from.recv().await.ok_or("the server task ended")?;
                if echo != MESSAGE {
                    return Err("an echo differs from the message".into());
                }
            }
            Ok(())
        })
        .await
    }
}

/// Runs `client` for each of `clients` on tasks of the current runtime, all at once, each
/// with its share of `total` round trips (or calls): round trips per second of all of them.
pub(super) async fn shares_per_second<C, F, Fut>(
    total: usize,
    clients: &[C],
    client: F,
) -> Result<f64, BenchError>
where
    C: Clone,
    F: Fn(C, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let each = (total / clients.len().max(1)).max(1);
    per_second(each * clients.len(), clients.iter().cloned(), |c| {
        client(c, each)
    })
    .await
}

/// Runs `client` for each of `clients` on tasks of the current runtime, all at once: `count`
/// round trips (or calls) in all, per second.
pub(super) async fn per_second<C, F, Fut>(
    count: usize,
    clients: impl IntoIterator<Item = C>,
    client: F,
) -> Result<f64, BenchError>
where
    F: Fn(C) -> Fut,
    Fut: std::future::Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in clients {
        tasks.spawn(client(c));
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rdma_rpc_core::transport::mem::MemTransport;
    use rdma_rpc_core::transport::Transport;

    use super::{echo_server, over_channels, over_transport};

    #[tokio::test]
    async fn every_client_gets_its_echoes_and_a_stopped_server_accepts_no_more() {
        let transport: Arc<dyn Transport> = Arc::new(MemTransport::new());
        let server = echo_server(transport.clone(), "mem://").await.unwrap();
        let addr = server.addr.clone();
        let rate = over_transport(&transport, &addr, 3, 30).await.unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
        server.stop().await;
        assert!(
            transport.connect(&addr).await.is_err(),
            "a stopped echo server still accepts"
        );
        let rate = over_channels(&tokio::runtime::Handle::current(), 3, 30)
            .await
            .unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
    }
}
