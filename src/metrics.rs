//! A table's metrics in the OpenMetrics text format (the names
//! `docs/operations.md` lists), encoded by `prometheus-client`, and the two histograms
//! the reaper keeps in the header for them (scan duration, silence at
//! eviction), so that any process can render them.

use crate::error::Result;
use crate::layout::{Header, SCAN_BUCKETS, SILENCE_BUCKETS};
use crate::session::SessionRefusals;
use crate::status::RegistrationState;
use crate::sync::AtomicU64;
use crate::sync::Ordering::Relaxed;
use crate::table::Table;
use prometheus_client::encoding::{text, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::borrow::Cow;

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

/// A histogram as the header holds it, read once.
#[derive(Debug)]
struct Histogram {
    /// `(upper bound, observations in this bucket alone)`, the last bound
    /// `+Inf` (the encoder makes the counts cumulative).
    buckets: Vec<(f64, u64)>,
    sum_seconds: f64,
}

impl Histogram {
    fn read(counts: &[AtomicU64], bounds: &[f64], sum_ns: &AtomicU64) -> Histogram {
        let buckets = bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(counts)
            .map(|(bound, count)| (bound, count.load(Relaxed)))
            .collect();
        Histogram {
            buckets,
            sum_seconds: sum_ns.load(Relaxed) as f64 / 1e9,
        }
    }

    fn count(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0u64, |total, (_, count)| total.saturating_add(*count))
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds, self.count(), &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One sample per label value (`reason`, `state`, `code`): counters or
/// gauges.
#[derive(Debug)]
struct ByLabel {
    key: &'static str,
    samples: Vec<(&'static str, u64)>,
    kind: MetricType,
}

impl EncodeMetric for ByLabel {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        for (value, count) in &self.samples {
            let labels = [(self.key, *value)];
            let mut encoder = encoder.encode_family(&labels)?;
            match self.kind {
                MetricType::Counter => encoder.encode_counter::<NoLabelSet, _, u64>(count, None)?,
                _ => encoder.encode_gauge(&i64::try_from(*count).unwrap_or(i64::MAX))?,
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
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
        let labels = [(Cow::Borrowed("table"), Cow::Owned(status.table.clone()))];
        let mut registry = Registry::with_prefix_and_labels("livereg", labels.into_iter());
        let gauge = |value: usize| ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
        registry.register(
            "registrations",
            "Live registrations",
            gauge(status.tracked_instances),
        );
        registry.register(
            "capacity",
            "Slots of the table",
            gauge(status.capacity as usize),
        );
        registry.register(
            "reaper_up",
            "1 while a reaper holds the table",
            gauge(usize::from(status.reaper_alive)),
        );
        if let Some(age) = status.reaper_heartbeat_age_seconds {
            registry.register_with_unit(
                "reaper_heartbeat_age",
                "Since the reaper's last scan",
                Unit::Seconds,
                ConstGauge::new(age),
            );
        }
        let sessions = |connected: bool| {
            status
                .registrations
                .iter()
                .filter(|r| r.state == RegistrationState::Live)
                .filter(|r| {
                    r.remote
                        .as_ref()
                        .is_some_and(|remote| remote.connected == connected)
                })
                .count() as u64
        };
        registry.register(
            "sessions",
            "Live registrations made over a session, by whether their connection is held",
            ByLabel {
                key: "state",
                samples: vec![("connected", sessions(true)), ("away", sessions(false))],
                kind: MetricType::Gauge,
            },
        );
        registry.register(
            "registrations_ended",
            "Ended registrations, by reason",
            ByLabel {
                key: "reason",
                samples: status
                    .ended
                    .iter()
                    .map(|(reason, n)| (reason.as_str(), *n))
                    .collect(),
                kind: MetricType::Counter,
            },
        );
        if let Some(refusals) = &process.session_refusals {
            registry.register(
                "sessions_refused",
                "Session handshakes refused, by the result code the client was told",
                ByLabel {
                    key: "code",
                    samples: refusals.by_code(),
                    kind: MetricType::Counter,
                },
            );
        }
        if let Some(connected) = process.etcd_connected {
            registry.register(
                "etcd_connected",
                "1 while this process's etcd publisher holds a connection",
                gauge(usize::from(connected)),
            );
        }
        registry.register(
            "handler_failures",
            "Drop and clear handlers that failed or panicked",
            ConstCounter::new(status.handler_failures),
        );
        registry.register(
            "handlers_overdue",
            "Handlers that ran past their deadline",
            ConstCounter::new(status.handlers_overdue),
        );
        registry.register(
            "scans",
            "Scans by every reaper of the table",
            ConstCounter::new(status.scans),
        );
        registry.register_with_unit(
            "scan_duration",
            "How long reaper scans took",
            Unit::Seconds,
            Histogram::read(&header.scan_histogram, &SCAN_BUCKETS, &header.scan_sum_ns),
        );
        registry.register_with_unit(
            "eviction_silence",
            "Silence of registrations when evicted (timeout, grace, process exit, stall)",
            Unit::Seconds,
            Histogram::read(
                &header.silence_histogram,
                &SILENCE_BUCKETS,
                &header.silence_sum_ns,
            ),
        );
        let mut out = String::new();
        text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        Ok(out)
    }
}
