//! `livereg run`: the program it wraps (exit codes, signals, a terminal, progress), and its registration.

use super::*;

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
