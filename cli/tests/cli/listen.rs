//! `livereg reap --listen`: isolated workers through a listener, a standby taking the listener over, the token file.

use super::*;

/// `livereg worker ADDRESS` in its own container (mount namespace with a
/// private /dev/shm, PID and IPC namespaces), once it says it registered.
fn isolated_worker(address: &str, instance: &str, token_file: Option<&str>) -> std::process::Child {
    let mut command = contained(env!("CARGO_BIN_EXE_livereg"), false);
    command
        .args([
            "worker",
            address,
            "--instance",
            instance,
            "--interval",
            "20ms",
        ])
        .stdout(Stdio::piped());
    if let Some(file) = token_file {
        command.args(["--token-file", file]);
    }
    let mut child = command.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("registered"), "{line}");
    child
}

#[test]
fn a_standby_takes_over_the_listener_and_its_sessions_within_the_timeout() {
    let (name, _guard) = created("standby-listen", &["--timeout", "2s", "--grace", "4s"]);
    let socket = format!("/tmp/{name}.sock");
    let unix = format!("unix:{socket}");
    let hook_log = std::env::temp_dir().join(format!("{name}.hook"));
    let hook = format!(
        "echo \"$LIVEREG_INSTANCE_ID $LIVEREG_REASON\" >> {}",
        hook_log.display()
    );
    let reaper = |standby: bool| {
        let mut args = vec!["reap", &name, "--on-drop", &hook, "--listen", &unix];
        if standby {
            args.push("--standby");
        }
        Background::spawn(&args)
    };
    let first = reaper(false);
    wait_until("the first reaper", || reaper_alive(&name));
    let token = stdout(&livereg(&["probe", &name]));
    let _standby = reaper(true);
    let mut worker = isolated_worker(&unix, "1", None);

    first.signal(libc::SIGKILL);
    drop(first);
    wait_until("the standby to take over", || {
        let now = livereg(&["probe", &name]);
        now.status.success() && stdout(&now) != token
    });
    wait_until("the session reclaimed", || {
        status_json(&name)["registrations"][0]["remote"]["connected"] == true
    });
    std::thread::sleep(Duration::from_secs(3)); // past the 2 s timeout
    assert!(
        !hook_log.exists(),
        "a hook ran: {:?}",
        std::fs::read_to_string(&hook_log)
    );
    assert_eq!(status_json(&name)["tracked_instances"], 1);
    assert_eq!(
        worker.try_wait().unwrap(),
        None,
        "the worker heard an eviction"
    );

    worker.kill().unwrap();
    let _ = worker.wait();
    wait_until("the hook", || {
        std::fs::read_to_string(&hook_log).is_ok_and(|log| log.contains("1 disconnected"))
    });
    let _ = std::fs::remove_file(&hook_log);
}

/// `reap --listen`: workers that cannot map the table (`worker ADDRESS`, in
/// a container of their own: private /dev/shm, own PID and IPC namespaces)
/// register over a Unix socket and a token-guarded TCP port; status shows
/// their sessions; the daemon SIGKILLed and restarted within the timeout
/// loses none of them (no hook runs, their pings go on), and a worker
/// killed meanwhile is dropped `disconnected`.
#[test]
fn reap_listen_serves_isolated_workers_and_a_restart_within_the_timeout_loses_none() {
    let (name, _guard) = created("listen", &["--timeout", "2s", "--grace", "4s"]);
    let socket = format!("/tmp/{name}.sock");
    let token_file = std::env::temp_dir().join(format!("{name}.token"));
    write_secret(&token_file, "s3cret\n");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (unix, tcp) = (format!("unix:{socket}"), format!("tcp://127.0.0.1:{port}"));
    let hook_log = std::env::temp_dir().join(format!("{name}.hook"));
    let hook = format!(
        "echo \"$LIVEREG_INSTANCE_ID $LIVEREG_REASON\" >> {}",
        hook_log.display()
    );
    let token = token_file.to_str().unwrap();
    let daemon = |name: &str| {
        Background::spawn(&[
            "reap",
            name,
            "--on-drop",
            &hook,
            "--listen",
            &unix,
            "--listen",
            &tcp,
            "--token-file",
            token,
        ])
    };
    let no_token = livereg(&["reap", &name, "--listen", &tcp]);
    fails_with(&no_token, "needs a token");
    let first = daemon(&name);
    wait_until("the reaper", || reaper_alive(&name));
    let mut over_unix = isolated_worker(&unix, "1", Some(token));
    let mut over_tcp = isolated_worker(&tcp, "2", Some(token));
    let shown = stdout(&livereg(&["status", &name]));
    assert!(shown.contains("session from unix pid="), "{shown}");
    assert!(shown.contains("session from tcp 127.0.0.1:"), "{shown}");
    assert_eq!(
        status_json(&name)["registrations"][0]["exit_detection"],
        "connection"
    );

    first.signal(libc::SIGKILL);
    drop(first);
    std::thread::sleep(Duration::from_millis(500));
    let away = stdout(&livereg(&["status", &name]));
    assert_eq!(away.matches("away: reclaim pending").count(), 2, "{away}");
    let _second = daemon(&name);
    wait_until("the restarted reaper", || reaper_alive(&name));
    wait_until("both sessions reclaimed", || {
        let rows = status_json(&name)["registrations"].clone();
        (0..2).all(|i| rows[i]["remote"]["connected"] == true)
    });
    std::thread::sleep(Duration::from_secs(3)); // past the 2 s timeout
    assert!(
        !hook_log.exists(),
        "a hook ran: {:?}",
        std::fs::read_to_string(&hook_log)
    );
    assert_eq!(status_json(&name)["tracked_instances"], 2);
    assert_eq!(
        over_unix.try_wait().unwrap(),
        None,
        "the worker heard an eviction"
    );
    assert_eq!(
        over_tcp.try_wait().unwrap(),
        None,
        "the worker heard an eviction"
    );

    over_unix.kill().unwrap();
    wait_until("the hook", || {
        std::fs::read_to_string(&hook_log).is_ok_and(|log| log.contains("1 disconnected"))
    });
    over_tcp.kill().unwrap();
    let _ = (over_unix.wait(), over_tcp.wait());
    // `run` over an address: registers, passes the exit code on, deregisters.
    let ran = livereg(&[
        "run",
        &unix,
        "--instance",
        "5",
        "--token-file",
        token,
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(ran.status.code(), Some(3), "{}", stderr(&ran));
    wait_until("run's deregistration", || {
        std::fs::read_to_string(&hook_log).is_ok_and(|log| log.contains("5 deregistered"))
    });

    // `clear` over an address: the clear handlers run; with `--reset`,
    // every registration ends `cleared` first. A wrong token clears nothing.
    let completed = || status_json(&name)["clears_completed"].as_u64().unwrap();
    let before = completed();
    let wrong = std::env::temp_dir().join(format!("{name}.wrong"));
    write_secret(&wrong, "guess\n");
    let refused = livereg(&["clear", &tcp, "--token-file", wrong.to_str().unwrap()]);
    fails_with(&refused, "token");
    let _ = std::fs::remove_file(&wrong);
    let cleared = livereg(&["clear", &tcp, "--token-file", token]);
    assert!(cleared.status.success(), "{}", stderr(&cleared));
    assert_eq!(
        stdout(&cleared).trim(),
        format!("cleared table '{name}': the clear handlers ran, registrations untouched")
    );
    assert_eq!(completed(), before + 1);
    let mut held = isolated_worker(&unix, "6", Some(token));
    let reset = livereg(&[
        "clear",
        &unix,
        "--reset",
        "--wait",
        "10s",
        "--token-file",
        token,
    ]);
    assert!(reset.status.success(), "{}", stderr(&reset));
    assert_eq!(
        stdout(&reset).trim(),
        format!("reset table '{name}': 1 registrations ended, then the clear handlers ran")
    );
    wait_until("the reset's hook", || {
        std::fs::read_to_string(&hook_log).is_ok_and(|log| log.contains("6 cleared"))
    });
    let _ = held.kill();
    let _ = held.wait();
    let _ = std::fs::remove_file(&hook_log);
    let _ = std::fs::remove_file(&token_file);
}

/// Writes a token file only its owner can read (a file others can read is
/// refused).
fn write_secret(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A token file everyone may read is no secret: the daemon refuses to
/// start on it and says which mode it found and which it expects.
#[test]
fn reap_refuses_a_token_file_others_can_read_naming_its_mode() {
    let (name, _guard) = created("token-mode", &["--timeout", "2s"]);
    let token_file = std::env::temp_dir().join(format!("{name}.token"));
    write_secret(&token_file, "s3cret\n");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let refused = livereg(&[
        "reap",
        &name,
        "--listen",
        "tcp://127.0.0.1:0",
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&token_file);
    fails_with(&refused, "readable by everyone (mode 0644)");
}

/// Plants `NAME.sessions` as uid 65534's: a symbolic link (to a file of
/// root's) or a regular file of theirs.
fn plant_foreign_sessions_file(name: &str, plant: &str) -> std::path::PathBuf {
    let beside = std::path::PathBuf::from(format!("/dev/shm/{name}.sessions"));
    match plant {
        "link" => {
            std::os::unix::fs::symlink("/etc/hostname", &beside).unwrap();
            std::os::unix::fs::lchown(&beside, Some(65534), Some(65534)).unwrap();
        }
        _ => {
            std::fs::write(&beside, b"").unwrap();
            std::os::unix::fs::chown(&beside, Some(65534), Some(65534)).unwrap();
        }
    }
    beside
}

/// Starts `reap --listen` with `NAME.sessions` planted by uid 65534 as
/// `plant`: it exits 1 with one line that names the file, says it `is`
/// what was planted, and what to do; the planted file is left alone.
fn listener_refuses_planted(plant: &str, is: &str) {
    let (name, _guard) = created(&format!("planted-sessions-{plant}"), &["--timeout", "2s"]);
    let beside = plant_foreign_sessions_file(&name, plant);
    let socket = format!("unix:/tmp/{name}.sock");
    let refused = livereg(&["reap", &name, "--listen", &socket]);
    let kept_planted = std::fs::symlink_metadata(&beside).is_ok();
    let _ = std::fs::remove_file(&beside);
    let _ = std::fs::remove_file(format!("/tmp/{name}.sock"));
    let path = beside.display().to_string();
    fails_with(&refused, &format!("{path} {is}"));
    fails_with(
        &refused,
        &format!(
            "remove it (it is not the table's) as uid 65534 or root: rm '{path}', and start again"
        ),
    );
    assert!(kept_planted, "{plant}: the planted file was removed");
}

#[test]
fn reap_listen_refuses_a_sessions_link_another_user_planted_naming_it_its_owner_and_what_to_do() {
    listener_refuses_planted(
        "link",
        "is a symbolic link owned by uid 65534 (to /etc/hostname), expected a regular file of uid 0",
    );
}

#[test]
fn reap_listen_refuses_a_sessions_file_of_another_user_naming_it_its_owner_and_what_to_do() {
    listener_refuses_planted(
        "file",
        "is a regular file owned by uid 65534, expected uid 0",
    );
}
