//! The client side of one call, for every operation (the server side is in
//! `server/call.rs`).
//!
//! - send / write: the request carries small payloads inline. Otherwise the server answers
//!   with a descriptor of a write-only window of exactly the payload's length; the client
//!   RDMA-writes the bytes, acks, and waits for the response.
//! - receive / read: the response carries small results inline. Otherwise the server answers
//!   with a descriptor of a read-only window over the result; the client RDMA-reads it into a
//!   registered staging buffer (no copy afterwards), acks, and waits for the response.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{lock, Client, Entry, Inner, ServerEvent};
use crate::memory::Access;
use crate::protocol::frames::{CallId, GrantFrame, Kind, RequestFrame, ResponseFrame};
use crate::protocol::FRAME_OVERHEAD;
use crate::service::EndpointDef;
use crate::status::Status;
use crate::transport::{Descriptor, SendData};

/// Removes an abandoned call's routing and tells the server, when the caller stops waiting
/// (deadline, or the future was dropped) before the response.
struct CallGuard<'a> {
    inner: &'a Inner,
    id: u64,
    done: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut calls = lock(&self.inner.calls);
        let Some(entry) = calls.get_mut(&self.id) else {
            return; // the response already came, or the connection is gone
        };
        // Keep the entry (and its in-flight permit) until the server's response arrives.
        entry.events = None;
        drop(calls);
        let channel = self.inner.channel.clone();
        let id = self.id;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = channel.send(Kind::Cancel(CallId { id })).await;
            });
        }
    }
}

impl Client {
    /// Runs one call of `endpoint` with an encoded request message. Inbound endpoints (send,
    /// write) take `data`; outbound ones (receive, read) return the bytes. Used by generated
    /// clients; see `codegen::call_inbound` and `codegen::call_outbound`.
    pub async fn call_raw(
        &self,
        endpoint: &EndpointDef,
        metadata: Bytes,
        data: Option<Bytes>,
        timeout: Option<Duration>,
    ) -> Result<(Bytes, Bytes), Status> {
        let timeout = timeout
            .or(endpoint.timeout())
            .or(self.inner.config.default_timeout);
        let call = self.call_inner(endpoint, metadata, data, timeout);
        match timeout {
            Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "{} {} did not complete within {limit:?}",
                    endpoint.op, endpoint.path
                )))
            }),
            None => call.await,
        }
    }

    fn closed_status(&self) -> Status {
        lock(&self.inner.closed)
            .clone()
            .unwrap_or_else(|| Status::unavailable("connection lost"))
    }

    async fn call_inner(
        &self,
        endpoint: &EndpointDef,
        metadata: Bytes,
        data: Option<Bytes>,
        timeout: Option<Duration>,
    ) -> Result<(Bytes, Bytes), Status> {
        let inner = &*self.inner;
        let data = data.unwrap_or_default();
        if endpoint.op.is_inbound() && data.len() as u64 > endpoint.buffer_size {
            return Err(Status::invalid_argument(format!(
                "{} bytes do not fit the {} byte buffer of {} {}",
                data.len(),
                endpoint.buffer_size,
                endpoint.op,
                endpoint.path
            )));
        }
        let permit = inner
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| self.closed_status())?;
        if let Some(status) = lock(&inner.closed).clone() {
            return Err(status);
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut events) = mpsc::unbounded_channel();
        lock(&inner.calls).insert(
            id,
            Entry {
                events: Some(tx),
                _permit: permit,
            },
        );
        let mut guard = CallGuard {
            inner,
            id,
            done: false,
        };

        let inline = data.len() <= inner.inline_threshold
            && data.len() + metadata.len() + FRAME_OVERHEAD <= inner.channel.peer_max_frame();
        let request = RequestFrame {
            id,
            path: endpoint.path.to_owned(),
            op: endpoint.op.as_u32(),
            metadata,
            payload_len: data.len() as u64,
            inline_payload: (endpoint.op.is_inbound() && inline).then(|| data.clone()),
            timeout_us: timeout.map_or(0, |t| t.as_micros().max(1) as u64),
        };
        inner
            .channel
            .send(Kind::Request(request))
            .await
            .map_err(Status::from)?;

        let mut received = Bytes::new();
        let response = loop {
            match events.recv().await {
                None => return Err(self.closed_status()),
                Some(ServerEvent::Response(r)) => break r,
                Some(ServerEvent::Grant(g)) => {
                    inner.transfers.fetch_add(1, Ordering::Relaxed);
                    received = self.transfer(endpoint, &g, &data).await?;
                    inner
                        .channel
                        .send(Kind::Ack(CallId { id }))
                        .await
                        .map_err(Status::from)?;
                }
            }
        };
        guard.done = true;
        inner.completed.fetch_add(1, Ordering::Relaxed);
        let ResponseFrame {
            status,
            metadata,
            inline_payload,
            ..
        } = response;
        if let Some(status) = status {
            return Err(Status::from(status));
        }
        Ok((metadata, inline_payload.unwrap_or(received)))
    }

    /// Moves the call's bytes through the window the server granted.
    async fn transfer(
        &self,
        endpoint: &EndpointDef,
        grant: &GrantFrame,
        data: &Bytes,
    ) -> Result<Bytes, Status> {
        let conn = self.inner.channel.conn();
        let descriptor = Descriptor {
            addr: grant.addr,
            len: grant.len,
            rkey: grant.rkey,
            access: Access::from_bits_truncate(grant.access),
            blob: grant.blob.clone(),
        };
        let violation = |what: &str| {
            Status::internal(format!(
                "protocol violation: the server granted {what} for {} {}",
                endpoint.op, endpoint.path
            ))
        };
        if endpoint.op.is_inbound() {
            if grant.len != data.len() as u64 || !descriptor.access.contains(Access::REMOTE_WRITE) {
                return Err(violation("a window that does not fit the payload"));
            }
            conn.write(SendData::Bytes(data.clone()), &descriptor, None)
                .await
                .map_err(|e| Status::unavailable(format!("RDMA write failed: {e}")))?;
            Ok(Bytes::new())
        } else {
            if grant.len > endpoint.buffer_size || !descriptor.access.contains(Access::REMOTE_READ)
            {
                return Err(violation("a window larger than the endpoint's buffer"));
            }
            let buf = self
                .inner
                .staging
                .acquire(grant.len as usize)
                .map_err(Status::from)?;
            let buf = conn
                .read(&descriptor, buf)
                .await
                .map_err(|e| Status::unavailable(format!("RDMA read failed: {e}")))?;
            Ok(buf.freeze())
        }
    }
}
