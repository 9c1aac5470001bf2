//! `livereg demo`.

use super::*;

#[test]
fn demo_runs_every_scenario_and_exits_zero_with_none_failed() {
    let output = livereg(&["demo", "--workers", "4"]);
    assert!(
        output.status.success(),
        "{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(stdout(&output).contains("0 failed"), "{}", stdout(&output));
}
