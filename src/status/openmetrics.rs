//! The OpenMetrics text format, as much of it as a table's metrics use:
//! families of counters, gauges and histograms whose values are a snapshot,
//! every sample labelled with its table, ended by `# EOF`.
//!
//! A family is written as `# HELP`, `# TYPE` (and `# UNIT`) lines, then its
//! samples; a counter's samples carry the `_total` suffix its family name
//! does not, a histogram's are `_sum`, `_count` and cumulative `_bucket`s
//! up to `le="+Inf"`. Label values and help texts are escaped (`\`, `"`,
//! newline), so a table named anything cannot break a line. Prometheus
//! itself parses what this writes in CI (`.ci/dashboard`).

use std::fmt::Write as _;

/// What a family holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's value: an integer, or a float written as OpenMetrics reads
/// one (`1.0`, `0.0001`, `1e-7`, `+Inf`, `NaN`).
pub(crate) enum Value {
    Integer(u64),
    Float(f64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Value::Integer(n) => write!(f, "{n}"),
            Value::Float(x) if x.is_nan() => f.write_str("NaN"),
            Value::Float(x) if x == f64::INFINITY => f.write_str("+Inf"),
            Value::Float(x) if x == f64::NEG_INFINITY => f.write_str("-Inf"),
            // `Debug` keeps the `.0` of a whole number, as the format's
            // canonical `le` values have it.
            Value::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// Metrics being written: every sample gets the common label first.
pub(crate) struct Exposition {
    out: String,
    /// `KEY="VALUE"`, escaped.
    common: String,
    /// The current family's name and kind.
    family: (String, Kind),
}

impl Exposition {
    /// An exposition whose every sample carries `key="value"`.
    pub(crate) fn new(key: &str, value: &str) -> Exposition {
        Exposition {
            out: String::new(),
            common: format!("{key}=\"{}\"", escaped(value, true)),
            family: (String::new(), Kind::Gauge),
        }
    }

    /// Starts family `name` (its unit, if any, already its name's last
    /// word: `livereg_scan_duration_seconds`).
    pub(crate) fn family(&mut self, name: &str, kind: Kind, unit: Option<&str>, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escaped(help, false));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
        if let Some(unit) = unit {
            let _ = writeln!(self.out, "# UNIT {name} {unit}");
        }
        self.family = (name.to_owned(), kind);
    }

    /// One sample of the current family, with one more label if given (a
    /// counter's sample gets its `_total`).
    pub(crate) fn sample(&mut self, label: Option<(&str, &str)>, value: Value) {
        let suffix = if self.family.1 == Kind::Counter {
            "_total"
        } else {
            ""
        };
        self.line(suffix, label, value);
    }

    /// The current family as a histogram: `(upper bound, observations in
    /// that bucket alone)` with `+Inf` last, and the observations' sum.
    pub(crate) fn histogram(&mut self, buckets: &[(f64, u64)], sum: f64) {
        let count = buckets.iter().fold(0u64, |n, (_, c)| n.saturating_add(*c));
        self.line("_sum", None, Value::Float(sum));
        self.line("_count", None, Value::Integer(count));
        let mut cumulative = 0u64;
        for (bound, observed) in buckets {
            cumulative = cumulative.saturating_add(*observed);
            let le = Value::Float(*bound).to_string();
            self.line("_bucket", Some(("le", &le)), Value::Integer(cumulative));
        }
    }

    /// The text, ended by `# EOF`.
    pub(crate) fn finish(mut self) -> String {
        self.out.push_str("# EOF\n");
        self.out
    }

    fn line(&mut self, suffix: &str, label: Option<(&str, &str)>, value: Value) {
        let (name, common) = (&self.family.0, &self.common);
        let _ = match label {
            Some((key, text)) => writeln!(
                self.out,
                "{name}{suffix}{{{common},{key}=\"{}\"}} {value}",
                escaped(text, true)
            ),
            None => writeln!(self.out, "{name}{suffix}{{{common}}} {value}"),
        };
    }
}

/// `text` with `\` and newlines escaped (and `"`, in a label value).
fn escaped(text: &str, label: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms_are_written_as_openmetrics_reads_them() {
        let mut text = Exposition::new("table", "a \"b\"\\\n");
        text.family("x_up", Kind::Gauge, None, "Up\\down\nor not");
        text.sample(None, Value::Integer(1));
        text.family("x_ended", Kind::Counter, None, "Ended");
        text.sample(Some(("reason", "timeout")), Value::Integer(3));
        text.family("x_age_seconds", Kind::Gauge, Some("seconds"), "Age");
        text.sample(None, Value::Float(0.25));
        text.family("x_wait_seconds", Kind::Histogram, Some("seconds"), "Wait");
        text.histogram(&[(0.0001, 1), (1.0, 2), (f64::INFINITY, 1)], 1e-7);
        let t = r#"table="a \"b\"\\\n""#;
        assert_eq!(
            text.finish(),
            format!(
                "# HELP x_up Up\\\\down\\nor not\n# TYPE x_up gauge\nx_up{{{t}}} 1\n\
                 # HELP x_ended Ended\n# TYPE x_ended counter\nx_ended_total{{{t},reason=\"timeout\"}} 3\n\
                 # HELP x_age_seconds Age\n# TYPE x_age_seconds gauge\n# UNIT x_age_seconds seconds\nx_age_seconds{{{t}}} 0.25\n\
                 # HELP x_wait_seconds Wait\n# TYPE x_wait_seconds histogram\n# UNIT x_wait_seconds seconds\n\
                 x_wait_seconds_sum{{{t}}} 1e-7\nx_wait_seconds_count{{{t}}} 4\n\
                 x_wait_seconds_bucket{{{t},le=\"0.0001\"}} 1\nx_wait_seconds_bucket{{{t},le=\"1.0\"}} 3\n\
                 x_wait_seconds_bucket{{{t},le=\"+Inf\"}} 4\n# EOF\n"
            )
        );
    }

    #[test]
    fn floats_are_written_as_the_format_spells_them() {
        let show = |x: f64| Value::Float(x).to_string();
        assert_eq!(show(0.0), "0.0");
        assert_eq!(show(600.0), "600.0");
        assert_eq!(show(f64::INFINITY), "+Inf");
        assert_eq!(show(f64::NEG_INFINITY), "-Inf");
        assert_eq!(show(f64::NAN), "NaN");
        assert_eq!(Value::Integer(u64::MAX).to_string(), "18446744073709551615");
    }
}
