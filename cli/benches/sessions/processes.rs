//! The processes the sessions bench starts and watches: a `livereg reap`
//! daemon, session clients each in a container of its own, local workers,
//! and what `/proc` says of them.

use super::{certs, LIVEREG, TOKEN};
use crate::container::contained;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `livereg reap` daemon, killed on drop (a panicking bench leaves none
/// behind), its socket removed.
pub struct Daemon(Child, String);

impl Daemon {
    /// `livereg ARGS`, with `token` in its environment (`LIVEREG_TOKEN`:
    /// what a `tcp://` listener needs) where given.
    pub fn start(args: &[&str], socket: &str, token: Option<&str>) -> Daemon {
        let mut command = Command::new(LIVEREG);
        if let Some(token) = token {
            command.env("LIVEREG_TOKEN", token);
        }
        let child = command
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Daemon(child, socket.to_owned())
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILLs it and waits for it (its socket stays, as a killed
    /// daemon's does).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

/// A client in a container of its own (`unshare`: mount namespace with a
/// private /dev/shm, PID and IPC namespaces; network too over `unix:`),
/// holding `hold_mib` MiB of touched 4 KiB pages (none: 0), beating every
/// 10 ms; returns it once registered.
pub fn isolated_worker(address: &str, id: u64, hold_mib: u64) -> Child {
    let mut child = contained(LIVEREG, address.starts_with("unix:"))
        .args(["worker", address, "--instance", &id.to_string()])
        .args(["--interval", "10ms", "--hold-mib", &hold_mib.to_string()])
        .args(if address.starts_with("tls://") {
            vec!["--tls-ca".to_owned(), certs().path("ca.pem")]
        } else {
            Vec::new()
        })
        .env("LIVEREG_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.as_mut().unwrap());
    let mut line = String::new();
    if hold_mib > 0 {
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("holding"), "{line}");
        line.clear();
    }
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("registered"), "{line}");
    child
}

pub fn local_worker(table: &str, id: u64) -> Child {
    let mut child = Command::new(LIVEREG)
        .args([
            "worker",
            table,
            "--instance",
            &id.to_string(),
            "--interval",
            "10ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    child
}

/// The innermost descendant of `pid` (the worker `unshare` runs, through
/// the shell that `exec`s it), or `pid` itself.
pub fn innermost(pid: u32) -> u32 {
    let mut pid = pid;
    for _ in 0..20 {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        match children.split_whitespace().next() {
            Some(child) => pid = child.parse().unwrap(),
            None => return pid,
        }
    }
    pid
}

/// CPU time of process `pid`'s threads by name, to the nanosecond (each
/// thread's run time in `/proc/PID/task/TID/schedstat`: clock ticks of
/// 10 ms would leave a quiet daemon's figure at one tick or none), and its
/// thread count. Threads that ended before the call are not counted.
pub fn cpu_by_thread(pid: u32) -> (std::collections::BTreeMap<String, Duration>, u64) {
    let mut by_name = std::collections::BTreeMap::new();
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let (Ok(schedstat), Ok(comm)) = (
            std::fs::read_to_string(task.join("schedstat")),
            std::fs::read_to_string(task.join("comm")),
        ) else {
            continue; // ended meanwhile
        };
        let ns: u64 = schedstat.split(' ').next().unwrap().parse().unwrap();
        *by_name
            .entry(comm.trim().to_owned())
            .or_insert(Duration::ZERO) += Duration::from_nanos(ns);
        threads += 1;
    }
    (by_name, threads)
}
