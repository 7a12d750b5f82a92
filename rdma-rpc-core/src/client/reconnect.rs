//! Reconnecting after a lost connection, as tonic's `Channel` does: lazily, when a call finds
//! the connection gone, with exponential backoff between failed attempts.
//!
//! Calls that were in flight when the connection ended fail with `UNAVAILABLE` (they may or
//! may not have run: the client never repeats them). The next call dials again; calls made
//! while an attempt runs wait for it, and calls made during the backoff after a failed
//! attempt fail at once with `UNAVAILABLE`, naming the last error, with the time left until
//! the next attempt in `Status::retry_after` (never in the message, which stays the same for
//! every call of the wait).

use std::time::{Duration, Instant};

/// When the next attempt may start, and why the last one failed. Pure state: the caller
/// supplies the time.
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    /// Wait after the next failure (before jitter).
    next_delay: Duration,
    /// No attempt before this.
    not_before: Option<Instant>,
    /// Why the last attempt failed.
    last_error: Option<String>,
    /// Failed attempts in a row.
    failures: u32,
}

impl Backoff {
    /// Waits of `initial`, doubling up to `max`; an `initial` of zero never waits.
    pub(crate) fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            next_delay: initial,
            not_before: None,
            last_error: None,
            failures: 0,
        }
    }

    /// `Err(wait, why)` while the backoff of the last failure runs.
    pub(crate) fn ready(&self, now: Instant) -> Result<(), (Duration, &str)> {
        match self.not_before {
            Some(t) if t > now => Err((t - now, self.last_error.as_deref().unwrap_or(""))),
            _ => Ok(()),
        }
    }

    /// An attempt failed at `now`. `jitter` in `[0, 1)` spreads the wait over its upper fifth
    /// (so that clients that lost the same server do not all come back at once). Returns the
    /// wait.
    pub(crate) fn failed(&mut self, now: Instant, error: String, jitter: f64) -> Duration {
        let jitter = jitter.clamp(0.0, 1.0);
        let wait = self.next_delay.mul_f64(0.8 + 0.2 * jitter);
        self.not_before = Some(now + wait);
        self.last_error = Some(error);
        self.failures = self.failures.saturating_add(1);
        self.next_delay = (self.next_delay * 2).min(self.max);
        wait
    }

    /// An attempt succeeded: the next failure waits the initial delay again.
    pub(crate) fn succeeded(&mut self) {
        self.next_delay = self.initial;
        self.not_before = None;
        self.last_error = None;
        self.failures = 0;
    }

    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

/// A number in `[0, 1)` that differs between clients and attempts.
pub(crate) fn jitter() -> f64 {
    (crate::remote::new_token() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap_and_reset_on_success() {
        let t0 = Instant::now();
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        assert!(b.ready(t0).is_ok(), "the first attempt never waits");
        let waits: Vec<_> = (0..6)
            .map(|_| b.failed(t0, "refused".into(), 1.0))
            .collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1000, 1000].map(|ms| ms * MS),
            "doubling, capped"
        );
        assert_eq!(b.failures(), 6);
        b.succeeded();
        assert_eq!(b.failed(t0, "refused".into(), 1.0), 100 * MS);
    }

    #[test]
    fn refuses_attempts_inside_the_wait_and_says_why() {
        let t0 = Instant::now();
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let wait = b.failed(t0, "connection refused".into(), 0.5);
        let (left, why) = b.ready(t0 + 10 * MS).unwrap_err();
        assert_eq!(left, wait - 10 * MS);
        assert_eq!(why, "connection refused");
        assert!(b.ready(t0 + wait).is_ok());
    }

    #[test]
    fn jitter_keeps_the_wait_within_its_fifth() {
        let t0 = Instant::now();
        for j in [0.0, 0.25, 0.999, -1.0, 7.0] {
            let mut b = Backoff::new(100 * MS, 1000 * MS);
            let wait = b.failed(t0, String::new(), j);
            assert!(wait >= 80 * MS && wait <= 100 * MS, "{j}: {wait:?}");
        }
        let j = jitter();
        assert!((0.0..1.0).contains(&j), "{j}");
    }
}
