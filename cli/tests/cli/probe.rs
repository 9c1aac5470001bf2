//! `livereg probe`, `clear` and `rm`: a reaper asked, a clear and a reset carried out, a table removed.

use super::*;

#[test]
fn probe_answers_with_a_reaper_clear_ends_nothing_reset_ends_all_and_rm_removes_the_table() {
    let (name, _guard) = created("probe", &["--timeout", "5s"]);
    fails_with(&livereg(&["probe", &name]), "no reaper is alive");
    fails_with(
        &livereg(&["clear", &name, "--wait", "1s"]),
        "no reaper is alive",
    );
    let _reaper = Background::spawn(&["reap", &name]);
    wait_until("the reaper", || reaper_alive(&name));
    let probe = livereg(&["probe", &name]);
    assert!(
        stdout(&probe).trim().starts_with("0x"),
        "{}",
        stdout(&probe)
    );
    let mut worker = Background::spawn(&["worker", &name, "--instance", "1"]);
    let line = BufReader::new(worker.0.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert!(line.starts_with("registered"));
    let clear = livereg(&["clear", &name, "--wait", "5s"]);
    assert!(clear.status.success(), "{}", stderr(&clear));
    assert!(
        stdout(&clear).contains("registrations untouched"),
        "{}",
        stdout(&clear)
    );
    let status = status_json(&name);
    assert_eq!(status["ended"]["cleared"], 0, "a clear ends nothing");
    assert_eq!(status["tracked_instances"], 1);
    let reset = livereg(&["clear", &name, "--reset", "--wait", "5s"]);
    assert!(reset.status.success(), "{}", stderr(&reset));
    assert!(
        stdout(&reset).contains("1 registrations ended"),
        "{}",
        stdout(&reset)
    );
    assert_eq!(status_json(&name)["ended"]["cleared"], 1);
    assert!(livereg(&["rm", &name]).status.success());
    fails_with(&livereg(&["rm", &name]), "no such table");
}

#[test]
fn probe_instance_exits_0_only_for_a_live_instance_and_says_why_not() {
    let (name, _guard) = created(
        "probe-instance",
        &["--timeout", "400ms", "--grace", "800ms"],
    );
    fails_with(
        &livereg(&["probe", &name, "--instance", "7"]),
        &format!("instance 7 is not registered in table '{name}'"),
    );
    let mut worker = Background::spawn(&["worker", &name, "--instance", "7", "--interval", "50ms"]);
    let line = BufReader::new(worker.0.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert!(line.starts_with("registered"), "{line}");
    let live = livereg(&["probe", &name, "--instance", "7"]);
    assert!(live.status.success(), "{}", stderr(&live));
    assert!(
        stdout(&live).starts_with("instance 7 live"),
        "{}",
        stdout(&live)
    );
    // Stopped after a beat, with no reaper to end it: silent past its timeout.
    wait_until("a heartbeat", || {
        status_json(&name)["registrations"][0]["heartbeats"].as_u64() > Some(0)
    });
    worker.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(700));
    fails_with(
        &livereg(&["probe", &name, "--instance", "7"]),
        "past the timeout",
    );
    worker.signal(libc::SIGCONT);
}
