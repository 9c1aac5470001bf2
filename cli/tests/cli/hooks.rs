//! `livereg reap --on-drop`: hooks that fail, hang, are interrupted, and an id that waits for its hook.

use super::*;

#[test]
fn slow_failing_hooks_hold_their_slots_count_as_failures_and_never_stall_scans() {
    let (name, _guard) = created("slow-hook", &["--timeout", "400ms", "--grace", "800ms"]);
    let hook_log = std::env::temp_dir().join(format!("{name}.hook"));
    let hook = format!(
        "echo \"$LIVEREG_INSTANCE_ID\" >> {}; sleep 1; exit 3",
        hook_log.display()
    );
    let _reaper = Background::spawn(&["reap", &name, "--on-drop", &hook]);
    wait_until("the reaper", || reaper_alive(&name));
    let workers: Vec<Background> = (1..=3)
        .map(|id| Background::spawn(&["worker", &name, "--instance", &id.to_string()]))
        .collect();
    wait_until("the workers", || {
        status_json(&name)["tracked_instances"] == 3
    });
    let killed = Instant::now();
    for worker in &workers {
        worker.signal(libc::SIGKILL);
    }
    // Three hooks take three seconds; the reaper ends all three long before.
    wait_until("all three ended", || {
        status_json(&name)["tracked_instances"] == 0
    });
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "scans waited for the hooks: {:?}",
        killed.elapsed()
    );
    // Their slots are freed only as their hooks exit, each a failure (exit 3).
    let json = status_json(&name);
    assert!(json["ended_total"].as_u64().unwrap() < 3, "{json}");
    wait_until("every hook ran", || status_json(&name)["ended_total"] == 3);
    assert_eq!(status_json(&name)["handler_failures"], 3);
    let mut ids: Vec<String> = std::fs::read_to_string(&hook_log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    ids.sort();
    let _ = std::fs::remove_file(&hook_log);
    assert_eq!(ids, ["1", "2", "3"]);
}

#[test]
fn an_id_comes_back_only_after_its_hook_ran() {
    let (name, _guard) = created("hook-id", &["--timeout", "400ms", "--grace", "800ms"]);
    let done = std::env::temp_dir().join(format!("{name}.done"));
    let hook = format!("sleep 0.5; touch {}", done.display());
    let _reaper = Background::spawn(&["reap", &name, "--on-drop", &hook]);
    wait_until("the reaper", || reaper_alive(&name));
    let first = Background::spawn(&["worker", &name, "--instance", "5"]);
    wait_until("the worker", || {
        status_json(&name)["tracked_instances"] == 1
    });
    first.signal(libc::SIGKILL);
    wait_until("its ending", || {
        status_json(&name)["tracked_instances"] == 0
    });
    let mut second = Background::spawn(&["worker", &name, "--instance", "5"]);
    let mut lines = BufReader::new(second.0.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("registered"));
    assert!(
        done.exists(),
        "registered again before the hook of its previous registration ran"
    );
    let _ = std::fs::remove_file(&done);
}

#[test]
fn a_hook_interrupted_by_a_killed_daemon_runs_again_under_the_next() {
    let (name, _guard) = created("hook-again", &["--timeout", "400ms", "--grace", "800ms"]);
    let hook_log = std::env::temp_dir().join(format!("{name}.hook"));
    let hook = format!(
        "echo \"start $LIVEREG_INSTANCE_ID\" >> {0}; sleep 1; echo \"end $LIVEREG_INSTANCE_ID\" >> {0}",
        hook_log.display()
    );
    let first = Background::spawn(&["reap", &name, "--on-drop", &hook]);
    wait_until("the reaper", || reaper_alive(&name));
    let worker = Background::spawn(&["worker", &name, "--instance", "7"]);
    wait_until("the worker", || {
        status_json(&name)["tracked_instances"] == 1
    });
    worker.signal(libc::SIGKILL);
    let starts = || {
        std::fs::read_to_string(&hook_log)
            .map(|log| log.matches("start 7").count())
            .unwrap_or(0)
    };
    wait_until("the hook to start", || starts() == 1);
    first.signal(libc::SIGKILL);
    drop(first);
    let _second = Background::spawn(&["reap", &name, "--on-drop", &hook]);
    wait_until("the drop to run again", || starts() == 2);
    wait_until("the slot freed after it", || {
        status_json(&name)["ended_total"] == 1
    });
    let _ = std::fs::remove_file(&hook_log);
}

#[test]
fn a_hook_past_its_timeout_is_killed_with_its_group_and_counted() {
    let (name, _guard) = created("hook-timeout", &["--timeout", "400ms", "--grace", "800ms"]);
    let pid_file = std::env::temp_dir().join(format!("{name}.pid"));
    let hook = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
    let _reaper =
        Background::spawn(&["reap", &name, "--on-drop", &hook, "--hook-timeout", "300ms"]);
    wait_until("the reaper", || reaper_alive(&name));
    let worker = Background::spawn(&["worker", &name, "--instance", "6"]);
    wait_until("the worker", || {
        status_json(&name)["tracked_instances"] == 1
    });
    worker.signal(libc::SIGKILL);
    wait_until("the drop", || status_json(&name)["ended_total"] == 1);
    assert_eq!(status_json(&name)["handler_failures"], 1);
    let sleeper: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = std::fs::remove_file(&pid_file);
    wait_until("the hook's child killed with its group", || gone(sleeper));
}
