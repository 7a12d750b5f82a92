//! Pieces every transport needs the same way: the queue of completed receives, and a
//! listener whose connections are set up in the background.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, RawWakerVTable, Waker};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex, Semaphore};
use tokio::task::JoinHandle;

use super::{BoxFuture, Connection, Listener, RecvCompletion};
use crate::error::{Error, Result};

/// Completed receives of one connection, handed out in order; once the connection is closed
/// and the queue is empty, the connection's error.
///
/// Laid out for a connection that is one of many: a connection with one message at a time
/// (the common case) keeps it in `QueueState::oldest`, next to the lock, instead of in the
/// `VecDeque`'s own memory, whose ring moves on by one slot with every message; and what a
/// message's arrival and its reader touch (`quiet`, the lock, the first waiter, the pointer to
/// any others and that completion) fill exactly the first two cache lines
/// (`repr(C, align(64))`; `a_completion_touches_two_lines_of_its_queue`). With 1,000
/// connections each of those lines is a cache miss per message; they were three.
#[repr(C, align(64))]
pub(crate) struct RecvQueue {
    quiet: Quiet,
    state: std::sync::Mutex<QueueState>,
}

#[derive(Default)]
#[repr(C)]
struct QueueState {
    /// The readers waiting, and behind the same pointer what few connections need: the
    /// completions queued behind `oldest`, and whether the connection closed.
    waiters: Waiters<Backlog>,
    /// The oldest completion, when there is any: the queue is `oldest` then the backlog's.
    oldest: Option<RecvCompletion>,
}

/// What a queue keeps out of its first two lines (see [`RecvQueue`]).
#[derive(Default)]
struct Backlog {
    completed: VecDeque<RecvCompletion>,
    closed: bool,
}

impl QueueState {
    fn push(&mut self, completion: RecvCompletion) {
        if self.oldest.is_none() {
            // Nothing older waits in the backlog either: it only fills behind `oldest`.
            debug_assert!(self.waiters.extra().is_none_or(|b| b.completed.is_empty()));
            self.oldest = Some(completion);
        } else {
            self.waiters.extra_mut().completed.push_back(completion);
        }
    }

    fn pop(&mut self) -> Option<RecvCompletion> {
        let oldest = self.oldest.take()?;
        self.oldest = self
            .waiters
            .extra_mut_if_any()
            .and_then(|b| b.completed.pop_front());
        Some(oldest)
    }

    fn closed(&self) -> bool {
        self.waiters.extra().is_some_and(|b| b.closed)
    }
}

impl RecvQueue {
    pub(crate) fn new() -> RecvQueue {
        RecvQueue {
            state: std::sync::Mutex::new(QueueState::default()),
            quiet: Quiet::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks for the two lines a completion's arrival touches, and for the record of the task
    /// it will wake, if one waits (see [`crate::prefetch`]). Reads the queue's first line.
    #[cfg(feature = "doca")]
    pub(crate) fn prefetch(&self) {
        let start = std::ptr::from_ref(self).cast::<u8>();
        crate::prefetch::line(start.wrapping_add(64));
        self.quiet.prefetch_waiter();
    }

    /// Queues a completion.
    pub(crate) fn push(&self, completion: RecvCompletion) {
        let woken = {
            let mut st = self.state();
            st.push(completion);
            st.waiters.take(&self.quiet)
        };
        woken.wake();
    }

    /// The connection ended: once the queue is drained, receivers get its error.
    pub(crate) fn close(&self) {
        let woken = {
            let mut st = self.state();
            st.waiters.extra_mut().closed = true;
            st.waiters.take(&self.quiet)
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
        if self.quiet.holds(cx.waker()) {
            return Poll::Pending;
        }
        let mut st = self.state();
        if let Some(c) = st.pop() {
            return Poll::Ready(Ok(c));
        }
        if st.closed() {
            return Poll::Ready(Err(error()));
        }
        st.waiters.register(cx.waker(), &self.quiet);
        Poll::Pending
    }
}

/// Tasks waiting for the receives of one connection: nearly always one. What is rare, the
/// other waiters and whatever the owner keeps with them (`X`), is boxed: 8 bytes here in the
/// common case.
#[repr(C)]
pub(crate) struct Waiters<X = ()> {
    first: Option<Waker>,
    more: Option<Box<More<X>>>,
}

impl<X> Default for Waiters<X> {
    fn default() -> Self {
        Waiters {
            first: None,
            more: None,
        }
    }
}

#[derive(Default)]
struct More<X> {
    /// The waiters after the first (a connection read by more than one task at once).
    wakers: Vec<Waker>,
    extra: X,
}

impl<X: Default> Waiters<X> {
    /// Registers `waker` (under the queue's lock, with no completion waiting): `quiet` then
    /// lets the first waiter's next poll that finds nothing skip the lock.
    pub(crate) fn register(&mut self, waker: &Waker, quiet: &Quiet) {
        match &self.first {
            None => self.first = Some(waker.clone()),
            Some(w) if w.will_wake(waker) => {}
            Some(_) => {
                let more = &mut self.more_mut().wakers;
                if !more.iter().any(|w| w.will_wake(waker)) {
                    more.push(waker.clone());
                }
            }
        }
        if let Some(first) = &self.first {
            quiet.arm(first);
        }
    }

    /// Takes the wakers, to wake once the lock is released; `quiet` is disarmed first (a
    /// completion or the end is why they are taken).
    pub(crate) fn take(&mut self, quiet: &Quiet) -> Woken {
        quiet.disarm();
        Woken {
            first: self.first.take(),
            more: self
                .more
                .as_mut()
                .map_or_else(Vec::new, |m| std::mem::take(&mut m.wakers)),
        }
    }

    fn more_mut(&mut self) -> &mut More<X> {
        self.more.get_or_insert_with(Box::default)
    }

    /// What the owner keeps here, made on first use.
    fn extra_mut(&mut self) -> &mut X {
        &mut self.more_mut().extra
    }

    /// What the owner keeps here, if it was ever made.
    fn extra_mut_if_any(&mut self) -> Option<&mut X> {
        self.more.as_mut().map(|m| &mut m.extra)
    }

    fn extra(&self) -> Option<&X> {
        self.more.as_ref().map(|m| &m.extra)
    }
}

/// Lets a poll that would find no completion, from the task whose waker is registered first,
/// skip the queue's lock: a reader polls again after every frame, and most of those polls
/// find nothing (a lock is two atomic read-modify-writes, about 7 ns each on the development
/// VM). Armed under the lock by [`Waiters::register`] (no completion waits then), disarmed
/// under the lock by [`Waiters::take`], which every new completion and the connection's end
/// do before they wake anyone.
///
/// Why a poll that sees it armed may return `Pending` without the lock: its waker is the one
/// registered first, and stays registered until a `take`, which disarms before it wakes. A
/// poll that reads "armed" just before a completion's disarm has its waker woken by that
/// completion's `take`; a task woken by a `take` sees the disarm when it polls again (the wake
/// orders them).
#[derive(Default)]
pub(crate) struct Quiet {
    /// The first waiter's identity (what [`Waker::will_wake`] compares), written only while
    /// disarmed or with the same waker.
    data: AtomicPtr<()>,
    /// Its vtable while armed; null while disarmed (no waker has a null vtable). A flag of its
    /// own would make this 24 bytes, and the queue's common case a third cache line.
    vtable: AtomicPtr<RawWakerVTable>,
}

impl Quiet {
    fn arm(&self, first: &Waker) {
        self.data.store(first.data().cast_mut(), Ordering::Relaxed);
        // Release: a poll that sees this vtable sees the data stored with it.
        self.vtable.store(
            std::ptr::from_ref(first.vtable()).cast_mut(),
            Ordering::Release,
        );
    }

    fn disarm(&self) {
        self.vtable.store(std::ptr::null_mut(), Ordering::Release);
    }

    /// Asks for the line the armed waiter's waker points to (a task's header, for tokio's),
    /// which waking it writes. Never dereferenced: a waker's data is only an address here.
    #[cfg(feature = "doca")]
    fn prefetch_waiter(&self) {
        if !self.vtable.load(Ordering::Relaxed).is_null() {
            crate::prefetch::line(self.data.load(Ordering::Relaxed).cast_const());
        }
    }

    /// Whether a poll with `waker` would find nothing and leave `waker` registered as it is.
    pub(crate) fn holds(&self, waker: &Waker) -> bool {
        std::ptr::eq(self.vtable.load(Ordering::Acquire), waker.vtable())
            && std::ptr::eq(self.data.load(Ordering::Relaxed), waker.data())
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

/// Sockets one listener sets up at once (their transport handshake: the preamble, TLS, the
/// out-of-band exchange, each bounded by `handshake_timeout`). A socket accepted past it is
/// closed at once: a peer that opens sockets and says nothing holds at most this many (their
/// task, socket and TLS state), not as many as the process has file descriptors. As many as a
/// `doca+oob://` listener keeps waiting to be accepted, for a thousand clients that reconnect
/// together.
pub(crate) const MAX_SETTING_UP: usize = 4096;

/// A TCP listener whose accepted sockets become connections through `setup`, each in its own
/// task, so a slow or silent peer never holds up the others; at most [`MAX_SETTING_UP`] at
/// once.
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
        QueuedListener::start_capped(listener, local, MAX_SETTING_UP, setup)
    }

    /// As [`start`](Self::start), with at most `cap` sockets in their setup at once.
    pub(crate) fn start_capped<F, Fut>(
        listener: TcpListener,
        local: String,
        cap: usize,
        setup: F,
    ) -> QueuedListener
    where
        F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn Connection>>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(64);
        let setup = Arc::new(setup);
        let setting_up = Arc::new(Semaphore::new(cap));
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
                let Ok(permit) = setting_up.clone().try_acquire_owned() else {
                    drop(stream);
                    let full = Error::LimitExceeded {
                        limit: "sockets in their transport handshake, per listener",
                        max: cap as u64,
                        actual: cap as u64 + 1,
                    };
                    dropping(from, &full);
                    continue;
                };
                let (tx, setup) = (tx.clone(), setup.clone());
                tokio::spawn(async move {
                    let set_up = setup(stream, from).await;
                    drop(permit);
                    match set_up {
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

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use super::RecvQueue;
    use crate::error::Error;
    use crate::memory::{Access, RegisteredBuf};
    use crate::tests::wakes::Wakes;
    use crate::transport::{RecvCompletion, RecvOpcode};

    fn completion(byte: u8) -> RecvCompletion {
        RecvCompletion {
            buf: RegisteredBuf::from_slice(&[byte], Access::LOCAL_WRITE).unwrap(),
            opcode: RecvOpcode::Send,
            imm: None,
            write_len: 0,
        }
    }

    fn poll(q: &RecvQueue, w: &Waker) -> Poll<crate::error::Result<RecvCompletion>> {
        q.poll_next(&mut Context::from_waker(w), || Error::ConnectionClosed {
            peer: "p".into(),
            reason: "closed".into(),
        })
    }

    fn got(p: Poll<crate::error::Result<RecvCompletion>>) -> u8 {
        match p {
            Poll::Ready(Ok(c)) => c.buf.as_slice()[0],
            other => panic!("expected a completion, got {other:?}"),
        }
    }

    /// What a completion's arrival and its reader touch (the lock-free check, the lock, the
    /// waiters, the oldest completion) lies in the queue's first two cache lines.
    #[test]
    fn a_completion_touches_two_lines_of_its_queue() {
        assert_eq!(std::mem::align_of::<RecvQueue>(), 64);
        let q = RecvQueue::new();
        let (_wakes, w) = Wakes::new();
        assert!(poll(&q, &w).is_pending());
        q.push(completion(1));
        let start = std::ptr::from_ref(&q) as usize;
        let st = q.state();
        let end = |field: usize, len: usize| field - start + len;
        let quiet = end(std::ptr::from_ref(&q.quiet) as usize, size_of_val(&q.quiet));
        let waiters = end(
            std::ptr::from_ref(&st.waiters) as usize,
            size_of_val(&st.waiters),
        );
        let oldest = end(
            std::ptr::from_ref(&st.oldest) as usize,
            size_of_val(&st.oldest),
        );
        assert!(
            quiet <= 64 && waiters <= 64,
            "quiet ends at {quiet}, waiters at {waiters}"
        );
        assert!(oldest <= 128, "the oldest completion ends at byte {oldest}");
    }

    /// Polls that find nothing (the lock-free ones included) leave the reader registered,
    /// every completion and the end are seen by the next poll, and a second reader is woken
    /// as well as the first.
    #[test]
    fn quiet_polls_keep_the_reader_registered_and_miss_nothing() {
        let q = RecvQueue::new();
        let (one, w1) = Wakes::new();
        assert!(poll(&q, &w1).is_pending());
        assert!(
            q.quiet.holds(&w1),
            "the next poll of this reader skips the lock"
        );
        assert!(poll(&q, &w1).is_pending());
        q.push(completion(1));
        assert_eq!(one.count(), 1);
        assert!(
            !q.quiet.holds(&w1),
            "a completion waits: the next poll takes the lock"
        );
        assert_eq!(got(poll(&q, &w1)), 1);
        assert!(poll(&q, &w1).is_pending());
        q.push(completion(2));
        q.push(completion(3));
        assert_eq!(one.count(), 2);
        assert_eq!(got(poll(&q, &w1)), 2);
        assert_eq!(got(poll(&q, &w1)), 3);
        assert!(poll(&q, &w1).is_pending());
        // A second reader: both are woken by the next completion.
        let (two, w2) = Wakes::new();
        assert!(poll(&q, &w2).is_pending());
        assert!(!q.quiet.holds(&w2), "only the first reader skips the lock");
        assert!(poll(&q, &w1).is_pending());
        q.push(completion(4));
        assert_eq!((one.count(), two.count()), (3, 1));
        assert_eq!(got(poll(&q, &w2)), 4);
        // The end reaches a reader that was quiet.
        assert!(poll(&q, &w2).is_pending());
        q.close();
        assert!(matches!(poll(&q, &w2), Poll::Ready(Err(_))));
    }

    /// Completions come out in the order they went in, however pushes and polls interleave,
    /// and a connection with one completion at a time keeps it in the queue itself: the
    /// `VecDeque` behind it never allocates.
    #[test]
    fn completions_keep_their_order_and_one_at_a_time_stays_inline() {
        let q = RecvQueue::new();
        let (_, w) = Wakes::new();
        for byte in 0..5 {
            q.push(completion(byte));
            assert_eq!(got(poll(&q, &w)), byte);
        }
        assert!(
            q.state().waiters.extra().is_none(),
            "one completion at a time never reached the backlog"
        );
        q.push(completion(10));
        q.push(completion(11));
        assert_eq!(got(poll(&q, &w)), 10);
        q.push(completion(12));
        q.push(completion(13));
        assert_eq!(got(poll(&q, &w)), 11);
        assert_eq!(got(poll(&q, &w)), 12);
        q.push(completion(14));
        assert_eq!(got(poll(&q, &w)), 13);
        assert_eq!(got(poll(&q, &w)), 14);
        assert!(poll(&q, &w).is_pending());
    }

    /// A listener sets up at most its cap of sockets at once: one more is closed as it is
    /// accepted (the peer reads the end of the stream), and once the setups end it sets up
    /// new sockets again.
    #[tokio::test]
    async fn sockets_past_the_cap_are_closed_while_others_set_up() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use tokio::io::AsyncReadExt;
        use tokio::net::{TcpListener, TcpStream};

        use super::QueuedListener;
        use crate::tests::bounded;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let count = started.clone();
        let _listener = QueuedListener::start_capped(listener, "test".into(), 2, move |s, _| {
            let (count, mut released) = (count.clone(), released.clone());
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                let _ = released.wait_for(|r| *r).await;
                drop(s);
                Err(Error::ConnectionClosed {
                    peer: String::new(),
                    reason: "the test's setup ends".into(),
                })
            }
        });
        let connect = || async { TcpStream::connect(addr).await.unwrap() };
        let mut held = vec![connect().await, connect().await];
        bounded("two setups", async {
            while started.load(Ordering::SeqCst) < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        // The third is closed as it is accepted: the end of the stream (or a reset).
        let mut third = connect().await;
        let mut byte = [0u8; 1];
        let read = bounded("the third closed", third.read(&mut byte)).await;
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert_eq!(started.load(Ordering::SeqCst), 2);

        // The setups end (they close their sockets); a new socket is set up again. Its
        // permit may come back just after its socket closed: a socket accepted before then
        // is closed too, and the peer tries again.
        release.send_replace(true);
        for h in &mut held {
            let read = bounded("a held socket closed", h.read(&mut byte)).await;
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        }
        bounded("a setup again", async {
            loop {
                let mut next = connect().await;
                tokio::select! {
                    _ = next.read(&mut byte) => {}
                    _ = async {
                        while started.load(Ordering::SeqCst) < 3 {
                            tokio::task::yield_now().await;
                        }
                    } => return,
                }
            }
        })
        .await;
    }
}
