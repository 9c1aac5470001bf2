//! Beyond one host, against a real etcd (started per test on loopback):
//! two "hosts" (two tables, two `livereg reap --etcd --host` daemons)
//! publish, drops delete keys with their reason, a killed host's keys vanish
//! with its lease, an etcd restart or hang loses nothing and never holds up
//! local reaping.
#![cfg(feature = "etcd")]

#[path = "../../../tests/common/certs.rs"]
mod certs;
#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/etcd_server.rs"]
mod etcd_server;

mod faults;
mod library;
mod proxy;
mod publishing;
mod reconnects;
mod security;
mod takeover;
mod watch;

use common::{unique_name, TempTable, UnlinkOnDrop};
use etcd_client::{Client, EventType, GetOptions};
use etcd_server::{EtcdServer, Seen};
use livereg::etcd::{ClusterStatus, EtcdOptions, Publisher};
use livereg::{Table, TableOptions};
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

/// `table` published under `options`, beside a reaper whose drop handler
/// tells the publisher each end's reason (as `livereg reap --etcd` does).
fn publish_reaped(table: &Table, options: EtcdOptions) -> (Publisher, livereg::ReaperThread) {
    let publisher = Publisher::start(table, options).unwrap();
    let ends = publisher.sink();
    let reaper = table
        .reaper()
        .on_drop(move |event| {
            ends.ended(event);
            Ok(())
        })
        .spawn()
        .unwrap();
    (publisher, reaper)
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

/// Removes a file on drop.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
