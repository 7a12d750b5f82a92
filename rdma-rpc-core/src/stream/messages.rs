//! Message streams: the incoming side ([`MessageStream`], typed as [`Streaming`]) and the
//! outgoing side ([`MessageSink`]), the same on the client and the server.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_core::Stream;

use super::cell::{Next, StreamCell};
use crate::protocol::frames::{CreditFrame, Kind, MessagesFrame};
use crate::protocol::stream::{message_cost, Batch, MESSAGES_FRAME_OVERHEAD};
use crate::service::EndpointDef;
use crate::session::Session;
use crate::status::Status;

/// The messages a call's peer streams, encoded, in order: the client's request messages on
/// the server, the server's response messages on the client. Ends (`None`) when the peer's
/// stream ends; an error ends it early (the call failed, was cancelled, or its deadline
/// passed). Taking messages is what lets the peer send more: a stream nobody reads holds at
/// most its window (`stream_window`) of them.
///
/// Typed messages come through [`Streaming`], which wraps one of these.
pub struct MessageStream {
    cell: Arc<StreamCell>,
    session: Arc<Session>,
    id: u64,
    endpoint: EndpointDef,
    /// What keeps the call open while the stream lives (the client's call, whose drop
    /// cancels it); nothing on the server, whose call task owns the call.
    _call: Option<Box<dyn Send>>,
    /// When the call's deadline passes (client).
    deadline: super::StreamDeadline,
    done: bool,
}

impl std::fmt::Debug for MessageStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageStream")
            .field(
                "endpoint",
                &format_args!("{} {}", self.endpoint.op, self.endpoint.path),
            )
            .field("call", &self.id)
            .field("done", &self.done)
            .finish()
    }
}

impl MessageStream {
    pub(crate) fn new(
        cell: Arc<StreamCell>,
        session: Arc<Session>,
        id: u64,
        endpoint: EndpointDef,
    ) -> MessageStream {
        MessageStream {
            cell,
            session,
            id,
            endpoint,
            _call: None,
            deadline: super::StreamDeadline::at(None),
            done: false,
        }
    }

    /// Keeps `call` with the stream (dropped with it), and ends the stream at `deadline`.
    pub(crate) fn holding(
        mut self,
        call: Box<dyn Send>,
        deadline: Option<tokio::time::Instant>,
    ) -> MessageStream {
        self._call = Some(call);
        self.deadline = super::StreamDeadline::at(deadline);
        self
    }

    /// The next message; `Ok(None)` once the peer's stream ended.
    pub async fn message(&mut self) -> Result<Option<Bytes>, Status> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .transpose()
    }

    fn credit(&self, bytes: u64) {
        // Queued: it leaves as soon as the connection has a credit (a connection that ended
        // wants no credit).
        let _ = self
            .session
            .send(Kind::Credit(CreditFrame { id: self.id, bytes }));
    }
}

impl Stream for MessageStream {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.cell.poll_message(cx) {
            Poll::Ready(Next::Message(message, credit)) => {
                if let Some(bytes) = credit {
                    self.credit(bytes);
                }
                return Poll::Ready(Some(Ok(message)));
            }
            Poll::Ready(Next::End) => {
                self.done = true;
                return Poll::Ready(None);
            }
            Poll::Ready(Next::Failed(status)) => {
                self.done = true;
                return Poll::Ready(Some(Err(status)));
            }
            Poll::Pending => {}
        }
        let this = &mut *self;
        this.deadline.poll_end(cx, &this.endpoint, &mut this.done)
    }
}

/// A stream of typed messages from the call's peer (as tonic's `Streaming`): the client's
/// request messages in a handler, the server's response messages on the client. Read it with
/// [`message`](Streaming::message) or as a [`Stream`](futures_core::Stream).
pub struct Streaming<T> {
    raw: MessageStream,
    _message: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Streaming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Streaming").field(&self.raw).finish()
    }
}

impl<T: prost::Message + Default> Streaming<T> {
    /// Decodes the messages of `raw` as `T`.
    pub fn new(raw: MessageStream) -> Streaming<T> {
        Streaming {
            raw,
            _message: PhantomData,
        }
    }

    /// The next message; `Ok(None)` once the peer's stream ended.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .transpose()
    }

    /// The encoded messages.
    pub fn into_raw(self) -> MessageStream {
        self.raw
    }

    fn decode(&self, bytes: Bytes) -> Result<T, Status> {
        T::decode(bytes).map_err(|e| {
            let ep = self.raw.endpoint;
            Status::internal(format!(
                "a malformed stream message of {} {}: {e}",
                ep.op, ep.path
            ))
        })
    }
}

impl<T: prost::Message + Default> Stream for Streaming<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match Pin::new(&mut self.raw).poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(self.decode(bytes))),
            Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(status))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Room kept in each block of encoded messages (see [`MessageSink`]).
const SCRATCH: usize = 16 * 1024;

/// The sending side of a message stream: the server's response messages in a handler, the
/// client's request messages on the client. Messages are packed into frames, as many as fit;
/// a frame leaves once it is full, or when the producer has nothing more at once, and only
/// while the peer's window has room (a peer that does not read makes the sender wait).
pub struct MessageSink {
    cell: Arc<StreamCell>,
    session: Arc<Session>,
    id: u64,
    endpoint: EndpointDef,
    batch: Batch,
    /// Most bytes of messages in one frame.
    room: usize,
    /// Most window one frame may spend: half the peer's window (so that a sender waiting
    /// for credit always gets some; `protocol::stream`).
    max_cost: u64,
    /// Where messages are encoded: blocks shared by consecutive messages.
    scratch: BytesMut,
    /// The sink said its stream ended.
    ended: bool,
    /// Longest wait for the peer's window (`transfer_timeout`): a peer that takes nothing
    /// for that long ends the stream.
    patience: std::time::Duration,
}

impl std::fmt::Debug for MessageSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageSink")
            .field(
                "endpoint",
                &format_args!("{} {}", self.endpoint.op, self.endpoint.path),
            )
            .field("call", &self.id)
            .finish()
    }
}

/// Most bytes of staging one stream reserves for its frames in flight.
const MAX_FRAME_RESERVE: usize = 8 << 20;

/// Registers, before the first frame, the staging the frames of a stream with `window` bytes
/// of credit can hold in flight at once (a frame is released when its send completes, which
/// on a busy sender can trail the peer's credit): frames larger than half a frame size fit
/// `window` twice over, the smaller ones fall upward into them (see
/// [`reserve_sends`](crate::transport::Connection::reserve_sends)). Without it the pool
/// would grow while streaming whenever sends completed later than they did before.
fn reserve_frames(session: &Session, window: u64) {
    let frame = session.peer_max_frame().max(1);
    let bytes = usize::try_from(window)
        .unwrap_or(usize::MAX)
        .saturating_mul(2)
        .min(MAX_FRAME_RESERVE);
    let count = bytes / frame + 2;
    if let Err(e) = session.transport().reserve_sends(frame, count) {
        tracing::debug!(error = %e, frame, count, "stream frames not reserved");
    }
}

impl MessageSink {
    pub(crate) fn new(
        cell: Arc<StreamCell>,
        session: Arc<Session>,
        id: u64,
        endpoint: EndpointDef,
        peer_window: u64,
        patience: std::time::Duration,
    ) -> MessageSink {
        let room = session
            .peer_max_frame()
            .saturating_sub(MESSAGES_FRAME_OVERHEAD);
        reserve_frames(&session, peer_window);
        MessageSink {
            cell,
            session,
            id,
            endpoint,
            batch: Batch::default(),
            room,
            max_cost: peer_window / 2,
            scratch: BytesMut::new(),
            ended: false,
            patience,
        }
    }

    /// The most bytes one message may encode to: what a frame holds.
    pub fn max_message_len(&self) -> usize {
        // One message alone in a frame: its key and length take up to 6 bytes.
        self.room.saturating_sub(6)
    }

    /// Queues a message; sends the frame it fills. A message larger than a frame fails with
    /// `RESOURCE_EXHAUSTED`, naming the limit.
    pub async fn send<M: prost::Message>(&mut self, message: &M) -> Result<(), Status> {
        let encoded = self.encode(message)?;
        self.send_raw(encoded).await
    }

    /// Queues an encoded message (see [`send`](Self::send)).
    pub async fn send_raw(&mut self, message: Bytes) -> Result<(), Status> {
        self.check(message.len())?;
        let cost = message_cost(message.len());
        if !self
            .batch
            .fits(message.len(), self.room, cost, self.max_cost)
        {
            self.flush().await?;
        }
        self.batch.push(message);
        Ok(())
    }

    /// Sends every message of `messages`, in frames as full as the producer allows: a frame
    /// leaves when it is full, or when the next message is not ready yet. An error from the
    /// stream ends it: the messages before it are sent, and the error is returned.
    pub async fn send_all<M, S>(&mut self, messages: S) -> Result<(), Status>
    where
        M: prost::Message,
        S: Stream<Item = Result<M, Status>>,
    {
        let drained = self
            .drain(messages, |sink, message: M| sink.encode(&message))
            .await;
        let flushed = self.flush().await;
        drained.and(flushed)
    }

    /// Queues every item of `items` (encoded by `encode`), sending frames as they fill or as
    /// the producer pauses; what is queued at the end stays queued.
    pub(crate) async fn drain<T, S>(
        &mut self,
        items: S,
        mut encode: impl FnMut(&mut Self, T) -> Result<Bytes, Status>,
    ) -> Result<(), Status>
    where
        S: Stream<Item = Result<T, Status>>,
    {
        let mut items = std::pin::pin!(items);
        loop {
            let next = if self.batch.is_empty() {
                std::future::poll_fn(|cx| items.as_mut().poll_next(cx)).await
            } else {
                // Ready now, or the frame so far leaves first.
                match std::future::poll_fn(|cx| Poll::Ready(items.as_mut().poll_next(cx))).await {
                    Poll::Ready(next) => next,
                    Poll::Pending => {
                        self.flush().await?;
                        continue;
                    }
                }
            };
            match next {
                Some(Ok(item)) => {
                    let message = encode(self, item)?;
                    self.send_raw(message).await?;
                }
                Some(Err(status)) => return Err(status),
                None => return Ok(()),
            }
        }
    }

    /// Sends the messages queued so far, waiting for the peer's window if it must.
    pub async fn flush(&mut self) -> Result<(), Status> {
        self.send_batch(false).await
    }

    /// Sends what is queued and tells the peer the stream ends (client).
    pub(crate) async fn finish(&mut self) -> Result<(), Status> {
        if self.ended {
            return Ok(());
        }
        self.send_batch(true).await
    }

    async fn send_batch(&mut self, end: bool) -> Result<(), Status> {
        if self.batch.is_empty() && !end {
            return Ok(());
        }
        let cost = self.batch.cost();
        if cost > 0 {
            let room = std::future::poll_fn(|cx| self.cell.poll_send(cx, cost));
            match tokio::time::timeout(self.patience, room).await {
                Ok(room) => room?,
                Err(_) => {
                    let ep = self.endpoint;
                    return Err(Status::unavailable(format!(
                        "the peer took no messages of the stream of {} {} within {:?} \
                         (transfer_timeout)",
                        ep.op, ep.path, self.patience
                    )));
                }
            }
        } else if let Some(status) = self.over() {
            return Err(status);
        }
        let frame = MessagesFrame {
            id: self.id,
            messages: self.batch.take(),
            end,
        };
        self.ended |= end;
        self.session
            .send(Kind::Messages(frame))
            .map_err(Status::from)
    }

    fn over(&self) -> Option<Status> {
        self.cell
            .is_over()
            .then(|| Status::cancelled("the call is over"))
    }

    fn check(&self, len: usize) -> Result<(), Status> {
        let max = self.max_message_len();
        if len > max {
            let ep = self.endpoint;
            return Err(Status::resource_exhausted(format!(
                "a stream message of {} {} encodes to {len} bytes, more than the {max} a frame \
                 holds (max_frame)",
                ep.op, ep.path
            )));
        }
        Ok(())
    }

    fn encode<M: prost::Message>(&mut self, message: &M) -> Result<Bytes, Status> {
        let len = message.encoded_len();
        self.check(len)?;
        if self.scratch.capacity() < len {
            self.scratch.reserve(SCRATCH.max(len));
        }
        message
            .encode(&mut self.scratch)
            .map_err(|e| Status::internal(format!("encoding a stream message: {e}")))?;
        Ok(self.scratch.split().freeze())
    }
}
