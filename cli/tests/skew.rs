//! Version skew against the real previous build: the `livereg` command of
//! the last commit that spoke session protocol 3 (`.ci/previous-build`,
//! named by `LIVEREG_PREVIOUS_BIN`), beside today's. Its client registers
//! with today's reaper and today's client with its reaper, each beats, is
//! ended on SIGKILL as a client of the reaper's own version is, and
//! survives its reaper restarting; a reaper upgraded or downgraded under
//! live registrations keeps every one. Run by `.ci/run` through
//! `.ci/skew`: `cargo test -p livereg-cli --test skew -- --ignored`.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{unique_name, UnlinkOnDrop};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(1);
const TOKEN: &str = "skew-test-token";

fn today() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_livereg"))
}

fn previous() -> PathBuf {
    let path = std::env::var_os("LIVEREG_PREVIOUS_BIN").expect(
        "LIVEREG_PREVIOUS_BIN: the previous protocol's livereg (.ci/previous-build prints it)",
    );
    PathBuf::from(path)
}

/// A background `livereg` process, killed on drop.
struct Running(Child);

impl Running {
    fn start(bin: &PathBuf, args: &[&str]) -> Running {
        Running(
            Command::new(bin)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn signal(&mut self, signal: i32) {
        // SAFETY: `kill` has no memory effects; the child is not yet waited for.
        unsafe { libc::kill(self.0.id() as libc::pid_t, signal) };
        if signal == libc::SIGKILL || signal == libc::SIGTERM {
            let _ = self.0.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port that no other test of this process was given: the
/// kernel may hand a port just released to the next test's probe, and two
/// tests would then share one listener.
fn port_of_its_own() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A table with a `tcp://` listener's address and token file, and a
/// `unix:` listener's address (where a client of protocol 4 beats in a
/// region its listener of protocol 4 shares, and with frames otherwise).
struct Setup {
    name: String,
    address: String,
    unix: String,
    token_file: PathBuf,
    _table: UnlinkOnDrop,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.token_file);
        let _ = std::fs::remove_file(self.unix.trim_start_matches("unix:"));
    }
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let name = unique_name(tag);
        let created = Command::new(today())
            .args(["create", &name, "--timeout", "1s", "--grace", "2s"])
            .output()
            .unwrap();
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stderr)
        );
        let port = port_of_its_own();
        let token_file = std::env::temp_dir().join(format!("{name}.token"));
        std::fs::write(&token_file, TOKEN).unwrap();
        std::fs::set_permissions(
            &token_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        Setup {
            address: format!("tcp://127.0.0.1:{port}"),
            unix: format!(
                "unix:{}",
                std::env::temp_dir().join(format!("{name}.sock")).display()
            ),
            token_file,
            _table: UnlinkOnDrop(name.clone()),
            name,
        }
    }

    fn reaper(&self, bin: &PathBuf) -> Running {
        let token = self.token_file.to_str().unwrap();
        let reaper = Running::start(
            bin,
            &[
                "reap",
                &self.name,
                "--listen",
                &self.address,
                "--listen",
                &self.unix,
                "--token-file",
                token,
            ],
        );
        // This reaper, not another test's on a port the kernel gave twice:
        // the table's reaper is its process, and it listens.
        let pid = u64::from(reaper.0.id());
        self.wait_until("the reaper to listen", || {
            self.status()["reaper_pid"] == pid
                && std::net::TcpStream::connect(self.address.trim_start_matches("tcp://")).is_ok()
                && std::os::unix::net::UnixStream::connect(self.unix.trim_start_matches("unix:"))
                    .is_ok()
        });
        reaper
    }

    /// `livereg run` registered through the `tcp://` listener.
    fn session(&self, bin: &PathBuf, instance: u64) -> Running {
        self.session_at(&self.address, bin, instance)
    }

    /// `livereg run` registered through the listener at `address`.
    fn session_at(&self, address: &str, bin: &PathBuf, instance: u64) -> Running {
        let token = self.token_file.to_str().unwrap();
        let id = instance.to_string();
        let client = Running::start(
            bin,
            &[
                "run",
                address,
                "--instance",
                &id,
                "--token-file",
                token,
                "--",
                "sleep",
                "600",
            ],
        );
        self.wait_until("the session to register", || self.live(instance));
        client
    }

    /// `livereg run` registered in the table itself.
    fn local(&self, bin: &PathBuf, instance: u64) -> Running {
        let id = instance.to_string();
        let worker = Running::start(
            bin,
            &["run", &self.name, "--instance", &id, "--", "sleep", "600"],
        );
        self.wait_until("the worker to register", || self.live(instance));
        worker
    }

    fn status(&self) -> serde_json::Value {
        let output = Command::new(today())
            .args(["status", &self.name, "--json"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn live(&self, instance: u64) -> bool {
        self.status()["registrations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["instance_id"] == instance && r["state"] == "live")
    }

    fn ended(&self) -> serde_json::Value {
        self.status()["ended"].clone()
    }

    fn ended_total(&self) -> u64 {
        self.status()["ended_total"].as_u64().unwrap()
    }

    fn wait_until(&self, what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !check() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {}",
                self.status()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The reason the next registration to end ended for, after SIGKILL of
    /// `client`, and how long it took.
    fn kill_and_reason(&self, client: &mut Running) -> (String, Duration) {
        let before = self.ended();
        let killed = Instant::now();
        client.signal(libc::SIGKILL);
        self.wait_until("the killed client to be ended", || self.ended() != before);
        let after = self.ended();
        let reason = after
            .as_object()
            .unwrap()
            .iter()
            .find(|(reason, n)| before[reason.as_str()] != **n)
            .map(|(reason, _)| reason.clone())
            .unwrap();
        (reason, killed.elapsed())
    }
}

/// `client_bin`'s sessions against `reaper_bin`'s listeners, over `tcp://`
/// and over `unix:`: each registers, beats for 3 T, survives the reaper
/// restarting (same build), and is ended on SIGKILL; returns the reasons.
fn session_lifetime(reaper_bin: &PathBuf, client_bin: &PathBuf) -> Vec<String> {
    [false, true]
        .into_iter()
        .map(|unix| session_lifetime_over(reaper_bin, client_bin, unix))
        .collect()
}

fn session_lifetime_over(reaper_bin: &PathBuf, client_bin: &PathBuf, unix: bool) -> String {
    let setup = Setup::new("skew");
    let mut reaper = setup.reaper(reaper_bin);
    let address = if unix { &setup.unix } else { &setup.address };
    let mut client = setup.session_at(address, client_bin, 7);
    std::thread::sleep(3 * T);
    assert_eq!(
        setup.ended_total(),
        0,
        "ended while beating: {}",
        setup.status()
    );

    reaper.signal(libc::SIGTERM);
    let _reaper = setup.reaper(reaper_bin);
    std::thread::sleep(3 * T);
    assert_eq!(
        setup.ended_total(),
        0,
        "ended across the reaper's restart: {}",
        setup.status()
    );
    assert!(
        setup.live(7),
        "not live after the restart: {}",
        setup.status()
    );

    let (reason, after) = setup.kill_and_reason(&mut client);
    assert!(
        after < 3 * T,
        "a killed client ended {after:?} after SIGKILL"
    );
    reason
}

#[test]
#[ignore = "needs the previous protocol's build: .ci/skew runs it"]
fn a_previous_client_is_served_by_todays_reaper_as_a_current_one_is() {
    let current = session_lifetime(&today(), &today());
    let older = session_lifetime(&today(), &previous());
    assert_eq!(
        older, current,
        "a previous client ends for another reason than a current one"
    );
}

#[test]
#[ignore = "needs the previous protocol's build: .ci/skew runs it"]
fn todays_client_speaks_the_previous_protocol_to_a_previous_reaper() {
    let native = session_lifetime(&previous(), &previous());
    let newer = session_lifetime(&previous(), &today());
    assert_eq!(
        newer, native,
        "today's client ends for another reason than the reaper's own"
    );
}

#[test]
#[ignore = "needs the previous protocol's build: .ci/skew runs it"]
fn a_reaper_upgraded_or_downgraded_under_live_registrations_keeps_every_one() {
    let setup = Setup::new("skew-upgrade");
    let mut reaper = setup.reaper(&previous());
    let _workers = [
        setup.local(&previous(), 1),
        setup.local(&today(), 2),
        setup.session(&previous(), 3),
        setup.session(&today(), 4),
        setup.session_at(&setup.unix, &previous(), 5),
        setup.session_at(&setup.unix, &today(), 6),
    ];
    reaper.signal(libc::SIGTERM);
    let mut reaper = setup.reaper(&today());
    std::thread::sleep(3 * T);
    assert_eq!(
        setup.ended_total(),
        0,
        "ended across the upgrade: {}",
        setup.status()
    );
    assert_eq!(setup.status()["tracked_instances"], 6);

    reaper.signal(libc::SIGTERM);
    let _reaper = setup.reaper(&previous());
    std::thread::sleep(3 * T);
    assert_eq!(
        setup.ended_total(),
        0,
        "ended across the downgrade: {}",
        setup.status()
    );
    assert_eq!(setup.status()["tracked_instances"], 6);
}
