//! A call's pool buffer: taken within the connection's share of the endpoint's pool, waited
//! for no longer than `buffer_wait` or the call's deadline, refused with the reason when none
//! will come.

use tokio::time::Instant;

use super::call::{Call, ClientEvent};
use crate::memory::RegisteredBuf;
use crate::observe::logs;
use crate::protocol::mailbox::Mailbox;
use crate::protocol::wait::{wait, Wait};
use crate::status::Status;

/// A buffer of the endpoint's pool, within this connection's share of it, waiting no longer
/// than the client does. Taken at once when one is free; the wait (with its timers) lives in
/// a future of its own, so the common call's future stays small.
pub(super) async fn take_buffer(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
) -> Result<RegisteredBuf, Status> {
    if call.share_permit.is_none() {
        call.share_permit = call.conn.shares.of(&call.route).try_enter();
    }
    if call.share_permit.is_some() {
        // Counted before the buffer is taken: whoever sees the pool empty sees this holder.
        let holding = call.route.holders.enter();
        if let Some(buf) = call.route.pool.try_acquire() {
            call.holding = Some(holding);
            return Ok(buf);
        }
    }
    Box::pin(wait_for_buffer(call, events)).await
}

async fn wait_for_buffer(
    call: &mut Call,
    events: &Mailbox<ClientEvent>,
) -> Result<RegisteredBuf, Status> {
    let endpoint = call.route.endpoint;
    let Wait {
        until: limit,
        deadline_first,
    } = wait(
        Instant::now(),
        call.conn.buffer_wait,
        events.limits().deadline.map(|d| d.at),
    );
    if call.share_permit.is_none() {
        let share = call.conn.shares.of(&call.route).clone();
        match tokio::time::timeout_at(limit, share.enter()).await {
            Ok(permit) => call.share_permit = Some(permit),
            Err(_) if deadline_first => {
                return Err(Status::deadline_exceeded(format!(
                    "this connection holds its share of {} of the {} buffers of {} {} until \
                     the deadline",
                    share.limit(),
                    share.pool(),
                    endpoint.op,
                    endpoint.path
                )))
            }
            Err(_) => {
                let status = Status::resource_exhausted(format!(
                    "no buffer for {} {} within {:?} (buffer_wait): this connection already \
                     holds its share, {} of the {} buffers (pool_share_percent)",
                    endpoint.op,
                    endpoint.path,
                    call.conn.buffer_wait,
                    share.limit(),
                    share.pool()
                ));
                refused(call, &status);
                return Err(status);
            }
        }
    }
    if call.route.pool.available() == 0 && call.route.holders.count() == 0 {
        // No call holds a buffer of this path: handlers that returned keep them all, and
        // nothing will give one back. Waiting would only hide that.
        let status = Status::resource_exhausted(format!(
            "all {} buffers of {} {} are kept by handlers that returned and still hold their \
             `data` (a Bytes of a pool buffer keeps it): copy what a handler keeps \
             (`data.to_vec()`), or raise max_buffers",
            call.route.pool.count(),
            endpoint.op,
            endpoint.path
        ));
        refused(call, &status);
        return Err(status);
    }
    let holding = call.route.holders.enter();
    match tokio::time::timeout_at(limit, call.route.pool.acquire()).await {
        Ok(buf) => {
            call.holding = Some(holding);
            Ok(buf)
        }
        Err(_) if deadline_first => Err(Status::deadline_exceeded(format!(
            "no free buffer for {} {} before the deadline (all {} in use)",
            endpoint.op,
            endpoint.path,
            call.route.pool.count()
        ))),
        Err(_) => {
            let status = Status::resource_exhausted(format!(
                "no free buffer for {} {} within {:?} (buffer_wait): all {} are in use, by \
                 calls in flight or by handlers that keep their payload",
                endpoint.op,
                endpoint.path,
                call.conn.buffer_wait,
                call.route.pool.count()
            ));
            refused(call, &status);
            Err(status)
        }
    }
}

/// Logs a call refused for lack of buffers, within the log budget.
fn refused(call: &Call, status: &Status) {
    if let Some(line) = logs::line("call refused", status.code().as_str()) {
        tracing::warn!(
            peer = %call.conn.info.peer,
            reason = status.message(),
            suppressed = line.suppressed,
            "call refused"
        );
    }
}
