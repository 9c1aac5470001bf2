//! What attacks by clients without the token cost a `livereg reap --listen`
//! daemon, beside the same daemon unattacked in the same run: its peak RSS
//! and CPU, legitimate hellos welcomed within 2 s, and SIGKILL of a session
//! client → its drop (the `--on-drop` hook's line). Attacks: 4 connections
//! flooding 1 MiB writes of zeros, 1,000 idle connections reopened as soon
//! as closed. `cargo bench --bench session_attacks` (`-- --quick` or
//! `LIVEREG_BENCH_QUICK=1`: fewer kills).

#[path = "../../tests/common/attack.rs"]
mod attack;

use attack::{flood, slowloris, victim, Attack, Daemon, TOKEN};
use livereg::{connect, ConnectOptions, Table, TableOptions};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_livereg");

/// Starts an attack on an address (or none, for the baseline).
type StartAttack = fn(&str) -> Option<Attack>;

struct Figures {
    peak_rss_mb: f64,
    cpu_percent: f64,
    welcomed: usize,
    hellos: usize,
    slowest_hello: Duration,
    kill_to_drop: Vec<Duration>,
    live_evicted: bool,
}

fn main() {
    raise_descriptor_limit();
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var_os("LIVEREG_BENCH_QUICK").is_some();
    let kills = if quick { 5 } else { 20 };
    let scenarios: [(&str, StartAttack); 3] = [
        ("no attack (baseline)", |_| None),
        ("4 connections flooding zeros", |a| Some(flood(a, 4))),
        ("1,000 idle connections (slow-loris)", |a| {
            Some(slowloris(a, 1000, b""))
        }),
    ];
    let mut rows = Vec::new();
    for (what, start) in scenarios {
        rows.push((what, measure(start, kills)));
    }
    let baseline = median(&rows[0].1.kill_to_drop);
    println!("| scenario | daemon peak RSS | daemon CPU | hellos welcomed within 2 s (slowest) | SIGKILL → drop median (max) | ratio to baseline | live session evicted |");
    println!("|---|---|---|---|---|---|---|");
    for (what, f) in &rows {
        let m = median(&f.kill_to_drop);
        println!(
            "| {what} | {:.1} MB | {:.1} % | {}/{} ({:.1?}) | {:.2?} ({:.2?}) | {:.2} | {} |",
            f.peak_rss_mb,
            f.cpu_percent,
            f.welcomed,
            f.hellos,
            f.slowest_hello,
            m,
            f.kill_to_drop.iter().max().copied().unwrap_or_default(),
            m.as_secs_f64() / baseline.as_secs_f64(),
            if f.live_evicted { "yes" } else { "no" },
        );
    }
}

fn measure(start: StartAttack, kills: usize) -> Figures {
    let name = format!(
        "livereg-bench-attacks-{}-{}",
        std::process::id(),
        rand_suffix()
    );
    let options = TableOptions {
        capacity: 64,
        reap_timeout: Duration::from_secs(2),
        registration_grace: Duration::from_secs(4),
        ..TableOptions::default()
    };
    let _table = Table::create(&name, &options).unwrap();
    let address = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("tcp://{}", l.local_addr().unwrap())
    };
    let daemon = Daemon::start(BIN, &name, &[&address]);
    let options = ConnectOptions {
        token: Some(TOKEN.as_bytes().to_vec()),
        ..ConnectOptions::default()
    };
    let live = connect(&address, 1, "live", &options).unwrap();
    let attack = start(&address);
    std::thread::sleep(Duration::from_secs(1));
    let (cpu_before, at) = (daemon.cpu(), Instant::now());
    let mut live_evicted = false;
    let (mut welcomed, hellos, mut slowest_hello) = (0, 20, Duration::ZERO);
    for instance in 0..hellos {
        let started = Instant::now();
        if let Ok(worker) = connect(&address, 100 + instance as u64, "hello", &options) {
            let took = started.elapsed();
            slowest_hello = slowest_hello.max(took);
            welcomed += usize::from(took <= Duration::from_secs(2));
            let _ = worker.deregister();
        }
        live_evicted |= live.heartbeat().is_err();
    }
    let mut kill_to_drop = Vec::new();
    for k in 0..kills {
        let instance = 1000 + k as u64;
        let mut victim = victim(BIN, &address, instance);
        let table = Table::open(&name).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !table
            .status()
            .unwrap()
            .registrations
            .iter()
            .any(|r| r.instance_id == instance)
        {
            assert!(
                Instant::now() < deadline,
                "victim {instance} never registered"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let killed = Instant::now();
        victim.kill().unwrap();
        let prefix = format!("{instance} ");
        while !daemon.drops().iter().any(|l| l.starts_with(&prefix)) {
            assert!(
                killed.elapsed() < Duration::from_secs(30),
                "victim {instance} never dropped"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        kill_to_drop.push(killed.elapsed());
        let _ = victim.wait();
        live_evicted |= live.heartbeat().is_err();
    }
    let cpu = daemon.cpu() - cpu_before;
    let cpu_percent = 100.0 * cpu.as_secs_f64() / at.elapsed().as_secs_f64();
    let peak_rss_mb = daemon.peak_rss() as f64 / 1e6;
    drop(attack);
    live_evicted |= live.heartbeat().is_err();
    drop(daemon);
    let _ = Table::unlink(&name);
    Figures {
        peak_rss_mb,
        cpu_percent,
        welcomed,
        hellos,
        slowest_hello,
        kill_to_drop,
        live_evicted,
    }
}

fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        .into()
}

/// 1,000 attacking connections need more descriptors than a default soft
/// limit of 1,024 leaves beside the test's own.
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max.min(65_536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
