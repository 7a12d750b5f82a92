//! Waiting for a peer with a bound: a transport operation the peer must answer (a one-sided
//! read of its memory, a write into it) is awaited no longer than a given instant; past it the
//! peer loses its connection, as an RDMA queue pair fails when an access never completes. Closing
//! the connection completes the operation with an error, which frees the memory it held (a pool
//! buffer, a lease). If the waiter goes first (its call was stopped), a task of its own keeps
//! watching the operation until the same instant, so dropping a call never leaves an operation
//! unbounded.

use std::sync::Arc;

use tokio::time::Instant;

use crate::error::Result;
use crate::observe::logs;
use crate::transport::{BoxFuture, Connection};

/// `op`'s result if it completes by `until()`; otherwise `None`, after closing `conn`.
///
/// An operation complete as soon as it is posted (the in-process transport's are) needs no
/// bound: `until` is called, the clock read and a timer armed, only for one that is not.
pub(crate) async fn answered_by<T: Send + 'static>(
    conn: &Arc<dyn Connection>,
    mut op: BoxFuture<'static, Result<T>>,
    until: impl FnOnce() -> Instant,
) -> Option<Result<T>> {
    if let Some(done) = poll_once(&mut op) {
        return Some(done);
    }
    let until = until();
    let mut watched = Watched {
        op: Some(op),
        conn: conn.clone(),
        until,
    };
    let result = tokio::time::timeout_at(until, watched.next()).await;
    watched.op = None;
    match result {
        Ok(done) => Some(done),
        Err(_) => {
            if let Some(line) = logs::line("connection dropped", "transfer_timeout") {
                tracing::warn!(
                    peer = %conn.peer(),
                    suppressed = line.suppressed,
                    "the peer did not answer an RDMA operation in time; connection closed"
                );
            }
            conn.close();
            None
        }
    }
}

/// An operation in flight and what bounds it: dropped before it completed, it leaves a task
/// that waits for it until `until` and then closes the connection.
struct Watched<T: Send + 'static> {
    op: Option<BoxFuture<'static, Result<T>>>,
    conn: Arc<dyn Connection>,
    until: Instant,
}

impl<T: Send + 'static> Watched<T> {
    async fn next(&mut self) -> Result<T> {
        std::future::poll_fn(|cx| match self.op.as_mut() {
            Some(op) => op.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        })
        .await
    }
}

impl<T: Send + 'static> Drop for Watched<T> {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else {
            return;
        };
        let (conn, until) = (self.conn.clone(), self.until);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if tokio::time::timeout_at(until, op).await.is_err() {
                        if let Some(line) = logs::line("connection dropped", "transfer_timeout") {
                            tracing::warn!(
                                peer = %conn.peer(),
                                suppressed = line.suppressed,
                                "the peer did not answer an RDMA operation of a stopped call in \
                                 time; connection closed"
                            );
                        }
                        conn.close();
                    }
                });
            }
            // No runtime to watch it from: close now rather than leave it unbounded.
            Err(_) => conn.close(),
        }
    }
}

/// Polls `f` once, without waiting: its output if it is ready now (an operation a transport
/// refused when it was posted has failed already).
pub(crate) fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(f).poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::transport::conformance;
    use crate::transport::mem::MemTransport;

    /// An operation complete as posted is not bounded: no clock read, no timer, and its
    /// connection stays.
    #[tokio::test]
    async fn an_operation_done_as_posted_reads_no_clock() {
        let (conn, _peer) = conformance::pair_on(&MemTransport::new(), "mem://").await;
        let done: BoxFuture<'static, Result<u32>> = Box::pin(std::future::ready(Ok(7)));
        let answered = answered_by(&conn, done, || panic!("the clock was read")).await;
        assert!(matches!(answered, Some(Ok(7))));
        assert!(
            poll_once(&mut conn.closed()).is_none(),
            "the connection stays"
        );
    }

    /// One that is not complete is bounded from when it was found so: past `until()`, the
    /// connection is closed.
    #[tokio::test]
    async fn an_operation_that_waits_is_bounded_and_closes_its_connection() {
        let (conn, _peer) = conformance::pair_on(&MemTransport::new(), "mem://").await;
        let never: BoxFuture<'static, Result<u32>> = Box::pin(std::future::pending());
        let asked = AtomicBool::new(false);
        let until = || {
            asked.store(true, Ordering::Relaxed);
            Instant::now() + Duration::from_millis(20)
        };
        assert!(answered_by(&conn, never, until).await.is_none());
        assert!(asked.load(Ordering::Relaxed));
        assert!(
            poll_once(&mut conn.closed()).is_some(),
            "the connection was closed"
        );
    }
}
