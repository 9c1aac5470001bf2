//! `Table::metrics_text`: the OpenMetrics text of a table, its counters and
//! the two histograms the reaper keeps in the header.

mod common;

use common::{manual_setup, options, SECOND};
use livereg::{Reason, Table, TableOptions};

/// The value of the sample line that starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn counters_and_the_silence_histogram_move_with_evictions() {
    let (table, clock, mut reaper, recorder) = manual_setup(&options());
    let timeout = u64::try_from(table.reap_timeout().as_nanos()).unwrap();
    let t = r#"table="(in memory)""#;
    let before = table.metrics_text().unwrap();
    assert!(before.ends_with("# EOF\n"));
    assert_eq!(sample(&before, &format!("livereg_capacity{{{t}}}")), 8.0);
    let silent = table.register(1, "a").unwrap();
    silent.heartbeat().unwrap();
    let leaving = table.register(2, "b").unwrap();
    assert_eq!(
        sample(
            &table.metrics_text().unwrap(),
            &format!("livereg_registrations{{{t}}}")
        ),
        2.0
    );
    leaving.deregister().unwrap();
    let beat_at = clock.now_ns();
    reaper.scan_once(beat_at + timeout + 2 * SECOND).unwrap();
    assert_eq!(recorder.reasons().len(), 2);
    let after = table.metrics_text().unwrap();
    let ended = |reason: Reason| {
        sample(
            &after,
            &format!("livereg_registrations_ended_total{{{t},reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(ended(Reason::Timeout), 1.0);
    assert_eq!(ended(Reason::Deregistered), 1.0);
    assert_eq!(ended(Reason::ProcessExited), 0.0);
    assert_eq!(
        sample(&after, &format!("livereg_registrations{{{t}}}")),
        0.0
    );
    // Only the timeout is an eviction: silent 3 s, in the 10 s bucket.
    let silence = "livereg_eviction_silence_seconds";
    assert_eq!(sample(&after, &format!("{silence}_count{{{t}}}")), 1.0);
    assert_eq!(sample(&after, &format!("{silence}_sum{{{t}}}")), 3.0);
    assert_eq!(
        sample(&after, &format!("{silence}_bucket{{{t},le=\"1.0\"}}")),
        0.0
    );
    assert_eq!(
        sample(&after, &format!("{silence}_bucket{{{t},le=\"10.0\"}}")),
        1.0
    );
    assert_eq!(
        sample(&after, &format!("{silence}_bucket{{{t},le=\"+Inf\"}}")),
        1.0
    );
    // Every scan is counted, in cumulative buckets ending at the count.
    let scans = sample(&after, &format!("livereg_scans_total{{{t}}}"));
    assert!(scans >= 1.0);
    let duration = "livereg_scan_duration_seconds";
    assert_eq!(sample(&after, &format!("{duration}_count{{{t}}}")), scans);
    assert_eq!(
        sample(&after, &format!("{duration}_bucket{{{t},le=\"+Inf\"}}")),
        scans
    );
}

#[test]
fn each_table_labels_its_samples_with_its_name() {
    let name = common::unique_name("metrics-label");
    let table = Table::create(&name, &TableOptions::default()).unwrap();
    let _guard = common::UnlinkOnDrop(name.clone());
    let text = table.metrics_text().unwrap();
    assert_eq!(
        sample(&text, &format!("livereg_reaper_up{{table=\"{name}\"}}")),
        0.0
    );
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.contains(&format!("table=\"{name}\"")), "{line}");
    }
}
