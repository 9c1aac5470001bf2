//! `livereg reap`: its log, its exit codes, systemd notification, health and the etcd options of a build without them.

use super::*;

#[test]
fn reap_logs_runs_the_hook_refuses_a_second_reaper_and_stops_on_sigterm() {
    let (name, _guard) = created("reap", &["--timeout", "400ms", "--grace", "800ms"]);
    let hook_log = std::env::temp_dir().join(format!("{name}.hook"));
    let hook = format!(
        "echo \"$LIVEREG_INSTANCE_ID $LIVEREG_REASON $LIVEREG_PID $LIVEREG_LABEL $LIVEREG_SLOT\" >> {}",
        hook_log.display()
    );
    let reaper = Background::spawn(&["reap", &name, "--on-drop", &hook]);
    wait_until("the reaper", || reaper_alive(&name));
    fails_with(&livereg(&["reap", &name]), "another reaper");

    let worker = Background::spawn(&["worker", &name, "--instance", "9", "--label", "gpu9"]);
    wait_until("the worker", || {
        status_json(&name)["tracked_instances"] == 1
    });
    let pid = worker.0.id();
    worker.signal(libc::SIGKILL);
    wait_until("the hook", || {
        std::fs::read_to_string(&hook_log).is_ok_and(|s| s.ends_with('\n'))
    });
    let line = std::fs::read_to_string(&hook_log).unwrap();
    let _ = std::fs::remove_file(&hook_log);
    assert_eq!(line.trim(), format!("9 process_exited {pid} gpu9 0"));

    reaper.signal(libc::SIGTERM);
    let output = reaper.finish();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let log = stderr(&output);
    assert!(
        log.contains("instance 9 (gpu9") && log.contains("process_exited"),
        "{log}"
    );
    assert!(!reaper_alive(&name));
}

#[test]
fn reap_keeps_reaping_after_its_log_reader_goes_away() {
    let (name, _guard) = created("epipe", &["--timeout", "400ms", "--grace", "800ms"]);
    let mut reaper = Background::spawn(&["reap", &name, "--on-drop", "exit 3"]);
    wait_until("the reaper", || reaper_alive(&name));
    // Every drop is logged, and every hook fails and is logged: into a pipe
    // nobody reads any more (EPIPE).
    drop(reaper.0.stderr.take());
    for (id, ended) in [("1", 1), ("2", 2)] {
        let worker = Background::spawn(&["worker", &name, "--instance", id]);
        wait_until("the worker", || {
            status_json(&name)["tracked_instances"] == 1
        });
        worker.signal(libc::SIGKILL);
        wait_until("its drop", || status_json(&name)["ended_total"] == ended);
    }
    assert!(reaper_alive(&name));
    assert_eq!(reaper.0.try_wait().unwrap(), None, "the daemon is still up");
}

#[test]
fn reap_exits_1_naming_the_cause_when_its_table_is_truncated() {
    // The size is checked before every read; a truncation landing between a
    // check and the reads after it (a thread preempted right there, on a
    // loaded machine) still faults the reader: the documented window. So an
    // attempt that died of SIGBUS is tried again; one that exits must exit 1
    // naming the cause, and one of five must.
    for attempt in 1..=5 {
        let (name, _guard) = created("truncated", &["--timeout", "2s", "--grace", "4s"]);
        let mut reaper = Background::spawn(&["reap", &name]);
        let mut log = BufReader::new(reaper.0.stderr.take().unwrap()).lines();
        assert!(log.next().unwrap().unwrap().contains("reaping"));
        // Between two scans (every 500 ms here), not during the first,
        // which starts as the line is printed.
        std::thread::sleep(Duration::from_millis(150));
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/shm/{name}"))
            .unwrap()
            .set_len(0)
            .unwrap();
        let output = reaper.finish();
        let rest: Vec<String> = log.map_while(Result::ok).collect();
        if output.status.signal() == Some(libc::SIGBUS) {
            eprintln!("attempt {attempt}: the truncation hit the documented window (SIGBUS)");
            continue;
        }
        assert_eq!(
            output.status.code(),
            Some(1),
            "{:?} {rest:?}",
            output.status
        );
        let last = rest.last().cloned().unwrap_or_default();
        assert!(
            last.contains("shrank to 0 bytes") && last.contains("truncated"),
            "{last}"
        );
        return;
    }
    panic!("five truncations in a row hit the window");
}

#[test]
fn reap_logs_each_ending_through_the_installed_logger_as_text_or_json() {
    let (name, _guard) = created("logfmt", &["--timeout", "400ms", "--grace", "800ms"]);
    for (format, level) in [("json", "info"), ("text", "warn")] {
        let reaper =
            Background::spawn(&["reap", &name, "--log-format", format, "--log-level", level]);
        wait_until("the reaper", || reaper_alive(&name));
        let worker = Background::spawn(&["worker", &name, "--instance", "12", "--label", "gpu12"]);
        wait_until("the worker", || {
            status_json(&name)["tracked_instances"] == 1
        });
        worker.signal(libc::SIGKILL);
        wait_until("its drop", || status_json(&name)["tracked_instances"] == 0);
        reaper.signal(libc::SIGTERM);
        let log = stderr(&reaper.finish());
        if format == "json" {
            let records: Vec<serde_json::Value> = log
                .lines()
                .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
                .collect();
            let ended: Vec<_> = records
                .iter()
                .filter(|r| {
                    r["message"]
                        .as_str()
                        .unwrap()
                        .contains("instance 12 (gpu12")
                })
                .collect();
            assert_eq!(ended.len(), 1, "logged once: {log}");
            assert_eq!(ended[0]["level"], "INFO");
            let message = ended[0]["message"].as_str().unwrap();
            assert!(
                message.contains("process_exited") && message.contains("silent"),
                "{message}"
            );
            assert!(ended[0]["ts"].as_f64().unwrap() > 1.7e9);
        } else {
            // At warn, an ending (info) is not shown.
            assert!(!log.contains("instance 12"), "{log}");
        }
    }
}

/// Every datagram that arrives on `socket` within `wait`.
fn datagrams(socket: &std::os::unix::net::UnixDatagram, wait: Duration) -> Vec<String> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buffer = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match socket.recv(&mut buffer) {
            Ok(n) => got.push(String::from_utf8_lossy(&buffer[..n]).into_owned()),
            Err(_) => break,
        }
    }
    got
}

/// The first datagram to arrive on `socket` within `wait`.
fn first_datagram(socket: &std::os::unix::net::UnixDatagram, wait: Duration) -> Option<String> {
    socket.set_read_timeout(Some(wait)).unwrap();
    let mut buffer = [0u8; 4096];
    let n = socket.recv(&mut buffer).ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

#[test]
fn reap_notify_tells_systemd_ready_watchdog_and_stopping_and_a_hung_reaper_goes_silent() {
    // Scans every 100 ms.
    let (name, _guard) = created("notify", &["--timeout", "400ms", "--grace", "800ms"]);
    let dir = std::env::temp_dir().join(format!("{name}.notify"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let reaper = Background(
        Command::new(env!("CARGO_BIN_EXE_livereg"))
            .args(["reap", &name, "--notify"])
            .env("NOTIFY_SOCKET", &path)
            .env("WATCHDOG_USEC", "2000000")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The first datagram comes after the reaper's start and first scan,
    // however slow a loaded machine makes them; then a second of scans.
    let mut first: Vec<String> = first_datagram(&socket, Duration::from_secs(20))
        .into_iter()
        .collect();
    assert!(!first.is_empty(), "nothing arrived");
    // Then scans, one datagram each: five of them, however long a loaded
    // machine takes (about half a second idle).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while first.iter().filter(|d| d.contains("WATCHDOG=1")).count() < 5
        && std::time::Instant::now() < deadline
    {
        first.extend(datagrams(&socket, Duration::from_millis(200)));
    }
    assert!(first[0].lines().any(|l| l == "READY=1"), "{first:?}");
    assert!(
        first[0].lines().any(|l| l.starts_with("STATUS=0/256 live")),
        "{first:?}"
    );
    let watchdogs = first
        .iter()
        .filter(|d| d.lines().any(|l| l == "WATCHDOG=1"))
        .count();
    assert!(watchdogs >= 5, "a WATCHDOG=1 per scan: {first:?}");
    assert_eq!(
        first.iter().filter(|d| d.contains("READY=1")).count(),
        1,
        "READY once"
    );

    // A hung reaper (stopped) sends nothing, so systemd's watchdog fires.
    reaper.signal(libc::SIGSTOP);
    let _ = datagrams(&socket, Duration::from_millis(100)); // in flight
    assert_eq!(
        datagrams(&socket, Duration::from_millis(700)),
        Vec::<String>::new()
    );
    reaper.signal(libc::SIGCONT);
    let resumed = first_datagram(&socket, Duration::from_secs(10));
    assert!(
        resumed.as_ref().is_some_and(|d| d.contains("WATCHDOG=1")),
        "{resumed:?}"
    );

    reaper.signal(libc::SIGTERM);
    let output = reaper.finish();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let last = datagrams(&socket, Duration::from_millis(200));
    assert!(last.iter().any(|d| d == "STOPPING=1"), "{last:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn healthz_is_200_while_reaping_and_503_with_the_reason_while_standing_by() {
    let (name, _guard) = created("healthz", &["--timeout", "400ms", "--grace", "800ms"]);
    // A port alone: loopback.
    let mut active = Background::spawn(&["reap", &name, "--metrics-addr", "0"]);
    let at_active = served_address(&mut active);
    assert!(at_active.starts_with("127.0.0.1:"), "{at_active}");
    wait_until("the reaper", || reaper_alive(&name));
    wait_until("a scan", || status_json(&name)["scans"].as_u64() > Some(0));
    let healthy = http_get(&at_active, "/healthz");
    assert!(healthy.starts_with("HTTP/1.1 200"), "{healthy}");
    assert!(
        healthy.contains(&format!("ok: reaping table '{name}'")),
        "{healthy}"
    );

    let mut standby = Background::spawn(&["reap", &name, "--standby", "--metrics-addr", "0"]);
    let at_standby = served_address(&mut standby);
    let waiting = http_get(&at_standby, "/healthz");
    assert!(waiting.starts_with("HTTP/1.1 503"), "{waiting}");
    assert!(waiting.contains("standing by: another reaper"), "{waiting}");

    active.signal(libc::SIGKILL);
    wait_until("the standby to take over and report healthy", || {
        http_get(&at_standby, "/healthz").starts_with("HTTP/1.1 200")
    });
    standby.signal(libc::SIGTERM);
}

#[cfg(not(feature = "etcd"))]
#[test]
fn a_build_without_etcd_refuses_its_options_in_one_line_saying_how_to_build_them_in() {
    let (name, _table) = created("no-etcd", &[]);
    for args in [
        &["reap", name.as_str(), "--etcd", "127.0.0.1:2379"][..],
        &["status", "--cluster", "--etcd", "127.0.0.1:2379"][..],
    ] {
        let output = livereg(args);
        fails_with(&output, "built without etcd support");
        fails_with(&output, "--features etcd");
    }
    // Nothing was started: the table has no reaper.
    assert!(!reaper_alive(&name));
}

#[test]
fn reap_progress_timeout_judges_a_table_made_without_one_and_shows_it_in_status() {
    let (name, _guard) = created("reap-progress", &["--timeout", "400ms", "--grace", "800ms"]);
    assert_eq!(status_json(&name)["progress_timeout_seconds"], 0.0);
    let refused = livereg(&["reap", &name, "--progress-timeout", "50ms"]);
    fails_with(&refused, "below one scan interval");
    let _reaper = Background::spawn(&["reap", &name, "--progress-timeout", "400ms"]);
    wait_until("the reaper", || reaper_alive(&name));
    assert_eq!(status_json(&name)["progress_timeout_seconds"], 0.4);
    let file = std::env::temp_dir().join(format!("{name}.progress"));
    std::fs::write(&file, "busy").unwrap();
    let _run = Background::spawn(&[
        "run",
        &name,
        "--instance",
        "13",
        "--progress-file",
        file.to_str().unwrap(),
        "--",
        "sleep",
        "30",
    ]);
    wait_until("the stall", || status_json(&name)["ended"]["stalled"] == 1);
    // The operator's view: the table's progress timeout and what ended.
    let text = stdout(&livereg(&["status", &name]));
    assert!(
        text.contains("progress timeout 400ms") && text.contains("stalled 1"),
        "{text}"
    );
    let _ = std::fs::remove_file(&file);
}
