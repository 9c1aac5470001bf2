//! A host frozen whole: `reap` and its `run` workers stopped together for
//! 3 T and resumed, reaper first or all at once. Silence the reaper did not
//! witness is no evidence: nobody who beats after the thaw is ended, and a
//! worker that stays stopped is ended within [T, 1.25 T] of the thaw.

use super::*;

const T: Duration = Duration::from_secs(1);

fn stop(processes: &[&Background]) {
    for process in processes {
        process.signal(libc::SIGSTOP);
    }
}

fn resume(processes: &[&Background]) {
    for process in processes {
        process.signal(libc::SIGCONT);
    }
}

fn ended_total(name: &str) -> u64 {
    status_json(name)["ended_total"].as_u64().unwrap()
}

#[test]
fn a_host_frozen_for_three_timeouts_ends_nobody_who_beats_after_the_thaw() {
    let (name, _guard) = created("frozen", &["--timeout", "1s", "--grace", "2s"]);
    let reaper = Background::spawn(&["reap", &name]);
    wait_until("the reaper", || reaper_alive(&name));
    let first = Background::spawn(&["run", &name, "--instance", "1", "--", "sleep", "600"]);
    let second = Background::spawn(&["run", &name, "--instance", "2", "--", "sleep", "600"]);
    wait_until("both workers", || {
        status_json(&name)["tracked_instances"] == 2
    });

    // The reaper resumed first, the workers 50 ms after it.
    stop(&[&reaper, &first, &second]);
    std::thread::sleep(3 * T);
    resume(&[&reaper]);
    std::thread::sleep(Duration::from_millis(50));
    resume(&[&first, &second]);
    std::thread::sleep(2 * T);
    assert_eq!(ended_total(&name), 0, "ended after a thaw, reaper first");

    // Everything resumed at once.
    stop(&[&reaper, &first, &second]);
    std::thread::sleep(3 * T);
    resume(&[&reaper, &first, &second]);
    std::thread::sleep(2 * T);
    assert_eq!(ended_total(&name), 0, "ended after a thaw, all at once");
    assert_eq!(status_json(&name)["tracked_instances"], 2);

    // One worker stays stopped: ended T to 1.25 T after the thaw (and a
    // margin for a loaded machine above).
    stop(&[&reaper, &first, &second]);
    std::thread::sleep(3 * T);
    resume(&[&reaper, &first]);
    let thawed = Instant::now();
    while ended_total(&name) == 0 {
        assert!(
            thawed.elapsed() < 4 * T,
            "the stopped worker was never ended"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let ended_after = thawed.elapsed();
    assert!(
        ended_after >= T && ended_after <= T * 5 / 4 + Duration::from_millis(750),
        "the worker left stopped was ended {ended_after:?} after the thaw"
    );
    let json = status_json(&name);
    assert_eq!(json["ended"]["timeout"], 1, "{json}");
    resume(&[&second]);
}

#[test]
fn a_host_frozen_whole_ends_none_of_its_sessions_that_beat_after_the_thaw() {
    let (name, _guard) = created("frozen-sessions", &["--timeout", "1s", "--grace", "2s"]);
    let unix = format!("unix:/tmp/{name}.sock");
    let reaper = Background::spawn(&["reap", &name, "--listen", &unix, "--log-level", "debug"]);
    wait_until("the listener", || {
        std::path::Path::new(&format!("/tmp/{name}.sock")).exists()
    });
    let first = Background::spawn(&["run", &unix, "--instance", "1", "--", "sleep", "600"]);
    let second = Background::spawn(&["run", &unix, "--instance", "2", "--", "sleep", "600"]);
    wait_until("both sessions", || {
        status_json(&name)["tracked_instances"] == 2
    });
    for clients_later in [Duration::from_millis(50), Duration::ZERO] {
        stop(&[&reaper, &first, &second]);
        std::thread::sleep(3 * T);
        resume(&[&reaper]);
        std::thread::sleep(clients_later);
        resume(&[&first, &second]);
        std::thread::sleep(2 * T);
        let json = status_json(&name);
        if json["ended_total"] != 0 || json["tracked_instances"] != 2 {
            reaper.signal(libc::SIGTERM);
            let log = stderr(&reaper.finish());
            panic!("clients resumed {clients_later:?} after the reaper: {json}\nthe reaper's log:\n{log}");
        }
    }
}
