//! The reader task of a software-transport connection, playing the peer-facing half of an
//! RDMA NIC: it takes the peer's packets, checks key, bounds and rights of one-sided accesses,
//! moves bytes between the socket and registered memory, matches sends with posted receives,
//! and answers with acks, naks and read responses.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, BufReader};

use super::shared::*;
use super::wire::{Header, Kind, NakReason, HEADER_LEN};
use super::writer::deadline;
use crate::error::{AccessViolation, Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::{RecvCompletion, RecvOpcode};

/// The serving loop; returns why the connection ended.
pub(super) async fn serve<R: AsyncRead + Unpin>(
    shared: &Arc<Shared>,
    mut rd: BufReader<R>,
) -> Error {
    let mut raw = [0u8; HEADER_LEN];
    loop {
        if let Err(e) = rd.read_exact(&mut raw).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::ConnectionClosed {
                    peer: shared.peer.clone(),
                    reason: "closed by the peer".into(),
                }
            } else {
                Error::io(format!("reading from {}", shared.peer), e)
            };
        }
        let header = match Header::decode(&raw) {
            Ok(h) => h,
            Err(reason) => return protocol(shared, reason),
        };
        if let Err(e) = handle(shared, &mut rd, header).await {
            return e;
        }
    }
}

fn protocol(shared: &Shared, reason: impl Into<String>) -> Error {
    Error::Protocol {
        peer: shared.peer.clone(),
        reason: reason.into(),
    }
}

async fn respond(shared: &Shared, header: Header, payload: Payload) -> Result<()> {
    shared
        .responses
        .send(Packet { header, payload })
        .await
        .map_err(|_| Error::ConnectionClosed {
            peer: shared.peer.clone(),
            reason: "writer stopped".into(),
        })
}

/// Sends a NAK for `req` and returns the error that ends the connection.
async fn nak(shared: &Shared, req: &Header, reason: NakReason, extra: u64, err: Error) -> Error {
    let mut header = Header::new(Kind::Nak, req.op_id);
    header.status = reason.code();
    header.rkey = req.rkey;
    header.addr = req.addr;
    header.arg0 = req.len;
    header.arg1 = extra;
    let _ = respond(shared, header, Payload::None).await;
    err
}

async fn ack(shared: &Shared, req: &Header) -> Result<()> {
    #[cfg(test)]
    shared
        .acks
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    respond(shared, Header::new(Kind::Ack, req.op_id), Payload::None).await
}

/// Waits (bounded by the RNR timeout) for a posted receive.
async fn take_posted(shared: &Shared, req: &Header) -> Result<RegisteredBuf> {
    let deadline = tokio::time::Instant::now() + shared.config.rnr_timeout;
    loop {
        if let Some(buf) = lock(&shared.state).posted.pop_front() {
            return Ok(buf);
        }
        #[cfg(test)]
        shared
            .rnr_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if tokio::time::timeout_at(deadline, shared.posted.notified())
            .await
            .is_err()
        {
            let retry_ms = shared.config.rnr_timeout.as_millis() as u64;
            let err = Error::ReceiverNotReady { retry_ms };
            return Err(nak(shared, req, NakReason::ReceiverNotReady, 0, err).await);
        }
    }
}

/// Reads `len` payload bytes into `buf` at `offset`, within `limit` (`TimedOut` otherwise:
/// a peer that stops in the middle of a payload must not hold the buffer, or a window's
/// lock, forever).
///
/// # Safety
/// The caller owns `buf` exclusively (or holds its window's write lock), and
/// `offset + len <= buf.capacity()`.
async unsafe fn read_into<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    buf: &RegisteredBuf,
    offset: usize,
    len: usize,
    limit: Duration,
) -> std::io::Result<()> {
    // SAFETY: guaranteed by the caller.
    let dst = unsafe { std::slice::from_raw_parts_mut(buf.ptr_at(offset), len) };
    deadline(limit, async { rd.read_exact(dst).await.map(drop) }).await
}

async fn handle<R: AsyncRead + Unpin>(
    shared: &Arc<Shared>,
    rd: &mut BufReader<R>,
    h: Header,
) -> Result<()> {
    let limit = shared.config.stall_timeout;
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::TimedOut => Error::Protocol {
            peer: shared.peer.clone(),
            reason: format!(
                "a payload of {} bytes stalled for {limit:?} (stall_timeout); connection closed",
                h.len
            ),
        },
        _ => Error::io(format!("reading from {}", shared.peer), e),
    };
    if (h.kind.carries_payload() || h.kind == Kind::ReadReq) && h.len > shared.config.max_message {
        let err = Error::LimitExceeded {
            limit: "max_message",
            max: shared.config.max_message,
            actual: h.len,
        };
        return Err(nak(shared, &h, NakReason::InvalidRequest, 0, err).await);
    }
    match h.kind {
        Kind::Send => {
            let mut buf = take_posted(shared, &h).await?;
            if h.len > buf.capacity() as u64 {
                let capacity = buf.capacity() as u64;
                let err = Error::ReceiveTooSmall {
                    len: h.len,
                    capacity,
                };
                return Err(nak(shared, &h, NakReason::ReceiveTooSmall, capacity, err).await);
            }
            let len = h.len as usize;
            // SAFETY: the posted buffer is owned by this task; `len <= capacity` checked above.
            unsafe { read_into(rd, &buf, 0, len, limit) }
                .await
                .map_err(io)?;
            buf.set_len(len);
            let opcode = if h.imm.is_some() {
                RecvOpcode::SendWithImm
            } else {
                RecvOpcode::Send
            };
            // Ack before the application can see the data (and possibly close): a delivered
            // message is never reported as failed to the sender.
            if !h.unsignaled {
                ack(shared, &h).await?;
            }
            shared.completions.push(RecvCompletion {
                buf,
                opcode,
                imm: h.imm,
                write_len: 0,
            });
            Ok(())
        }
        Kind::Write => {
            let violation = |v| Error::Protocol {
                peer: shared.peer.clone(),
                reason: format!(
                    "its write of {} bytes to key {:#x} at {:#x} was refused: {v}",
                    h.len, h.rkey, h.addr
                ),
            };
            let (slot, offset) = match shared.lookup(h.rkey, h.addr, h.len, Access::REMOTE_WRITE) {
                Ok(found) => found,
                Err(v) => return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await),
            };
            let guard = slot.write_owned().await;
            let Some(buf) = guard.as_ref() else {
                let v = AccessViolation::UnknownKey;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            };
            // SAFETY: the write guard gives exclusive access to the window's buffer (the
            // owner gave it up when granting); `lookup` checked the range against the window.
            unsafe { read_into(rd, buf, offset, h.len as usize, limit) }
                .await
                .map_err(io)?;
            drop(guard);
            if let Some(imm) = h.imm {
                let mut buf = take_posted(shared, &h).await?;
                buf.set_len(0);
                ack(shared, &h).await?;
                shared.completions.push(RecvCompletion {
                    buf,
                    opcode: RecvOpcode::WriteWithImm,
                    imm: Some(imm),
                    write_len: h.len,
                });
                return Ok(());
            }
            // A posted write (`Connection::write_posted`) asks for no ACK: what its sender
            // sends next is read after these bytes landed, which is all it waits for.
            if h.unsignaled {
                return Ok(());
            }
            ack(shared, &h).await
        }
        Kind::ReadReq => {
            let violation = |v| Error::Protocol {
                peer: shared.peer.clone(),
                reason: format!(
                    "its read of {} bytes from key {:#x} at {:#x} was refused: {v}",
                    h.len, h.rkey, h.addr
                ),
            };
            let (slot, offset) = match shared.lookup(h.rkey, h.addr, h.len, Access::REMOTE_READ) {
                Ok(found) => found,
                Err(v) => return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await),
            };
            let guard = slot.read_owned().await;
            if guard.is_none() {
                let v = AccessViolation::UnknownKey;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            }
            let mut header = Header::new(Kind::ReadResp, h.op_id);
            header.len = h.len;
            let payload = Payload::Window {
                guard,
                offset,
                len: h.len as usize,
            };
            respond(shared, header, payload).await
        }
        Kind::Cas | Kind::Faa => {
            let violation = |v| Error::Protocol {
                peer: shared.peer.clone(),
                reason: format!(
                    "its atomic on key {:#x} at {:#x} was refused: {v}",
                    h.rkey, h.addr
                ),
            };
            if !h.addr.is_multiple_of(8) {
                let v = AccessViolation::Misaligned;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            }
            let (slot, offset) = match shared.lookup(h.rkey, h.addr, 8, Access::REMOTE_ATOMIC) {
                Ok(found) => found,
                Err(v) => return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await),
            };
            let guard = slot.write_owned().await;
            let Some(buf) = guard.as_ref() else {
                let v = AccessViolation::UnknownKey;
                return Err(nak(shared, &h, NakReason::Access(v), 0, violation(v)).await);
            };
            // SAFETY: exclusive access under the write guard; the 8 bytes are inside the
            // window (checked by `lookup`) and 8-aligned (the buffer is page-aligned and the
            // address is 8-aligned).
            let old = unsafe {
                let p = buf.ptr_at(offset).cast::<u64>();
                let old = p.read();
                let new = match h.kind {
                    Kind::Cas if old == h.arg0 => h.arg1,
                    Kind::Cas => old,
                    _ => old.wrapping_add(h.arg0),
                };
                p.write(new);
                old
            };
            drop(guard);
            let mut header = Header::new(Kind::AtomicResp, h.op_id);
            header.arg0 = old;
            respond(shared, header, Payload::None).await
        }
        Kind::ReadResp => {
            let pending = lock(&shared.state).pending.remove(&h.op_id);
            let Some(Pending::Read { dst, len, done }) = pending else {
                return Err(protocol(
                    shared,
                    format!("read response for unknown operation {}", h.op_id),
                ));
            };
            if h.len != len {
                let _ = done;
                return Err(protocol(
                    shared,
                    format!("read response of {} bytes for a read of {len}", h.len),
                ));
            }
            let mut dst = dst;
            // SAFETY: `dst` was moved into the pending read and is owned by this task now;
            // `len <= capacity` was checked when the read was posted.
            unsafe { read_into(rd, &dst, 0, len as usize, limit) }
                .await
                .map_err(io)?;
            dst.set_len(len as usize);
            let _ = done.send(Ok(dst));
            Ok(())
        }
        Kind::Ack | Kind::AtomicResp => {
            let pending = lock(&shared.state).pending.remove(&h.op_id);
            match (h.kind, pending) {
                (Kind::Ack, Some(Pending::Ack(tx))) => {
                    let _ = tx.send(Ok(()));
                    Ok(())
                }
                (Kind::AtomicResp, Some(Pending::Atomic(tx))) => {
                    let _ = tx.send(Ok(h.arg0));
                    Ok(())
                }
                (kind, _) => Err(protocol(
                    shared,
                    format!("{kind:?} for unknown operation {}", h.op_id),
                )),
            }
        }
        Kind::Nak => {
            let err = match NakReason::from_code(h.status) {
                NakReason::Access(violation) => Error::RemoteAccess {
                    rkey: h.rkey,
                    addr: h.addr,
                    len: h.arg0,
                    violation,
                },
                NakReason::ReceiverNotReady => Error::ReceiverNotReady {
                    retry_ms: shared.config.rnr_timeout.as_millis() as u64,
                },
                NakReason::ReceiveTooSmall => Error::ReceiveTooSmall {
                    len: h.arg0,
                    capacity: h.arg1,
                },
                NakReason::InvalidRequest => {
                    protocol(shared, "the peer rejected a request as invalid")
                }
            };
            // The operation fails with the reason; the connection goes to error with it.
            let pending = lock(&shared.state).pending.remove(&h.op_id);
            if let Some(op) = pending {
                op.fail(err.duplicate());
            }
            Err(err)
        }
    }
}
