//! Pieces every transport needs the same way: the queue of completed receives, and a
//! listener whose connections are set up in the background.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;

use super::{BoxFuture, Connection, Listener, RecvCompletion};
use crate::error::{Error, Result};

/// Completed receives of one connection, handed out in order; once the connection is closed
/// and the queue is empty, the connection's error.
pub(crate) struct RecvQueue {
    tx: mpsc::UnboundedSender<RecvCompletion>,
    rx: Mutex<mpsc::UnboundedReceiver<RecvCompletion>>,
}

impl RecvQueue {
    pub(crate) fn new() -> RecvQueue {
        let (tx, rx) = mpsc::unbounded_channel();
        RecvQueue {
            tx,
            rx: Mutex::new(rx),
        }
    }

    /// Queues a completion.
    pub(crate) fn push(&self, completion: RecvCompletion) {
        // The receiver lives as long as `self`: sending cannot fail.
        let _ = self.tx.send(completion);
    }

    /// The next completion. Cancel safe: a completion is only taken when it is returned.
    pub(crate) async fn next(
        &self,
        closed: &watch::Sender<bool>,
        error: impl Fn() -> Error,
    ) -> Result<RecvCompletion> {
        let mut rx = self.rx.lock().await;
        let mut closed = closed.subscribe();
        loop {
            if let Ok(c) = rx.try_recv() {
                return Ok(c);
            }
            if *closed.borrow_and_update() {
                return Err(error());
            }
            tokio::select! {
                c = rx.recv() => if let Some(c) = c { return Ok(c) },
                _ = closed.changed() => {}
            }
        }
    }
}

/// A TCP listener whose accepted sockets become connections through `setup`, each in its own
/// task, so a slow or silent peer never holds up the others.
pub(crate) struct QueuedListener {
    local: String,
    ready: Mutex<mpsc::Receiver<Result<Arc<dyn Connection>>>>,
    task: JoinHandle<()>,
}

impl QueuedListener {
    pub(crate) fn start<F, Fut>(listener: TcpListener, local: String, setup: F) -> QueuedListener
    where
        F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn Connection>>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(64);
        let setup = Arc::new(setup);
        let task = tokio::spawn(async move {
            loop {
                let (stream, from) = match listener.accept().await {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of file descriptors and the like: report, back off, go on.
                        if tx
                            .send(Err(Error::io("accepting a connection", e)))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let (tx, setup) = (tx.clone(), setup.clone());
                tokio::spawn(async move {
                    match setup(stream, from).await {
                        Ok(conn) => {
                            if tx.send(Ok(conn)).await.is_err() {
                                tracing::debug!("listener closed before a connection was taken");
                            }
                        }
                        Err(e) => tracing::warn!(peer = %from, error = %e, "dropping connection"),
                    }
                });
            }
        });
        QueuedListener {
            local,
            ready: Mutex::new(rx),
            task,
        }
    }
}

impl Drop for QueuedListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl fmt::Debug for QueuedListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .finish()
    }
}

impl Listener for QueuedListener {
    fn accept(&self) -> BoxFuture<'_, Result<Arc<dyn Connection>>> {
        Box::pin(async move {
            match self.ready.lock().await.recv().await {
                Some(result) => result,
                None => Err(Error::ConnectionClosed {
                    peer: self.local.clone(),
                    reason: "listener stopped".into(),
                }),
            }
        })
    }

    fn local_addr(&self) -> String {
        self.local.clone()
    }
}
