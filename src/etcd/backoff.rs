//! How long to wait before trying etcd again: a delay that doubles per
//! failure up to a cap, each wait drawn at random from its second half, so
//! hosts (and watchers) that lost etcd at the same moment come back spread
//! over the delay, each at its own phase, never in lockstep.

use std::time::Duration;

/// The first retry's delay after a failure. A wait is at least half the
/// delay, so one client makes at most `2 / FIRST_RETRY` attempts a second
/// however etcd fails.
pub(super) const FIRST_RETRY: Duration = Duration::from_millis(200);
/// The longest delay between attempts while etcd is away.
pub(super) const LAST_RETRY: Duration = Duration::from_secs(5);

/// The delay of the next attempt: [`FIRST_RETRY`] doubling to [`LAST_RETRY`].
#[derive(Debug)]
pub(super) struct Backoff {
    delay: Duration,
}

impl Backoff {
    pub(super) fn new() -> Backoff {
        Backoff { delay: FIRST_RETRY }
    }

    /// An attempt failed: how long to wait before the next one (jittered),
    /// and the delay doubled for the one after.
    pub(super) fn failed(&mut self) -> Duration {
        let wait = jittered(self.delay);
        self.delay = (self.delay * 2).min(LAST_RETRY);
        wait
    }

    /// An attempt went through: the next failure starts afresh.
    pub(super) fn succeeded(&mut self) {
        self.delay = FIRST_RETRY;
    }

    /// The delay the next failure waits up to.
    pub(super) fn delay(&self) -> Duration {
        self.delay
    }
}

/// A uniform point of `[0, window]`: where in a period a client acts, each
/// at its own phase.
pub(super) fn spread(window: Duration) -> Duration {
    let span = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    let draw = crate::os::random::random_u64().unwrap_or(0);
    Duration::from_nanos(draw % span.saturating_add(1))
}

/// A uniform point of `[delay / 2, delay]`, from the kernel's randomness
/// (half the delay if it has none to give).
fn jittered(delay: Duration) -> Duration {
    let half = delay / 2;
    let spread = u64::try_from((delay - half).as_nanos()).unwrap_or(u64::MAX);
    let draw = crate::os::random::random_u64().unwrap_or(0);
    half + Duration::from_nanos(draw % spread.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_failing_together_retry_apart_within_the_delay() {
        let waits: Vec<Duration> = (0..200)
            .map(|_| {
                let mut backoff = Backoff {
                    delay: Duration::from_secs(4),
                };
                backoff.failed()
            })
            .collect();
        let (least, most) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert!(*least >= Duration::from_secs(2), "{least:?}");
        assert!(*most <= Duration::from_secs(4), "{most:?}");
        // Spread over the window, not in lockstep: the waits fill it.
        assert!(
            *most - *least > Duration::from_secs(1),
            "{least:?} .. {most:?}"
        );
        let mut distinct = waits.clone();
        distinct.sort();
        distinct.dedup();
        assert!(
            distinct.len() > 190,
            "{} distinct waits of 200",
            distinct.len()
        );
    }

    #[test]
    fn a_spread_covers_its_window() {
        let window = Duration::from_secs(3);
        let points: Vec<Duration> = (0..200).map(|_| spread(window)).collect();
        assert!(points.iter().all(|p| *p <= window));
        let (least, most) = (points.iter().min().unwrap(), points.iter().max().unwrap());
        assert!(
            *least < Duration::from_millis(300) && *most > Duration::from_millis(2700),
            "{least:?} .. {most:?}"
        );
    }

    #[test]
    fn the_delay_doubles_to_its_cap_and_a_success_starts_it_afresh() {
        let mut backoff = Backoff::new();
        let first = backoff.failed();
        assert!(
            first >= FIRST_RETRY / 2 && first <= FIRST_RETRY,
            "{first:?}"
        );
        for _ in 0..10 {
            backoff.failed();
        }
        assert_eq!(backoff.delay(), LAST_RETRY);
        backoff.succeeded();
        assert_eq!(backoff.delay(), FIRST_RETRY);
    }
}
