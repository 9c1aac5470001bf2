//! Sessions over real sockets, each figure beside its baseline in the same
//! run: a session's ping against a local one (criterion); SIGKILL of a
//! client in an isolated container to its drop handler over `unix:` and
//! `tcp://` loopback, against a local worker watched by pidfd; SIGKILL of
//! such a client holding 2 GiB to its `on_dying` over `unix:` against its
//! `on_drop` of the same kills, and to its `on_drop` over `tcp://` (no
//! dying); SIGSTOP of such a client to its `timeout` drop at T = 1 s,
//! against a local worker stopped the same way (the bound: within
//! [T, 1.25 T + 5 ms]); connect to registered against a local
//! registration; one reaper holding 1,000 sessions beating at T = 1 s (its
//! process's CPU share and threads), over `unix:` (regions) and over
//! `tcp://` (frames), against 1,000 local registrations; a reaper
//! SIGKILLed and restarted under 100 sessions. Prints markdown.
//! `LIVEREG_BENCH_QUICK=1` runs small counts (64 MiB held). Parts:
//! `ping`, `kill`, `dying`, `stop`, `connect`, `load`, `restart` (`cargo
//! bench --bench sessions -- dying load` runs those two).

#[path = "../../tests/common/certs.rs"]
mod certs;
#[path = "../../tests/common/container.rs"]
mod container;
#[path = "sessions/processes.rs"]
mod processes;
#[path = "../../benches/support/mod.rs"]
mod support;

use criterion::black_box;
use livereg::{connect, Address, ConnectOptions, DropEvent, Reason, Table, TableOptions};
use processes::{cpu_by_thread, innermost, isolated_worker, local_worker, Daemon};
use std::process::Child;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};
use support::{quick, BenchTable};

const LIVEREG: &str = env!("CARGO_BIN_EXE_livereg");
const TOKEN: &str = "bench-token";

/// The CA and the listener's certificate of the `tls://` figures, made by
/// the bench (rcgen).
fn certs() -> &'static certs::TestCerts {
    static CERTS: std::sync::OnceLock<certs::TestCerts> = std::sync::OnceLock::new();
    CERTS.get_or_init(|| certs::TestCerts::new("bench-sessions"))
}

fn options(timeout: Duration, capacity: u32) -> TableOptions {
    TableOptions {
        capacity,
        reap_timeout: timeout,
        registration_grace: timeout * 2,
        ..TableOptions::default()
    }
}

fn socket(tag: &str) -> (String, String) {
    let path = format!("/tmp/livereg-bench-{tag}-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&path);
    (format!("unix:{path}"), path)
}

fn tcp() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("tcp://{}", listener.local_addr().unwrap())
}

fn tcp_tls() -> String {
    tcp().replace("tcp://", "tls://")
}

/// A client's options for `address`: the token, and the CA for `tls://`.
fn client_options(address: &str) -> ConnectOptions {
    ConnectOptions {
        token: Some(TOKEN.as_bytes().to_vec()),
        tls: address.starts_with("tls://").then(|| livereg::TlsClient {
            ca: certs().path("ca.pem").into(),
            cert: None,
            key: None,
        }),
        ..ConnectOptions::default()
    }
}

fn token() -> ConnectOptions {
    client_options("unix:")
}

/// Which handler of the reaper ran.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Handler {
    Dying,
    Drop,
}

/// A reaper listening at `addresses` that sends every `on_dying` and
/// `on_drop` event, with the handler and when it ran, on one channel.
fn listening(
    table: &Table,
    addresses: &[&str],
) -> (
    livereg::ReaperThread,
    Receiver<(Handler, DropEvent, Instant)>,
) {
    let (sender, events) = mpsc::channel();
    let dying = sender.clone();
    let mut builder = table
        .reaper()
        .on_dying(move |e| Ok(dying.send((Handler::Dying, e.clone(), Instant::now()))?))
        .on_drop(move |e| Ok(sender.send((Handler::Drop, e.clone(), Instant::now()))?));
    for address in addresses {
        builder = builder.listen(
            Address::parse(address).unwrap(),
            Some(TOKEN.as_bytes().to_vec()),
        );
    }
    if addresses.iter().any(|a| a.starts_with("tls://")) {
        builder = builder.tls(livereg::TlsServer {
            cert: certs().path("server.pem").into(),
            key: certs().path("server.key").into(),
            client_ca: None,
        });
    }
    (builder.spawn().unwrap(), events)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn show(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

/// Criterion: `heartbeat()` through a session against a local one.
fn ping(c: &mut criterion::Criterion) {
    let bench = BenchTable::new("session-ping", &options(Duration::from_secs(10), 8));
    let (address, _path) = socket("ping");
    let tls = tcp_tls();
    let (_reaper, _events) = listening(&bench.table, &[&address, &tls]);
    let local = bench.table.register(1, "local").unwrap();
    let remote = connect(&address, 2, "session", &token()).unwrap();
    let remote_tls = connect(&tls, 3, "session", &client_options(&tls)).unwrap();
    let mut group = c.benchmark_group("ping");
    group.bench_function("Worker::heartbeat, local registration (baseline)", |b| {
        b.iter(|| black_box(&local).heartbeat().unwrap())
    });
    group.bench_function("Worker::heartbeat, session over unix:", |b| {
        b.iter(|| black_box(&remote).heartbeat().unwrap())
    });
    group.bench_function("Worker::heartbeat, session over tls://", |b| {
        b.iter(|| black_box(&remote_tls).heartbeat().unwrap())
    });
    group.finish();
}

/// One SIGKILL as the reaper heard it, from the kill: its `on_dying` (if
/// one ran) and its `on_drop`.
struct Kill {
    dying: Option<Duration>,
    dropped: Duration,
}

/// SIGKILL of a client holding `hold_mib` MiB (the process itself, not the
/// container around it) → its handlers, per run; `address` `None` is a
/// local worker watched by pidfd, `Some` a client in a container of its own.
fn kill_to_handlers(address: Option<&str>, hold_mib: u64, runs: usize) -> Vec<Kill> {
    let bench = BenchTable::new("session-kill", &options(Duration::from_secs(10), 64));
    let (_reaper, events) = match address {
        Some(address) => listening(&bench.table, &[address]),
        None => listening(&bench.table, &[]),
    };
    (0..runs)
        .map(|run| {
            let id = run as u64 + 1;
            let mut child = match address {
                Some(address) => isolated_worker(address, id, hold_mib),
                None => local_worker(&bench.name, id),
            };
            // Time for its death thread to claim its death word.
            std::thread::sleep(Duration::from_millis(200));
            let killed = Instant::now();
            // SAFETY: plain kill(2) of a worker this bench started.
            assert_eq!(
                unsafe { libc::kill(innermost(child.id()) as i32, libc::SIGKILL) },
                0
            );
            let mut dying = None;
            let dropped = loop {
                let (handler, event, at) = events.recv_timeout(Duration::from_secs(30)).unwrap();
                assert_eq!(event.instance_id, id, "{handler:?} {event:?}");
                match handler {
                    Handler::Dying => dying = Some(at - killed),
                    Handler::Drop => break (event.reason, at - killed),
                }
            };
            let expected = if address.is_some() {
                Reason::Disconnected
            } else {
                Reason::ProcessExited
            };
            assert_eq!(dropped.0, expected);
            let _ = child.wait();
            Kill {
                dying,
                dropped: dropped.1,
            }
        })
        .collect()
}

/// SIGSTOP → `timeout` drop at T = 1 s, per run, the stops spread over the
/// scan and forward intervals; `address` `None` is the local baseline.
fn stop_to_drop(address: Option<&str>, runs: usize) -> Vec<Duration> {
    let bench = BenchTable::new("session-stop", &options(Duration::from_secs(1), 64));
    let (_reaper, events) = match address {
        Some(address) => listening(&bench.table, &[address]),
        None => listening(&bench.table, &[]),
    };
    let mut children: Vec<Child> = (1..=runs as u64)
        .map(|id| match address {
            Some(address) => isolated_worker(address, id, 0),
            None => local_worker(&bench.name, id),
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let stopped: Vec<Instant> = children
        .iter()
        .map(|child| {
            // A step that is no divisor of the intervals: stops land at
            // every phase of the scans and forwards.
            std::thread::sleep(Duration::from_millis(37));
            let at = Instant::now();
            // SAFETY: plain kill(2) of a worker this bench started.
            assert_eq!(
                unsafe { libc::kill(innermost(child.id()) as i32, libc::SIGSTOP) },
                0
            );
            at
        })
        .collect();
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let (handler, event, at) = events.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(
                (handler, event.reason),
                (Handler::Drop, Reason::Timeout),
                "{event:?}"
            );
            at - stopped[event.instance_id as usize - 1]
        })
        .collect();
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    samples.sort();
    samples
}

/// Connect → registered (`connect` returning), against `register`.
fn connect_latency(runs: usize) -> (Vec<Duration>, Vec<Duration>) {
    let bench = BenchTable::new("session-connect", &options(Duration::from_secs(10), 8));
    let (address, _path) = socket("connect");
    let (_reaper, _events) = listening(&bench.table, &[&address]);
    let mut sessions = Vec::new();
    let mut locals = Vec::new();
    for run in 0..runs {
        let id = run as u64 + 1;
        let started = Instant::now();
        let worker = bench.table.register(id, "local").unwrap();
        locals.push(started.elapsed());
        worker.deregister().unwrap();
        let started = Instant::now();
        let worker = connect(&address, id + 1_000, "session", &token()).unwrap();
        sessions.push(started.elapsed());
        worker.deregister().unwrap();
    }
    (sessions, locals)
}

/// What a load figure's reaper daemon holds.
#[derive(Clone, Copy, PartialEq)]
enum Held {
    /// Registrations in its table (the baseline).
    Local,
    /// Sessions over `unix:`: each beats in a region the listener reads.
    Unix,
    /// Sessions over `tcp://` loopback: each beats with frames.
    Tcp,
}

/// A reaper daemon (`livereg reap`) holding `count` registrations beating
/// at T = 1 s for `measure`: its CPU share of one core and its threads.
/// Sessions come from this process (one client with `count` connections).
fn reaper_load(count: u32, held: Held, measure: Duration) -> (f64, u64, String) {
    let bench = BenchTable::new(
        match held {
            Held::Local => "local-load",
            Held::Unix => "session-load",
            Held::Tcp => "tcp-load",
        },
        &options(Duration::from_secs(1), count + 8),
    );
    let (unix, path) = socket("load");
    let address = if held == Held::Tcp { tcp() } else { unix };
    let mut args = vec!["reap", bench.name.as_str()];
    if held != Held::Local {
        args.extend(["--listen", address.as_str()]);
    }
    let token = (held == Held::Tcp).then_some(TOKEN);
    let daemon = Daemon::start(&args, &path, token);
    while bench.table.probe().is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    if held != Held::Local {
        wait_for_listener(&address);
    }
    // A beater pings every worker connected so far every 100 ms, from the
    // first connect on (connecting 1,000 takes longer than the timeout).
    let workers = std::sync::Arc::new(std::sync::Mutex::new(Vec::<livereg::Worker>::new()));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beater = {
        let (workers, done) = (workers.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for worker in workers.lock().unwrap().iter() {
                    worker.heartbeat().expect("a beating worker was evicted");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    for i in 0..count {
        let id = u64::from(i) + 1;
        let worker = if held == Held::Local {
            bench.table.register(id, "load").unwrap()
        } else {
            connect(&address, id, "load", &client_options(&address)).unwrap()
        };
        worker.heartbeat().unwrap();
        workers.lock().unwrap().push(worker);
    }
    std::thread::sleep(Duration::from_secs(2)); // settle
    let (before, _) = cpu_by_thread(daemon.id());
    let started = Instant::now();
    std::thread::sleep(measure);
    let (after, threads) = cpu_by_thread(daemon.id());
    let elapsed = started.elapsed().as_secs_f64();
    let spent: Vec<(String, f64)> = after
        .iter()
        .map(|(name, time)| {
            let was = before.get(name).copied().unwrap_or_default();
            (
                name.clone(),
                time.saturating_sub(was).as_secs_f64() / elapsed,
            )
        })
        .collect();
    let share = spent.iter().map(|(_, share)| share).sum();
    let by_thread = spent
        .iter()
        .filter(|(_, share)| *share >= 0.00005)
        .map(|(name, share)| format!("{name} {:.3} %", share * 100.0))
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        bench.table.status().unwrap().tracked_instances,
        count as usize
    );
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    beater.join().expect("every worker kept its registration");
    workers.lock().unwrap().clear();
    drop(daemon);
    (share, threads, by_thread)
}

/// Until the daemon listens at `address` (`unix:` or `tcp://`).
fn wait_for_listener(address: &str) {
    let started = Instant::now();
    let listening = || match address.strip_prefix("tcp://") {
        Some(host) => std::net::TcpStream::connect(host).is_ok(),
        None => std::path::Path::new(&address[5..]).exists(),
    };
    while !listening() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the daemon does not listen at {address}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// 100 sessions on a reaper daemon that is SIGKILLed and restarted at once:
/// registrations lost (drops seen by the hook) and the time from the
/// restart until every session is connected again.
fn restart(count: u32) -> (usize, Duration) {
    let bench = BenchTable::new(
        "session-restart",
        &options(Duration::from_secs(2), count + 8),
    );
    let (address, path) = socket("restart");
    let hook_log = format!("/tmp/livereg-bench-restart-{}.hook", std::process::id());
    let _ = std::fs::remove_file(&hook_log);
    let hook = format!("echo $LIVEREG_INSTANCE_ID >> {hook_log}");
    let daemon = || {
        Daemon::start(
            &[
                "reap",
                &bench.name,
                "--listen",
                &address,
                "--on-drop",
                &hook,
            ],
            &path,
            None,
        )
    };
    let mut first = daemon();
    while !std::path::Path::new(&path).exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let workers: Vec<livereg::Worker> = (0..count)
        .map(|i| connect(&address, u64::from(i) + 1, "r", &ConnectOptions::default()).unwrap())
        .collect();
    first.kill();
    let restarted = Instant::now();
    let second = daemon();
    let connected = |table: &Table| {
        let status = table.status().unwrap();
        status.registrations.len() == count as usize
            && status
                .registrations
                .iter()
                .all(|r| r.remote.as_ref().is_some_and(|remote| remote.connected))
    };
    while !connected(&bench.table) {
        for worker in &workers {
            let _ = worker.heartbeat();
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "not all reclaimed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let all_back = restarted.elapsed();
    // Past the timeout: nothing may have ended.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        for worker in &workers {
            worker.heartbeat().expect("a session was lost");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let lost = std::fs::read_to_string(&hook_log)
        .map(|log| log.lines().count())
        .unwrap_or(0);
    drop(workers);
    drop(second);
    let _ = std::fs::remove_file(&hook_log);
    (lost, all_back)
}

/// Whether to run part `name`: every part, or those a filter argument
/// names (`cargo bench --bench sessions -- load`).
fn part(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if part("ping") {
        // Criterion reads the arguments only here: it takes one filter, the
        // parts several.
        let mut c = support::criterion();
        ping(&mut c);
        c.final_summary();
    }
    let runs = if quick() { 3 } else { 30 };
    println!("\n| figure (runs) | median | max | baseline (same run) | ratio of medians |");
    println!("|---|---|---|---|---|");
    if part("kill") {
        kill_figures(runs);
    }
    if part("dying") {
        dying_figures();
    }
    if part("stop") {
        stop_figure(runs);
    }
    if part("connect") {
        connect_figure();
    }
    if part("load") {
        load_figure();
    }
    if part("restart") {
        restart_figure();
    }
    let _ = std::fs::remove_dir_all(&certs().dir);
}

/// Medians and maxima of `samples`.
fn median_max(mut samples: Vec<Duration>) -> (Duration, Duration) {
    let m = median(&mut samples);
    (m, *samples.last().unwrap())
}

fn kill_figures(runs: usize) {
    let drops = |address| {
        median_max(
            kill_to_handlers(address, 0, runs)
                .iter()
                .map(|kill| kill.dropped)
                .collect(),
        )
    };
    let (local_median, _) = drops(None);
    let (unix, _path) = socket("kill");
    for (what, address) in [
        ("unix:", unix.as_str()),
        ("tcp:// loopback", &tcp()),
        ("tls:// loopback", &tcp_tls()),
    ] {
        let (m, max) = drops(Some(address));
        println!(
            "| SIGKILL of an isolated client → drop handler over {what} ({runs}) | {} | {} | local worker by pidfd: median {} | {:.2}x |",
            show(m),
            show(max),
            show(local_median),
            m.as_secs_f64() / local_median.as_secs_f64()
        );
    }
}

/// SIGKILL of an isolated client holding memory: over `unix:` its
/// `on_dying` against its `on_drop` (the socket's close) of the same kills;
/// over `tcp://` loopback (nothing shared, no dying) its `on_drop`.
fn dying_figures() {
    let (mib, runs) = if quick() { (64, 3) } else { (2048, 15) };
    let (unix, _path) = socket("dying");
    let unix_kills = kill_to_handlers(Some(&unix), mib, runs);
    let tcp_kills = kill_to_handlers(Some(&tcp()), mib, runs);
    let (dying, dying_max) = median_max(
        unix_kills
            .iter()
            .map(|kill| kill.dying.expect("a killed unix: client is dying first"))
            .collect(),
    );
    let (dropped, dropped_max) = median_max(unix_kills.iter().map(|kill| kill.dropped).collect());
    assert!(
        tcp_kills.iter().all(|kill| kill.dying.is_none()),
        "a tcp:// client is never dying"
    );
    let (tcp, tcp_max) = median_max(tcp_kills.iter().map(|kill| kill.dropped).collect());
    println!(
        "| SIGKILL of an isolated client holding {mib} MiB → `on_dying` over unix: ({runs}) | {} | {} | its `on_drop` (disconnected), same kills: median {}, max {} | {:.3}x |",
        show(dying),
        show(dying_max),
        show(dropped),
        show(dropped_max),
        dying.as_secs_f64() / dropped.as_secs_f64()
    );
    println!(
        "| SIGKILL of an isolated client holding {mib} MiB → `on_drop` over tcp:// loopback, no dying ({runs}) | {} | {} | over unix:, `on_drop` above: median {} | {:.2}x |",
        show(tcp),
        show(tcp_max),
        show(dropped),
        tcp.as_secs_f64() / dropped.as_secs_f64()
    );
}

fn stop_figure(runs: usize) {
    let local = stop_to_drop(None, runs);
    let (unix, _path) = socket("stop");
    let sessions = stop_to_drop(Some(&unix), runs);
    let t = Duration::from_secs(1);
    let in_t = |d: Duration| format!("{:.3} T", d.as_secs_f64() / t.as_secs_f64());
    println!(
        "| SIGSTOP of an isolated client → `timeout` drop over unix:, T = 1 s ({runs}): earliest {} | {} | {} | local worker: earliest {}, median {}, max {} | {:.2}x |",
        in_t(sessions[0]),
        in_t(sessions[runs / 2]),
        in_t(sessions[runs - 1]),
        in_t(local[0]),
        in_t(local[runs / 2]),
        in_t(local[runs - 1]),
        sessions[runs / 2].as_secs_f64() / local[runs / 2].as_secs_f64()
    );
}

/// Connect → registered over `address`, per run.
fn connect_over(address: &str, runs: usize) -> Vec<Duration> {
    let bench = BenchTable::new("session-connect-tcp", &options(Duration::from_secs(10), 8));
    let (_reaper, _events) = listening(&bench.table, &[address]);
    (0..runs)
        .map(|run| {
            let started = Instant::now();
            let worker =
                connect(address, run as u64 + 1, "session", &client_options(address)).unwrap();
            let took = started.elapsed();
            worker.deregister().unwrap();
            took
        })
        .collect()
}

fn connect_figure() {
    let runs = if quick() { 5 } else { 100 };
    let mut plain = connect_over(&tcp(), runs);
    let mut tls = connect_over(&tcp_tls(), runs);
    let (p, t) = (median(&mut plain), median(&mut tls));
    println!(
        "| connect → registered over tls:// loopback ({runs}) | {} | {} | over tcp:// loopback: median {} | {:.1}x |",
        show(t),
        show(*tls.last().unwrap()),
        show(p),
        t.as_secs_f64() / p.as_secs_f64()
    );
    let (mut sessions, mut locals) = connect_latency(if quick() { 5 } else { 100 });
    let (s, l) = (median(&mut sessions), median(&mut locals));
    println!(
        "| connect → registered over unix: ({}) | {} | {} | `register` in the table: median {} | {:.1}x |",
        sessions.len(),
        show(s),
        show(*sessions.last().unwrap()),
        show(l),
        s.as_secs_f64() / l.as_secs_f64()
    );
}

fn load_figure() {
    let count = if quick() { 50 } else { 1_000 };
    let measure = Duration::from_secs(if quick() { 2 } else { 20 });
    let (local_share, local_threads, local_spent) = reaper_load(count, Held::Local, measure);
    let local = format!(
        "{count} local registrations: {:.3} % of a core, {local_threads} threads ({local_spent})",
        local_share * 100.0
    );
    for (what, held) in [
        ("unix: sessions (regions: no frame per beat)", Held::Unix),
        ("tcp:// loopback sessions (a frame per beat)", Held::Tcp),
    ] {
        let (share, threads, spent) = reaper_load(count, held, measure);
        println!(
            "| reaper daemon, {count} {what} beating at T = 1 s ({}s) | {:.3} % of a core, {threads} threads ({spent}) | | {local} | {:.1}x |",
            measure.as_secs(),
            share * 100.0,
            share / local_share,
        );
    }
}

fn restart_figure() {
    let (lost, back) = restart(if quick() { 10 } else { 100 });
    println!(
        "| reaper SIGKILLed and restarted under {} sessions (T = 2 s) | {lost} lost | every session connected again {} after the restart | | |",
        if quick() { 10 } else { 100 },
        show(back)
    );
}
