//! A frame channel over one connection: posted receives, credits, encode and decode.
//!
//! Each side posts a few receives of `max_frame` bytes ([`super::INITIAL_RECEIVES`]) and adds
//! one with each frame it receives (other than a credit update), up to its `recv_credits`; the handshake tells the peer
//! both figures (`Hello.credits`, `Hello.max_credits`). An idle connection so holds little
//! memory for receives and a busy one all it announced. Sending a frame uses one credit (one
//! receive of the peer); each frame returns the credits for the receives its sender re-posted
//! or added. The last credit is kept for frames that
//! unblock the peer (handshake, credit updates, goaway), so two sides that both run out can
//! always tell each other about re-posted receives.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::Notify;

use super::codec::{encode_frame, put_credits, Decoder};
use super::credits::{Credits, Need};
use super::frames::{Frame, Kind};
use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::{BoxFuture, Connection, RecvOpcode, SendData};

pub(crate) struct FrameChannel {
    conn: Arc<dyn Connection>,
    /// The credit rules live in [`Credits`], without I/O.
    credits: Mutex<Credits>,
    credit_wake: Notify,
    peer_max_frame: AtomicUsize,
    /// Size of each receive posted.
    max_frame: usize,
    /// Decodes received frames as a connection's state does (`codec`).
    decoder: Mutex<Decoder>,
}

/// A frame encoded with room for its credits after its `len` bytes.
struct Encoded {
    bytes: Vec<u8>,
    len: usize,
}

impl std::fmt::Debug for FrameChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameChannel")
            .field("peer", &self.conn.peer())
            .finish()
    }
}

impl FrameChannel {
    /// Posts `recv_count` receives of `max_frame` bytes.
    pub(crate) fn new(
        conn: Arc<dyn Connection>,
        recv_count: u32,
        max_frame: usize,
        initial_credits: bool,
    ) -> Result<FrameChannel> {
        FrameChannel::growing(conn, recv_count, recv_count, max_frame, initial_credits)
    }

    /// Posts `initial` receives of `max_frame` bytes, and one more with each frame received
    /// (other than the handshake and credit updates) until `max` are posted: an idle
    /// connection keeps little memory, a busy one gets every receive it announced
    /// (`Hello::max_credits`).
    pub(crate) fn growing(
        conn: Arc<dyn Connection>,
        initial: u32,
        max: u32,
        max_frame: usize,
        initial_credits: bool,
    ) -> Result<FrameChannel> {
        let initial = initial.min(max);
        for _ in 0..initial {
            conn.post_recv(RegisteredBuf::new(max_frame, Access::LOCAL_WRITE)?)?;
        }
        Ok(FrameChannel {
            conn,
            credits: Mutex::new(Credits::new(initial, max, initial_credits)),
            credit_wake: Notify::new(),
            // Until the handshake says otherwise, frames stay within the smallest size any
            // build posts.
            peer_max_frame: AtomicUsize::new(super::FRAME_OVERHEAD * 2),
            max_frame,
            decoder: Mutex::new(Decoder::default()),
        })
    }

    pub(crate) fn conn(&self) -> &Arc<dyn Connection> {
        &self.conn
    }

    /// Applies the peer's handshake: its receive count and size.
    /// `announced` is the peer's receive count from its handshake (at most
    /// [`super::MAX_PEER_CREDITS`] count), `credits` how many of them this side may use now.
    pub(crate) fn set_peer(&self, credits: u32, announced: u32, max_frame: u32) {
        self.peer_max_frame
            .store(max_frame as usize, Ordering::Relaxed);
        let ignored = self.credits().handshake(credits, announced);
        self.ignored(ignored);
        self.credit_wake.notify_waiters();
    }

    fn credits(&self) -> MutexGuard<'_, Credits> {
        self.credits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Credits this side holds now.
    #[cfg(test)]
    pub(crate) fn available_credits(&self) -> u32 {
        self.credits().available()
    }

    fn ignored(&self, n: u32) {
        if n > 0 {
            tracing::debug!(
                peer = self.conn.peer(),
                ignored = n,
                "the peer returned more credits than receives it announced; ignored"
            );
        }
    }

    pub(crate) fn peer_max_frame(&self) -> usize {
        self.peer_max_frame.load(Ordering::Relaxed)
    }

    fn add_credits(&self, n: u32) {
        if n == 0 {
            return;
        }
        let ignored = self.credits().returned(n);
        self.ignored(ignored);
        self.credit_wake.notify_waiters();
    }

    async fn take_credit(&self, need: Need) -> Result<()> {
        loop {
            let notified = self.credit_wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.credits().try_take(need) {
                return Ok(());
            }
            tokio::select! {
                _ = &mut notified => {}
                err = self.conn.closed() => return Err(err),
            }
        }
    }

    /// Encodes a frame as a connection's state does (`codec`), refusing it before using a
    /// credit if the peer could not receive it; its credits are written when it leaves.
    fn encode(&self, kind: Option<Kind>) -> Result<Encoded> {
        let mut bytes = Vec::new();
        let len = encode_frame(kind.as_ref(), self.peer_max_frame(), &mut bytes)?;
        Ok(Encoded { bytes, len })
    }

    /// Writes the credits owed to the peer into the frame's room for them.
    fn with_credits(&self, encoded: Encoded) -> SendData {
        let Encoded { mut bytes, len } = encoded;
        let owed = self.credits().take_owed();
        let written = put_credits(&mut bytes[len..], owed, false);
        bytes.truncate(len + written);
        SendData::Bytes(Bytes::from(bytes))
    }

    fn send_encoded(&self, out: Encoded) {
        // No completion is needed: a failure puts the connection in error, which every
        // waiter sees through `recv` or `closed`.
        if let Err(e) = self.conn.send_unsignaled(self.with_credits(out), None) {
            tracing::debug!(peer = self.conn.peer(), error = %e, "frame not sent");
        }
    }

    /// Sends a frame, waiting for a credit. The frame is encoded before the returned future
    /// is first polled, so the future holds the bytes and not the frame; the wait for a credit
    /// (rare) lives in a future of its own. Both keep the futures of calls small.
    pub(crate) fn send(&self, kind: Kind) -> impl Future<Output = Result<()>> + Send + '_ {
        let encoded = self.encode(Some(kind));
        async move {
            let out = encoded?;
            let ready = self.credits().try_take(Need::Ordinary);
            if !ready {
                Box::pin(self.take_credit(Need::Ordinary)).await?;
            }
            self.send_encoded(out);
            Ok(())
        }
    }

    /// Sends a handshake or goaway frame; may use the reserved last credit.
    pub(crate) async fn send_priority(&self, kind: Kind) -> Result<()> {
        let out = self.encode(Some(kind))?;
        self.take_credit(Need::Priority).await?;
        self.send_encoded(out);
        Ok(())
    }

    /// Sends a goaway (or other last) frame only if a credit is free now. The returned
    /// future resolves once the peer has it, and so (in order) every frame sent before it:
    /// await it before closing the connection.
    pub(crate) fn try_send_last(&self, kind: Kind) -> Option<BoxFuture<'static, Result<()>>> {
        let out = self.encode(Some(kind)).ok()?;
        if !self.credits().try_take(Need::Priority) {
            return None;
        }
        Some(self.conn.send(self.with_credits(out), None))
    }

    /// The next frame. `Err` ends the connection: the transport failed or the peer sent
    /// something that is not a frame.
    ///
    /// Each frame spends one unit of the task's tokio budget, as tokio's own sockets and
    /// channels do: a connection whose frames never stop arriving (a peer faster than this
    /// side, or a hostile one) makes its task yield now and then instead of keeping its
    /// thread from every other connection.
    pub(crate) async fn recv(&self) -> Result<Frame> {
        // Polled in place: no future to allocate per frame.
        let completion = std::future::poll_fn(|cx| {
            let budget = std::task::ready!(tokio::task::coop::poll_proceed(cx));
            let completion = std::task::ready!(self.conn.poll_recv(cx));
            budget.made_progress();
            std::task::Poll::Ready(completion)
        })
        .await?;
        if completion.opcode != RecvOpcode::Send {
            return Err(self.malformed(format!(
                "expected a control frame, got {:?}",
                completion.opcode
            )));
        }
        let decoded = self
            .decoder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decode(completion.buf.as_slice());
        let reposted = self.conn.post_recv(completion.buf);
        let frame = decoded.map_err(|e| self.malformed(e))?;
        if reposted.is_err() {
            // The connection ended after this frame arrived (a peer's goaway and close):
            // the frame is still the peer's word, and the next `recv` reports the end.
            return Ok(frame);
        }
        self.add_credits(frame.credits);
        // Receives grow (by one here) when the peer says it was starved. Only this task
        // receives, so the decision holds until it is carried out.
        let grow = frame.starved && self.credits().growth(0) > 0;
        let grew = grow && self.post_one_more();
        let update = {
            let mut credits = self.credits();
            if grew {
                credits.grew();
            }
            credits.reposted() && credits.try_take(Need::Priority)
        };
        if update {
            if let Ok(out) = self.encode(None) {
                self.send_encoded(out);
            }
        }
        Ok(frame)
    }

    /// Posts one more receive; whether it was posted (the peer gets a credit for it with the
    /// next frame).
    fn post_one_more(&self) -> bool {
        match RegisteredBuf::new(self.max_frame, Access::LOCAL_WRITE) {
            Ok(buf) => self.conn.post_recv(buf).is_ok(),
            Err(_) => false,
        }
    }

    /// Sends `kind` as a peer that keeps reading would: frames that arrive while it waits for
    /// a credit are read (credit updates applied) and handed to `arrived`. For tests whose
    /// hand-written peers send several frames in a row: receives start small and grow as
    /// frames arrive, so such a peer must read to get its credits back.
    #[cfg(test)]
    pub(crate) async fn send_reading(
        &self,
        kind: Kind,
        mut arrived: impl FnMut(Kind),
    ) -> Result<()> {
        loop {
            tokio::select! {
                sent = self.send(kind.clone()) => return sent,
                frame = self.recv() => match frame {
                    Ok(frame) => {
                        if let Some(kind) = frame.kind {
                            arrived(kind);
                        }
                    }
                    // The connection is over: the send does what it does on such a one.
                    Err(_) => return self.send(kind).await,
                },
            }
        }
    }

    pub(crate) fn malformed(&self, reason: String) -> Error {
        Error::Protocol {
            peer: self.conn.peer().to_owned(),
            reason,
        }
    }
}
