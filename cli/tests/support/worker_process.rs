//! A worker process (the CLI's hidden worker mode) for the tests that
//! kill, stop and watch real processes: its lines read as it prints them,
//! killed (after a SIGCONT) on drop.
#![allow(dead_code)] // each test binary uses what it needs

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};

pub struct WorkerProcess {
    pub child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl WorkerProcess {
    /// `command` started with its stdout piped.
    pub fn spawn(command: &mut Command) -> WorkerProcess {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a worker process");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        WorkerProcess { child, lines }
    }

    /// `livereg worker TABLE --instance ID --interval 50ms EXTRA...`.
    pub fn worker(table: &str, instance: u64, extra: &[&str]) -> WorkerProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_livereg"));
        command
            .args(["worker", table, "--instance", &instance.to_string()])
            .args(["--interval", "50ms"])
            .args(extra);
        WorkerProcess::spawn(&mut command)
    }

    /// The next line the worker prints (blocking; the worker prints soon or exits).
    pub fn next_line(&mut self) -> Option<String> {
        self.lines.next().and_then(Result::ok)
    }

    /// Reads lines until one starts with `prefix`; returns it.
    pub fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            let line = self
                .next_line()
                .unwrap_or_else(|| panic!("the worker ended before saying '{prefix}'"));
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: `kill` has no memory effects; the child is not yet waited
        // for, so its pid is not reused.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
