//! When the two ends of a session speak, as fractions of the table's reap
//! timeout `T`: how often a client beats, how long a listener lets it go
//! unheard, how often the listener says it hears. The codec (`wire.rs`)
//! knows nothing of time; the sender, the listener and the reaper take
//! their schedules from here.

use std::time::Duration;

/// How many `Beat`s a client sends per reap timeout `T`: one every `T/8`
/// on a fixed schedule, whether or not anything changed (a beat that says
/// "no heartbeat for `T`" is how a listener learns that an engine loop hung
/// while its sender lives). A listener holding 1,000 sessions at T = 1 s
/// reads 8,000 beats a second.
pub(crate) const FORWARDS_PER_TIMEOUT: u32 = 8;

/// The time between a client's beats: `T / FORWARDS_PER_TIMEOUT`.
pub(crate) fn forward_interval(reap_timeout: Duration) -> Duration {
    (reap_timeout / FORWARDS_PER_TIMEOUT).max(Duration::from_millis(1))
}

/// How much longer than `T` a listener lets a session go unheard before it
/// ends it `timeout`: a client stopped right after a beat may have pinged
/// for one more forward interval without those pings leaving the process,
/// plus slack for a late sender (`T/32`, at least 10 ms). So a stopped
/// client is never evicted before `T` of real silence; with the
/// listener's tick (`T/16`) it is evicted within `1.22 T`.
pub(crate) fn unheard_allowance(reap_timeout: Duration) -> Duration {
    forward_interval(reap_timeout) + (reap_timeout / 32).max(Duration::from_millis(10))
}

/// How often a listener tells a session it holds that it hears it
/// (`Heard`): every `T/4`, so a client that hears nothing for `T` has missed
/// four.
pub(crate) fn heard_interval(reap_timeout: Duration) -> Duration {
    (reap_timeout / 4).max(Duration::from_millis(1))
}
