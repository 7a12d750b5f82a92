//! [`Chunks`]: the chunks of a write stream, as its handler takes them.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;

use super::bulk_server::Reader;
use crate::status::Status;
use crate::transport::BoxFuture;

/// The payload of a write stream in its handler: chunks of at most the endpoint's buffer
/// size, in order, [`len`](Chunks::len) bytes in all. Each chunk is a lease of one of the
/// path's pool buffers, read from the client's memory by RDMA as the handler asks for it (a
/// few ahead): dropping a chunk frees its buffer for the next one, so a handler that keeps
/// every chunk runs the pool dry, and one that is slow makes the client wait. Read it with
/// [`chunk`](Chunks::chunk) or as a [`Stream`](futures_core::Stream).
pub struct Chunks {
    len: u64,
    taken: u64,
    source: Source,
}

enum Source {
    /// The whole payload came with the request (small payloads), or the stream is empty.
    Inline(Option<Bytes>),
    /// Read from the client's windows.
    Reader {
        idle: Option<Box<Reader>>,
        next: Option<BoxFuture<'static, Taken>>,
    },
}

/// The reader back, with the chunk it read (or its end, or its error).
type Taken = (Box<Reader>, Option<Result<Bytes, Status>>);

impl std::fmt::Debug for Chunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunks")
            .field("len", &self.len)
            .field("taken", &self.taken)
            .finish()
    }
}

impl Chunks {
    /// A stream whose payload is `data`, in one chunk (none if it is empty).
    pub fn from_bytes(data: Bytes) -> Chunks {
        Chunks {
            len: data.len() as u64,
            taken: 0,
            source: Source::Inline((!data.is_empty()).then_some(data)),
        }
    }

    pub(crate) fn reading(len: u64, reader: Reader) -> Chunks {
        Chunks {
            len,
            taken: 0,
            source: Source::Reader {
                idle: Some(Box::new(reader)),
                next: None,
            },
        }
    }

    /// The payload's length, as the client declared it: the chunks add up to it.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes taken so far.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// The next chunk; `Ok(None)` once all [`len`](Self::len) bytes were taken.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Status> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .transpose()
    }

    /// Every chunk, copied into one buffer (for payloads a handler wants whole; its memory
    /// is the payload's length).
    pub async fn collect(mut self) -> Result<Bytes, Status> {
        let mut all = bytes::BytesMut::with_capacity(self.len as usize);
        while let Some(chunk) = self.chunk().await? {
            all.extend_from_slice(&chunk);
        }
        Ok(all.freeze())
    }
}

impl Stream for Chunks {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let next = match &mut this.source {
            Source::Inline(data) => data.take().map(Ok),
            Source::Reader { idle, next } => {
                if next.is_none() {
                    let Some(mut reader) = idle.take() else {
                        return Poll::Ready(None);
                    };
                    *next = Some(Box::pin(async move {
                        let chunk = reader.next().await;
                        (reader, chunk)
                    }));
                }
                let future = next.as_mut().expect("set above");
                let (reader, chunk) = std::task::ready!(future.as_mut().poll(cx));
                *next = None;
                *idle = Some(reader);
                chunk
            }
        };
        if let Some(Ok(chunk)) = &next {
            this.taken += chunk.len() as u64;
        }
        Poll::Ready(next)
    }
}
