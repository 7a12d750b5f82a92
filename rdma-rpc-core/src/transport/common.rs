//! Pieces every transport needs the same way: the queue of completed receives, and a
//! listener whose connections are set up in the background.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinHandle;

use super::{BoxFuture, Connection, Listener, RecvCompletion};
use crate::error::{Error, Result};

/// Completed receives of one connection, handed out in order; once the connection is closed
/// and the queue is empty, the connection's error.
pub(crate) struct RecvQueue {
    state: std::sync::Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    completed: VecDeque<RecvCompletion>,
    closed: bool,
    waiters: Waiters,
}

impl RecvQueue {
    pub(crate) fn new() -> RecvQueue {
        RecvQueue {
            state: std::sync::Mutex::new(QueueState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a completion.
    pub(crate) fn push(&self, completion: RecvCompletion) {
        let woken = {
            let mut st = self.state();
            st.completed.push_back(completion);
            st.waiters.take()
        };
        woken.wake();
    }

    /// The connection ended: once the queue is drained, receivers get its error.
    pub(crate) fn close(&self) {
        let woken = {
            let mut st = self.state();
            st.closed = true;
            st.waiters.take()
        };
        woken.wake();
    }

    /// The next completion, or the connection's error once closed and drained. Nothing is
    /// taken unless it is returned, so a receiver that stops polling loses nothing.
    pub(crate) fn poll_next(
        &self,
        cx: &mut Context<'_>,
        error: impl FnOnce() -> Error,
    ) -> Poll<Result<RecvCompletion>> {
        let mut st = self.state();
        if let Some(mut c) = st.completed.pop_front() {
            if st.completed.is_empty() && !st.closed {
                st.waiters.register(cx.waker());
                c.last = true;
            }
            return Poll::Ready(Ok(c));
        }
        if st.closed {
            return Poll::Ready(Err(error()));
        }
        st.waiters.register(cx.waker());
        Poll::Pending
    }
}

/// Tasks waiting for the receives of one connection: nearly always one.
#[derive(Default)]
pub(crate) struct Waiters {
    first: Option<Waker>,
    more: Vec<Waker>,
}

impl Waiters {
    pub(crate) fn register(&mut self, waker: &Waker) {
        match &self.first {
            None => self.first = Some(waker.clone()),
            Some(w) if w.will_wake(waker) => {}
            Some(_) => {
                if !self.more.iter().any(|w| w.will_wake(waker)) {
                    self.more.push(waker.clone());
                }
            }
        }
    }

    /// Takes the wakers, to wake once the lock is released.
    pub(crate) fn take(&mut self) -> Woken {
        Woken {
            first: self.first.take(),
            more: if self.more.is_empty() {
                Vec::new()
            } else {
                std::mem::take(&mut self.more)
            },
        }
    }
}

/// Wakers taken under the lock, woken after it.
#[must_use]
pub(crate) struct Woken {
    first: Option<Waker>,
    more: Vec<Waker>,
}

impl Woken {
    pub(crate) fn wake(self) {
        if let Some(w) = self.first {
            w.wake();
        }
        for w in self.more {
            w.wake();
        }
    }
}

/// Logs a socket whose setup failed: a peer that went away at `DEBUG`, anything else at
/// `WARN` within the log budget (a peer can open sockets without end).
fn dropping(from: SocketAddr, e: &Error) {
    use crate::observe::logs::{self, Ending};
    let ending = Ending::of(e);
    if ending == Ending::Closed {
        tracing::debug!(peer = %from, error = %e, "dropping connection");
    } else if let Some(line) = logs::line("dropping connection", ending.as_str()) {
        tracing::warn!(
            peer = %from,
            error = %logs::shown_reason(&e.to_string()),
            suppressed = line.suppressed,
            "dropping connection"
        );
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
                        Err(e) => dropping(from, &e),
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
