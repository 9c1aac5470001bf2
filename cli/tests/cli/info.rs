//! `livereg info`: the info area workers read.

use super::*;

#[test]
fn info_publishes_and_prints_what_workers_read() {
    let (name, _guard) = created("info", &[]);
    let set = livereg(&["info", &name, "--set", r#"{"chunk_size": 256}"#]);
    assert!(set.status.success(), "{}", stderr(&set));
    let shown = livereg(&["info", &name]);
    assert_eq!(stdout(&shown), "{\"chunk_size\": 256}\n");
    fails_with(
        &livereg(&["info", &name, "--set", &"x".repeat(1025)]),
        "at most 1024",
    );
}
