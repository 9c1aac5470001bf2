//! The publisher's hold on etcd: the connection holding its lease, the
//! lease kept across reconnects, keep-alives and their answers, and when to
//! try again after a failure.

use super::backoff::{spread, Backoff};
use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use std::time::{Duration, Instant};

/// A connection holding the lease.
pub(super) struct LeaseConnection {
    pub(super) client: Client,
    pub(super) lease: i64,
    pub(super) keeper: LeaseKeeper,
    pub(super) answers: LeaseKeepAliveStream,
    pub(super) keep_alive_every: Duration,
    pub(super) next_keep_alive: Instant,
    /// The lease's TTL: with no keep-alive answer for this long, etcd has
    /// let the lease expire, or is not there (a hung etcd, a black-holed
    /// route): the connection is given up.
    pub(super) ttl: Duration,
    /// When etcd last answered a keep-alive (or the connection was made).
    pub(super) answered: Instant,
}

impl LeaseConnection {
    /// When the lease is lost for want of answers.
    pub(super) fn answer_deadline(&self) -> Instant {
        self.answered + self.ttl
    }
}

/// What woke the publisher's loop.
pub(super) enum Wake {
    /// A round is due: the table changed, an end came, or a timer ran out.
    Round,
    /// A keep-alive answer came.
    Lease(LeaseNews),
}

/// What a keep-alive answer said.
pub(super) enum LeaseNews {
    Alive,
    /// etcd no longer has the lease (it expired): its keys are gone.
    Expired,
    /// The connection broke; the lease may live on.
    Broken(String),
}

/// When to try etcd again, and whether it is failing now (to log an outage
/// once, and its end).
pub(super) struct Retry {
    pub(super) at: Instant,
    pub(super) backoff: Backoff,
    pub(super) failing: bool,
}

impl Retry {
    pub(super) fn failed(&mut self, error: &dyn std::fmt::Display) {
        if self.failing {
            log::debug!("{error}; retrying in {:?} at most", self.backoff.delay());
        } else {
            log::warn!(
                "{error}; local reaping goes on, publishing resumes when etcd answers (retrying)"
            );
        }
        self.failing = true;
        self.at = Instant::now() + self.backoff.failed();
    }

    /// A round went through: the outage, if any, is over.
    pub(super) fn succeeded(&mut self, endpoints: &str) {
        if self.failing {
            log::info!("etcd at {endpoints}: publishing again");
        }
        self.failing = false;
        self.backoff.succeeded();
    }
}

/// The publisher's hold on etcd: its connection (if any), the lease it
/// keeps across reconnects, and when to try again.
pub(super) struct LeaseHold {
    pub(super) connection: Option<LeaseConnection>,
    pub(super) lease: Option<i64>,
    pub(super) retry: Retry,
}

impl LeaseHold {
    pub(super) fn new() -> LeaseHold {
        LeaseHold {
            connection: None,
            lease: None,
            retry: Retry {
                at: Instant::now(),
                backoff: Backoff::new(),
                failing: false,
            },
        }
    }

    /// Takes in what woke the loop: a keep-alive answer refreshes the
    /// deadline; no answer by the deadline, an expired lease or a broken
    /// stream gives the connection up.
    pub(super) fn heed(&mut self, woke: Wake, endpoints: &str) {
        let unanswered = self
            .connection
            .as_ref()
            .is_some_and(|s| Instant::now() >= s.answer_deadline());
        match woke {
            Wake::Lease(LeaseNews::Alive) => {
                if let Some(s) = self.connection.as_mut() {
                    s.answered = Instant::now();
                }
                return;
            }
            Wake::Round if unanswered => {
                let ttl = self.connection.as_ref().map_or(Duration::ZERO, |s| s.ttl);
                self.retry.failed(&format_args!(
                    "etcd at {endpoints}: no keep-alive answer within the lease TTL ({ttl:?}); reconnecting"
                ));
            }
            Wake::Round => return,
            Wake::Lease(LeaseNews::Expired) => {
                // etcd answers: a new lease at once, no backoff.
                self.retry.failed(&format_args!(
                    "etcd at {endpoints}: the lease expired (etcd answered TTL 0); taking a new one"
                ));
                self.retry.at = Instant::now();
                self.lease = None;
            }
            // The connection broke: its member went (every host of that
            // member at the same moment). Each comes back at its own point
            // of its next keep-alive period, which its lease outlasts, not
            // all at once; then with backoff.
            Wake::Lease(LeaseNews::Broken(why)) => {
                self.retry
                    .failed(&format_args!("etcd at {endpoints}: {why}"));
                if let Some(s) = &self.connection {
                    self.retry.at = Instant::now() + spread(s.keep_alive_every);
                }
            }
        }
        self.connection = None;
    }
}

/// A third of the lease's TTL.
pub(super) fn keep_alive_every(ttl_seconds: i64) -> Duration {
    Duration::from_secs(ttl_seconds.max(1) as u64) / 3
}

/// The next keep-alive answer. Never returns without a connection.
pub(super) async fn lease_news(connection: Option<&mut LeaseConnection>) -> LeaseNews {
    let Some(connection) = connection else {
        return std::future::pending().await;
    };
    match connection.answers.message().await {
        Ok(Some(answer)) if answer.ttl() > 0 => LeaseNews::Alive,
        Ok(Some(_)) => LeaseNews::Expired,
        Ok(None) => LeaseNews::Broken("the keep-alive stream ended".into()),
        Err(error) => LeaseNews::Broken(format!("the keep-alive stream broke: {error}")),
    }
}
