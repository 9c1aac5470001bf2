//! Beyond one host, against a real etcd on loopback (started here): how soon
//! an etcd watcher sees a registration and its end, against a bare put seen
//! by the same watcher; and the requests per second one host's reaper sends
//! etcd with 64 live workers, at three heartbeat rates (it must not follow
//! the rate). Prints a markdown table. `LIVEREG_BENCH_QUICK=1`: 3 runs and
//! 2 s windows.

#[path = "../../tests/common/etcd_server.rs"]
mod etcd_server;
#[path = "../../benches/support/mod.rs"]
mod support;

use etcd_client::EventType;
use etcd_server::{EtcdServer, Seen};
use livereg::{Table, TableOptions};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};
use support::{quick, BenchTable};

const LIVEREG: &str = env!("CARGO_BIN_EXE_livereg");
const PREFIX: &str = "/livereg-bench";

fn runs() -> usize {
    if quick() {
        3
    } else {
        30
    }
}

/// A child process, killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `kind` on `key` and returns when it arrived.
fn seen(events: &Receiver<Seen>, kind: EventType, key: &str) -> Instant {
    loop {
        let seen = events
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no {kind:?} of {key} within 10 s"));
        if seen.kind == kind && seen.key == key {
            return seen.at;
        }
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// The floor: a put by a client, seen by the watcher.
fn bare_put(etcd: &EtcdServer, events: &Receiver<Seen>) -> Vec<Duration> {
    let (runtime, mut client) = etcd.client();
    let key = format!("{PREFIX}/bare");
    (0..runs())
        .map(|_| {
            let start = Instant::now();
            runtime
                .block_on(client.put(key.as_str(), "x", None))
                .unwrap();
            seen(events, EventType::Put, &key) - start
        })
        .collect()
}

/// Register → PUT seen, and deregister → DELETE seen, through a
/// `livereg reap --etcd` daemon.
fn publish_latency(table: &BenchTable, events: &Receiver<Seen>) -> (Vec<Duration>, Vec<Duration>) {
    let (mut registered, mut ended) = (Vec::new(), Vec::new());
    let handle = Table::open(&table.name).unwrap();
    for run in 0..runs() {
        let id = run as u64 + 1;
        let key = format!("{PREFIX}/bench/{}/{id}", table.name);
        let start = Instant::now();
        let worker = handle.register(id, "bench").unwrap();
        registered.push(seen(events, EventType::Put, &key) - start);
        worker.heartbeat().unwrap();
        let start = Instant::now();
        worker.deregister().unwrap();
        ended.push(seen(events, EventType::Delete, &key) - start);
    }
    (registered, ended)
}

/// Registrations one worker process holds for the bulk figure.
const BULK: usize = 1000;

/// A reaper started on a table with `BULK` live registrations → every key
/// seen by the watcher (process start, connection and lease included), and
/// the baseline: the same number of puts, one at a time, from a client.
fn bulk_publish(etcd: &EtcdServer, events: &Receiver<Seen>) -> (Duration, Duration) {
    let options = TableOptions {
        capacity: 1024,
        reap_timeout: Duration::from_secs(10),
        ..TableOptions::default()
    };
    let table = BenchTable::new("etcd-bulk", &options);
    let also = (BULK - 1).to_string();
    let _workers = Daemon(
        Command::new(LIVEREG)
            .args(["worker", &table.name, "--instance", "1", "--also", &also])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    while table.table.status().unwrap().tracked_instances < BULK {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (runtime, mut client) = etcd.client();
    let start = Instant::now();
    for id in 0..BULK {
        let key = format!("{PREFIX}/one-by-one/{id}");
        runtime.block_on(client.put(key, "x", None)).unwrap();
    }
    let last = format!("{PREFIX}/one-by-one/{}", BULK - 1);
    let one_by_one = seen(events, EventType::Put, &last) - start;

    let start = Instant::now();
    let _reaper = Daemon(
        Command::new(LIVEREG)
            .args(["reap", &table.name, "--etcd", &etcd.address()])
            .args(["--etcd-prefix", PREFIX, "--host", "bulk"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let prefix = format!("{PREFIX}/bulk/");
    let mut keys = 0;
    while keys < BULK {
        let seen = events
            .recv_timeout(Duration::from_secs(10))
            .expect("the bulk keys");
        if seen.kind == EventType::Put && seen.key.starts_with(&prefix) {
            keys += 1;
        }
    }
    (start.elapsed(), one_by_one)
}

/// Requests etcd received (every gRPC message: unary requests and stream
/// messages such as keep-alives), from its own metrics.
fn requests(etcd: &EtcdServer) -> f64 {
    etcd.metrics()
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// etcd requests per second while 64 registrations beat every `interval`.
fn write_load(etcd: &EtcdServer, table: &BenchTable, interval: &str) -> f64 {
    let _workers = Daemon(
        Command::new(LIVEREG)
            .args(["worker", &table.name, "--instance", "1000", "--also", "63"])
            .args(["--interval", interval])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Settle: the 64 keys published.
    std::thread::sleep(Duration::from_secs(1));
    let window = if quick() {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(20)
    };
    let before = requests(etcd);
    let start = Instant::now();
    std::thread::sleep(window);
    let after = requests(etcd);
    (after - before) / start.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let etcd = EtcdServer::start("bench");
    let events = etcd.watch(PREFIX);
    let options = TableOptions {
        capacity: 128,
        reap_timeout: Duration::from_secs(10),
        ..TableOptions::default()
    };
    let table = BenchTable::new("etcd", &options);
    let _reaper = Daemon(
        Command::new(LIVEREG)
            .args(["reap", &table.name, "--etcd", &etcd.address()])
            .args(["--etcd-prefix", PREFIX, "--host", "bench"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while !Table::open(&table.name).unwrap().reaper_alive() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the reaper did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its first put (lease, connection) is not what is measured.
    std::thread::sleep(Duration::from_millis(500));

    let floor = median(bare_put(&etcd, &events));
    let (registered, ended) = publish_latency(&table, &events);
    let (registered, ended) = (median(registered), median(ended));
    let version = etcd
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("etcd_server_version{server_version=\""))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("?")
        .to_owned();
    println!("etcd {version} on loopback; medians of {} runs\n", runs());
    println!("| figure | median | ratio to a bare put |");
    println!("|---|---|---|");
    println!("| a client's put → watcher (baseline) | {floor:.2?} | 1.00 |");
    for (what, took) in [
        ("register → key seen by a watcher", registered),
        ("deregister → delete seen by a watcher", ended),
    ] {
        println!(
            "| {what} | {took:.2?} | {:.2} |",
            took.as_secs_f64() / floor.as_secs_f64()
        );
    }
    let (bulk, one_by_one) = bulk_publish(&etcd, &events);
    println!("\n| {BULK} live registrations | time | ratio to one-by-one puts |");
    println!("|---|---|---|");
    println!("| {BULK} puts one at a time by a client (baseline) | {one_by_one:.2?} | 1.00 |");
    println!(
        "| `livereg reap --etcd` started → all {BULK} keys seen | {bulk:.2?} | {:.2} |",
        bulk.as_secs_f64() / one_by_one.as_secs_f64()
    );
    println!("\n| 64 workers beating every | etcd requests per second | ratio to 1 s beats |");
    println!("|---|---|---|");
    let mut baseline = None;
    for interval in ["1s", "100ms", "10ms"] {
        let load = write_load(&etcd, &table, interval);
        let base = *baseline.get_or_insert(load);
        println!(
            "| {interval} | {load:.2} | {:.2} |",
            load / base.max(f64::MIN_POSITIVE)
        );
    }
}
