//! How a call ends on the server, without I/O: its deadline is the client's (the time the
//! client said it has left when it sent the request) or, when the client gave none, the
//! endpoint's (`timeout:` in the spec is a default a request may override, longer or shorter),
//! capped by the server's limit on every call (`ServerConfig::max_call_duration`), so no call
//! holds server memory for ever. A call that
//! passes it, or that the client cancels, or whose connection ends, is stopped (the handler's
//! future is dropped) and answered with a status that says which of these ended it.

use std::time::Duration;

use tokio::time::Instant;

use super::mailbox::EndReason;
use crate::service::EndpointDef;
use crate::status::Status;

/// Who set the deadline that holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetBy {
    /// The client, with its call.
    Client,
    /// The endpoint's `timeout:` in the spec.
    Endpoint,
    /// The server's `max_call_duration`.
    Server,
}

/// A call's deadline on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    /// When it passes.
    pub(crate) at: Instant,
    /// How long the call had.
    pub(crate) after: Duration,
    /// Whose limit it is.
    pub(crate) set_by: SetBy,
}

/// The deadline of a call received at `received`: the client's, or the endpoint's when the
/// client set none (the spec's timeout is the default a request overrides, as the generated
/// clients let it), whichever holds capped by the server's (on a tie, the call's own limit is
/// named), or none when none is set.
pub(crate) fn call_deadline(
    received: Instant,
    client: Option<Duration>,
    endpoint: Option<Duration>,
    server: Option<Duration>,
) -> Option<Deadline> {
    let call = client
        .map(|after| (after, SetBy::Client))
        .or(endpoint.map(|after| (after, SetBy::Endpoint)));
    [call, server.map(|after| (after, SetBy::Server))]
        .into_iter()
        .flatten()
        // `min_by_key` keeps the first of equal keys: the call's own limit.
        .min_by_key(|&(after, _)| after)
        .map(|(after, set_by)| Deadline {
            at: received + after,
            after,
            set_by,
        })
}

impl Deadline {
    /// The status of a call of `ep` stopped at this deadline.
    pub(crate) fn passed(&self, ep: &EndpointDef) -> Status {
        let after = self.after;
        let (op, path) = (ep.op, ep.path);
        Status::deadline_exceeded(match self.set_by {
            SetBy::Client => {
                format!("{op} {path} did not complete within the client's deadline of {after:?}")
            }
            SetBy::Endpoint => format!(
                "{op} {path} did not complete within the endpoint's timeout of {after:?} (spec)"
            ),
            SetBy::Server => format!(
                "{op} {path} ran longer than this server allows a call ({after:?}, \
                 max_call_duration)"
            ),
        })
    }
}

/// The status of a call of `ep` that ended early for `reason`.
pub(crate) fn ended(reason: EndReason, ep: &EndpointDef) -> Status {
    let (op, path) = (ep.op, ep.path);
    Status::cancelled(match reason {
        EndReason::Cancelled => format!("{op} {path} was cancelled by the client"),
        EndReason::ConnectionLost => format!("{op} {path} ended with its connection"),
        EndReason::DeadlinePassed => format!("{op} {path} ran past its deadline"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::OpKind;
    use crate::status::Code;

    const EP: EndpointDef = EndpointDef {
        path: "/p",
        op: OpKind::Send,
        buffer_size: 64,
        method: "m",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    };

    #[test]
    fn the_limit_that_holds_says_whose_it_is() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            call_deadline(now, None, None, None),
            None,
            "no limit at all"
        );
        let d = call_deadline(now, Some(ms(200)), Some(ms(500)), Some(ms(60_000))).unwrap();
        assert_eq!((d.at, d.set_by), (now + ms(200), SetBy::Client));
        let d = call_deadline(now, Some(ms(900)), Some(ms(500)), Some(ms(60_000))).unwrap();
        assert_eq!(
            (d.after, d.set_by),
            (ms(900), SetBy::Client),
            "a request may ask for more than the spec's default"
        );
        let d = call_deadline(now, None, Some(ms(500)), Some(ms(60_000))).unwrap();
        assert_eq!(
            (d.after, d.set_by),
            (ms(500), SetBy::Endpoint),
            "the spec's timeout holds for a client that sets none"
        );
        let d = call_deadline(now, Some(ms(90_000)), Some(ms(500)), Some(ms(60_000))).unwrap();
        assert_eq!(
            (d.after, d.set_by),
            (ms(60_000), SetBy::Server),
            "no client outlasts the server's cap"
        );
        let d = call_deadline(now, None, None, Some(ms(60_000))).unwrap();
        assert_eq!(
            (d.after, d.set_by),
            (ms(60_000), SetBy::Server),
            "the server's cap"
        );
        let d = call_deadline(now, Some(ms(500)), Some(ms(500)), Some(ms(500))).unwrap();
        assert_eq!(d.set_by, SetBy::Client, "a tie is the client's");
        let d = call_deadline(now, None, Some(ms(500)), Some(ms(500))).unwrap();
        assert_eq!(d.set_by, SetBy::Endpoint);
    }

    #[test]
    fn each_end_has_its_code_and_names_its_cause() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        for (d, says) in [
            (
                call_deadline(now, Some(ms(1)), None, None),
                "client's deadline",
            ),
            (
                call_deadline(now, None, Some(ms(1)), None),
                "endpoint's timeout",
            ),
            (
                call_deadline(now, None, None, Some(ms(1))),
                "max_call_duration",
            ),
        ] {
            let status = d.unwrap().passed(&EP);
            assert_eq!(status.code(), Code::DeadlineExceeded);
            assert!(status.message().contains(says), "{status}");
            assert!(status.message().contains("send /p"), "{status}");
        }
        let cancelled = ended(EndReason::Cancelled, &EP);
        assert_eq!(cancelled.code(), Code::Cancelled);
        assert!(
            cancelled.message().contains("cancelled by the client"),
            "{cancelled}"
        );
        let lost = ended(EndReason::ConnectionLost, &EP);
        assert_eq!(lost.code(), Code::Cancelled);
        assert!(lost.message().contains("connection"), "{lost}");
    }
}
