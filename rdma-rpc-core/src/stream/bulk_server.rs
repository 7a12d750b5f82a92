//! Bulk streams on the server: the chunks of a write stream as its handler takes them, read
//! from the client's windows a pool buffer at a time ([`Reader`], behind [`Chunks`]), and the
//! chunks a read stream's handler sends, written into the client's windows ([`ChunkSink`]).
//! The server's memory stays within the path's pool: a chunk is a pool buffer, and the next
//! one is read only once a buffer is free (the handler dropped an earlier chunk).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::cell::StreamCell;
use crate::memory::{BufferPool, RegisteredBuf};
use crate::protocol::frames::{ChunksFrame, Kind, UsedWindow};
use crate::protocol::stream::Piece;
use crate::service::EndpointDef;
use crate::session::Session;
use crate::status::Status;
use crate::transport::{BoxFuture, Descriptor, SendData};

/// Reads in flight ahead of the handler, per stream: while it works on one chunk, the next
/// ones arrive (each holds a pool buffer).
const READ_AHEAD: usize = 2;

/// Writes of a read stream in flight before the sink waits for the oldest.
const WRITES_IN_FLIGHT: usize = 8;

/// What a bulk stream of one call needs on the server.
#[derive(Clone)]
pub(crate) struct ServerStream {
    pub(crate) cell: Arc<StreamCell>,
    pub(crate) session: Arc<Session>,
    pub(crate) id: u64,
    pub(crate) endpoint: EndpointDef,
    pub(crate) pool: BufferPool,
    pub(crate) buffer_wait: Duration,
    pub(crate) transfer_timeout: Duration,
    /// The call's deadline.
    pub(crate) deadline: Option<Instant>,
    pub(crate) peer: Arc<str>,
}

impl ServerStream {
    fn what(&self) -> String {
        format!("{} {}", self.endpoint.op, self.endpoint.path)
    }

    /// A free pool buffer, waiting no longer than `buffer_wait` and the call's deadline.
    async fn buffer(&self) -> Result<RegisteredBuf, Status> {
        if let Some(buf) = self.pool.try_acquire() {
            return Ok(buf);
        }
        let wait = Instant::now() + self.buffer_wait;
        let until = self.deadline.map_or(wait, |d| d.min(wait));
        match tokio::time::timeout_at(until, self.pool.acquire()).await {
            Ok(buf) => Ok(buf),
            Err(_) if until < wait => Err(Status::deadline_exceeded(format!(
                "no free buffer for the stream of {} before the deadline (all {} in use)",
                self.what(),
                self.pool.count()
            ))),
            Err(_) => Err(Status::resource_exhausted(format!(
                "no free buffer for the stream of {} within {:?} (buffer_wait): all {} are in \
                 use, by calls in flight or by chunks a handler keeps",
                self.what(),
                self.buffer_wait,
                self.pool.count()
            ))),
        }
    }

    /// Waits for what only the client can give (a window), no longer than
    /// `transfer_timeout`: a client that stops offering loses its connection.
    async fn given_by_client<T>(
        &self,
        what: &str,
        wait: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        match tokio::time::timeout(self.transfer_timeout, wait).await {
            Ok(result) => result,
            Err(_) => Err(self.unresponsive(what)),
        }
    }

    /// The client did not do its part in time: its connection goes (with what it held).
    fn unresponsive(&self, what: &str) -> Status {
        let status = Status::unavailable(format!(
            "the client gave no {what} for the stream of {} within {:?} (transfer_timeout); \
             connection closed",
            self.what(),
            self.transfer_timeout
        ));
        if let Some(line) = crate::observe::logs::line("connection dropped", "transfer_timeout") {
            tracing::warn!(
                peer = %self.peer,
                reason = status.message(),
                suppressed = line.suppressed,
                "connection dropped"
            );
        }
        self.session.transport().close();
        status
    }

    /// Tells the client the server is done with `window` (`len` bytes at `offset`).
    fn used(&self, window: u32, offset: u64, len: u64) -> Result<(), Status> {
        let frame = ChunksFrame {
            id: self.id,
            offers: Vec::new(),
            used: vec![UsedWindow {
                window,
                offset,
                len,
            }],
        };
        self.session.send(Kind::Chunks(frame)).map_err(Status::from)
    }
}

/// A read of a piece of a write stream, under way.
struct Pending {
    piece: Piece,
    read: BoxFuture<'static, crate::error::Result<RegisteredBuf>>,
}

/// Reads a write stream's chunks from the client's windows.
pub(crate) struct Reader {
    stream: ServerStream,
    reads: VecDeque<Pending>,
    /// The last piece is under way or taken.
    planned_all: bool,
    failed: bool,
}

impl Reader {
    pub(crate) fn new(stream: ServerStream) -> Reader {
        Reader {
            stream,
            reads: VecDeque::new(),
            planned_all: false,
            failed: false,
        }
    }

    /// The next chunk; `None` after the last.
    pub(crate) async fn next(&mut self) -> Option<Result<Bytes, Status>> {
        if self.failed {
            return None;
        }
        let next = self.next_chunk().await;
        if !matches!(next, Some(Ok(_))) {
            self.failed = true;
        }
        next
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, Status>> {
        if let Err(status) = self.read_ahead().await {
            return Some(Err(status));
        }
        let Pending { piece, read } = self.reads.pop_front()?;
        let s = &self.stream;
        let until = || Instant::now() + s.transfer_timeout;
        let buf = match crate::bounded::answered_by(s.session.transport(), read, until).await {
            Some(Ok(buf)) => buf,
            Some(Err(e)) => {
                return Some(Err(Status::unavailable(format!(
                    "reading the stream of {} from the client failed: {e}",
                    s.what()
                ))))
            }
            None => return Some(Err(s.unresponsive("answer to a read"))),
        };
        if piece.window_done {
            // Read to its end: the client may have the window back.
            let window = piece.window;
            if let Err(status) = s.used(window.id, window.offset, window.len) {
                return Some(Err(status));
            }
        }
        Some(Ok(buf.freeze()))
    }

    /// Starts reads up to [`READ_AHEAD`]: the first waits for a buffer and a window, the
    /// others start only if both are there now.
    async fn read_ahead(&mut self) -> Result<(), Status> {
        let max = self.stream.endpoint.buffer_size;
        while self.reads.len() < READ_AHEAD && !self.planned_all {
            let (buf, planned) = if self.reads.is_empty() {
                let buf = self.stream.buffer().await?;
                let cell = self.stream.cell.clone();
                let planned = self
                    .stream
                    .given_by_client(
                        "window",
                        std::future::poll_fn(|cx| cell.poll_piece(cx, max)),
                    )
                    .await?;
                (buf, planned)
            } else {
                if !self.stream.cell.has_window() {
                    break;
                }
                let Some(buf) = self.stream.pool.try_acquire() else {
                    break;
                };
                let cell = &self.stream.cell;
                let cx = std::task::Context::from_waker(std::task::Waker::noop());
                match cell.poll_piece(&cx, max) {
                    std::task::Poll::Ready(planned) => (buf, planned?),
                    std::task::Poll::Pending => break,
                }
            };
            let (piece, window) = planned;
            self.planned_all = piece.last;
            self.start(piece, &window, buf)?;
        }
        Ok(())
    }

    fn start(
        &mut self,
        piece: Piece,
        window: &Descriptor,
        buf: RegisteredBuf,
    ) -> Result<(), Status> {
        let src = window.slice(piece.at, piece.len).map_err(|_| {
            Status::invalid_argument(format!(
                "window {} of {} bytes does not hold the {} bytes at {} it was offered for",
                piece.window.id, window.len, piece.len, piece.at
            ))
        })?;
        let read = self.stream.session.transport().read(&src, buf);
        self.reads.push_back(Pending { piece, read });
        Ok(())
    }
}

/// What a read stream's handler sends: chunks of at most the endpoint's buffer size, each
/// written by RDMA into a window the client offered, in order. The client takes them as they
/// come; a client that stops taking them makes [`send`](ChunkSink::send) wait (and loses its
/// connection after `transfer_timeout`).
pub struct ChunkSink {
    stream: ServerStream,
    writes: VecDeque<BoxFuture<'static, crate::error::Result<()>>>,
    sent: u64,
}

impl std::fmt::Debug for ChunkSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkSink")
            .field("endpoint", &self.stream.what())
            .field("sent", &self.sent)
            .finish()
    }
}

impl ChunkSink {
    pub(crate) fn new(stream: ServerStream) -> ChunkSink {
        ChunkSink {
            stream,
            writes: VecDeque::new(),
            sent: 0,
        }
    }

    /// The most bytes of one chunk: the endpoint's buffer size.
    pub fn chunk_size(&self) -> usize {
        self.stream.endpoint.buffer_size as usize
    }

    /// Bytes sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The stream's limit (`max_len` in the spec).
    pub fn max_len(&self) -> u64 {
        self.stream.endpoint.max_payload()
    }

    /// A buffer of the path's pool to fill with the next chunk (its capacity is the chunk
    /// size; set its length with `fill_from` or `set_len`), then [`send`](Self::send).
    pub async fn buffer(&mut self) -> Result<RegisteredBuf, Status> {
        let mut buf = self.stream.buffer().await?;
        buf.set_len(0);
        Ok(buf)
    }

    /// Sends a filled buffer (of [`buffer`](Self::buffer)) as the next chunk; an empty one
    /// sends nothing. Past the stream's `max_len` it fails, as the handler's error.
    pub async fn send(&mut self, buf: RegisteredBuf) -> Result<(), Status> {
        let len = buf.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let s = &self.stream;
        let cell = s.cell.clone();
        let (window, offset, dst) = s
            .given_by_client(
                "window",
                std::future::poll_fn(|cx| cell.poll_window(cx, len)),
            )
            .await
            .map_err(|status| self.handler_error(status))?;
        let dst = dst
            .slice(0, len)
            .map_err(|_| Status::internal("a window shorter than it was offered"))?;
        let mut write = s
            .session
            .transport()
            .write_posted(SendData::Registered(buf), &dst);
        // Refused when posted (its queue full): failed now, never reported as sent.
        let pending = match crate::bounded::poll_once(&mut write) {
            Some(Err(e)) => {
                return Err(Status::unavailable(format!(
                    "writing a chunk of the stream of {} failed: {e}",
                    s.what()
                )))
            }
            Some(Ok(())) => None,
            None => Some(write),
        };
        // Posted before the report: the bytes are in place when the client reads it.
        s.used(window.id, offset, len)?;
        self.sent += len;
        self.writes.extend(pending);
        while self.writes.len() > WRITES_IN_FLIGHT {
            self.complete_oldest().await?;
        }
        Ok(())
    }

    /// Sends `data`, in chunks copied into pool buffers.
    pub async fn send_bytes(&mut self, data: &[u8]) -> Result<(), Status> {
        for part in data.chunks(self.chunk_size().max(1)) {
            let mut buf = self.buffer().await?;
            buf.fill_from(part).map_err(Status::from)?;
            self.send(buf).await?;
        }
        Ok(())
    }

    /// Waits until every chunk sent is in the client's memory: the bytes the stream moved.
    pub(crate) async fn finish(&mut self) -> Result<u64, Status> {
        while !self.writes.is_empty() {
            self.complete_oldest().await?;
        }
        Ok(self.sent)
    }

    async fn complete_oldest(&mut self) -> Result<(), Status> {
        let Some(write) = self.writes.pop_front() else {
            return Ok(());
        };
        let s = &self.stream;
        let until = || Instant::now() + s.transfer_timeout;
        match crate::bounded::answered_by(s.session.transport(), write, until).await {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(Status::unavailable(format!(
                "writing a chunk of the stream of {} failed: {e}",
                s.what()
            ))),
            None => Err(s.unresponsive("acknowledgement of a write")),
        }
    }

    /// A chunk the client's windows cannot take is the handler's doing: said so, with the
    /// endpoint.
    fn handler_error(&self, status: Status) -> Status {
        if status.code() != crate::Code::Internal {
            return status;
        }
        Status::internal(format!(
            "the handler of {} sent more than its stream may carry: {}",
            self.stream.what(),
            status.message()
        ))
    }
}
