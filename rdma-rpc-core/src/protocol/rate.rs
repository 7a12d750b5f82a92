//! At most so many events per interval, counted in fixed windows: what bounds a connection's
//! pings and the lines of one kind a peer can make the server log. Deterministic: no clock of
//! its own, the caller says when each event happens.

use std::time::{Duration, Instant};

/// Counts events in fixed windows of `interval`. The first window lets `limit` events pass,
/// and so does every window after a quiet one; a window that follows held events lets one
/// pass (the one that says how many were held), so a sustained flood passes one event per
/// interval after its first `limit`.
#[derive(Debug, Clone)]
pub(crate) struct Rate {
    limit: u32,
    interval: Duration,
    /// Start of the current window; `None` before the first event.
    start: Option<Instant>,
    /// Events the current window still lets pass.
    left: u32,
    /// Events held since the last one that passed.
    held: u64,
}

/// What [`Rate::check`] says of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The event passes; `held` events were held since the last that passed.
    Pass {
        /// Events held back before this one (since the last that passed).
        held: u64,
    },
    /// Over the limit: the event is held (and counted).
    Hold,
}

impl Rate {
    /// `limit` events per `interval`.
    pub(crate) fn new(limit: u32, interval: Duration) -> Rate {
        Rate {
            limit,
            interval,
            start: None,
            left: 0,
            held: 0,
        }
    }

    /// Decides about one event that happens at `now` (earlier instants than a previous call's
    /// count as that call's).
    pub(crate) fn check(&mut self, now: Instant) -> Verdict {
        let fresh = self
            .start
            .is_none_or(|start| now.saturating_duration_since(start) >= self.interval);
        if fresh {
            self.start = Some(now);
            self.left = if self.held > 0 {
                self.limit.min(1)
            } else {
                self.limit
            };
        }
        if self.left == 0 {
            self.held = self.held.saturating_add(1);
            return Verdict::Hold;
        }
        self.left -= 1;
        Verdict::Pass {
            held: std::mem::take(&mut self.held),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn passed(rate: &mut Rate, at: Instant, n: usize) -> Vec<Verdict> {
        (0..n).map(|_| rate.check(at)).collect()
    }

    #[test]
    fn the_first_window_passes_the_limit_then_holds() {
        let t0 = Instant::now();
        let mut rate = Rate::new(3, SEC);
        let pass = Verdict::Pass { held: 0 };
        assert_eq!(
            passed(&mut rate, t0, 5),
            [pass, pass, pass, Verdict::Hold, Verdict::Hold]
        );
        // Still the same window, however close to its end.
        assert_eq!(
            rate.check(t0 + SEC - Duration::from_nanos(1)),
            Verdict::Hold
        );
    }

    #[test]
    fn a_flood_passes_one_event_per_interval_with_the_count_held() {
        let t0 = Instant::now();
        let mut rate = Rate::new(10, SEC);
        passed(&mut rate, t0, 10 + 500);
        // The next window: one event, saying how many were held; the rest held again.
        assert_eq!(rate.check(t0 + SEC), Verdict::Pass { held: 500 });
        assert_eq!(rate.check(t0 + SEC), Verdict::Hold);
        assert_eq!(rate.check(t0 + SEC + SEC / 2), Verdict::Hold);
        assert_eq!(rate.check(t0 + 2 * SEC), Verdict::Pass { held: 2 });
        // A flood that goes on: one event per interval.
        let mut passes = 0;
        for ms in 0..60_000u64 {
            let at = t0 + 2 * SEC + Duration::from_millis(1 + ms);
            for _ in 0..10 {
                passes += usize::from(matches!(rate.check(at), Verdict::Pass { .. }));
            }
        }
        assert_eq!(passes, 60);
    }

    #[test]
    fn a_quiet_window_restores_the_limit() {
        let t0 = Instant::now();
        let mut rate = Rate::new(2, SEC);
        passed(&mut rate, t0, 4);
        // The window after the flood reports it and passes only that one ...
        assert_eq!(rate.check(t0 + SEC), Verdict::Pass { held: 2 });
        assert_eq!(rate.check(t0 + SEC), Verdict::Hold);
        // ... the one after passes one more (the held count) ...
        assert_eq!(rate.check(t0 + 2 * SEC), Verdict::Pass { held: 1 });
        // ... and a window after a quiet one passes the whole limit again.
        let pass = Verdict::Pass { held: 0 };
        assert_eq!(
            passed(&mut rate, t0 + 3 * SEC, 3),
            [pass, pass, Verdict::Hold]
        );
    }

    #[test]
    fn a_zero_limit_holds_everything_and_time_going_back_changes_nothing() {
        let t0 = Instant::now() + SEC;
        let mut rate = Rate::new(0, SEC);
        assert_eq!(passed(&mut rate, t0, 3), [Verdict::Hold; 3]);
        assert_eq!(rate.check(t0 + 5 * SEC), Verdict::Hold);
        let mut rate = Rate::new(1, SEC);
        assert_eq!(rate.check(t0), Verdict::Pass { held: 0 });
        assert_eq!(rate.check(t0 - SEC), Verdict::Hold);
    }
}
