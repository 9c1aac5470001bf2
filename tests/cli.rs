//! The `livereg` command, run as a real binary: every subcommand and exit code.

mod common;
#[path = "common/container.rs"]
mod container;

use common::{unique_name, UnlinkOnDrop};
use container::contained;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn livereg(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_livereg"))
        .args(args)
        .output()
        .expect("run livereg")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts a failure with exit 1 and one line on stderr containing `says`.
fn fails_with(output: &Output, says: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains(says), "expected '{says}' in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
}

/// A created table, removed on drop.
fn created(tag: &str, extra: &[&str]) -> (String, UnlinkOnDrop) {
    let name = unique_name(tag);
    let output = livereg(&[&["create", &name][..], extra].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    (name.clone(), UnlinkOnDrop(name))
}

/// A background `livereg` process, killed on drop.
struct Background(Child);

impl Background {
    fn spawn(args: &[&str]) -> Background {
        Background(
            Command::new(env!("CARGO_BIN_EXE_livereg"))
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    fn signal(&self, signal: i32) {
        // SAFETY:
        // - `kill` has no memory effects; the child is not yet waited for.
        unsafe { libc::kill(self.0.id() as libc::pid_t, signal) };
    }

    /// Waits for exit and returns the output.
    fn finish(mut self) -> Output {
        let child = std::mem::replace(&mut self.0, Command::new("true").spawn().unwrap());
        child.wait_with_output().unwrap()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn reaper_alive(name: &str) -> bool {
    livereg(&["probe", name]).status.success()
}

fn status_json(name: &str) -> serde_json::Value {
    let output = livereg(&["status", name, "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn create_refuses_an_existing_table_a_bad_name_and_a_short_grace() {
    let (name, _guard) = created(
        "create",
        &[
            "--capacity",
            "4",
            "--timeout",
            "2s",
            "--grace",
            "5s",
            "--mode",
            "640",
        ],
    );
    let mode = std::fs::metadata(format!("/dev/shm/{name}")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o640
    );
    fails_with(&livereg(&["create", &name]), &format!("table '{name}'"));
    fails_with(&livereg(&["create", "bad name"]), "contains ' '");
    let other = unique_name("short-grace");
    fails_with(
        &livereg(&["create", &other, "--timeout", "5s", "--grace", "1s"]),
        "grace >= timeout",
    );
    assert_eq!(
        livereg(&["create", &other, "--timeout", "soon"])
            .status
            .code(),
        Some(2),
        "usage error"
    );
    assert_eq!(livereg(&["frobnicate"]).status.code(), Some(2));
}

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

#[test]
fn probe_clear_and_rm() {
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

#[test]
fn a_standby_reaper_costs_the_active_one_no_scans() {
    let (name, _guard) = created("standby-cost", &["--timeout", "2s"]);
    let _active = Background::spawn(&["reap", &name]);
    wait_until("the reaper", || reaper_alive(&name));
    let scans_in = |window: Duration| {
        let before = status_json(&name)["scans"].as_u64().unwrap();
        std::thread::sleep(window);
        status_json(&name)["scans"].as_u64().unwrap() - before
    };
    let alone = scans_in(Duration::from_secs(2));
    let _standby = Background::spawn(&["reap", &name, "--standby"]);
    std::thread::sleep(Duration::from_millis(300)); // it is polling by now
    let beside_a_standby = scans_in(Duration::from_secs(2));
    // Every 500 ms alone: 4 or 5 scans (and one for each status read). A
    // standby polling every 100 ms used to add one per poll (~20).
    assert!(
        beside_a_standby <= alone + 2,
        "{beside_a_standby} scans beside a standby, {alone} alone"
    );
}

#[test]
fn standby_reaper_takes_over_when_the_first_dies() {
    let (name, _guard) = created("standby", &["--timeout", "400ms", "--grace", "800ms"]);
    let first = Background::spawn(&["reap", &name]);
    wait_until("the first reaper", || reaper_alive(&name));
    let token = stdout(&livereg(&["probe", &name]));
    let _second = Background::spawn(&["reap", &name, "--standby"]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        stdout(&livereg(&["probe", &name])),
        token,
        "the first reaper still holds it"
    );
    first.signal(libc::SIGKILL);
    wait_until("the standby to take over", || {
        let now = livereg(&["probe", &name]);
        now.status.success() && stdout(&now) != token
    });
}

#[test]
fn run_passes_the_exit_code_on_and_deregisters() {
    let (name, _guard) = created("run-exit", &["--timeout", "2s"]);
    let output = livereg(&["run", &name, "--instance", "5", "--", "sh", "-c", "exit 7"]);
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    let json = status_json(&name);
    assert_eq!(json["tracked_instances"], 0);
    assert_eq!(
        json["registrations"][0]["ended_reason"], "deregistered",
        "{json}"
    );
}

/// A program for `livereg run` that reports each terminating signal it
/// receives, as `NAME SENDER_PID`, and exits 0 after SIGTERM.
const SIGNAL_REPORTER: &str = r#"
import signal, sys
names = ["SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM"]
sigs = {getattr(signal, n) for n in names}
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
print("ready", flush=True)
while True:
    info = signal.sigwaitinfo(sigs)
    print(signal.Signals(info.si_signo).name, info.si_pid, flush=True)
    if info.si_signo == signal.SIGTERM:
        sys.exit(0)
"#;

#[test]
fn run_forwards_every_terminating_signal_once_and_keeps_running() {
    let (name, _guard) = created("run-signals", &["--timeout", "2s"]);
    let mut run = Background::spawn(&[
        "run",
        &name,
        "--instance",
        "8",
        "--",
        "python3",
        "-c",
        SIGNAL_REPORTER,
    ]);
    let wrapper = run.0.id();
    let mut lines = BufReader::new(run.0.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    for (signal, name) in [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
    ] {
        run.signal(signal);
        assert_eq!(
            lines.next().unwrap().unwrap(),
            format!("{name} {wrapper}"),
            "passed on once, by the wrapper"
        );
    }
    assert!(lines.next().is_none(), "nothing delivered twice");
    let output = run.finish();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        status_json(&name)["registrations"][0]["ended_reason"],
        "deregistered"
    );
}

#[test]
fn run_does_not_start_the_program_when_registration_fails() {
    let (name, _guard) = created("run-first", &["--timeout", "2s"]);
    let _holder = Background::spawn(&["worker", &name, "--instance", "4"]);
    wait_until("the holder", || {
        status_json(&name)["tracked_instances"] == 1
    });
    let marker = std::env::temp_dir().join(format!("{name}.started"));
    let output = livereg(&[
        "run",
        &name,
        "--instance",
        "4",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    fails_with(&output, "already registered");
    assert!(!marker.exists(), "the program started before registration");
}

#[test]
fn run_beats_at_once_even_with_an_interval_past_any_deadline() {
    let (name, _guard) = created("run-beat", &["--timeout", "2s"]);
    let _run = Background::spawn(&[
        "run",
        &name,
        "--instance",
        "7",
        "--interval",
        "9300000000000000000s",
        "--",
        "sleep",
        "30",
    ]);
    wait_until("the registration", || {
        status_json(&name)["tracked_instances"] == 1
    });
    let registration = &status_json(&name)["registrations"][0];
    assert_eq!(registration["heartbeats"], 1, "{registration}");
    assert!(
        registration["last_heartbeat_age_seconds"].is_number(),
        "{registration}"
    );
}

#[test]
fn run_lets_a_terminal_ctrl_c_reach_its_program_once() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let (name, _guard) = created("run-tty", &["--timeout", "2s"]);
    let (mut master, mut slave) = (0, 0);
    // SAFETY: both out-pointers are valid; NULL name, termios and winsize
    // ask for the defaults (ISIG on: Ctrl-C raises SIGINT).
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptors from openpty, owned by nobody else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut command = Command::new(env!("CARGO_BIN_EXE_livereg"));
    command
        .args([
            "run",
            &name,
            "--instance",
            "3",
            "--",
            "python3",
            "-c",
            SIGNAL_REPORTER,
        ])
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave);
    // SAFETY: runs in the child before exec; `setsid` and `ioctl` are
    // async-signal-safe. The terminal becomes the session's controlling
    // terminal, the wrapper's group its foreground group.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            Ok(())
        })
    };
    let mut wrapper = Background(command.spawn().unwrap());
    drop(command);
    let (lines, output) = std::sync::mpsc::channel();
    let reader = std::fs::File::from(master.try_clone().unwrap());
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { return };
            if lines.send(line.trim_end().to_owned()).is_err() {
                return;
            }
        }
    });
    let next = |what: &str| loop {
        let line = output
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no {what} from the program"));
        // The terminal echoes Ctrl-C as "^C" before the program's line.
        if let Some(at) = line.find(what) {
            return line[at..].to_owned();
        }
    };
    next("ready");
    std::fs::File::from(master).write_all(b"\x03").unwrap();
    // From the terminal (the kernel, sender pid 0), not from the wrapper.
    assert_eq!(next("SIGINT"), "SIGINT 0");
    let again: Vec<String> =
        std::iter::from_fn(|| output.recv_timeout(Duration::from_millis(500)).ok())
            .filter(|line| line.contains("SIG"))
            .collect();
    assert!(again.is_empty(), "delivered again: {again:?}");
    wrapper.signal(libc::SIGTERM);
    let _ = wrapper.0.wait();
}

#[test]
fn run_progress_file_ends_a_program_that_stops_making_progress_as_stalled() {
    let (name, _guard) = created(
        "run-progress",
        &[
            "--timeout",
            "400ms",
            "--grace",
            "800ms",
            "--progress-timeout",
            "400ms",
        ],
    );
    let _reaper = Background::spawn(&["reap", &name]);
    wait_until("the reaper", || reaper_alive(&name));
    let file = std::env::temp_dir().join(format!("{name}.progress"));
    let _ = std::fs::remove_file(&file);
    let script = format!(
        "for i in 1 2 3 4 5 6 7 8; do echo $i >> {0}; sleep 0.1; done; sleep 30",
        file.display()
    );
    let started = Instant::now();
    let _run = Background::spawn(&[
        "run",
        &name,
        "--instance",
        "12",
        "--progress-file",
        file.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    wait_until("the stall", || status_json(&name)["ended"]["stalled"] == 1);
    // It made progress for 0.8 s, then stopped: never ended before that.
    assert!(
        started.elapsed() > Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    let _ = std::fs::remove_file(&file);
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

#[test]
fn run_program_dies_with_a_killed_wrapper() {
    let (name, _guard) = created("run-pdeath", &["--timeout", "2s"]);
    let mut run = Background::spawn(&[
        "run",
        &name,
        "--instance",
        "9",
        "--",
        "sh",
        "-c",
        "echo $$; exec sleep 30",
    ]);
    let mut lines = BufReader::new(run.0.stdout.take().unwrap()).lines();
    let program: u32 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    assert!(!gone(program));
    run.signal(libc::SIGKILL);
    wait_until("the program to die with its wrapper", || gone(program));
}

#[test]
fn run_registers_again_after_being_evicted_while_stopped() {
    let (name, _guard) = created("run-evicted", &["--timeout", "400ms", "--grace", "800ms"]);
    let _reaper = Background::spawn(&["reap", &name]);
    wait_until("the reaper", || reaper_alive(&name));
    let run = Background::spawn(&[
        "run",
        &name,
        "--instance",
        "6",
        "--label",
        "wrapped",
        "--",
        "sleep",
        "30",
    ]);
    wait_until("the registration", || {
        status_json(&name)["tracked_instances"] == 1
    });
    let first = status_json(&name)["registrations"][0]["generation"].clone();
    run.signal(libc::SIGSTOP);
    wait_until("the eviction", || status_json(&name)["ended_total"] == 1);
    run.signal(libc::SIGCONT);
    wait_until("a new registration", || {
        let json = status_json(&name);
        json["tracked_instances"] == 1
            && json["registrations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["generation"] != first && r["state"] == "live")
    });
    run.signal(libc::SIGTERM);
    let output = run.finish();
    assert_eq!(
        output.status.code(),
        Some(128 + libc::SIGTERM),
        "the signal was forwarded to sleep"
    );
}

#[test]
fn demo_exits_zero() {
    let output = livereg(&["demo", "--workers", "4"]);
    assert!(
        output.status.success(),
        "{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(stdout(&output).contains("0 failed"), "{}", stdout(&output));
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
    first.extend(datagrams(&socket, Duration::from_secs(1)));
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

/// The address a `reap --metrics-addr` daemon logged it serves on (its
/// first line on stderr).
fn served_address(daemon: &mut Background) -> String {
    let mut line = String::new();
    BufReader::new(daemon.0.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in: {line}"))
        .to_owned()
}

/// `GET path` from `address`: the whole response.
fn http_get(address: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut stream, &mut response).unwrap();
    response
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
