//! End-to-end latencies over real processes, as distributions (criterion's
//! per-iteration model does not fit a kill): SIGKILL to drop handler with and
//! without a pidfd, SIGSTOP to drop handler against the timeout bound,
//! deregistration and reset to handler with an idle reaper; and memory.
//! Prints a markdown table. `LIVEREG_BENCH_QUICK=1` runs 3 of each.

#[path = "../../benches/support/mod.rs"]
mod support;

use livereg::{DropEvent, ExitDetection, Table, TableOptions};
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};
use support::{quick, BenchTable};

const WORKER: &str = env!("CARGO_BIN_EXE_livereg");

fn runs() -> usize {
    if quick() {
        3
    } else {
        30
    }
}

fn options(timeout_ms: u64) -> TableOptions {
    TableOptions {
        capacity: 64,
        reap_timeout: Duration::from_millis(timeout_ms),
        registration_grace: Duration::from_millis(timeout_ms * 2),
        ..TableOptions::default()
    }
}

fn reaper(table: &Table) -> (livereg::ReaperThread, Receiver<(DropEvent, Instant)>) {
    let (sender, events) = mpsc::channel();
    let reaper = table
        .reaper()
        .on_drop(move |e| Ok(sender.send((e.clone(), Instant::now()))?))
        .spawn()
        .unwrap();
    (reaper, events)
}

/// Starts a worker process (optionally in a new PID namespace) and waits for
/// its registration.
fn worker(table: &str, id: u64, interval: &str, namespace: bool) -> Child {
    let mut command = if namespace {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--kill-child", WORKER]);
        c
    } else {
        Command::new(WORKER)
    };
    let mut child = command
        .args([
            "worker",
            table,
            "--instance",
            &id.to_string(),
            "--interval",
            interval,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("registered"), "{line}");
    child
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: `kill` has no memory effects; the child is not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
}

fn wait_for_watch(table: &Table, id: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let status = table.status().unwrap();
        if status
            .registrations
            .iter()
            .any(|r| r.instance_id == id && r.exit_detection == ExitDetection::PidfdAndLock)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("instance {id} never became watched by pidfd");
}

struct Figure {
    what: &'static str,
    samples: Vec<Duration>,
    bound: String,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn show(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{} µs", d.as_micros())
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn kill_latency(namespace: bool, timeout_ms: u64) -> Vec<Duration> {
    let bench = BenchTable::new(
        if namespace { "kill-ns" } else { "kill" },
        &options(timeout_ms),
    );
    let (_reaper, events) = reaper(&bench.table);
    (0..runs())
        .map(|run| {
            let id = run as u64 + 1;
            let mut child = worker(&bench.name, id, "20ms", namespace);
            if !namespace {
                wait_for_watch(&bench.table, id);
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
            let killed = Instant::now();
            signal(&child, libc::SIGKILL);
            let (event, at) = events.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(
                (event.instance_id, event.reason),
                (id, livereg::Reason::ProcessExited)
            );
            let _ = child.wait();
            at - killed
        })
        .collect()
}

/// `unshare --pid --fork --kill-child livereg ARGS`: the program as pid 1 of
/// a new PID namespace; returns `unshare` and the program's pid here.
fn namespaced(args: &[&str]) -> (Child, libc::pid_t) {
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", WORKER])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let children = format!("/proc/{0}/task/{0}/children", child.id());
    let inner = loop {
        if let Some(pid) = std::fs::read_to_string(&children)
            .unwrap_or_default()
            .split_whitespace()
            .next()
        {
            break pid.parse().unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    if args[0] == "worker" {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("registered"), "{line}");
    }
    (child, inner)
}

/// The deployment of containers sharing `/dev/shm`: the reaper (`livereg
/// reap`) in one PID namespace, each worker in a sibling one, so no pidfd
/// can be opened. SIGKILL → the registration seen ended in the table
/// (polled every 100 µs from here; its drop handler runs right after).
fn sibling_kill_latency(timeout_ms: u64) -> Vec<Duration> {
    let bench = BenchTable::new("kill-sibling", &options(timeout_ms));
    let (mut reaper, _) = namespaced(&["reap", &bench.name]);
    while !bench.table.reaper_alive() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let live = |id: u64| {
        bench
            .table
            .status()
            .unwrap()
            .registrations
            .iter()
            .any(|r| r.instance_id == id && r.state == livereg::RegistrationState::Live)
    };
    let samples = (0..runs().max(if quick() { 3 } else { 30 }))
        .map(|run| {
            let id = (run + 1).to_string();
            let (mut child, inner) = namespaced(&["worker", &bench.name, "--instance", &id]);
            std::thread::sleep(Duration::from_millis(20));
            let killed = Instant::now();
            // SAFETY: `kill` has no memory effects; `inner` is unshare's live child.
            unsafe { libc::kill(inner, libc::SIGKILL) };
            while live(run as u64 + 1) {
                std::thread::sleep(Duration::from_micros(100));
            }
            let took = killed.elapsed();
            let _ = child.wait();
            took
        })
        .collect();
    let _ = reaper.kill();
    let _ = reaper.wait();
    samples
}

/// A reaper driven by this thread's own loop: SIGKILL of a pidfd-watched
/// worker → its descriptor readable → the scan's drop handler.
fn driven_kill_latency(timeout_ms: u64) -> Vec<Duration> {
    let bench = BenchTable::new("kill-driven", &options(timeout_ms));
    let (sender, events) = std::sync::mpsc::channel();
    let mut reaper = bench
        .table
        .reaper()
        .on_drop(move |event| Ok(sender.send((event.instance_id, Instant::now()))?))
        .build()
        .unwrap();
    (0..runs())
        .map(|run| {
            let id = run as u64 + 1;
            let mut child = worker(&bench.name, id, "20ms", false);
            while bench
                .table
                .status()
                .unwrap()
                .registrations
                .iter()
                .all(|r| r.instance_id != id || r.exit_detection != ExitDetection::PidfdAndLock)
            {
                reaper.scan().unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            reaper.scan().unwrap();
            let killed = Instant::now();
            signal(&child, libc::SIGKILL);
            let (ended, at) = loop {
                let mut ready = libc::pollfd {
                    fd: reaper.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let timeout = reaper.next_scan_in().as_millis() as i32;
                // SAFETY: one valid pollfd, as the count says.
                unsafe { libc::poll(&mut ready, 1, timeout) };
                reaper.scan().unwrap();
                if let Ok(dropped) = events.try_recv() {
                    break dropped;
                }
            };
            let _ = child.wait();
            assert_eq!(ended, id);
            at - killed
        })
        .collect()
}

fn hang_silence(timeout_ms: u64) -> Vec<Duration> {
    let bench = BenchTable::new("hang", &options(timeout_ms));
    let (_reaper, events) = reaper(&bench.table);
    (0..runs())
        .map(|run| {
            let id = run as u64 + 1;
            let mut child = worker(&bench.name, id, "10ms", false);
            std::thread::sleep(Duration::from_millis(30));
            signal(&child, libc::SIGSTOP);
            let (event, _) = events.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(
                (event.instance_id, event.reason),
                (id, livereg::Reason::Timeout)
            );
            signal(&child, libc::SIGKILL);
            signal(&child, libc::SIGCONT);
            let _ = child.wait();
            event.silent_for
        })
        .collect()
}

fn explicit_latency(reset: bool) -> Vec<Duration> {
    let bench = BenchTable::new(if reset { "reset" } else { "dereg" }, &options(10_000));
    let (_reaper, events) = reaper(&bench.table);
    (0..runs())
        .map(|run| {
            let worker = bench.table.register(run as u64 + 1, "bench").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let started = Instant::now();
            if reset {
                bench.table.reset(Duration::from_secs(5)).unwrap();
                std::mem::forget(worker);
            } else {
                worker.deregister().unwrap();
            }
            let (_, at) = events.recv_timeout(Duration::from_secs(5)).unwrap();
            at - started
        })
        .collect()
}

fn reaper_rss_kib(capacity: u32, registered: u64) -> u64 {
    let options = TableOptions {
        capacity,
        ..TableOptions::default()
    };
    let bench = BenchTable::new("rss", &options);
    let workers: Vec<_> = (1..=registered)
        .map(|id| bench.table.register(id, "rss").unwrap())
        .collect();
    let mut reap = Command::new(WORKER)
        .args(["reap", &bench.name])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let status = std::fs::read_to_string(format!("/proc/{}/status", reap.id())).unwrap();
    let _ = reap.kill();
    let _ = reap.wait();
    drop(workers);
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let namespaces = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success());
    let mut figures = vec![
        Figure {
            what: "SIGKILL → drop handler, same PID namespace (pidfd), timeout 10 s",
            samples: kill_latency(false, 10_000),
            bound: "goal: median < 10 ms (a scan would take up to 2.5 s)".into(),
        },
        Figure {
            what: "SIGKILL → drop handler, reaper driven by the caller's poll loop (wake descriptor), timeout 10 s",
            samples: driven_kill_latency(10_000),
            bound: "goal: < 5 ms".into(),
        },
        Figure {
            what: "SIGSTOP → drop handler: silence judged, timeout 200 ms",
            samples: hang_silence(200),
            bound: "[200 ms, 250 ms + 5 ms]".into(),
        },
        Figure {
            what: "deregister → drop handler, idle reaper",
            samples: explicit_latency(false),
            bound: "goal: < 5 ms".into(),
        },
        Figure {
            what: "reset → drop handler, idle reaper",
            samples: explicit_latency(true),
            bound: "goal: < 5 ms".into(),
        },
    ];
    if namespaces {
        figures.insert(
            1,
            Figure {
                what: "SIGKILL → registration ended, reaper and worker in sibling PID namespaces (no pidfd), timeout 8 s",
                samples: sibling_kill_latency(8_000),
                bound: "goal: median ≤ 10 ms, max ≤ 100 ms (a scan would take up to 2 s)".into(),
            },
        );
        figures.insert(
            2,
            Figure {
                what: "SIGKILL → drop handler, worker in a child PID namespace (no pidfd), timeout 8 s",
                samples: kill_latency(true, 8_000),
                bound: "goal: median ≤ 10 ms".into(),
            },
        );
    } else {
        println!("(no PID namespaces here: the other-namespace figure is skipped)");
    }
    println!("| figure | runs | median | p99 | max | bound |");
    println!("|---|---|---|---|---|---|");
    for figure in &mut figures {
        figure.samples.sort();
        let s = &figure.samples;
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            figure.what,
            s.len(),
            show(percentile(s, 0.5)),
            show(percentile(s, 0.99)),
            show(*s.last().unwrap()),
            figure.bound
        );
    }
    let capacity = 4096;
    println!();
    println!(
        "memory: {} bytes per slot; a {capacity}-slot table is {} bytes; the `livereg reap` process on it \
         with 1,000 registrations: {} KiB resident",
        livereg::SLOT_SIZE,
        livereg::table_size(capacity),
        reaper_rss_kib(capacity, 1000)
    );
}
