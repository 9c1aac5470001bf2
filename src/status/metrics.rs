//! A table's metrics in the OpenMetrics text format (the names
//! `docs/operations.md` lists; written by [`crate::status::openmetrics`]), and the
//! two histograms the reaper keeps in the header for them (scan duration,
//! silence at eviction), so that any process can render them.

use crate::error::Result;
use crate::session::SessionRefusals;
use crate::status::openmetrics::{Exposition, Kind, Value};
use crate::status::report::{RegistrationState, Status};
use crate::sync::AtomicU64;
use crate::sync::Ordering::Relaxed;
use crate::table::handle::Table;
use crate::table::layout::{Header, SCAN_BUCKETS, SILENCE_BUCKETS};

/// Counts one scan of `duration_ns` in the header's histogram.
pub(crate) fn observe_scan(header: &Header, duration_ns: u64) {
    observe(
        &header.scan_histogram,
        &SCAN_BUCKETS,
        &header.scan_sum_ns,
        duration_ns,
    );
}

/// Counts one eviction after `silent_ns` of silence.
pub(crate) fn observe_eviction(header: &Header, silent_ns: u64) {
    observe(
        &header.silence_histogram,
        &SILENCE_BUCKETS,
        &header.silence_sum_ns,
        silent_ns,
    );
}

fn observe(buckets: &[AtomicU64], bounds: &[f64], sum_ns: &AtomicU64, value_ns: u64) {
    let seconds = value_ns as f64 / 1e9;
    let bucket = bounds
        .iter()
        .position(|bound| seconds <= *bound)
        .unwrap_or(bounds.len());
    if let Some(count) = buckets.get(bucket) {
        count.fetch_add(1, Relaxed);
    }
    sum_ns.fetch_add(value_ns, Relaxed);
}

/// A histogram as the header holds it, read once: `(upper bound,
/// observations in this bucket alone)` with `+Inf` last, and the sum in
/// seconds.
fn histogram(counts: &[AtomicU64], bounds: &[f64], sum_ns: &AtomicU64) -> (Vec<(f64, u64)>, f64) {
    let buckets = bounds
        .iter()
        .copied()
        .chain([f64::INFINITY])
        .zip(counts)
        .map(|(bound, count)| (bound, count.load(Relaxed)))
        .collect();
    (buckets, sum_ns.load(Relaxed) as f64 / 1e9)
}

/// What a process that serves a table's metrics knows beside the table:
/// its reaper's refused sessions, its etcd publisher's connection (for
/// [`Table::metrics_text_with`]).
#[derive(Clone, Debug, Default)]
pub struct ProcessMetrics {
    /// The running reaper's refusals ([`Reaper::session_refusals`](crate::Reaper::session_refusals)):
    /// `livereg_sessions_refused_total{code}`.
    pub session_refusals: Option<SessionRefusals>,
    /// Whether its etcd publisher holds a connection, when it publishes:
    /// `livereg_etcd_connected`.
    pub etcd_connected: Option<bool>,
}

impl Table {
    /// The table's metrics in the OpenMetrics text format, ending in
    /// `# EOF`, every sample labelled `table="NAME"`: for a server that
    /// embeds the reaper to serve on its own `/metrics` (the `livereg reap
    /// --metrics-addr` daemon serves the same).
    ///
    /// | metric | type | what |
    /// |---|---|---|
    /// | `livereg_registrations` | gauge | live registrations |
    /// | `livereg_capacity` | gauge | slots |
    /// | `livereg_reaper_up` | gauge | 1 while a reaper holds the table |
    /// | `livereg_reaper_heartbeat_age_seconds` | gauge | since the reaper's last scan (absent before the first) |
    /// | `livereg_sessions{state}` | gauge | live registrations made over a session, `connected` or `away` (their client reconnecting) |
    /// | `livereg_registrations_ended_total{reason}` | counter | ended registrations by reason |
    /// | `livereg_handler_failures_total` | counter | drop and clear handlers that failed |
    /// | `livereg_handlers_overdue_total` | counter | handlers past their deadline |
    /// | `livereg_scans_total` | counter | scans by every reaper |
    /// | `livereg_scan_duration_seconds` | histogram | how long scans took |
    /// | `livereg_eviction_silence_seconds` | histogram | silence of registrations at eviction (timeout, grace, exit, stall) |
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`](crate::Error::Corrupt) for a table truncated
    /// under it, as [`Table::status`].
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::{Table, TableOptions};
    ///
    /// let table = Table::in_memory(&TableOptions::default())?;
    /// let _worker = table.register(1, "gpu0")?;
    /// let text = table.metrics_text()?;
    /// assert!(text.contains("livereg_registrations{table=\"(in memory)\"} 1"));
    /// assert!(text.ends_with("# EOF\n"));
    /// # Ok::<(), livereg::Error>(())
    /// ```
    pub fn metrics_text(&self) -> Result<String> {
        self.metrics_text_with(&ProcessMetrics::default())
    }

    /// [`Table::metrics_text`] with what the serving process knows beside
    /// the table (`livereg reap --metrics-addr` serves this):
    ///
    /// | metric | type | what |
    /// |---|---|---|
    /// | `livereg_sessions_refused_total{code}` | counter | handshakes its reaper's listeners refused, by the result code the client was told (`PERMISSION`: wrong token; `BUSY`: a source waiting after failed handshakes) |
    /// | `livereg_etcd_connected` | gauge | 1 while its etcd publisher holds a connection |
    ///
    /// # Errors
    ///
    /// As [`Table::metrics_text`].
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::{ProcessMetrics, Table, TableOptions};
    ///
    /// let table = Table::in_memory(&TableOptions::default())?;
    /// let reaper = table.reaper().spawn()?;
    /// let process = ProcessMetrics {
    ///     session_refusals: Some(reaper.session_refusals()),
    ///     etcd_connected: None,
    /// };
    /// let text = table.metrics_text_with(&process)?;
    /// assert!(text.contains("livereg_sessions_refused_total{table=\"(in memory)\",code=\"PERMISSION\"} 0"));
    /// # Ok::<(), livereg::Error>(())
    /// ```
    pub fn metrics_text_with(&self, process: &ProcessMetrics) -> Result<String> {
        let status = self.status()?;
        let header = self.memory.header();
        let mut text = Exposition::new("table", &status.table);
        registrations(&mut text, &status);
        if let Some(refusals) = &process.session_refusals {
            text.family(
                "livereg_sessions_refused",
                Kind::Counter,
                None,
                "Session handshakes refused, by the result code the client was told.",
            );
            for (code, count) in refusals.by_code() {
                text.sample(Some(("code", code)), Value::Integer(count));
            }
        }
        if let Some(connected) = process.etcd_connected {
            text.family(
                "livereg_etcd_connected",
                Kind::Gauge,
                None,
                "1 while this process's etcd publisher holds a connection.",
            );
            text.sample(None, Value::Integer(u64::from(connected)));
        }
        reaper(&mut text, &status, header);
        owned_files(&mut text, &status);
        Ok(text.finish())
    }
}

/// The registrations: live, slots, the reaper's presence and heartbeat age,
/// sessions, ended by reason.
fn registrations(text: &mut Exposition, status: &Status) {
    let mut gauge = |name: &str, help: &str, value: u64| {
        text.family(name, Kind::Gauge, None, help);
        text.sample(None, Value::Integer(value));
    };
    gauge(
        "livereg_registrations",
        "Live registrations.",
        status.tracked_instances as u64,
    );
    gauge(
        "livereg_capacity",
        "Slots of the table.",
        u64::from(status.capacity),
    );
    gauge(
        "livereg_reaper_up",
        "1 while a reaper holds the table.",
        u64::from(status.reaper_alive),
    );
    if let Some(age) = status.reaper_heartbeat_age_seconds {
        text.family(
            "livereg_reaper_heartbeat_age_seconds",
            Kind::Gauge,
            Some("seconds"),
            "Since the reaper's last scan.",
        );
        text.sample(None, Value::Float(age));
    }
    text.family(
        "livereg_sessions",
        Kind::Gauge,
        None,
        "Live registrations made over a session, by whether their connection is held.",
    );
    for (state, connected) in [("connected", true), ("away", false)] {
        let count = status
            .registrations
            .iter()
            .filter(|r| r.state == RegistrationState::Live)
            .filter(|r| {
                r.remote
                    .as_ref()
                    .is_some_and(|remote| remote.connected == connected)
            })
            .count();
        text.sample(Some(("state", state)), Value::Integer(count as u64));
    }
    text.family(
        "livereg_registrations_dying",
        Kind::Gauge,
        None,
        "Registrations whose process has begun to exit and that have not yet ended.",
    );
    let dying = status
        .registrations
        .iter()
        .filter(|r| r.state == RegistrationState::Dying)
        .count();
    text.sample(None, Value::Integer(dying as u64));
    text.family(
        "livereg_registrations_ended",
        Kind::Counter,
        None,
        "Ended registrations, by reason.",
    );
    for (reason, count) in &status.ended {
        text.sample(Some(("reason", reason.as_str())), Value::Integer(*count));
    }
}

/// The files processes own: held now, removed, the bytes freed, and the
/// removals refused (absent for a table without owned-file records).
fn owned_files(text: &mut Exposition, status: &Status) {
    let Some(owned) = &status.owned_files else {
        return;
    };
    text.family(
        "livereg_owned_files",
        Kind::Gauge,
        None,
        "Files processes own, removed once they have ended.",
    );
    let files = owned.owners.iter().map(|o| u64::from(o.files)).sum();
    text.sample(None, Value::Integer(files));
    let mut counter = |name: &str, help: &str, value: u64| {
        text.family(name, Kind::Counter, None, help);
        text.sample(None, Value::Integer(value));
    };
    counter(
        "livereg_owned_files_removed",
        "Owned files the reapers removed once their owner had ended.",
        owned.removed_total,
    );
    counter(
        "livereg_owned_bytes_freed",
        "Bytes held by the owned files the reapers removed.",
        owned.freed_bytes_total,
    );
    counter(
        "livereg_owned_removals_refused",
        "Owned files left in place: the name held another file, a link, or a file of a user the rules exclude.",
        owned.refused_total,
    );
}

/// The reaper's work: handler failures, overdue handlers, scans, and the
/// two histograms of the header.
fn reaper(text: &mut Exposition, status: &Status, header: &Header) {
    let mut counter = |name: &str, help: &str, value: u64| {
        text.family(name, Kind::Counter, None, help);
        text.sample(None, Value::Integer(value));
    };
    counter(
        "livereg_handler_failures",
        "Drop and clear handlers that failed or panicked.",
        status.handler_failures,
    );
    counter(
        "livereg_handlers_overdue",
        "Handlers that ran past their deadline.",
        status.handlers_overdue,
    );
    counter(
        "livereg_scans",
        "Scans by every reaper of the table.",
        status.scans,
    );
    let (buckets, sum) = histogram(&header.scan_histogram, &SCAN_BUCKETS, &header.scan_sum_ns);
    text.family(
        "livereg_scan_duration_seconds",
        Kind::Histogram,
        Some("seconds"),
        "How long reaper scans took.",
    );
    text.histogram(&buckets, sum);
    let (buckets, sum) = histogram(
        &header.silence_histogram,
        &SILENCE_BUCKETS,
        &header.silence_sum_ns,
    );
    text.family(
        "livereg_eviction_silence_seconds",
        Kind::Histogram,
        Some("seconds"),
        "Silence of registrations when evicted (timeout, grace, process exit, stall).",
    );
    text.histogram(&buckets, sum);
}
