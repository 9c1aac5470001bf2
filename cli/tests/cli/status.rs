//! `livereg status`: the table as text, JSON, a live view and OpenMetrics, and the tables it cannot read.

use super::*;

#[test]
fn status_shows_registrations_as_a_table_and_as_json() {
    let (name, _guard) = created("status", &["--timeout", "5s"]);
    let _worker = Background::spawn(&["worker", &name, "--instance", "42", "--label", "gpu42"]);
    wait_until("the worker to register", || {
        status_json(&name)["tracked_instances"] == 1
    });
    let human = stdout(&livereg(&["status", &name]));
    assert!(
        human.contains(&format!("table '{name}': 1/256 slots live")),
        "{human}"
    );
    assert!(
        human.contains("SLOT") && human.contains("LAST BEAT") && human.contains("gpu42"),
        "{human}"
    );
    assert!(human.contains("NONE ALIVE"), "no reaper yet: {human}");
    assert!(human.contains("last scan never"), "an absent fact: {human}");
    let json = status_json(&name);
    assert!(
        json["reaper_heartbeat_age_seconds"].is_null(),
        "no reaper ever ran: {}",
        json["reaper_heartbeat_age_seconds"]
    );
    for key in [
        "enabled",
        "reap_timeout_seconds",
        "registration_grace_seconds",
        "tracked_instances",
        "capacity",
        "reaper_alive",
        "boot_token",
        "ended",
        "registrations",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    let registration = &json["registrations"][0];
    for key in [
        "instance_id",
        "label",
        "pid",
        "slot",
        "last_heartbeat_age_seconds",
    ] {
        assert!(
            registration.get(key).is_some(),
            "missing registrations[].{key}"
        );
    }
    assert_eq!(registration["instance_id"], 42);
    assert_eq!(json["reap_timeout_seconds"], 5.0);
}

#[test]
fn status_of_missing_corrupted_and_truncated_tables_fails_cleanly() {
    fails_with(
        &livereg(&["status", &unique_name("missing")]),
        "no such table",
    );
    let (name, _guard) = created("garbage", &[]);
    let path = format!("/dev/shm/{name}");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(b"GARBAGE!");
    std::fs::write(&path, &bytes).unwrap();
    fails_with(&livereg(&["status", &name]), "not a livereg table");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(10)
        .unwrap();
    fails_with(&livereg(&["status", &name]), "truncated");
}

#[test]
fn status_watch_redraws_in_a_terminal_and_marks_what_ended_since_the_last_frame() {
    let (name, _guard) = created("watch", &["--timeout", "400ms", "--grace", "800ms"]);
    let _reaper = Background::spawn(&["reap", &name]);
    wait_until("the reaper", || reaper_alive(&name));
    let worker = Background::spawn(&["worker", &name, "--instance", "4", "--label", "gpu4"]);
    wait_until("the worker", || {
        status_json(&name)["tracked_instances"] == 1
    });
    // `script` gives the watcher a pseudo-terminal, as an operator's.
    let command = format!(
        "{} status {name} --watch 100ms",
        env!("CARGO_BIN_EXE_livereg")
    );
    let watcher = Command::new("script")
        .args(["-qfc", &command, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs the watcher in a pty");
    let watcher = Background(watcher);
    std::thread::sleep(Duration::from_millis(400));
    worker.signal(libc::SIGKILL);
    wait_until("the drop", || status_json(&name)["tracked_instances"] == 0);
    std::thread::sleep(Duration::from_millis(400));
    watcher.signal(libc::SIGTERM);
    let output = watcher.finish();
    let screen = stdout(&output);
    let frames = screen.matches("\u{1b}[H\u{1b}[2J").count();
    assert!(frames >= 2, "{frames} frames: {screen}");
    assert!(screen.contains("every 100ms"), "{screen}");
    assert!(
        screen.contains("ENDED  instance 4 (gpu4, pid"),
        "the ending is marked: {screen}"
    );
    assert!(screen.contains("process_exited +1"), "{screen}");
}

#[test]
fn status_renders_openmetrics_and_reap_serves_it_over_http() {
    let (name, _guard) = created("metrics", &["--timeout", "400ms", "--grace", "800ms"]);
    let text = stdout(&livereg(&["status", &name, "--format", "openmetrics"]));
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains(&format!("livereg_reaper_up{{table=\"{name}\"}} 0\n")),
        "{text}"
    );

    let mut reaper = Background::spawn(&["reap", &name, "--metrics-addr", "127.0.0.1:0"]);
    let address = served_address(&mut reaper);
    let get = |path: &str| http_get(&address, path);
    wait_until("the reaper", || reaper_alive(&name));
    let response = get("/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{response}"
    );
    assert!(
        response.contains(&format!("livereg_reaper_up{{table=\"{name}\"}} 1\r\n"))
            || response.contains(&format!("livereg_reaper_up{{table=\"{name}\"}} 1\n")),
        "{response}"
    );
    assert!(response.ends_with("# EOF\n"), "{response}");
    assert!(get("/nothing").starts_with("HTTP/1.1 404"));

    // The port is taken: one clear line, exit 1.
    fails_with(
        &livereg(&["reap", &name, "--metrics-addr", &address]),
        &format!("cannot serve metrics on {address}"),
    );
    reaper.signal(libc::SIGTERM);
    assert_eq!(reaper.finish().status.code(), Some(0));
}
