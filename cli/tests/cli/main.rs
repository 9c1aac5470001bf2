//! The `livereg` command, run as a real binary: every subcommand and exit
//! code, one file per subcommand (or per side of `reap`).

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/container.rs"]
mod container;
#[path = "../support/other_user.rs"]
mod other_user;

mod create;
mod demo;
mod frozen;
mod hooks;
mod info;
mod listen;
mod probe;
mod reap;
mod run;
mod standby;
mod status;

use common::{unique_name, UnlinkOnDrop};
use container::contained;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn livereg(args: &[&str]) -> Output {
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
