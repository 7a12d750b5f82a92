//! The state one call's streams share between the task that reads the connection (which
//! delivers the peer's frames here, and ends the connection when they break the rules) and
//! the application's side (which takes messages and chunks, and waits for credit or windows).
//! The rules themselves are in `protocol::stream`; this is their lock and their wakers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use crate::protocol::frames::{MessagesFrame, ResponseFrame, UsedWindow, WindowOffer};
use crate::protocol::stream::{
    message_cost, Direction, Done, Offered, Offering, Piece, RecvWindow, SendWindow, Violation,
    Window,
};
use crate::status::Status;
use crate::transport::Descriptor;

/// What a call's streams are, on one side.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Setup {
    /// This side receives messages, buffering this many bytes of them (its window).
    pub(crate) receives: Option<u64>,
    /// This side sends messages into a window of this many bytes (the peer's).
    pub(crate) sends: Option<u64>,
    /// Server: the client offers windows for a bulk stream of this direction and limit.
    pub(crate) offered: Option<(Direction, u64)>,
    /// Client: this side offers windows for a bulk stream of this direction and limit.
    pub(crate) offering: Option<(Direction, u64)>,
}

/// The next message of a stream, as the application sees it.
pub(crate) enum Next {
    /// A message, and the credit to send back for it, if one is due.
    Message(Bytes, Option<u64>),
    /// The peer's stream ended.
    End,
    /// The call is over with this status before the peer's stream ended.
    Failed(Status),
}

#[derive(Default)]
struct State {
    recv: Option<RecvWindow>,
    messages: VecDeque<Bytes>,
    /// The peer's messages ended (its end flag; on the client, the response).
    peer_done: bool,
    /// Client: the response's error, which ends the server's stream once the messages before
    /// it were taken.
    peer_failed: Option<Status>,
    reader: Option<Waker>,
    /// A task that only waits for the call to be over (a client's request stream).
    watcher: Option<Waker>,
    send: Option<SendWindow>,
    writer: Option<Waker>,
    offered: Option<Offered>,
    /// The descriptors of the windows in `offered`, by number.
    descriptors: Vec<(u32, Descriptor)>,
    offering: Option<Offering>,
    used: VecDeque<Done>,
    /// The call is over: whatever waits stops with this.
    over: Option<Status>,
    /// Client: the call's response, once it came.
    response: Option<ResponseFrame>,
    /// Client: the response was taken.
    answered: bool,
}

impl State {
    fn answered(&self) -> bool {
        self.response.is_some() || self.answered
    }
}

/// One call's streams. See the module's documentation.
pub(crate) struct StreamCell(Mutex<State>);

impl std::fmt::Debug for StreamCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("StreamCell")
            .field("queued", &state.messages.len())
            .field("peer_done", &state.peer_done)
            .field("over", &state.over)
            .finish()
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(w) = waker {
        w.wake();
    }
}

fn park(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        slot => *slot = Some(cx.waker().clone()),
    }
}

impl StreamCell {
    pub(crate) fn new(setup: Setup) -> Arc<StreamCell> {
        Arc::new(StreamCell(Mutex::new(State {
            recv: setup.receives.map(RecvWindow::new),
            send: setup.sends.map(SendWindow::new),
            offered: setup.offered.map(|(d, limit)| Offered::new(d, limit)),
            offering: setup.offering.map(|(d, limit)| Offering::new(d, limit)),
            ..State::default()
        })))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    // The reading task's side: the peer's frames.

    /// The peer's `Messages` frame.
    pub(crate) fn messages(&self, frame: MessagesFrame) -> Result<(), Violation> {
        let mut state = self.state();
        if state.over.is_some() {
            return Ok(()); // the call is over: what is still in flight is dropped
        }
        if state.peer_done {
            return Err(Violation("stream messages after the stream's end".into()));
        }
        let Some(recv) = state.recv.as_mut() else {
            return Err(Violation(
                "stream messages for a call that streams none this way".into(),
            ));
        };
        let cost = frame.messages.iter().map(|m| message_cost(m.len())).sum();
        recv.receive(cost)?;
        state.messages.extend(frame.messages);
        state.peer_done |= frame.end;
        let reader = state.reader.take();
        drop(state);
        wake(reader);
        Ok(())
    }

    /// The peer's `Credit` frame.
    pub(crate) fn credit(&self, bytes: u64) -> Result<(), Violation> {
        let mut state = self.state();
        let Some(send) = state.send.as_mut() else {
            return Err(Violation("a credit for a stream that sends nothing".into()));
        };
        send.credit(bytes)?;
        let writer = state.writer.take();
        drop(state);
        wake(writer);
        Ok(())
    }

    /// Server: windows the client offered (in its request or a `Chunks` frame).
    pub(crate) fn offers(&self, offers: Vec<WindowOffer>) -> Result<(), Violation> {
        let mut state = self.state();
        if state.over.is_some() {
            return Ok(());
        }
        let state = &mut *state;
        let Some(offered) = state.offered.as_mut() else {
            return Err(Violation(
                "windows offered for a call without a bulk stream".into(),
            ));
        };
        for offer in offers {
            let Some(descriptor) = offer.descriptor else {
                return Err(Violation(format!(
                    "window {} offered without a descriptor",
                    offer.window
                )));
            };
            let descriptor = Descriptor::from(descriptor);
            offered.offer(Window {
                id: offer.window,
                offset: offer.offset,
                len: descriptor.len,
            })?;
            state.descriptors.push((offer.window, descriptor));
        }
        let writer = state.writer.take();
        wake(writer);
        Ok(())
    }

    /// Client: windows the server is done with.
    pub(crate) fn used(&self, used: Vec<UsedWindow>) -> Result<(), Violation> {
        let mut state = self.state();
        if state.over.is_some() {
            return Ok(());
        }
        let state = &mut *state;
        let Some(offering) = state.offering.as_mut() else {
            return Err(Violation(
                "windows reported for a call without a bulk stream".into(),
            ));
        };
        for u in used {
            state
                .used
                .push_back(offering.done(u.window, u.offset, u.len)?);
        }
        let reader = state.reader.take();
        let writer = state.writer.take();
        wake(reader);
        wake(writer);
        Ok(())
    }

    /// Client: the call's response. The server's stream ends with it.
    pub(crate) fn respond(&self, response: ResponseFrame) {
        let mut state = self.state();
        state.peer_failed = response.status.clone().map(Status::from);
        state.response = Some(response);
        state.peer_done = true;
        let (reader, writer, watcher) = (
            state.reader.take(),
            state.writer.take(),
            state.watcher.take(),
        );
        drop(state);
        wake(reader);
        wake(writer);
        wake(watcher);
    }

    /// The call is over (answered, cancelled, its connection lost): whatever waits stops
    /// with `status`. The first status stays.
    pub(crate) fn end(&self, status: Status) {
        let mut state = self.state();
        if state.over.is_some() {
            return;
        }
        state.over = Some(status);
        let (reader, writer, watcher) = (
            state.reader.take(),
            state.writer.take(),
            state.watcher.take(),
        );
        drop(state);
        wake(reader);
        wake(writer);
        wake(watcher);
    }

    /// Ready once the call is over or (client) answered.
    pub(crate) fn poll_over(&self, cx: &Context<'_>) -> Poll<()> {
        let mut state = self.state();
        if state.over.is_some() || state.answered() {
            return Poll::Ready(());
        }
        park(&mut state.watcher, cx);
        Poll::Pending
    }

    /// Whether the call is over.
    pub(crate) fn is_over(&self) -> bool {
        self.state().over.is_some()
    }

    // The application's side.

    /// The next message the peer streamed.
    pub(crate) fn poll_message(&self, cx: &Context<'_>) -> Poll<Next> {
        let mut state = self.state();
        if let Some(message) = state.messages.pop_front() {
            let cost = message_cost(message.len());
            let credit = state.recv.as_mut().and_then(|r| r.consume(cost));
            return Poll::Ready(Next::Message(message, credit));
        }
        if let Some(status) = &state.peer_failed {
            return Poll::Ready(Next::Failed(status.clone()));
        }
        if state.peer_done {
            return Poll::Ready(Next::End);
        }
        if let Some(status) = &state.over {
            return Poll::Ready(Next::Failed(status.clone()));
        }
        park(&mut state.reader, cx);
        Poll::Pending
    }

    /// Ready once the peer's window has `cost` bytes for this side's next messages (and
    /// takes them), or the call is over.
    pub(crate) fn poll_send(&self, cx: &Context<'_>, cost: u64) -> Poll<Result<(), Status>> {
        let mut state = self.state();
        if let Some(status) = &state.over {
            return Poll::Ready(Err(status.clone()));
        }
        if state.answered() {
            return Poll::Ready(Err(Status::cancelled("the server answered the call")));
        }
        let Some(send) = state.send.as_mut() else {
            return Poll::Ready(Err(Status::internal(
                "this call streams no messages this way",
            )));
        };
        if send.take(cost) {
            return Poll::Ready(Ok(()));
        }
        park(&mut state.writer, cx);
        Poll::Pending
    }

    /// Server, write streams: the next piece of the client's bytes to read, of at most `max`
    /// bytes, with the descriptor of the window it is in.
    pub(crate) fn poll_piece(
        &self,
        cx: &Context<'_>,
        max: u64,
    ) -> Poll<Result<(Piece, Descriptor), Status>> {
        let mut state = self.state();
        if let Some(status) = &state.over {
            return Poll::Ready(Err(status.clone()));
        }
        let state = &mut *state;
        let Some(offered) = state.offered.as_mut() else {
            return Poll::Ready(Err(Status::internal("a call without a bulk stream")));
        };
        let Some(piece) = offered.next_piece(max) else {
            park(&mut state.writer, cx);
            return Poll::Pending;
        };
        let at = state
            .descriptors
            .iter()
            .position(|(id, _)| *id == piece.window.id)
            .expect("an offered window has its descriptor");
        let descriptor = if piece.window_done {
            state.descriptors.swap_remove(at).1
        } else {
            state.descriptors[at].1.clone()
        };
        Poll::Ready(Ok((piece, descriptor)))
    }

    /// Server, read streams: a window for a chunk of `len` bytes, with the chunk's place in
    /// the stream. A chunk the window cannot take fails with the handler's error.
    pub(crate) fn poll_window(
        &self,
        cx: &Context<'_>,
        len: u64,
    ) -> Poll<Result<(Window, u64, Descriptor), Status>> {
        let mut state = self.state();
        if let Some(status) = &state.over {
            return Poll::Ready(Err(status.clone()));
        }
        let state = &mut *state;
        let Some(offered) = state.offered.as_mut() else {
            return Poll::Ready(Err(Status::internal("a call without a bulk stream")));
        };
        match offered.window_for(len) {
            None => {
                park(&mut state.writer, cx);
                Poll::Pending
            }
            Some(Err(why)) => Poll::Ready(Err(Status::internal(why))),
            Some(Ok((window, offset))) => {
                let at = state
                    .descriptors
                    .iter()
                    .position(|(id, _)| *id == window.id)
                    .expect("an offered window has its descriptor");
                Poll::Ready(Ok((window, offset, state.descriptors.swap_remove(at).1)))
            }
        }
    }

    /// Server: whether the client has a window offered that the server has not used.
    pub(crate) fn has_window(&self) -> bool {
        self.state()
            .offered
            .as_ref()
            .is_some_and(Offered::has_window)
    }

    /// Client: offers a window of `len` bytes (see [`Offering::offer`]).
    pub(crate) fn offer(&self, len: u64) -> Window {
        self.state()
            .offering
            .as_mut()
            .expect("a call that offers windows")
            .offer(len)
    }

    /// Client: bytes of a read stream the server reported so far.
    pub(crate) fn received(&self) -> u64 {
        self.state().offering.as_ref().map_or(0, Offering::received)
    }

    /// Client: the next window the server is done with; `None` once the response came and
    /// every report before it was taken.
    pub(crate) fn poll_used(&self, cx: &Context<'_>) -> Poll<Result<Option<Done>, Status>> {
        let mut state = self.state();
        if let Some(done) = state.used.pop_front() {
            return Poll::Ready(Ok(Some(done)));
        }
        if state.answered() {
            return Poll::Ready(Ok(None));
        }
        if let Some(status) = &state.over {
            return Poll::Ready(Err(status.clone()));
        }
        park(&mut state.reader, cx);
        Poll::Pending
    }

    /// Client: the call's response, once it came (taken once).
    pub(crate) fn poll_response(&self, cx: &Context<'_>) -> Poll<Result<ResponseFrame, Status>> {
        let mut state = self.state();
        if let Some(response) = state.response.take() {
            state.answered = true;
            return Poll::Ready(Ok(response));
        }
        if let Some(status) = &state.over {
            return Poll::Ready(Err(status.clone()));
        }
        // Whoever waits for the response also waits for reports and messages: one waker.
        park(&mut state.writer, cx);
        Poll::Pending
    }

    /// Client: whether the response came (taken or not).
    pub(crate) fn responded(&self) -> bool {
        self.state().answered()
    }
}
