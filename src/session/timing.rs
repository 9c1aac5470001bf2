//! When the two ends of a session speak, as fractions of the table's reap
//! timeout `T`: how often a client beats, how long a listener lets it go
//! unheard, how often the listener looks and says it hears, when the
//! reaper takes over from a listener that does not run, when a client that
//! hears nothing gives up. The codec (`wire/`)
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

/// How often a listener looks over its connections (greetings past their
/// deadline, sessions unheard, registrations ended, `Heard` due): every
/// `T/16`, between 5 ms and 250 ms.
pub(crate) fn listener_tick(reap_timeout: Duration) -> Duration {
    (reap_timeout / 16).clamp(Duration::from_millis(5), Duration::from_millis(250))
}

/// How often a listener whose connections are all sessions beating in a
/// region looks over them (their beats are the reaper's to pull and
/// judge; what is left is telling ends and info): every `T/4`, between
/// 5 ms and 250 ms.
pub(crate) fn quiet_listener_tick(reap_timeout: Duration) -> Duration {
    (reap_timeout / 4).clamp(Duration::from_millis(5), Duration::from_millis(250))
}

/// How long a listener that holds sessions may go without running before
/// the reaper counts its scan as one of a stale listener: `T/2`, at least
/// 500 ms. From two such scans on, the reaper judges held sessions itself.
pub(crate) fn listener_stale_after(reap_timeout: Duration) -> Duration {
    (reap_timeout / 2).max(Duration::from_millis(500))
}

/// Scans of a stale listener after which the reaper judges held sessions
/// itself (one is not enough: after the process was stopped, the reaper
/// may scan before the listener has run).
pub(crate) const STALE_SCANS_MAX: u32 = 2;

/// How many reap timeouts a client goes without hearing its listener
/// before it gives its registration up (`disconnected`): from the first
/// `T` of silence on, it tries to reclaim over a new connection while
/// keeping the old one, which may come back (a listener stopped and
/// resumed reads what waited) until then.
pub(crate) const SILENT_TIMEOUTS_MAX: u32 = 3;

/// How often a listener tells a session it holds that it hears it
/// (`Heard`): every `T/4`, so a client that hears nothing for `T` has missed
/// four.
pub(crate) fn heard_interval(reap_timeout: Duration) -> Duration {
    (reap_timeout / 4).max(Duration::from_millis(1))
}
