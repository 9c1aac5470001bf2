//! Beyond one host, against a real etcd (started per test on loopback):
//! two "hosts" (two tables, two `livereg reap --etcd --host` daemons)
//! publish, drops delete keys with their reason, a killed host's keys vanish
//! with its lease, an etcd restart or hang loses nothing and never holds up
//! local reaping.
#![cfg(feature = "etcd")]

#[path = "common/certs.rs"]
mod certs;
mod common;
#[path = "common/etcd_server.rs"]
mod etcd_server;

use common::{unique_name, TempTable, UnlinkOnDrop};
use etcd_client::{Client, EventType, GetOptions};
use etcd_server::{EtcdServer, Seen};
use livereg::etcd::{ClusterStatus, EtcdOptions, Publisher};
use livereg::Table;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const LIVEREG: &str = env!("CARGO_BIN_EXE_livereg");
/// The lease TTL the daemons here take (etcd's minimum).
const TTL: Duration = Duration::from_secs(2);

fn livereg(args: &[&str]) -> Output {
    Command::new(LIVEREG)
        .args(args)
        .output()
        .expect("run livereg")
}

/// A background process, killed on drop.
struct Daemon(Child);

impl Daemon {
    fn spawn(args: &[&str]) -> Daemon {
        Daemon(
            Command::new(LIVEREG)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn livereg"),
        )
    }

    fn signal(&self, signal: i32) {
        // SAFETY: `kill` has no memory effects; the child is not yet waited for.
        unsafe { libc::kill(self.0.id() as libc::pid_t, signal) };
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// Waits for the first stdout line (a worker's `registered SLOT GEN`).
    fn first_line(&mut self) -> String {
        let mut line = String::new();
        BufReader::new(self.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        line
    }

    fn stdin(&mut self) -> Option<ChildStdin> {
        self.0.stdin.take()
    }

    /// Kills it and returns what it wrote on stderr.
    fn stderr(mut self) -> String {
        self.signal(libc::SIGTERM);
        let child = std::mem::replace(&mut self.0, Command::new("true").spawn().unwrap());
        String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr).into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill();
    }
}

/// A created table, removed on drop.
fn table(tag: &str, timeout: &str) -> (String, UnlinkOnDrop) {
    let name = unique_name(tag);
    let output = livereg(&["create", &name, "--timeout", timeout, "--grace", "5s"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (name.clone(), UnlinkOnDrop(name))
}

/// `livereg reap NAME --etcd … --host HOST` with a 2 s TTL and a prefix of
/// the test's own; `extra` appended.
fn reaper(name: &str, etcd: &EtcdServer, prefix: &str, host: &str, extra: &[&str]) -> Daemon {
    let (ttl, address) = (format!("{}s", TTL.as_secs()), etcd.address());
    let args = [
        &["reap", name, "--etcd", &address, "--etcd-prefix", prefix][..],
        &["--host", host, "--etcd-ttl", &ttl],
        extra,
    ]
    .concat();
    let daemon = Daemon::spawn(&args);
    wait_for("the reaper", Duration::from_secs(10), || {
        livereg(&["probe", name]).status.success()
    });
    daemon
}

/// A worker beating every 100 ms, registered when this returns.
fn worker(name: &str, id: u64, label: &str) -> Daemon {
    let id = id.to_string();
    let mut worker = Daemon::spawn(&[
        "worker",
        name,
        "--instance",
        &id,
        "--label",
        label,
        "--until-stdin-closes",
    ]);
    let line = worker.first_line();
    assert!(line.starts_with("registered"), "worker said: {line}");
    worker
}

fn wait_for(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// A test's view of etcd: the keys under a prefix.
struct Reader {
    runtime: tokio::runtime::Runtime,
    client: Client,
}

impl Reader {
    fn new(etcd: &EtcdServer) -> Reader {
        let (runtime, client) = etcd.client();
        Reader { runtime, client }
    }

    /// Key → (value as JSON, lease).
    fn keys(&mut self, prefix: &str) -> BTreeMap<String, (Value, i64)> {
        let answer = self
            .runtime
            .block_on(
                self.client
                    .get(prefix, Some(GetOptions::new().with_prefix())),
            )
            .expect("read etcd");
        answer
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                (
                    key,
                    (serde_json::from_slice(kv.value()).unwrap(), kv.lease()),
                )
            })
            .collect()
    }

    fn ids(&mut self, prefix: &str) -> Vec<String> {
        self.keys(prefix).into_keys().collect()
    }
}

/// Every host's registrations under `prefix`, read through the library.
fn fetch(endpoints: &[String], prefix: &str) -> ClusterStatus {
    let mut options = EtcdOptions::new(endpoints.iter().cloned());
    options.prefix = prefix.to_owned();
    ClusterStatus::fetch(&options).unwrap()
}

fn prefix(tag: &str) -> String {
    format!("/{}", unique_name(tag))
}

#[test]
fn two_hosts_publish_drops_delete_with_their_reason_and_a_dead_host_vanishes_with_its_lease() {
    let etcd = EtcdServer::start("hosts");
    let prefix = prefix("hosts");
    let seen = etcd.watch(&prefix);
    let (a, _a) = table("host-a", "1s");
    let (b, _b) = table("host-b", "1s");
    let mut reaper_a = reaper(&a, &etcd, &prefix, "node-a", &[]);
    let _reaper_b = reaper(&b, &etcd, &prefix, "node-b", &[]);
    let mut one = worker(&a, 1, "gpu0");
    let mut two = worker(&a, 2, "gpu1");
    let _three = worker(&b, 3, "gpu0");
    let mut reader = Reader::new(&etcd);
    let (key_a1, key_a2) = (
        format!("{prefix}/node-a/{a}/1"),
        format!("{prefix}/node-a/{a}/2"),
    );
    let key_b3 = format!("{prefix}/node-b/{b}/3");
    wait_for("three keys", Duration::from_secs(5), || {
        reader.ids(&prefix) == [key_a1.clone(), key_a2.clone(), key_b3.clone()]
    });

    // The record, under one lease per host.
    let keys = reader.keys(&prefix);
    let (record, lease_a) = &keys[&key_a1];
    assert_eq!(record["host"], "node-a");
    assert_eq!(record["table"], a.as_str());
    assert_eq!(record["instance_id"], 1);
    assert_eq!(record["label"], "gpu0");
    assert_eq!(record["pid"], one.0.id());
    assert_eq!(record["ended"], Value::Null);
    assert!(record["boot_token"].as_u64().unwrap() != 0);
    let age = now_unix() - record["registered_unix_seconds"].as_f64().unwrap();
    assert!((0.0..10.0).contains(&age), "registered {age}s ago");
    assert_eq!(keys[&key_a2].1, *lease_a, "one lease per host");
    assert_ne!(keys[&key_b3].1, *lease_a);

    // `status --cluster` lists both hosts, with their leases' TTL.
    let cluster = cluster_status(&etcd, &prefix, &["--json"]);
    assert!(
        cluster.status.success(),
        "{}",
        String::from_utf8_lossy(&cluster.stderr)
    );
    let cluster: Value = serde_json::from_slice(&cluster.stdout).unwrap();
    let hosts = cluster["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2, "{cluster}");
    assert_eq!(
        (hosts[0]["host"].as_str(), hosts[0]["live"].as_u64()),
        (Some("node-a"), Some(2))
    );
    assert_eq!(
        (hosts[1]["host"].as_str(), hosts[1]["live"].as_u64()),
        (Some("node-b"), Some(1))
    );
    for host in hosts {
        let ttl = host["lease_ttl_seconds"].as_i64().unwrap();
        // etcd truncates the seconds left; a late keep-alive may leave 0.
        assert!((0..=TTL.as_secs() as i64).contains(&ttl), "{host}");
    }
    let text = cluster_status(&etcd, &prefix, &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("host node-a: 2 live") && text.contains("host node-b: 1 live"),
        "{text}"
    );

    // A clean exit and a SIGKILL: each key deleted within 1 s, its last
    // value saying why.
    let deregistered = Instant::now();
    drop(two.stdin());
    let (at, last) = wait_deleted(&seen, &key_a2);
    assert!(
        at - deregistered < Duration::from_secs(1),
        "{:?}",
        at - deregistered
    );
    assert_eq!(last["ended"], "deregistered");
    let killed = Instant::now();
    one.kill();
    let (at, last) = wait_deleted(&seen, &key_a1);
    assert!(at - killed < Duration::from_secs(1), "{:?}", at - killed);
    assert_eq!(last["ended"], "process_exited");

    // Host a's reaper dies with a live registration: its key vanishes when
    // the lease expires (within TTL + 2 s); host b's stays.
    let _four = worker(&a, 4, "gpu2");
    let key_a4 = format!("{prefix}/node-a/{a}/4");
    wait_for("key 4", Duration::from_secs(5), || {
        reader.keys(&prefix).contains_key(&key_a4)
    });
    let died = Instant::now();
    reaper_a.kill();
    wait_for(
        "host a's key to vanish",
        TTL + Duration::from_secs(2),
        || !reader.keys(&prefix).contains_key(&key_a4),
    );
    let (_, last) = wait_deleted(&seen, &key_a4);
    assert_eq!(last["ended"], Value::Null, "a lease expiry says no reason");
    assert!(
        died.elapsed() >= Duration::from_secs(1),
        "not before the lease could expire"
    );
    std::thread::sleep(TTL);
    assert_eq!(reader.ids(&prefix), [key_b3], "host b's key stays");
}

/// Waits for the delete of `key`: when the watcher saw it, and the value the
/// key had last.
fn wait_deleted(events: &Receiver<Seen>, key: &str) -> (Instant, Value) {
    loop {
        let seen = events
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("no delete of {key} within 5 s"));
        if seen.kind == EventType::Delete && seen.key == key {
            return (seen.at, serde_json::from_slice(&seen.value).unwrap());
        }
    }
}

/// `livereg status --cluster` on `prefix`, `extra` appended.
fn cluster_status(etcd: &EtcdServer, prefix: &str, extra: &[&str]) -> Output {
    let address = etcd.address();
    let base = [
        "status",
        "--cluster",
        "--etcd",
        &address,
        "--etcd-prefix",
        prefix,
    ];
    livereg(&[&base[..], extra].concat())
}

fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn an_etcd_restart_mid_run_loses_nothing() {
    let mut etcd = EtcdServer::start("restart");
    let prefix = prefix("restart");
    let (name, _guard) = table("restart", "1s");
    let daemon = reaper(&name, &etcd, &prefix, "node", &[]);
    let mut one = worker(&name, 1, "a");
    let _two = worker(&name, 2, "b");
    let mut reader = Reader::new(&etcd);
    let key = |id: u64| format!("{prefix}/node/{name}/{id}");
    wait_for("two keys", Duration::from_secs(5), || {
        reader.ids(&prefix) == [key(1), key(2)]
    });

    // etcd goes away; meanwhile 1 ends and 3 registers.
    etcd.kill();
    one.kill();
    let _three = worker(&name, 3, "c");
    wait_for("the local drop of 1", Duration::from_secs(3), || {
        let status = livereg(&["status", &name, "--json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        status["ended"]["process_exited"] == 1
    });
    etcd.resume();
    let mut reader = Reader::new(&etcd);
    wait_for(
        "the keys to match the table",
        Duration::from_secs(15),
        || reader.ids(&prefix) == [key(2), key(3)],
    );
    // Every key is under one live lease.
    let keys = reader.keys(&prefix);
    let lease = keys[&key(2)].1;
    assert_eq!(keys[&key(3)].1, lease);
    assert_eq!(keys[&key(3)].0["label"], "c");

    // The lease is lost (revoked: etcd deletes its keys): the reaper takes a
    // new one and rewrites every key from the table.
    reader
        .runtime
        .block_on(reader.client.lease_revoke(lease))
        .expect("revoke the lease");
    wait_for(
        "the keys rewritten under a new lease",
        Duration::from_secs(10),
        || {
            let keys = reader.keys(&prefix);
            keys.len() == 2
                && keys
                    .values()
                    .all(|(_, l)| *l != lease && *l == keys[&key(2)].1)
        },
    );
    let log = daemon.stderr();
    assert!(
        log.contains("local reaping goes on"),
        "the outage is logged: {log}"
    );
    assert!(log.contains("the lease expired"), "{log}");
}

#[test]
fn a_hung_etcd_never_holds_up_local_reaping() {
    let etcd = EtcdServer::start("hung");
    let prefix = prefix("hung");
    let (name, _guard) = table("hung", "1s");
    let drops = std::env::temp_dir().join(format!("{name}.drops"));
    let _drops = RemoveOnDrop(drops.clone());
    let hook = format!(
        "echo $LIVEREG_INSTANCE_ID $LIVEREG_REASON >> {}",
        drops.display()
    );
    let _daemon = reaper(&name, &etcd, &prefix, "node", &["--on-drop", &hook]);
    let mut killed = worker(&name, 1, "killed");
    let stopped = worker(&name, 2, "stopped");
    let _kept = worker(&name, 3, "kept");
    let mut reader = Reader::new(&etcd);
    wait_for("three keys", Duration::from_secs(5), || {
        reader.ids(&prefix).len() == 3
    });

    wait_for("every worker to beat", Duration::from_secs(5), || {
        let status = livereg(&["status", &name, "--json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        status["registrations"]
            .as_array()
            .is_some_and(|all| all.iter().all(|r| r["heartbeats"].as_u64() > Some(0)))
    });
    // etcd hangs (its requests time out rather than fail).
    etcd.signal(libc::SIGSTOP);
    let dropped = |line: &str| {
        std::fs::read_to_string(&drops)
            .unwrap_or_default()
            .lines()
            .any(|l| l == line)
    };
    let start = Instant::now();
    killed.kill();
    let took = wait_for("the killed worker's drop", Duration::from_secs(5), || {
        dropped("1 process_exited")
    });
    assert!(
        took < Duration::from_secs(1),
        "exit detection took {took:?}"
    );
    // The stopped worker: evicted within timeout + a scan interval (1.25 s)
    // and a generous margin, never before the timeout less one beat.
    stopped.signal(libc::SIGSTOP);
    let took = wait_for(
        "the stopped worker's eviction",
        Duration::from_secs(4),
        || dropped("2 timeout"),
    );

    assert!(took >= Duration::from_millis(900), "evicted after {took:?}");
    assert!(start.elapsed() < Duration::from_secs(5));

    // etcd comes back: the keys follow the table.
    etcd.signal(libc::SIGCONT);
    wait_for(
        "the keys to match the table",
        Duration::from_secs(15),
        || reader.ids(&prefix) == [format!("{prefix}/node/{name}/3")],
    );
}

/// Removes a file on drop.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_reaper_stops_promptly_with_etcd_hung() {
    let etcd = EtcdServer::start("stop");
    let prefix = prefix("stop");
    let (name, _guard) = table("stop", "1s");
    let mut daemon = reaper(&name, &etcd, &prefix, "node", &[]);
    let _worker = worker(&name, 1, "");
    let mut reader = Reader::new(&etcd);
    wait_for("the key", Duration::from_secs(5), || {
        reader.ids(&prefix).len() == 1
    });
    etcd.signal(libc::SIGSTOP);
    // Registrations churn, so a round is in flight against the hung etcd.
    let _more: Vec<Daemon> = (2..6).map(|id| worker(&name, id, "")).collect();
    std::thread::sleep(Duration::from_millis(500));
    let stopping = Instant::now();
    daemon.signal(libc::SIGTERM);
    let status = daemon.0.wait().unwrap();
    let took = stopping.elapsed();
    assert!(status.success(), "{status}");
    // The request in flight (3 s) and the revoke (1 s), with margin.
    assert!(took < Duration::from_secs(8), "stopping took {took:?}");
}

#[test]
fn an_unreachable_etcd_is_logged_and_reaping_goes_on() {
    let (name, _guard) = table("unreachable", "1s");
    let reaper = Daemon::spawn(&["reap", &name, "--etcd", "127.0.0.1:1", "--host", "x"]);
    wait_for("the reaper", Duration::from_secs(10), || {
        livereg(&["probe", &name]).status.success()
    });
    let mut gone = worker(&name, 1, "");
    gone.kill();
    wait_for("the local drop", Duration::from_secs(3), || {
        let status = livereg(&["status", &name, "--json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        status["ended"]["process_exited"] == 1
    });
    let log = reaper.stderr();
    assert!(log.contains("etcd at 127.0.0.1:1"), "{log}");
    assert!(log.contains("local reaping goes on"), "{log}");
    assert_eq!(log.matches("local reaping goes on").count(), 1, "{log}");
}

#[test]
fn bad_etcd_options_are_refused_in_one_line() {
    let (name, _guard) = table("badopts", "1s");
    for (args, says) in [
        (
            vec!["--etcd", "127.0.0.1:2379", "--host", "a/b"],
            "expected a non-empty name without '/'",
        ),
        (
            vec!["--etcd", ",", "--host", "a"],
            "expected at least one (host:port), found none",
        ),
    ] {
        let output = livereg(&[&["reap", &name][..], &args].concat());
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "expected '{says}' in: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let output = livereg(&["status", "--cluster", "--etcd", "127.0.0.1:1"]);
    assert_eq!(output.status.code(), Some(1));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("etcd at 127.0.0.1:1"), "{err}");
}

#[test]
fn a_standby_that_takes_over_republishes_under_its_own_lease_without_a_gap() {
    let etcd = EtcdServer::start("standby");
    let prefix = prefix("standby");
    let (name, _guard) = table("standby", "1s");
    let mut first = reaper(&name, &etcd, &prefix, "node", &[]);
    let _second = Daemon::spawn(&[
        "reap",
        &name,
        "--standby",
        "--etcd",
        &etcd.address(),
        "--etcd-prefix",
        &prefix,
        "--host",
        "node",
        "--etcd-ttl",
        "2s",
    ]);
    let _worker = worker(&name, 1, "kept");
    let key = format!("{prefix}/node/{name}/1");
    let mut reader = Reader::new(&etcd);
    wait_for("the key", Duration::from_secs(5), || {
        reader.keys(&prefix).contains_key(&key)
    });
    let first_lease = reader.keys(&prefix)[&key].1;
    let events = etcd.watch(&prefix);

    first.kill();
    wait_for(
        "the key under the standby's lease",
        Duration::from_secs(5),
        || {
            reader
                .keys(&prefix)
                .get(&key)
                .is_some_and(|(_, lease)| *lease != first_lease)
        },
    );
    // The first lease expires meanwhile; the key, moved off it, stays.
    std::thread::sleep(TTL + Duration::from_secs(1));
    assert!(reader.keys(&prefix).contains_key(&key));
    let deletes = events
        .try_iter()
        .filter(|e| e.kind == EventType::Delete)
        .count();
    assert_eq!(deletes, 0, "the key never blinked");
}

#[test]
fn the_library_publisher_reads_back_and_a_clean_stop_revokes_its_keys_at_once() {
    let etcd = EtcdServer::start("library");
    let prefix = prefix("library");
    let table = TempTable::new("library", &common::options());
    let mut options = EtcdOptions::new([etcd.address()]);
    options.prefix.clone_from(&prefix);
    options.host = "lib".into();
    options.ttl = Duration::from_secs(30);
    let publisher = Publisher::start(&table.table, options).unwrap();
    let ends = publisher.sink();
    let reaper = table
        .table
        .reaper()
        .on_drop(move |event| {
            ends.ended(event);
            Ok(())
        })
        .spawn()
        .unwrap();
    let events = etcd.watch(&prefix);
    let handle = Table::open(&table.name).unwrap();
    let (nine, ten) = (
        handle.register(9, "nine").unwrap(),
        handle.register(10, "ten").unwrap(),
    );
    let endpoints = [etcd.address()];
    let mut cluster = None;
    wait_for(
        "both registrations read back",
        Duration::from_secs(5),
        || {
            let read = fetch(&endpoints, &prefix);
            let found = read.hosts.first().is_some_and(|h| h.live == 2);
            cluster = Some(read);
            found
        },
    );
    assert!(publisher.is_connected());
    let cluster = cluster.unwrap();
    let host = &cluster.hosts[0];
    assert_eq!((host.host.as_str(), host.tables.len()), ("lib", 1));
    let ids: Vec<u64> = host.tables[0]
        .registrations
        .iter()
        .map(|r| r.instance_id)
        .collect();
    assert_eq!(ids, [9, 10]);
    assert!(
        host.lease_ttl_seconds.is_some_and(|ttl| ttl > 20),
        "{host:?}"
    );

    nine.deregister().unwrap();
    let (_, last) = wait_deleted(&events, &format!("{prefix}/lib/{}/9", table.name));
    assert_eq!(last["ended"], "deregistered");

    // Keys under the prefix that are not registrations are counted, not read.
    let mut reader = Reader::new(&etcd);
    for (key, value) in [
        (format!("{prefix}/stray"), "x"),
        (format!("{prefix}/h/t/x"), "{}"),
        (format!("{prefix}/h/t/1"), "not json"),
    ] {
        reader
            .runtime
            .block_on(reader.client.put(key, value, None))
            .unwrap();
    }
    let read = fetch(&endpoints, &prefix);
    assert_eq!((read.foreign_keys, read.hosts.len()), (3, 1));

    // A clean stop revokes the lease (TTL 30 s): the key goes at once.
    reaper.stop().unwrap();
    publisher.stop();
    let left = reader.keys(&format!("{prefix}/lib/"));
    assert!(left.is_empty(), "{left:?}");
    drop(ten);
}

#[test]
fn writes_etcd_refuses_for_their_size_are_split_and_published_with_one_warning() {
    // etcd takes at most 2 operations per transaction; a round writes 5.
    let etcd = EtcdServer::start_with("txn-ops", &["--max-txn-ops", "2"]);
    let prefix = prefix("txn-ops");
    let (name, _table) = table("txn-ops", "5s");
    let workers: Vec<Daemon> = (1..=5)
        .map(|id| worker(&name, id, &format!("gpu{id}")))
        .collect();
    let daemon = reaper(&name, &etcd, &prefix, "h", &[]);
    let mut reader = Reader::new(&etcd);
    wait_for("all five keys", Duration::from_secs(10), || {
        reader.ids(&format!("{prefix}/h/")).len() == 5
    });
    std::thread::sleep(Duration::from_secs(2)); // what a retry storm would fill
    let log = daemon.stderr();
    let warnings = log.matches("local reaping goes on").count();
    let reconnects = log.matches("publishing table").count();
    assert!(warnings <= 1, "one warning per outage at most: {log}");
    assert_eq!(reconnects, 1, "no reconnect for a refused size: {log}");
    assert!(log.contains("operations per transaction"), "{log}");
    drop(workers);
}

#[test]
fn a_publisher_whose_keep_alives_go_unanswered_gives_the_connection_up_and_comes_back() {
    let mut etcd = EtcdServer::start("blackhole");
    let prefix = prefix("blackhole");
    let table = TempTable::new("blackhole", &common::options());
    let _worker = table.table.register(5, "five").unwrap();
    let mut options = EtcdOptions::new([etcd.address()]);
    options.prefix.clone_from(&prefix);
    options.host = "bh".into();
    options.ttl = TTL;
    let publisher = Publisher::start(&table.table, options).unwrap();
    let _reaper = table.table.reaper().spawn().unwrap();
    let mut reader = Reader::new(&etcd);
    wait_for("the key", Duration::from_secs(10), || {
        !reader.ids(&format!("{prefix}/bh/")).is_empty()
    });
    assert!(publisher.is_connected());
    // etcd stops answering; nothing in the table changes.
    etcd.signal(libc::SIGSTOP);
    let gave_up = wait_for(
        "the publisher to notice no keep-alive answers",
        TTL + Duration::from_secs(8),
        || !publisher.is_connected(),
    );
    etcd.signal(libc::SIGCONT);
    assert!(gave_up >= TTL / 2, "gave up after {gave_up:?}");
    wait_for("connected again", Duration::from_secs(20), || {
        publisher.is_connected()
    });
    wait_for("the key again", Duration::from_secs(10), || {
        !reader.ids(&format!("{prefix}/bh/")).is_empty()
    });
    publisher.stop();
    etcd.kill();
}

#[test]
fn a_reaper_that_takes_over_publishes_the_end_of_a_registration_its_predecessor_published() {
    let etcd = EtcdServer::start("takeover-end");
    let prefix = prefix("takeover-end");
    let (name, _table) = table("takeover-end", "5s");
    // A lease long enough that only the second reaper can delete the key.
    let (address, ttl) = (etcd.address(), "20s");
    let reap = [
        "reap",
        name.as_str(),
        "--etcd",
        &address,
        "--etcd-prefix",
        &prefix,
    ];
    let reap = [&reap[..], &["--host", "h", "--etcd-ttl", ttl]].concat();
    let mut first = Daemon::spawn(&reap);
    wait_for("the reaper", Duration::from_secs(10), || {
        livereg(&["probe", &name]).status.success()
    });
    let mut doomed = worker(&name, 4, "doomed");
    let key = format!("{prefix}/h/{name}/4");
    let mut reader = Reader::new(&etcd);
    wait_for("the key", Duration::from_secs(10), || {
        reader.keys(&key).contains_key(&key)
    });
    let events = etcd.watch(&prefix);
    // The reaper dies with its lease alive; then its worker dies.
    first.signal(libc::SIGKILL);
    first.kill();
    doomed.signal(libc::SIGKILL);
    doomed.kill();
    let _second = Daemon::spawn(&reap);
    let (_, last) = wait_deleted(&events, &key);
    assert_eq!(last["ended"], "process_exited", "{last}");
}

#[test]
fn records_carry_the_boot_token_of_the_reaper_that_runs_now() {
    let etcd = EtcdServer::start("boot-token");
    let prefix = prefix("boot-token");
    let table = TempTable::new("boot-token", &common::options());
    let _worker = table.table.register(6, "six").unwrap();
    let mut options = EtcdOptions::new([etcd.address()]);
    options.prefix.clone_from(&prefix);
    options.host = "bt".into();
    // Started before any reaper: the table's boot token is 0.
    let publisher = Publisher::start(&table.table, options).unwrap();
    let key = format!("{prefix}/bt/{}/6", table.name);
    let mut reader = Reader::new(&etcd);
    wait_for("the key", Duration::from_secs(10), || {
        reader.keys(&key).contains_key(&key)
    });
    for _ in 0..2 {
        let reaper = table.table.reaper().spawn().unwrap();
        let token = table.table.probe().unwrap();
        wait_for("the reaper's boot token", Duration::from_secs(10), || {
            reader
                .keys(&key)
                .get(&key)
                .map(|(v, _)| v["boot_token"].clone())
                == Some(token.into())
        });
        reaper.stop().unwrap();
    }
    publisher.stop();
}

#[test]
fn the_cluster_view_does_not_count_a_key_whose_registration_ended() {
    let etcd = EtcdServer::start("ended-keys");
    let prefix = prefix("ended-keys");
    let mut reader = Reader::new(&etcd);
    let record = |id: u64, ended: &str| {
        format!(
            r#"{{"host":"h","table":"t","instance_id":{id},"label":"","pid":1,"slot":{id},"generation":0,"registered_unix_seconds":1.0,"boot_token":1,"ended":{ended}}}"#
        )
    };
    for (id, ended) in [(1, "null"), (2, r#""timeout""#)] {
        let key = format!("{prefix}/h/t/{id}");
        reader
            .runtime
            .block_on(reader.client.put(key, record(id, ended), None))
            .unwrap();
    }
    let read = fetch(&[etcd.address()], &prefix);
    assert_eq!(read.hosts[0].live, 1, "{read:?}");
    let ids: Vec<u64> = read.hosts[0].tables[0]
        .registrations
        .iter()
        .map(|r| r.instance_id)
        .collect();
    assert_eq!(ids, [1]);
}

/// A TLS etcd (server certificate from the test's CA, client certificates
/// required) with authentication on: user `livereg` (password `secret`) may
/// read and write under `prefix`; `root` (password `rootpw`) owns the rest.
fn secure_etcd(certs: &certs::TestCerts, prefix: &str) -> EtcdServer {
    let (server, key, ca) = (
        certs.path("server.pem"),
        certs.path("server.key"),
        certs.path("ca.pem"),
    );
    let etcd = EtcdServer::start_with(
        "secure",
        &[
            "--cert-file",
            &server,
            "--key-file",
            &key,
            "--trusted-ca-file",
            &ca,
            "--client-cert-auth",
        ],
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut root = Client::connect([etcd.endpoint.as_str()], Some(tls_options(certs)))
            .await
            .expect("connect over TLS");
        root.user_add("root", "rootpw", None).await.unwrap();
        root.user_grant_role("root", "root").await.unwrap();
        root.role_add("publisher").await.unwrap();
        let keys = etcd_client::Permission::read_write(prefix.to_owned()).with_prefix();
        root.role_grant_permission("publisher", keys).await.unwrap();
        root.user_add("livereg", "secret", None).await.unwrap();
        root.user_grant_role("livereg", "publisher").await.unwrap();
        root.auth_enable().await.unwrap();
    });
    etcd
}

fn tls_options(certs: &certs::TestCerts) -> etcd_client::ConnectOptions {
    etcd_client::ConnectOptions::new().with_tls(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(certs.read("ca.pem")))
            .identity(etcd_client::Identity::from_pem(
                certs.read("client.pem"),
                certs.read("client.key"),
            )),
    )
}

/// The keys under `prefix`, read as root over TLS.
fn secure_keys(etcd: &EtcdServer, certs: &certs::TestCerts, prefix: &str) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = tls_options(certs).with_user("root", "rootpw");
        let mut root = Client::connect([etcd.endpoint.as_str()], Some(options))
            .await
            .unwrap();
        let found = root
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        found
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect()
    })
}

/// The options that reach the secure etcd: its CA, this client's
/// certificate and key, the user (its password comes separately).
fn secure_flags(certs: &certs::TestCerts) -> Vec<String> {
    vec![
        "--etcd-ca".into(),
        certs.path("ca.pem"),
        "--etcd-cert".into(),
        certs.path("client.pem"),
        "--etcd-key".into(),
        certs.path("client.key"),
        "--etcd-user".into(),
        "livereg".into(),
    ]
}

/// `livereg ARGS`, with `LIVEREG_ETCD_PASSWORD` set to `password`.
fn livereg_with_password(args: &[&str], password: &str) -> Output {
    Command::new(LIVEREG)
        .args(args)
        .env("LIVEREG_ETCD_PASSWORD", password)
        .output()
        .expect("run livereg")
}

/// Asserts exit 1 and one line on stderr containing each of `says`.
fn fails_in_one_line(output: &Output, says: &[&str]) {
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for part in says {
        assert!(err.contains(part), "expected '{part}' in: {err}");
    }
}

#[test]
fn over_tls_with_a_user_publishing_and_the_cluster_view_work() {
    let certs = certs::TestCerts::new("tls-ok");
    let prefix = prefix("tls-ok");
    let etcd = secure_etcd(&certs, &prefix);
    let (name, _table) = table("tls-ok", "5s");
    let password_file = certs.dir.join("password");
    std::fs::write(&password_file, "secret\n").unwrap();
    let endpoint = etcd.endpoint.clone();
    let secure = secure_flags(&certs);
    let secure: Vec<&str> = secure.iter().map(String::as_str).collect();
    let password_flag = password_file.display().to_string();
    let reap = [
        &[
            "reap",
            name.as_str(),
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
        ][..],
        &["--host", "h", "--etcd-password-file", &password_flag],
        &secure,
    ]
    .concat();
    let _reaper = Daemon::spawn(&reap);
    let _worker = worker(&name, 12, "gpu12");
    let key12 = format!("{prefix}/h/{name}/12");
    wait_for("the key over TLS", Duration::from_secs(15), || {
        secure_keys(&etcd, &certs, &prefix).contains(&key12)
    });
    let view = [
        &[
            "status",
            "--cluster",
            "--json",
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
        ][..],
        &secure,
    ]
    .concat();
    let shown = livereg_with_password(&view, "secret");
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let cluster: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(cluster["hosts"][0]["live"], 1, "{cluster}");
}

#[test]
fn a_wrong_ca_a_missing_client_certificate_or_a_wrong_password_fail_in_one_line() {
    let certs = certs::TestCerts::new("tls-bad");
    let prefix = prefix("tls-bad");
    let etcd = secure_etcd(&certs, &prefix);
    let endpoint = etcd.endpoint.clone();
    let (ca, other, cert, key) = (
        certs.path("ca.pem"),
        certs.path("other-ca.pem"),
        certs.path("client.pem"),
        certs.path("client.key"),
    );
    let view = |extra: &[&str], password: &str| {
        let base = [
            "status",
            "--cluster",
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
        ];
        livereg_with_password(&[&base[..], extra].concat(), password)
    };
    let mutual = ["--etcd-cert", cert.as_str(), "--etcd-key", key.as_str()];
    let user = ["--etcd-user", "livereg"];
    // A CA that did not sign etcd's certificate.
    let wrong_ca = view(
        &[&["--etcd-ca", other.as_str()][..], &mutual, &user].concat(),
        "secret",
    );
    fails_in_one_line(&wrong_ca, &[&endpoint, "connect"]);
    // No client certificate, where etcd requires one.
    let no_cert = view(&[&["--etcd-ca", ca.as_str()][..], &user].concat(), "secret");
    fails_in_one_line(&no_cert, &[&endpoint]);
    // The wrong password.
    let wrong_password = view(
        &[&["--etcd-ca", ca.as_str()][..], &mutual, &user].concat(),
        "nope",
    );
    fails_in_one_line(&wrong_password, &[&endpoint, "authentication failed"]);
    // https:// without a CA, and a plaintext endpoint with TLS configured.
    let plain = format!("http://{}", etcd.address());
    fails_in_one_line(
        &livereg(&["status", "--cluster", "--etcd", &endpoint]),
        &["https:// needs a CA", "--etcd-ca"],
    );
    fails_in_one_line(
        &livereg(&["status", "--cluster", "--etcd", &plain, "--etcd-ca", &ca]),
        &["plaintext, but TLS is configured"],
    );

    // A reaper with the wrong password publishes nothing and reaps on.
    let (name, _table) = table("tls-bad", "5s");
    let reaper = Command::new(LIVEREG)
        .args([
            "reap",
            &name,
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
            "--host",
            "h",
        ])
        .args(secure_flags(&certs))
        .env("LIVEREG_ETCD_PASSWORD", "nope")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reaper = Daemon(reaper);
    wait_for("the reaper", Duration::from_secs(10), || {
        livereg(&["probe", &name]).status.success()
    });
    let mut doomed = worker(&name, 13, "doomed");
    doomed.signal(libc::SIGKILL);
    doomed.kill();
    wait_for("the local drop", Duration::from_secs(5), || {
        let status = livereg(&["status", &name, "--json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        status["ended"]["process_exited"] == 1
    });
    assert!(secure_keys(&etcd, &certs, &prefix).is_empty());
    let log = reaper.stderr();
    assert!(log.contains("authentication failed"), "{log}");
    assert_eq!(
        log.matches("local reaping goes on").count(),
        1,
        "one warning for the outage: {log}"
    );
}
