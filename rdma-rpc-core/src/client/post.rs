//! A call's request, built and sent: its route (inline, a write slot, a window to read from),
//! the windows it offers (kept by the call until its response) and the frame itself. A plain
//! function, not part of the call's future: its locals, the request frame above all, are not
//! kept in the future across the call's waits (`call::future_sizes`).

use std::time::Duration;

use bytes::Bytes;

use super::call::{reply_window, CallGuard, Opened};
use super::Inner;
use crate::encoded::Encoded;
use crate::memory::{Access, RegisteredBuf};
use crate::protocol::call;
use crate::protocol::frames::MetadataEntry;
use crate::protocol::route::{outgoing, Outgoing};
use crate::service::EndpointDef;
use crate::status::Status;
use crate::transport::{BoxFuture, Fencing, SendData};

/// What a call sends, for [`Inner::post_request`].
pub(super) struct Sending<'a> {
    pub(super) message: Encoded,
    /// The payload; taken when it travels inline (the call does not need it after).
    pub(super) data: &'a mut Bytes,
    /// The caller's buffer for the result (receive and read into it).
    pub(super) dst: Option<RegisteredBuf>,
    pub(super) inline: bool,
    pub(super) timeout: Option<Duration>,
    pub(super) call_metadata: Vec<MetadataEntry>,
}

/// What [`Inner::try_send_inline`] sends, taken only if it does.
pub(super) struct Unsent<'a> {
    pub(super) message: &'a mut Encoded,
    pub(super) data: &'a mut Bytes,
    pub(super) call_metadata: &'a mut Vec<MetadataEntry>,
}

/// A call [`Inner::try_send_inline`] sent.
pub(super) struct Sent {
    pub(super) id: u64,
    /// The call waits for its response in its caller's task already, and another call reads
    /// the connection and will be woken when a frame lands: the call's first wait can return
    /// at once (see [`Inner::event`]).
    pub(super) reader_elsewhere: bool,
}

impl Inner {
    /// Opens a call and sends its request, the payload in it, under one lock of the
    /// connection's state, if the window has room now for a caller not in line: the call's
    /// id. `None`: nothing was taken or opened, the call waits its turn ([`open`], then
    /// [`post_request`](Self::post_request)).
    ///
    /// Under the same lock the call starts to wait for its response in the task of `waker`
    /// (the caller's, cloned in the poll that calls this: the call's next step, in the same
    /// poll, is [`event`](Inner::event)), and learns whether another call reads the
    /// connection meanwhile: then its first wait needs neither the lock nor a read
    /// ([`Sent::reader_elsewhere`]).
    ///
    /// [`open`]: Inner::open
    pub(super) fn try_send_inline(
        &self,
        endpoint: &EndpointDef,
        deadline: Option<std::time::Instant>,
        timeout: Option<Duration>,
        unsent: Unsent<'_>,
        waker: std::task::Waker,
    ) -> Result<Option<Sent>, Status> {
        let Unsent {
            message,
            data,
            call_metadata,
        } = unsent;
        let mut locked = self.session.lock();
        let proto = &mut locked.proto;
        if !proto.room_now()? {
            return Ok(None);
        }
        let id = proto.open_call(None, deadline);
        let payload = std::mem::take(data);
        let (message, small) = std::mem::take(message).split();
        let request = call::request(
            id,
            endpoint,
            message,
            payload.len(),
            Some(payload),
            timeout,
            std::mem::take(call_metadata),
        );
        // On failure the state forgets the call it opened.
        proto
            .send_request(id, &request, small.as_ref())
            .map_err(Status::from)?;
        proto.will_wait(id, waker);
        let reader_elsewhere = self.session.another_reads(&locked, id);
        Ok(Some(Sent {
            id,
            reader_elsewhere,
        }))
    }

    /// Builds the request of call `opened`, offers what it needs (the payload's window to
    /// read, the result's to write: kept in `guard` until the response) or starts the write of
    /// its payload into the write slot it took, and sends it. Returns that write, to await
    /// before the response.
    pub(super) fn post_request(
        &self,
        endpoint: &EndpointDef,
        opened: Opened,
        sending: Sending<'_>,
        guard: &mut CallGuard<'_>,
    ) -> Result<Option<BoxFuture<'static, crate::error::Result<()>>>, Status> {
        let inner = self;
        let Sending {
            message,
            data,
            dst,
            inline,
            timeout,
            call_metadata,
        } = sending;
        let (id, slot) = (opened.id, opened.slot);
        let inbound = endpoint.op.is_inbound();
        let negotiated = &inner.negotiated;
        let conn = inner.session.transport();
        let route = inbound.then(|| outgoing(inline, slot.is_some(), negotiated.pull_writes));
        let payload_len = data.len();
        let inline_payload = (route == Some(Outgoing::Inline)).then(|| std::mem::take(data));
        guard.sent_inline = inline_payload.is_some();
        let (message, small) = message.split();
        let mut request = call::request(
            id,
            endpoint,
            message,
            payload_len,
            inline_payload,
            timeout,
            call_metadata,
        );
        let mut slot_write = None;
        match (route, slot) {
            (Some(Outgoing::Slot), Some((index, window))) => {
                // Posted before the request on the same connection: the bytes are in the slot
                // when the request arrives, with no acknowledgement of their own.
                slot_write = Some(conn.write_posted(SendData::Bytes(data.clone()), &window));
                request.slot = Some(index);
            }
            (Some(Outgoing::Pull), _) => {
                // Bytes frozen from a memory region are offered where they are, where a
                // revoked window cannot be read any more; otherwise from a staging copy.
                let buf = match crate::memory::frozen_view(data) {
                    Some(view) if conn.fencing() == Fencing::Revocable => view,
                    _ => {
                        // Staging memory of this connection: over DOCA its peer may still
                        // reach it, so it is written by a raw copy, never borrowed.
                        let mut buf = inner.staging.acquire(data.len()).map_err(Status::from)?;
                        buf.copy_in(0, data);
                        buf.set_len(data.len());
                        buf
                    }
                };
                let window = conn
                    .grant(buf, 0, data.len(), Access::REMOTE_READ)
                    .map_err(Status::from)?;
                request.source = Some(window.descriptor().into());
                guard.windows.push(window);
            }
            // Inline, or the server grants a window for it once it has a buffer.
            (Some(_), _) => {}
            (None, _) => {
                let window = match dst {
                    // The caller's buffer is the result window. Fenced: once the call is over,
                    // the server cannot write the caller's memory any more, on any transport
                    // (over DOCA through this connection's bounce memory, or the region's
                    // share). No more than the endpoint's buffer: a server refuses larger
                    // result windows.
                    Some(dst) => {
                        let len = dst.capacity().min(endpoint.buffer_size as usize);
                        Some(conn.grant_result(dst, len).map_err(Status::from)?)
                    }
                    None => opened
                        .reply
                        .map(|size| reply_window(inner, size))
                        .transpose()?,
                };
                if let Some(window) = window {
                    request.reply_to = Some(window.descriptor().into());
                    guard.windows.push(window);
                }
            }
        }
        let sent = inner
            .session
            .lock()
            .proto
            .send_request(id, &request, small.as_ref());
        sent.map_err(Status::from)?;
        Ok(slot_write)
    }
}
