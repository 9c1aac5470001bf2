//! Failed handshakes by where they come from: after a few, a source waits
//! longer and longer before its next greeting is even looked at, so
//! guessing a token costs time, not only a connection. Sources are peers'
//! IP addresses (`tcp://`, `tls://`) and user ids (`unix:`); a source that
//! fails nothing for a minute is forgotten.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Where a connection comes from, as the kernel says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    Ip(IpAddr),
    Uid(u32),
    Unknown,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Ip(ip) => write!(f, "{ip}"),
            Source::Uid(uid) => write!(f, "uid {uid}"),
            Source::Unknown => f.write_str("an unknown peer"),
        }
    }
}

/// Failures after which a source waits: a client with a stale token
/// retried by hand once or twice is not slowed down; from its third failed
/// handshake on, its next greeting waits.
const FREE_FAILURES: u32 = 3;
/// The wait after the first failure past the free ones; doubled after each
/// further one, up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(50);
/// The longest wait: a guesser gets about one look a second.
const LONGEST_WAIT: Duration = Duration::from_secs(1);
/// A source that failed nothing for this long starts afresh.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Sources remembered at most: a peer that varies its address cannot make
/// the map grow without bound (the oldest waits are let go first).
const SOURCES_MAX: usize = 4096;

/// Failed handshakes by source.
#[derive(Default)]
pub(crate) struct Penalties {
    by_source: HashMap<Source, Penalty>,
}

#[derive(Clone, Copy)]
struct Penalty {
    failures: u32,
    last_failure: Instant,
    until: Instant,
}

impl Penalties {
    /// How long `source` must still wait before its greeting is looked at.
    pub(crate) fn wait(&self, source: Source, now: Instant) -> Option<Duration> {
        self.by_source
            .get(&source)
            .map(|penalty| penalty.until.saturating_duration_since(now))
            .filter(|wait| !wait.is_zero())
    }

    /// `source` failed a handshake at `now`.
    pub(crate) fn failed(&mut self, source: Source, now: Instant) {
        if self.by_source.len() >= SOURCES_MAX && !self.by_source.contains_key(&source) {
            self.forget_old(now);
        }
        let penalty = self.by_source.entry(source).or_insert(Penalty {
            failures: 0,
            last_failure: now,
            until: now,
        });
        if now.saturating_duration_since(penalty.last_failure) >= FORGET_AFTER {
            penalty.failures = 0;
        }
        penalty.failures = penalty.failures.saturating_add(1);
        penalty.last_failure = now;
        if let Some(beyond) = penalty.failures.checked_sub(FREE_FAILURES) {
            let wait = FIRST_WAIT.saturating_mul(1 << beyond.min(16));
            penalty.until = now + wait.min(LONGEST_WAIT);
        }
    }

    /// Drops the sources whose last failure is a minute old; if that is
    /// not enough, the half whose waits end first.
    fn forget_old(&mut self, now: Instant) {
        self.by_source
            .retain(|_, p| now.saturating_duration_since(p.last_failure) < FORGET_AFTER);
        if self.by_source.len() >= SOURCES_MAX {
            let mut ends: Vec<Instant> = self.by_source.values().map(|p| p.until).collect();
            ends.sort_unstable();
            let cut = ends[ends.len() / 2];
            self.by_source.retain(|_, p| p.until > cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_waits_after_its_third_failure_longer_each_time_up_to_a_second() {
        let mut penalties = Penalties::default();
        let source = Source::Uid(1000);
        let now = Instant::now();
        assert_eq!(FREE_FAILURES, 3, "docs/sessions.md says three");
        for _ in 1..FREE_FAILURES {
            penalties.failed(source, now);
            assert_eq!(penalties.wait(source, now), None);
        }
        let mut waits = Vec::new();
        for _ in 0..8 {
            penalties.failed(source, now);
            waits.push(penalties.wait(source, now).unwrap());
        }
        assert_eq!(waits[0], FIRST_WAIT);
        assert_eq!(waits[1], FIRST_WAIT * 2);
        assert_eq!(*waits.last().unwrap(), LONGEST_WAIT);
        assert_eq!(
            penalties.wait(Source::Uid(1001), now),
            None,
            "others are not slowed"
        );
        assert_eq!(penalties.wait(source, now + LONGEST_WAIT), None);
    }

    #[test]
    fn the_map_stays_bounded_whatever_the_sources() {
        let mut penalties = Penalties::default();
        let now = Instant::now();
        for uid in 0..(3 * SOURCES_MAX as u32) {
            penalties.failed(Source::Uid(uid), now);
        }
        assert!(penalties.by_source.len() <= SOURCES_MAX);
    }

    #[test]
    fn a_minute_without_failure_starts_afresh() {
        let mut penalties = Penalties::default();
        let source = Source::Ip("10.0.0.9".parse().unwrap());
        let now = Instant::now();
        for _ in 0..10 {
            penalties.failed(source, now);
        }
        let later = now + FORGET_AFTER;
        penalties.failed(source, later);
        assert_eq!(penalties.wait(source, later), None);
    }
}
