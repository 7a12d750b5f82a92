//! How long a call may wait, without I/O: the server waits for a buffer, or for the client to
//! finish a transfer, no longer than its own patience (`buffer_wait`, `transfer_timeout`) and
//! never past the deadline the client set. Which of the two ends the wait decides the status:
//! the client's deadline (`DEADLINE_EXCEEDED`) or the server's limit (the status names it).

use std::time::Duration;

use tokio::time::Instant;

/// The end of a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait {
    /// When to stop waiting.
    pub(crate) until: Instant,
    /// Whether the client's deadline comes first (or together with the server's limit).
    pub(crate) deadline_first: bool,
}

/// A wait that starts at `now`, with the server's `patience` and the call's `deadline`.
pub(crate) fn wait(now: Instant, patience: Duration, deadline: Option<Instant>) -> Wait {
    let limit = now + patience;
    match deadline {
        Some(d) if d <= limit => Wait {
            until: d,
            deadline_first: true,
        },
        _ => Wait {
            until: limit,
            deadline_first: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earlier_of_deadline_and_patience_ends_a_wait_and_says_which() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(
            wait(now, s(10), None),
            Wait {
                until: now + s(10),
                deadline_first: false
            },
            "no deadline: the server's patience"
        );
        assert_eq!(
            wait(now, s(10), Some(now + s(2))),
            Wait {
                until: now + s(2),
                deadline_first: true
            }
        );
        assert_eq!(
            wait(now, s(1), Some(now + s(2))),
            Wait {
                until: now + s(1),
                deadline_first: false
            },
            "the server's limit first: its status, not DEADLINE_EXCEEDED"
        );
        assert!(
            wait(now, s(2), Some(now + s(2))).deadline_first,
            "a tie is the client's deadline"
        );
        assert_eq!(
            wait(now, s(10), Some(now - s(1))).until,
            now - s(1),
            "a deadline already past ends the wait at once"
        );
    }
}
