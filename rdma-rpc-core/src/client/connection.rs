//! One connection of a client: dialled and handshaken over a transport, the session that
//! drives its protocol state (`protocol::connection`), the task that reads it while no call
//! does, pings, and the goodbye. What a call does on it is in `call.rs` and `stream.rs`.

use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;

use super::copies::CopyPool;
use super::{ClientConfig, Counters};
use crate::error::{Error, Result};
use crate::memory::StagingPools;
use crate::protocol::connection::{ClientSettings, Connection as Proto, Negotiated, ServerEvent};
use crate::remote::RemoteMemory;
use crate::session::Session;
use crate::status::Status;
use crate::transport::Connection;

/// One connection and what its calls share. In this order (`repr(C)`): what every call reads
/// (the session, what the handshake settled) first, next to the reference count each call
/// takes; the compiler had put them after 80 bytes of what only some calls use.
#[repr(C)]
pub(crate) struct Inner {
    pub(super) session: Arc<Session>,
    /// What the handshake settled.
    pub(super) negotiated: Negotiated,
    pub(super) counters: Arc<Counters>,
    /// Warm buffers for copies of pushed results over unfenced transports.
    pub(super) copies: Arc<CopyPool>,
    pub(super) staging: StagingPools,
    /// Offers both ways on this connection.
    pub(super) remote: RemoteMemory,
    /// Windows a bulk stream offers at once.
    pub(super) stream_depth: usize,
    /// The task reading the connection while no call does (set once, right after the
    /// handshake).
    driver: OnceLock<AbortHandle>,
}

/// Longest a client's goodbye waits for the server to have it before the connection closes.
pub(super) const GOODBYE_WAIT: Duration = Duration::from_secs(1);

/// A handshake that found no receive posted for it: the server accepted the connection (a
/// bound server does) but does not run (`serve` was never called, or it is stuck). Said so
/// instead of the transport's "receiver not ready", which points elsewhere.
fn unserved(peer: &str, e: Error) -> Error {
    match e {
        Error::ReceiverNotReady { retry_ms } => Error::ConnectionClosed {
            peer: peer.to_owned(),
            reason: format!(
                "the server accepted the connection but took no handshake within {retry_ms} ms: \
                 is it serving? (a bound server answers once serve() or \
                 serve_with_shutdown() runs, on a task of its own)"
            ),
        },
        other => other,
    }
}

impl Inner {
    /// Runs the handshake on `conn`: the connection, once the server answered.
    pub(super) async fn handshake(
        conn: Arc<dyn Connection>,
        config: &ClientConfig,
        counters: Arc<Counters>,
    ) -> Result<Arc<Inner>> {
        let initial = config.initial_receives.min(config.recv_credits);
        let peer = conn.peer().to_owned();
        let proto = Proto::client(
            ClientSettings {
                max_frame: config.max_frame,
                initial_receives: initial,
                recv_credits: config.recv_credits,
                max_in_flight: config.max_in_flight,
                inline_threshold: config.inline_threshold,
                stream_window: config.stream_window,
                token: crate::remote::new_token(),
            },
            Arc::from(peer.as_str()),
        );
        let session = Session::new(conn, proto, config.max_frame, initial, true)?;
        // This task reads the connection until the server answered. It is made the reader
        // before it reads: the transport wakes the reader, and an answer landing between the
        // read and a later `set_driver` woke nobody (the first time, no reader was set yet):
        // the handshake then waited for the connect timeout to poll it again.
        let answered = std::future::poll_fn(|cx| {
            session.set_driver(&mut session.lock(), cx.waker());
            let over = session.poll_frames(cx, &mut |_, _| {}).is_ready();
            let locked = session.lock();
            if locked.proto.is_open() {
                return Poll::Ready(Ok(()));
            }
            if let Some(end) = locked.proto.end() {
                let error = end.error.as_ref().map_or_else(
                    || Error::ConnectionClosed {
                        peer: peer.clone(),
                        reason: end.status.message().to_owned(),
                    },
                    Error::duplicate,
                );
                return Poll::Ready(Err(unserved(&peer, error)));
            }
            if over {
                return Poll::Ready(Err(Error::ConnectionClosed {
                    peer: peer.clone(),
                    reason: "closed during the handshake".into(),
                }));
            }
            Poll::Pending
        });
        // The connection closes with the handshake's future when it is dropped unfinished
        // (the connect timeout).
        let mut guard = CloseOnDrop(Some(session.clone()));
        answered.await?;
        guard.0 = None;
        let negotiated = *session
            .lock()
            .proto
            .negotiated()
            .expect("an open connection was negotiated");
        let inner = Arc::new(Inner {
            remote: RemoteMemory::new(session.clone(), config.transfer_timeout),
            session: session.clone(),
            negotiated,
            staging: StagingPools::new(config.staging_budget),
            copies: CopyPool::new(config.staging_budget),
            counters,
            stream_depth: config.stream_depth.max(1),
            driver: OnceLock::new(),
        });
        let driver = tokio::spawn(drive(session));
        let _ = inner.driver.set(driver.abort_handle());
        Ok(inner)
    }

    /// Why new calls on this connection are refused, if they are: the server said goodbye,
    /// this client closed it, or it was lost.
    pub(super) fn lost(&self) -> Option<Status> {
        // Read on every call: the flag spares the lock while the connection lives.
        if !self.session.is_refusing() {
            return None;
        }
        let locked = self.session.lock();
        locked
            .proto
            .lost()
            .or_else(|| locked.proto.end().map(|e| e.status.clone()))
    }

    /// The status of a call that finds the connection over.
    pub(super) fn closed_status(&self) -> Status {
        self.lost()
            .unwrap_or_else(|| Status::unavailable("connection lost"))
    }

    /// Resolves once the connection is over (lost, ended by the server's goaway, or closed).
    pub(super) async fn ended(&self) {
        self.session.refused().await;
    }

    /// The next event of call `id`, reading the connection meanwhile: the call's own task
    /// takes its response where it lands (see `session`). `None`: the connection ended first.
    /// `reader_elsewhere`: the call was set to wait in this task, while another call read,
    /// under the lock it was sent under, in this same poll (`Sent::reader_elsewhere`); its
    /// first poll here then returns at once.
    pub(super) async fn event(&self, id: u64, reader_elsewhere: bool) -> Option<ServerEvent> {
        let mut reader_elsewhere = reader_elsewhere;
        std::future::poll_fn(|cx| self.poll_event(id, &mut reader_elsewhere, cx)).await
    }

    /// [`event`](Inner::event) as a poll, for a call written as a future of its own
    /// (`call::SentCall`): `reader_elsewhere` is taken on the first poll.
    pub(super) fn poll_event(
        &self,
        id: u64,
        reader_elsewhere: &mut bool,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<ServerEvent>> {
        // Sent and set to wait in this same poll while another call read: nothing to look at
        // yet (`try_send_inline`).
        if std::mem::take(reader_elsewhere) {
            return Poll::Pending;
        }
        // The event may be there already (another call's task read it): then nothing is
        // read. Otherwise the call reads, unless another call does (see `session`).
        let mut locked = self.session.lock();
        if let Poll::Ready(event) = locked.proto.poll_event(id, cx) {
            self.session.hand_off(&mut locked, id);
            return Poll::Ready(event);
        }
        if self.session.another_reads(&locked, id) {
            return Poll::Pending;
        }
        self.session.set_reader(&mut locked, Some(id), cx.waker());
        drop(locked);
        let _ = self.session.poll_frames(cx, &mut |_, _| {});
        let mut locked = self.session.lock();
        match locked.proto.poll_event(id, cx) {
            Poll::Ready(event) => {
                self.session.hand_off(&mut locked, id);
                Poll::Ready(event)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    pub(super) async fn ping(&self) -> Result<Duration, Status> {
        let id = self.session.lock().proto.ping()?;
        // Forgets the ping if the caller stops waiting.
        struct Forget<'a>(&'a Session, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.lock().proto.forget_ping(self.1);
            }
        }
        let _forget = Forget(&self.session, id);
        let started = Instant::now();
        std::future::poll_fn(|cx| self.session.lock().proto.poll_pong(id, cx)).await?;
        Ok(started.elapsed())
    }

    /// Closes the connection for good: calls in flight end with `UNAVAILABLE`, the server
    /// gets a goodbye. Returns whether it was open (the goodbye is then on its way: await
    /// [`Session::finish`] before the transport closes).
    pub(super) fn leave(&self) -> bool {
        self.session.lock().proto.leave()
    }

    /// Calls in flight on this connection.
    pub(super) fn in_flight(&self) -> usize {
        self.session.lock().proto.calls_in_flight()
    }

    /// Calls this connection may still start before its window is full.
    pub(super) fn room(&self) -> usize {
        let locked = self.session.lock();
        (self.negotiated.max_in_flight as usize).saturating_sub(locked.proto.calls_in_flight())
    }

    /// The server's address.
    pub(super) fn peer(&self) -> &str {
        self.session.peer()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(driver) = self.driver.get() {
            driver.abort();
        }
        // The last handle is gone: a client that leaves, not a connection lost.
        if self.leave() {
            finish_later(&self.session);
        }
    }
}

/// Lets the goodbye reach the server (at most [`GOODBYE_WAIT`]) and closes the transport, on a
/// task of its own; outside a runtime, closes at once.
pub(super) fn finish_later(session: &Arc<Session>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let session = session.clone();
            drop(runtime.spawn(async move { session.finish(GOODBYE_WAIT).await }));
        }
        Err(_) => session.transport().close(),
    }
}

/// Closes a connection whose handshake was given up.
struct CloseOnDrop(Option<Arc<Session>>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            session.abort(Error::ConnectionClosed {
                peer: session.peer().to_owned(),
                reason: "the handshake was given up".into(),
            });
        }
    }
}

/// Reads the connection while no call does (credit updates, revocations, pongs, the server's
/// goodbye, the frames of streaming calls), until it is over, and keeps the connection's timer
/// for its calls' deadlines.
async fn drive(session: Arc<Session>) {
    // The timer, and the instant it is set to.
    let mut timer = std::pin::pin!(None::<tokio::time::Sleep>);
    let mut set_to: Option<Instant> = None;
    let reading = std::future::poll_fn(|cx| {
        loop {
            let at = {
                let mut locked = session.lock();
                session.set_driver(&mut locked, cx.waker());
                locked.proto.set_timer_waker(cx.waker());
                locked.proto.poll_timeout()
            };
            let Some(at) = at else { break };
            if set_to != Some(at) {
                set_to = Some(at);
                let at = tokio::time::Instant::from_std(at);
                match timer.as_mut().as_pin_mut() {
                    Some(sleep) => sleep.reset(at),
                    None => timer.set(Some(tokio::time::sleep_until(at))),
                }
            }
            let sleep = timer.as_mut().as_pin_mut().expect("set above");
            if std::future::Future::poll(sleep, cx).is_pending() {
                break;
            }
            // Calls whose deadline passed are woken; the timer is set to the next one (the
            // time is at least the one the timer fired for, so it moves on).
            let now = crate::session::now().max(at);
            session.lock().proto.handle_timeout(now);
        }
        match session.poll_frames(cx, &mut |_, _| {}) {
            Poll::Ready(crate::session::Read::Over) => Poll::Ready(()),
            // Nothing else is for a client: read on.
            Poll::Ready(crate::session::Read::Timer(_)) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    });
    tokio::select! {
        () = reading => {}
        () = session.ended() => {}
    }
}
