//! One end of an in-process connection: the [`Connection`] API over the [`Link`] both ends
//! share (`link/datapath.rs` holds the data path). An operation that need not wait has
//! completed when it is posted, and its future is ready at once.

use std::fmt;
use std::future::ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::link::{Action, Atomic, End, FromOutput, Link, Posted, Remote};
use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::{
    check_grant_range, BoxFuture, Connection, Descriptor, Fencing, Grant, RecvCompletion, SendData,
};

/// One end of an in-process connection (`mem://NAME`): RDMA's reliable connection between
/// two ends in one process, with no socket and no task in between.
///
/// Get one from [`MemTransport::connect_mem`](super::MemTransport::connect_mem) (connecting
/// completes at once; the other end comes out of the listener's
/// [`accept`](crate::transport::Listener::accept)), or as an `Arc<dyn Connection>` from
/// [`Transport::connect`](crate::transport::Transport::connect). It keeps the semantics of the
/// software transport over TCP, and carries out every operation on the thread that posts it:
///
/// - a [`send`](Connection::send) copies into the peer's next posted receive
///   ([`post_recv`](Connection::post_recv)) and wakes the task waiting in its
///   [`recv`](Connection::recv); one that finds none waits up to
///   [`MemConfig::rnr_timeout`](super::MemConfig) and then fails the connection (receiver not
///   ready), and the sender's later operations queue behind it;
/// - a [`write`](Connection::write), [`read`](Connection::read) or atomic copies into or out
///   of a window the peer [`grant`](Connection::grant)ed, once the peer's window table checked
///   key, rights and bounds; it has completed when the method returns;
/// - windows are [`Fencing::Revocable`]: a revoked window's key is forgotten and its buffer
///   taken back, so later accesses fail.
///
/// The two ends may live on different runtimes and threads. Closing either end (or dropping
/// it) fails both, and every operation still waiting completes with the error. Use it to test
/// services, or to measure the framework without any transport cost.
pub struct MemConnection {
    link: Arc<Link>,
    /// Which end of the link this is.
    me: usize,
}

impl fmt::Debug for MemConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemConnection")
            .field("peer", &self.link.peer(self.me))
            .field("failed", &self.link.error(self.me).is_some())
            .finish()
    }
}

impl Drop for MemConnection {
    fn drop(&mut self) {
        self.close();
    }
}

impl MemConnection {
    /// Both ends of a new connection: (end 0, end 1).
    pub(super) fn pair(ends: [End; 2]) -> (MemConnection, MemConnection) {
        let link = Link::new(ends);
        (
            MemConnection {
                link: link.clone(),
                me: 0,
            },
            MemConnection { link, me: 1 },
        )
    }

    fn check_len(&self, len: u64) -> Result<()> {
        let max = self.link.config(self.me).max_message;
        if len > max {
            return Err(Error::LimitExceeded {
                limit: "max_message",
                max,
                actual: len,
            });
        }
        Ok(())
    }

    /// Posts a signaled operation; its future is ready at once unless it waits in the peer's
    /// queue.
    fn post<T: FromOutput>(&self, action: Action) -> BoxFuture<'static, Result<T>> {
        match self.link.post(self.me, action, true) {
            Ok(Posted::Done(out)) => Box::pin(ready(Ok(T::from_output(out)))),
            Ok(Posted::Queued(done)) => {
                let link = self.link.clone();
                let me = self.me;
                Box::pin(async move {
                    match done.await {
                        Ok(result) => result.map(T::from_output),
                        // Every queued operation is completed; only a dropped link gets here.
                        Err(_) => Err(link.error(me).unwrap_or_else(|| Error::ConnectionClosed {
                            peer: link.peer(me).to_owned(),
                            reason: "the operation was dropped".into(),
                        })),
                    }
                })
            }
            Ok(Posted::Unsignaled) => failed_now(Error::InvalidArgument(
                "a signaled operation was posted as unsignaled".into(),
            )),
            Err(e) => failed_now(e),
        }
    }
}

fn failed_now<T: Send + 'static>(err: Error) -> BoxFuture<'static, Result<T>> {
    Box::pin(ready(Err(err)))
}

impl Connection for MemConnection {
    fn peer(&self) -> &str {
        self.link.peer(self.me)
    }

    fn fencing(&self) -> Fencing {
        // A revoked window's key is forgotten and its buffer taken back: later accesses fail.
        Fencing::Revocable
    }

    fn post_recv(&self, buf: RegisteredBuf) -> Result<()> {
        if !buf.access().contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "receive buffers need Access::LOCAL_WRITE".into(),
            ));
        }
        self.link.post_recv(self.me, buf)
    }

    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<RecvCompletion>> {
        self.link.poll_recv(self.me, cx)
    }

    fn send(&self, data: SendData, imm: Option<u32>) -> BoxFuture<'static, Result<()>> {
        if let Err(e) = self.check_len(data.len() as u64) {
            return failed_now(e);
        }
        self.post(Action::Send { data, imm })
    }

    fn send_unsignaled(&self, data: SendData, imm: Option<u32>) -> Result<()> {
        self.check_len(data.len() as u64)?;
        self.link
            .post(self.me, Action::Send { data, imm }, false)
            .map(drop)
    }

    fn send_frame(&self, frame: &[u8]) -> Result<()> {
        self.check_len(frame.len() as u64)?;
        self.link.post_frame(self.me, frame)
    }

    fn write(
        &self,
        src: SendData,
        dst: &Descriptor,
        imm: Option<u32>,
    ) -> BoxFuture<'static, Result<()>> {
        let len = src.len() as u64;
        if len > dst.len {
            return failed_now(Error::InvalidArgument(format!(
                "write of {len} bytes into a descriptor of {} bytes",
                dst.len
            )));
        }
        if let Err(e) = self.check_len(len) {
            return failed_now(e);
        }
        let (rkey, addr) = (dst.rkey, dst.addr);
        self.post(match imm {
            Some(imm) => Action::WriteImm {
                src,
                rkey,
                addr,
                imm,
            },
            None => Action::Remote(Remote::Write { src, rkey, addr }),
        })
    }

    fn read(
        &self,
        src: &Descriptor,
        dst: RegisteredBuf,
    ) -> BoxFuture<'static, Result<RegisteredBuf>> {
        if src.len > dst.capacity() as u64 {
            return failed_now(Error::InvalidArgument(format!(
                "read of {} bytes into a buffer of {} bytes",
                src.len,
                dst.capacity()
            )));
        }
        if let Err(e) = self.check_len(src.len) {
            return failed_now(e);
        }
        self.post(Action::Remote(Remote::Read {
            rkey: src.rkey,
            addr: src.addr,
            len: src.len,
            dst,
        }))
    }

    fn compare_and_swap(
        &self,
        dst: &Descriptor,
        expected: u64,
        new: u64,
    ) -> BoxFuture<'static, Result<u64>> {
        self.post(Action::Remote(Remote::Atomic {
            rkey: dst.rkey,
            addr: dst.addr,
            op: Atomic::CompareAndSwap { expected, new },
        }))
    }

    fn fetch_and_add(&self, dst: &Descriptor, add: u64) -> BoxFuture<'static, Result<u64>> {
        self.post(Action::Remote(Remote::Atomic {
            rkey: dst.rkey,
            addr: dst.addr,
            op: Atomic::FetchAndAdd { add },
        }))
    }

    fn grant(
        &self,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Grant> {
        check_grant_range(&buf, offset, len, access)?;
        self.link.grant(self.me, buf, offset, len, access)
    }

    fn close(&self) {
        self.link.close(self.me);
    }

    fn closed(&self) -> BoxFuture<'_, Error> {
        Box::pin(self.link.closed(self.me))
    }
}
