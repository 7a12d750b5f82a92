//! Starting a call: an admitted request checked against its endpoint (its route, its
//! message, how its payload comes, a streaming call's streams), the server's interceptors,
//! its deadline, and the call's place in the connection's state.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::call::{self, ClientEvent};
use super::conn::ConnCtx;
use super::spare::Spare;
use super::Shared;
use crate::interceptor::IncomingCall;
use crate::protocol::connection::{Admitted, Negotiated};
use crate::protocol::frames::RequestFrame;
use crate::protocol::mailbox::{call_mailbox, CallLimits, Mailbox, Sender};
use crate::protocol::route::{Incoming as Route, RequestShape};
use crate::protocol::stream::Direction;
use crate::service::{EndpointDef, RawRequest, StreamKind};
use crate::status::Status;
use crate::stream::{Setup, StreamCell};

/// Checks an admitted request against its endpoint and starts the call: `run`'s future,
/// boxed in the thread's spare memory when it fits, with the call's endpoint. The call takes
/// what it keeps of the request (the rest is dropped with it by the caller). It is built
/// where `run` takes it, and its future boxed here: each move of either is a `memcpy` of
/// hundreds of bytes.
pub(super) fn start_call<R, F>(
    shared: &Shared,
    ctx: &Arc<ConnCtx>,
    Admitted {
        request: req,
        slot,
        arrived,
    }: &mut Admitted<crate::session::Runtime>,
    run: &R,
) -> Result<(Pin<Box<F>>, EndpointDef), Status>
where
    R: Fn(call::Call, Mailbox<ClientEvent>) -> F,
    F: Future<Output = ()>,
{
    let route = shared.routes.find(&req.path, req.op)?;
    let ep = route.endpoint;
    if let Some(status) = crate::protocol::oversized_message(&ep, req.metadata.len()) {
        return Err(status);
    }
    let negotiated = &ctx.negotiated;
    if ep.op.is_inbound() && req.payload_len > u64::from(negotiated.inline_threshold) {
        // Slots would have saved this payload a round trip: arm them with the response.
        ctx.session.lock().proto.want_slots();
    }
    let (incoming, stream) = route_of(&ep, req, negotiated)?;
    let mut metadata =
        crate::metadata::Metadata::from_frames(std::mem::take(&mut req.call_metadata))?;
    if !shared.interceptors.is_empty() {
        let mut call = IncomingCall {
            service: route.service.name(),
            endpoint: &ep,
            peer: &ctx.info.peer,
            peer_identity: ctx.info.peer_identity.as_deref(),
            metadata: &mut metadata,
        };
        // A refusal is logged with the others, by the connection loop.
        shared.interceptors.run(&mut call)?;
    }
    let timeout = (req.timeout_us > 0).then(|| Duration::from_micros(req.timeout_us));
    // From the request's arrival, with the clock its frame was handled at (no second read).
    let deadline = crate::protocol::deadline::call_deadline(
        Instant::from_std(*arrived),
        timeout,
        ep.timeout(),
        shared.config.max_call_duration,
    );
    let limits = CallLimits {
        deadline,
        max_response_len: call::max_response_len(&ep, ctx.session.peer_max_frame()),
    };
    let (tx, events): (Sender<ClientEvent>, _) = call_mailbox(limits);
    let context = crate::service::CallContext::new(events.end_signal());
    ctx.session.lock().proto.start_call(
        req.id,
        tx,
        stream.clone(),
        deadline.map(|d| d.at.into_std()),
    );
    let future = run(
        call::Call {
            id: req.id,
            conn: ctx.clone(),
            route: route.clone(),
            holding: None,
            share_permit: None,
            request: Some(RawRequest::new(
                std::mem::take(&mut req.metadata),
                metadata,
                timeout,
                ctx.clone(),
                context,
            )),
            incoming,
            payload_len: req.payload_len,
            inline_payload: req.inline_payload.take(),
            slot: slot.take(),
            source: req.source.take().map(Into::into),
            reply_to: req.reply_to.take().map(Into::into),
            grants: 0,
            stream,
            arrived: *arrived,
        },
        events,
    );
    let running = match Spare::take::<F>() {
        Some(room) => room.put(future),
        None => Box::pin(future),
    };
    Ok((running, ep))
}

/// How the request's payload comes, and a streaming call's streams.
fn route_of(
    ep: &crate::service::EndpointDef,
    req: &RequestFrame,
    negotiated: &Negotiated,
) -> Result<(Route, Option<Arc<StreamCell>>), Status> {
    let shape = RequestShape {
        payload_len: req.payload_len,
        inline_len: req.inline_payload.as_ref().map(|p| p.len()),
        slot: req.slot.is_some(),
        source: req.source.is_some(),
        reply_to: req.reply_to.is_some(),
        offers: req.offers.len(),
    };
    match ep.stream {
        StreamKind::Unary => Ok((
            crate::protocol::route::incoming(ep, &shape, negotiated.pull_writes)?,
            None,
        )),
        kind => {
            crate::protocol::route::streaming(ep, &shape)?;
            let setup = match kind {
                StreamKind::Messages {
                    requests,
                    responses,
                } => Setup {
                    receives: requests.then_some(negotiated.stream_window),
                    sends: responses.then_some(negotiated.peer_stream_window),
                    ..Setup::default()
                },
                StreamKind::Bulk { max_len } => Setup {
                    offered: Some(if ep.op.is_inbound() {
                        (Direction::Write, req.payload_len)
                    } else {
                        (Direction::Read, max_len)
                    }),
                    ..Setup::default()
                },
                StreamKind::Unary => Setup::default(),
            };
            let cell = StreamCell::new(setup);
            if !req.offers.is_empty() {
                cell.offers(req.offers.clone())
                    .map_err(|v| Status::invalid_argument(format!("{} {}: {v}", ep.op, ep.path)))?;
            }
            Ok((Route::Nothing, Some(cell)))
        }
    }
}
