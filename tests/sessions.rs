//! Sessions: workers in isolated "containers" (their own mount namespace
//! with a private `/dev/shm`, their own PID, IPC and network namespaces,
//! made here with `unshare`) register through a reaper's listener and are
//! reaped like local workers; their socket's closing is their death signal.

mod common;
#[path = "common/container.rs"]
mod container;

use common::{hold_registration_lock, long_options, unique_name, TempTable};
use container::contained;
use livereg::{connect, Address, ConnectOptions, DropEvent, Error, Reason, TableOptions};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A Unix socket path no other test uses, removed on drop.
struct SocketPath(String);

impl SocketPath {
    fn new(tag: &str) -> SocketPath {
        SocketPath(format!("/tmp/{}.sock", unique_name(tag)))
    }
    fn address(&self) -> String {
        format!("unix:{}", self.0)
    }
}

impl Drop for SocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A free TCP port on loopback.
fn tcp_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("tcp://{}", listener.local_addr().unwrap())
}

fn with_events(
    table: &livereg::Table,
    address: &str,
    token: Option<&[u8]>,
) -> (livereg::ReaperThread, mpsc::Receiver<(DropEvent, Instant)>) {
    let (sender, events) = mpsc::channel();
    let reaper = table
        .reaper()
        .on_drop(move |event| Ok(sender.send((event.clone(), Instant::now()))?))
        .listen(Address::parse(address).unwrap(), token.map(<[u8]>::to_vec))
        .spawn()
        .unwrap();
    (reaper, events)
}

/// A client in its own container: `unshare` with new mount (a private
/// tmpfs on /dev/shm), PID, IPC and (for Unix sockets) network namespaces,
/// running this binary's `client_helper`.
struct Isolated {
    child: Child,
    lines: BufReader<ChildStdout>,
    /// A line here lets a client that waits for the test go on.
    go: ChildStdin,
}

impl Isolated {
    fn spawn(address: &str, instance: u64, mode: &str, token: Option<&str>) -> Isolated {
        let own_network = address.starts_with("unix:");
        let command = contained(std::env::current_exe().unwrap(), own_network);
        Isolated::spawn_as(command, address, instance, mode, token)
    }

    /// As [`Isolated::spawn`], also in a time namespace of its own whose
    /// `CLOCK_MONOTONIC` is a day ahead of this one's.
    fn spawn_a_day_ahead(address: &str, instance: u64, mode: &str) -> Isolated {
        let command = contained(std::env::current_exe().unwrap(), true);
        let mut args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
        args.splice(
            0..0,
            ["--time".into(), "--monotonic".into(), "86400".into()],
        );
        let mut ahead = Command::new(command.get_program());
        ahead.args(args);
        Isolated::spawn_as(ahead, address, instance, mode, None)
    }

    fn spawn_as(
        mut command: Command,
        address: &str,
        instance: u64,
        mode: &str,
        token: Option<&str>,
    ) -> Isolated {
        command
            .args([
                "--ignored",
                "--exact",
                "client_helper",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LIVEREG_HELPER_ADDRESS", address)
            .env("LIVEREG_HELPER_INSTANCE", instance.to_string())
            .env("LIVEREG_HELPER_MODE", mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(token) = token {
            command.env("LIVEREG_TOKEN", token);
        }
        let mut child = command.spawn().expect("spawn unshare");
        let lines = BufReader::new(child.stdout.take().unwrap());
        let go = child.stdin.take().unwrap();
        Isolated { child, lines, go }
    }

    /// Lets a client waiting for the test go on.
    fn go(&mut self) {
        writeln!(self.go, "go").unwrap();
    }

    /// The next line the client prints that starts with `prefix`.
    fn line(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        let mut skipped = String::new();
        loop {
            line.clear();
            let n = self.lines.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "the client ended before printing {prefix:?}, after:\n{skipped}"
            );
            // libtest prints "test client_helper ... " before the first line.
            if let Some(at) = line.find(prefix) {
                return line[at..].trim().to_owned();
            }
            skipped.push_str(&line);
        }
    }

    /// The client's pid in this namespace (`unshare`'s grandchild: the
    /// shell `exec`s the client).
    fn client_pid(&self) -> libc::pid_t {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.child.id()))
                    .unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                return pid.parse().unwrap();
            }
            assert!(Instant::now() < deadline, "unshare never forked");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: a plain kill(2) of our own child's process.
        assert_eq!(unsafe { libc::kill(self.client_pid(), signal) }, 0);
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The client in the container (run by [`Isolated`]): registers, says
/// `registered SLOT`, then acts as `LIVEREG_HELPER_MODE` says:
/// `ping` (every 10 ms, `evicted REASON` when told), `hang` (the engine
/// loop stops after `hanging`, the sender thread lives), `exit` (deregister
/// after a few pings, `done`), `clear` (a clear, `cleared`, a ping,
/// `beating`, then, once the test says go, a reset, `reset`, then pings
/// until evicted), `quiet` (never beats: its sender forwards on), `fork`
/// (a few pings, then a forked child that exits at once, `forked`, then
/// pings), `hostile` (forges its region's death word marked, `marked`,
/// then, once the test says go, writes every byte of the region over and
/// over, forging beats, its death word, another instance's id, for a few
/// seconds, `forged`, then sleeps).
#[test]
#[ignore = "a helper, run by the tests of this file in a container"]
fn client_helper() {
    let address = std::env::var("LIVEREG_HELPER_ADDRESS").unwrap();
    let instance: u64 = std::env::var("LIVEREG_HELPER_INSTANCE")
        .unwrap()
        .parse()
        .unwrap();
    let mode = std::env::var("LIVEREG_HELPER_MODE").unwrap();
    let options = ConnectOptions {
        token: std::env::var("LIVEREG_TOKEN").ok().map(String::into_bytes),
        ..ConnectOptions::default()
    };
    let worker = match connect(&address, instance, "isolated", &options) {
        Ok(worker) => worker,
        Err(e) => {
            println!("refused {} {e}", e.code());
            return;
        }
    };
    println!("registered {}", worker.slot());
    if mode == "clear" {
        worker.clear(Duration::from_secs(10)).unwrap();
        println!("cleared");
        worker.heartbeat().unwrap();
        println!("beating");
        // The test looks at what the clear did before the reset runs.
        std::io::stdin().read_line(&mut String::new()).unwrap();
        worker.reset(Duration::from_secs(10)).unwrap();
        println!("reset");
    }
    if mode == "quiet" {
        std::thread::sleep(Duration::from_secs(3600));
    }
    if mode == "hostile" {
        let region = map_region();
        // Its death word forged marked (`OWNER_DIED` and a thread id not
        // its own), at the offset docs/sessions.md gives.
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let death_word = livereg::table_size(1).div_ceil(page) * page + 128;
        // SAFETY: within the map, 4-byte aligned; volatile, as another
        // process reads it.
        unsafe { std::ptr::write_volatile(region.0.add(death_word).cast::<u32>(), 0x4000_0001) };
        println!("marked");
        std::io::stdin().read_line(&mut String::new()).unwrap();
        forge_region(region);
        println!("forged");
        std::thread::sleep(Duration::from_secs(3600));
    }
    let mut pings = 0u64;
    loop {
        match worker.heartbeat() {
            Ok(()) => {}
            Err(Error::Evicted { reason, .. }) => {
                println!("evicted {}", reason.map_or("?".into(), |r| r.to_string()));
                return;
            }
            Err(e) => panic!("{e}"),
        }
        pings += 1;
        if mode == "hang" && pings == 5 {
            println!("hanging");
            std::thread::sleep(Duration::from_secs(3600));
        }
        if mode == "fork" && pings == 5 {
            // SAFETY: the child calls only _exit; the parent waits for it.
            let child = unsafe { libc::fork() };
            if child == 0 {
                // SAFETY: _exit is async-signal-safe.
                unsafe { libc::_exit(0) };
            }
            assert!(child > 0, "fork failed");
            let mut status = 0;
            // SAFETY: waits for the child just forked.
            assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
            println!("forked");
        }
        if mode == "exit" && pings == 5 {
            worker.deregister().unwrap();
            println!("done");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The region its listener shared with this client, found among its
/// descriptors (a memfd named `livereg-session`) and mapped: its bytes and
/// its size.
fn map_region() -> (*mut u8, usize) {
    let region = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            target
                .to_string_lossy()
                .contains("livereg-session")
                .then(|| {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(entry.path())
                        .ok()
                })
                .flatten()
        })
        .next()
        .expect("a region among the client's descriptors");
    let size = region.metadata().unwrap().len() as usize;
    // SAFETY: a shared map of a file we opened, of its size.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&region),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    (base.cast(), size)
}

/// What a hostile client does to its region: writes every byte of it,
/// pass after pass: zeros, ones, a counting pattern, every 32-bit word
/// `OWNER_DIED` with another thread's id, every 64-bit word another
/// instance's id; for three seconds.
fn forge_region((bytes, size): (*mut u8, usize)) {
    let started = Instant::now();
    let mut pass = 0u64;
    while started.elapsed() < Duration::from_secs(3) {
        for offset in (0..size).step_by(4) {
            let word: u32 = match pass % 5 {
                0 => 0,
                1 => u32::MAX,
                2 => (offset as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(pass as u32),
                // OWNER_DIED, and the id of a thread of another process.
                3 => 0x4000_0000 | 1,
                // Another instance's id, as 64-bit words.
                _ => u32::from(offset % 8 == 0) * 99,
            };
            // SAFETY: `offset + 4 <= size`, within the map; volatile, as
            // another process reads it.
            unsafe { std::ptr::write_volatile(bytes.add(offset).cast::<u32>(), word) };
        }
        pass += 1;
    }
}

fn next_event(
    events: &mpsc::Receiver<(DropEvent, Instant)>,
    within: Duration,
) -> (DropEvent, Instant) {
    events.recv_timeout(within).expect("a drop event")
}

fn no_event(events: &mpsc::Receiver<(DropEvent, Instant)>, during: Duration) {
    if let Ok((event, _)) = events.recv_timeout(during) {
        panic!("unexpected drop: {event:?}");
    }
}

#[test]
fn an_isolated_client_killed_is_dropped_disconnected_at_once_over_unix_and_tcp() {
    let temp = TempTable::new("session-kill", &long_options());
    let socket = SocketPath::new("session-kill");
    let tcp = tcp_address();
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    reaper
        .listen(Address::parse(&tcp).unwrap(), Some(b"s3cret".to_vec()))
        .unwrap();
    for (instance, address, token) in [(1, socket.address(), None), (2, tcp, Some("s3cret"))] {
        let mut client = Isolated::spawn(&address, instance, "ping", token);
        client.line("registered");
        let status = temp.table.status().unwrap();
        let row = status
            .registrations
            .iter()
            .find(|r| r.instance_id == instance)
            .unwrap();
        let remote = row.remote.as_ref().expect("a remote registration");
        assert!(
            remote.peer.starts_with(address.split(':').next().unwrap()),
            "{remote:?}"
        );
        assert!(!remote.host.is_empty());
        assert!(remote.connected);
        std::thread::sleep(Duration::from_millis(100));
        let killed = Instant::now();
        client.signal(libc::SIGKILL);
        let (event, handled) = next_event(&events, Duration::from_secs(10));
        assert_eq!(
            (event.instance_id, event.reason),
            (instance, Reason::Disconnected)
        );
        // The 30 s timeout cannot explain it: the socket's closing did.
        assert!(
            handled - killed < Duration::from_secs(2),
            "{:?}",
            handled - killed
        );
    }
    reaper.stop().unwrap();
}

#[test]
fn an_isolated_client_that_deregisters_ends_deregistered() {
    let temp = TempTable::new("session-exit", &long_options());
    let socket = SocketPath::new("session-exit");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let mut client = Isolated::spawn(&socket.address(), 3, "exit", None);
    client.line("done");
    let (event, _) = next_event(&events, Duration::from_secs(10));
    assert_eq!((event.instance_id, event.reason), (3, Reason::Deregistered));
    no_event(&events, Duration::from_millis(300));
    reaper.stop().unwrap();
}

fn one_second() -> TableOptions {
    TableOptions {
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        ..TableOptions::default()
    }
}

#[test]
fn a_stopped_client_and_a_hung_engine_loop_time_out_within_bounds() {
    let temp = TempTable::new("session-silent", &one_second());
    let socket = SocketPath::new("session-silent");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let timeout = temp.table.reap_timeout();

    // SIGSTOP: the sender thread stops too, and pings of its last forward
    // interval (T/8) may not have left the process: the listener allows for
    // them, so the eviction is never before T from the stop (30 ms: a
    // sender starved past its slack), and within 1.25 T.
    let mut stopped = Isolated::spawn(&socket.address(), 4, "ping", None);
    stopped.line("registered");
    std::thread::sleep(Duration::from_millis(300));
    let stop = Instant::now();
    stopped.signal(libc::SIGSTOP);
    let (event, handled) = next_event(&events, Duration::from_secs(10));
    stopped.signal(libc::SIGCONT);
    assert_eq!((event.instance_id, event.reason), (4, Reason::Timeout));
    // The listener ended it; the event still says how long it was silent.
    assert!(event.silent_for >= timeout, "{event:?}");
    let after = handled - stop;
    assert!(after >= timeout - Duration::from_millis(30), "{after:?}");
    assert!(
        after <= timeout + timeout / 4 + Duration::from_millis(300),
        "{after:?}"
    );
    assert_eq!(stopped.line("evicted"), "evicted timeout");

    // A hung engine loop: the sender thread lives and keeps the
    // connection, but no heartbeat comes: timed from the last one.
    let mut hung = Isolated::spawn(&socket.address(), 5, "hang", None);
    hung.line("hanging");
    let last_ping = Instant::now();
    let (event, handled) = next_event(&events, Duration::from_secs(10));
    assert_eq!((event.instance_id, event.reason), (5, Reason::Timeout));
    assert!(event.silent_for >= timeout, "{event:?}");
    let after = handled - last_ping;
    assert!(after >= timeout - Duration::from_millis(30), "{after:?}");
    assert!(
        after <= timeout + timeout / 4 + Duration::from_millis(300),
        "{after:?}"
    );
    reaper.stop().unwrap();
}

/// A `unix:` client whose clock is not the reaper's (another time
/// namespace) beats in its region with stamps the reaper cannot read: it
/// is dated by when the reaper's scan sees its beat count change, as a
/// table registrant of another clock. Beating, it is never evicted;
/// stopped, it ends `timeout` no earlier than `T` and at most a scan later
/// than one of the reaper's clock.
#[test]
fn a_unix_client_of_another_clock_is_dated_by_its_beats_seen_and_evicted_within_bounds() {
    let temp = TempTable::new("session-other-clock", &one_second());
    let socket = SocketPath::new("session-other-clock");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let timeout = temp.table.reap_timeout();
    let mut client = Isolated::spawn_a_day_ahead(&socket.address(), 8, "ping");
    client.line("registered");
    let beating = events.recv_timeout(timeout * 3);
    assert!(
        beating.is_err(),
        "a beating client was evicted: {beating:?}"
    );
    let stop = Instant::now();
    client.signal(libc::SIGSTOP);
    let (event, handled) = next_event(&events, Duration::from_secs(10));
    client.signal(libc::SIGCONT);
    assert_eq!((event.instance_id, event.reason), (8, Reason::Timeout));
    let after = handled - stop;
    assert!(after >= timeout - Duration::from_millis(30), "{after:?}");
    assert!(
        after <= timeout + timeout / 2 + Duration::from_millis(300),
        "{after:?}"
    );
    assert_eq!(client.line("evicted"), "evicted timeout");
    reaper.stop().unwrap();
}

/// `status` says which sessions' deaths are seen as they begin: a `unix:`
/// client's (its death word held in its region), not a `tcp://` one's.
#[test]
fn status_shows_the_death_word_of_a_unix_session_and_none_for_tcp() {
    let temp = TempTable::new("session-death-word", &one_second());
    let socket = SocketPath::new("session-death-word");
    let tcp = tcp_address();
    let (reaper, _events) = with_events(&temp.table, &socket.address(), None);
    reaper
        .listen(Address::parse(&tcp).unwrap(), Some(b"s3cret".to_vec()))
        .unwrap();
    let mut unix = Isolated::spawn(&socket.address(), 31, "ping", None);
    let mut over_tcp = Isolated::spawn(&tcp, 32, "ping", Some("s3cret"));
    unix.line("registered");
    over_tcp.line("registered");
    let death_word = |instance| {
        temp.table
            .status()
            .unwrap()
            .registrations
            .iter()
            .find(|r| r.instance_id == instance)
            .map(|r| (r.death_word, r.exit_detection))
    };
    wait_for(|| death_word(31).is_some_and(|(held, _)| held));
    assert_eq!(
        death_word(31),
        Some((true, livereg::ExitDetection::Connection))
    );
    // Two scans later (each pulls every region), still none for tcp.
    let scans = temp.table.scans();
    wait_for(|| temp.table.scans() >= scans + 2);
    assert_eq!(
        death_word(32),
        Some((false, livereg::ExitDetection::Connection))
    );
    reaper.stop().unwrap();
}

#[test]
fn a_wrong_token_is_refused_and_registers_nothing() {
    let temp = TempTable::new("session-token", &long_options());
    let tcp = tcp_address();
    let (reaper, events) = with_events(&temp.table, &tcp, Some(b"right"));
    for token in [Some("wrong"), None] {
        let mut client = Isolated::spawn(&tcp, 6, "ping", token);
        let line = client.line("refused");
        assert!(
            line.starts_with("refused 8 wrong or missing token"),
            "{line}"
        );
    }
    assert!(temp.table.status().unwrap().registrations.is_empty());
    no_event(&events, Duration::from_millis(200));
    reaper.stop().unwrap();
}

#[test]
fn metrics_count_connected_sessions_and_the_handshakes_refused() {
    let temp = TempTable::new("session-metrics", &long_options());
    let socket = SocketPath::new("session-metrics");
    let (reaper, _events) = with_events(&temp.table, &socket.address(), Some(b"right"));
    let with = |token: &[u8]| ConnectOptions {
        token: Some(token.to_vec()),
        ..ConnectOptions::default()
    };
    let refused = connect(&socket.address(), 3, "w", &with(b"wrong")).unwrap_err();
    assert_eq!(refused.code(), 8, "{refused}");
    let worker = connect(&socket.address(), 4, "w", &with(b"right")).unwrap();
    let process = livereg::ProcessMetrics {
        session_refusals: Some(reaper.session_refusals()),
        etcd_connected: Some(false),
    };
    let text = temp.table.metrics_text_with(&process).unwrap();
    let t = format!("table=\"{}\"", temp.table.name());
    for line in [
        format!("livereg_sessions{{{t},state=\"connected\"}} 1"),
        format!("livereg_sessions{{{t},state=\"away\"}} 0"),
        format!("livereg_sessions_refused_total{{{t},code=\"PERMISSION\"}} 1"),
        format!("livereg_sessions_refused_total{{{t},code=\"BUSY\"}} 0"),
        format!("livereg_etcd_connected{{{t}}} 0"),
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    assert!(
        text.contains("livereg_reaper_heartbeat_age_seconds{"),
        "{text}"
    );
    // The table alone (any process): sessions, but not the reaper's refusals.
    let alone = temp.table.metrics_text().unwrap();
    assert!(alone.contains("livereg_sessions{") && !alone.contains("sessions_refused"));
    drop(worker);
    reaper.stop().unwrap();
}

#[test]
fn a_tcp_listener_needs_a_token() {
    let temp = TempTable::new("session-needs-token", &long_options());
    let tcp = tcp_address();
    let Err(error) = temp
        .table
        .reaper()
        .listen(Address::parse(&tcp).unwrap(), None)
        .build()
    else {
        panic!("a tcp:// listener started without a token");
    };
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    assert!(error.to_string().contains("needs a token"), "{error}");
}

#[test]
fn a_live_id_is_refused_exists_and_its_holder_is_untouched() {
    let temp = TempTable::new("session-exists", &long_options());
    let socket = SocketPath::new("session-exists");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let first = connect(&socket.address(), 7, "first", &ConnectOptions::default()).unwrap();
    let mut second = Isolated::spawn(&socket.address(), 7, "ping", None);
    assert!(second.line("refused").starts_with("refused 3 "));
    let local = temp.table.register(7, "local").unwrap_err();
    assert!(matches!(local, Error::Exists { .. }), "{local}");
    first.heartbeat().unwrap();
    no_event(&events, Duration::from_millis(300));
    first.heartbeat().unwrap();
    first.deregister().unwrap();
    let (event, _) = next_event(&events, Duration::from_secs(5));
    assert_eq!((event.instance_id, event.reason), (7, Reason::Deregistered));
    reaper.stop().unwrap();
}

#[test]
fn a_reset_reaches_remote_workers_and_info_is_delivered() {
    let temp = TempTable::new("session-reset", &long_options());
    let socket = SocketPath::new("session-reset");
    temp.table.set_info(b"chunk=256").unwrap();
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let worker = connect(&socket.address(), 8, "w", &ConnectOptions::default()).unwrap();
    assert_eq!(worker.info().unwrap(), b"chunk=256");
    temp.table.set_info(b"chunk=512").unwrap();
    wait_for(|| worker.info().unwrap() == b"chunk=512");
    temp.table.reset(Duration::from_secs(5)).unwrap();
    let (event, _) = next_event(&events, Duration::from_secs(5));
    assert_eq!((event.instance_id, event.reason), (8, Reason::Cleared));
    wait_for(|| worker.heartbeat().is_err());
    match worker.heartbeat() {
        Err(Error::Evicted { reason, .. }) => assert_eq!(reason, Some(Reason::Cleared)),
        other => panic!("{other:?}"),
    }
    reaper.stop().unwrap();
}

#[test]
fn an_isolated_engine_clears_and_resets_the_table_through_its_session() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    let temp = TempTable::new("session-clear", &long_options());
    let tcp = tcp_address();
    let clears = Arc::new(AtomicU32::new(0));
    let slow = Arc::new(AtomicBool::new(false));
    let (sender, events) = mpsc::channel();
    let reaper = {
        let (clears, slow) = (clears.clone(), slow.clone());
        temp.table
            .reaper()
            .on_drop(move |event| Ok(sender.send(event.clone())?))
            .on_clear(move || {
                if slow.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1500));
                }
                clears.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .listen(Address::parse(&tcp).unwrap(), Some(b"s3cret".to_vec()))
            .spawn()
            .unwrap()
    };
    let local = temp.table.register(20, "local").unwrap();
    let token = |t: &[u8]| ConnectOptions {
        token: Some(t.to_vec()),
        ..ConnectOptions::default()
    };

    // A clear from a container: the clear handlers run, nobody is evicted.
    let mut engine = Isolated::spawn(&tcp, 21, "clear", Some("s3cret"));
    engine.line("registered");
    engine.line("cleared");
    assert_eq!(clears.load(Ordering::SeqCst), 1);
    engine.line("beating");
    local.heartbeat().unwrap();
    assert!(events.try_recv().is_err(), "a clear evicts nobody");

    // Its reset ends every registration, its own too, then clears.
    engine.go();
    engine.line("reset");
    assert_eq!(clears.load(Ordering::SeqCst), 2);
    let mut ended: Vec<(u64, Reason)> = (0..2)
        .map(|_| {
            let event = events.recv_timeout(Duration::from_secs(5)).unwrap();
            (event.instance_id, event.reason)
        })
        .collect();
    ended.sort();
    assert_eq!(ended, [(20, Reason::Cleared), (21, Reason::Cleared)]);
    assert_eq!(engine.line("evicted"), "evicted cleared");
    assert!(matches!(
        local.heartbeat(),
        Err(Error::Evicted {
            reason: Some(Reason::Cleared),
            ..
        })
    ));

    // A wrong token clears nothing; a clear slower than the wait times out.
    let refused = livereg::remote_clear(&tcp, Duration::from_secs(5), &token(b"wrong"));
    assert!(matches!(refused, Err(Error::Permission(_))), "{refused:?}");
    assert_eq!(clears.load(Ordering::SeqCst), 2);
    slow.store(true, Ordering::SeqCst);
    let late = livereg::remote_clear(&tcp, Duration::from_millis(200), &token(b"s3cret"));
    match late {
        Err(Error::Timeout(message)) => assert!(message.contains("clear"), "{message}"),
        other => panic!("{other:?}"),
    }
    slow.store(false, Ordering::SeqCst);
    livereg::remote_clear(&tcp, Duration::from_secs(10), &token(b"s3cret")).unwrap();
    assert!(clears.load(Ordering::SeqCst) >= 3);
    reaper.stop().unwrap();
}

#[test]
fn a_reaper_restarted_within_the_timeout_loses_nothing_and_one_gone_longer_is_heard() {
    let temp = TempTable::new("session-restart", &one_second());
    let socket = SocketPath::new("session-restart");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let worker = connect(&socket.address(), 9, "w", &ConnectOptions::default()).unwrap();
    let slot = (worker.slot(), worker.generation());
    worker.heartbeat().unwrap();
    reaper.stop().unwrap();
    // Gone for half the timeout, back on the same socket.
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        worker.heartbeat().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let (reaper, events_after) = with_events(&temp.table, &socket.address(), None);
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        worker.heartbeat().expect("pings go on through the restart");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!((worker.slot(), worker.generation()), slot);
    assert!(events.try_recv().is_err());
    assert!(events_after.try_recv().is_err(), "no handler ran");
    // Now gone for longer than the timeout: the client hears it.
    reaper.stop().unwrap();
    let gone = Instant::now();
    wait_for(|| worker.heartbeat().is_err());
    assert!(
        gone.elapsed() >= Duration::from_millis(900),
        "{:?}",
        gone.elapsed()
    );
    match worker.heartbeat() {
        Err(Error::Evicted { reason, .. }) => assert_eq!(reason, Some(Reason::Disconnected)),
        other => panic!("{other:?}"),
    }
    // And the next reaper ends the registration nobody reclaimed.
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let (event, _) = next_event(&events, Duration::from_secs(5));
    assert_eq!((event.instance_id, event.reason), (9, Reason::Disconnected));
    reaper.stop().unwrap();
}

fn wait_for(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_silent_or_garbled_connection_is_closed_and_the_table_holds_at_most_capacity_sessions() {
    use std::io::{Read, Write};
    let temp = TempTable::new(
        "session-limits",
        &TableOptions {
            capacity: 2,
            ..long_options()
        },
    );
    let socket = SocketPath::new("session-limits");
    let (reaper, _events) = with_events(&temp.table, &socket.address(), None);
    // Says nothing: closed after the 2 s handshake deadline.
    let mut silent = std::os::unix::net::UnixStream::connect(&socket.0).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let opened = Instant::now();
    assert_eq!(silent.read(&mut [0u8; 16]).unwrap(), 0, "closed");
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // A frame over the cap: closed at once, nothing registered.
    let mut garbled = std::os::unix::net::UnixStream::connect(&socket.0).unwrap();
    garbled.write_all(&[0xFF, 0xFF, 0xFF, 0xFF, 1]).unwrap();
    garbled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(garbled.read(&mut [0u8; 16]).unwrap_or(0), 0);
    assert!(temp.table.status().unwrap().registrations.is_empty());
    // Two sessions fill the table; a third is refused, naming why.
    let options = ConnectOptions::default();
    let _one = connect(&socket.address(), 1, "", &options).unwrap();
    let _two = connect(&socket.address(), 2, "", &options).unwrap();
    let third = connect(&socket.address(), 3, "", &options).unwrap_err();
    assert!(matches!(third, Error::Full { .. }), "{third}");
    reaper.stop().unwrap();
}

#[test]
fn a_busy_session_without_progress_ends_stalled_and_the_socket_is_mode_0660() {
    use std::os::unix::fs::PermissionsExt;
    let temp = TempTable::new(
        "session-stall",
        &TableOptions {
            reap_timeout: Duration::from_secs(2),
            registration_grace: Duration::from_secs(4),
            progress_timeout: Duration::from_secs(1),
            ..TableOptions::default()
        },
    );
    let socket = SocketPath::new("session-stall");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let mode = std::fs::metadata(&socket.0).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660, "{mode:o}");
    let worker = connect(&socket.address(), 10, "engine", &ConnectOptions::default()).unwrap();
    worker.set_busy(true).unwrap();
    worker.progress().unwrap();
    // Beating on, busy, no more progress: the engine is stuck.
    let until = Instant::now() + Duration::from_secs(10);
    let event = loop {
        let _ = worker.heartbeat();
        if let Ok((event, _)) = events.recv_timeout(Duration::from_millis(20)) {
            break event;
        }
        assert!(Instant::now() < until, "never ended");
    };
    assert_eq!((event.instance_id, event.reason), (10, Reason::Stalled));
    wait_for(|| worker.heartbeat().is_err());
    match worker.heartbeat() {
        Err(Error::Evicted { reason, .. }) => assert_eq!(reason, Some(Reason::Stalled)),
        other => panic!("{other:?}"),
    }
    reaper.stop().unwrap();
}

#[test]
fn a_session_that_went_idle_while_its_reaper_was_away_is_idle_after_the_reclaim() {
    let temp = TempTable::new(
        "session-reclaim-idle",
        &TableOptions {
            reap_timeout: Duration::from_secs(2),
            registration_grace: Duration::from_secs(4),
            progress_timeout: Duration::from_secs(1),
            ..TableOptions::default()
        },
    );
    let socket = SocketPath::new("session-reclaim-idle");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let worker = connect(&socket.address(), 11, "engine", &ConnectOptions::default()).unwrap();
    worker.set_busy(true).unwrap();
    worker.progress().unwrap();
    std::thread::sleep(Duration::from_millis(400)); // forwarded: the slot is busy
    reaper.stop().unwrap();
    worker.set_busy(false).unwrap(); // done while the reaper is away
    let (reaper, events_after) = with_events(&temp.table, &socket.address(), None);
    // Idle, beating, for well past the progress timeout: never stalled.
    let until = Instant::now() + Duration::from_millis(3000);
    while Instant::now() < until {
        worker.heartbeat().expect("an idle engine is never stalled");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(events.try_recv().is_err() && events_after.try_recv().is_err());
    let row = &temp.table.status().unwrap().registrations[0];
    assert!(!row.busy, "{row:?}");
    reaper.stop().unwrap();
}

/// A build without the `tls` feature still takes a `tls://` address, and
/// answers it in one line saying how to get a build with TLS.
#[cfg(not(feature = "tls"))]
#[test]
fn without_the_tls_feature_a_tls_address_says_how_to_get_it() {
    let temp = TempTable::new("no-tls", &long_options());
    let certificate = livereg::TlsServer {
        cert: "/nonexistent/cert.pem".into(),
        key: "/nonexistent/key.pem".into(),
        client_ca: None,
    };
    let refused = temp
        .table
        .reaper()
        .listen(
            Address::parse("tls://127.0.0.1:0").unwrap(),
            Some(b"t".to_vec()),
        )
        .tls(certificate)
        .spawn()
        .map(drop)
        .unwrap_err();
    let options = ConnectOptions {
        tls: Some(livereg::TlsClient {
            ca: "/nonexistent/ca.pem".into(),
            ..livereg::TlsClient::default()
        }),
        ..ConnectOptions::default()
    };
    let refused_too = connect("tls://127.0.0.1:1", 1, "w", &options)
        .map(drop)
        .unwrap_err();
    for error in [refused, refused_too] {
        let line = error.to_string();
        assert!(matches!(error, Error::InvalidArgument(_)), "{line}");
        assert!(
            line.contains("--features tls") && !line.contains('\n'),
            "{line}"
        );
    }
    const { assert!(!livereg::TLS_BUILT_IN) };
}

#[test]
fn a_workers_table_is_the_one_its_slot_is_in() {
    let temp = TempTable::new("slot-table", &long_options());
    let socket = SocketPath::new("slot-table");
    let (reaper, _events) = with_events(&temp.table, &socket.address(), None);
    let local = temp.table.register(1, "local").unwrap();
    let table = local.table().expect("a local worker's table is here");
    assert_eq!(table.name(), temp.table.name());
    let listed = table.status().unwrap();
    assert!(listed.registrations.iter().any(|r| r.slot == local.slot()));
    // A session's slot is in the reaper's table, which this process has
    // not mapped: no table to answer with.
    let remote = connect(&socket.address(), 2, "w", &ConnectOptions::default()).unwrap();
    assert!(remote.is_remote() && remote.table().is_none());
    let status = temp.table.status().unwrap();
    let held = status.registrations.iter().find(|r| r.instance_id == 2);
    assert_eq!(held.map(|r| r.slot), Some(remote.slot()));
    remote.deregister().unwrap();
    local.deregister().unwrap();
    reaper.stop().unwrap();
}

#[test]
fn a_local_registrant_waiting_on_another_process_never_freezes_the_listener() {
    let temp = TempTable::new("session-local-wait", &one_second());
    let socket = SocketPath::new("session-local-wait");
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    let beating = connect(&socket.address(), 1, "w", &ConnectOptions::default()).unwrap();
    let held = hold_registration_lock(&temp.name);
    std::thread::scope(|scope| {
        // A thread of the reaper's own process registers (and one sets its
        // info) while the lock is held elsewhere: each waits up to 5 s.
        let registrant = scope.spawn(|| temp.table.register(2, "local"));
        let publisher = scope.spawn(|| temp.table.set_info(b"{}"));
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let refused = connect(&socket.address(), 3, "w", &ConnectOptions::default())
            .map(drop)
            .unwrap_err();
        let answered = started.elapsed();
        assert!(matches!(refused, Error::Busy { .. }), "{refused}");
        assert!(answered < Duration::from_secs(1), "BUSY after {answered:?}");
        // Three timeouts of beats: the listener keeps going round its loop.
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            beating.heartbeat().unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        no_event(&events, Duration::ZERO);
        drop(held);
        // The registrant (still within its wait, or refused BUSY after 5 s)
        // ends either way; the lock is free now.
        match registrant.join().unwrap() {
            Ok(worker) => worker.deregister().unwrap(),
            Err(e) => assert!(matches!(e, Error::Busy { .. }), "{e}"),
        }
        if let Err(e) = publisher.join().unwrap() {
            assert!(matches!(e, Error::Busy { .. }), "{e}");
        }
    });
    let admitted = connect(&socket.address(), 3, "w", &ConnectOptions::default()).unwrap();
    admitted.deregister().unwrap();
    beating.deregister().unwrap();
    reaper.stop().unwrap();
}

/// Starts a reaper with a listener on `temp`'s table and returns why it
/// was refused.
fn listener_refused(temp: &TempTable, socket: &SocketPath) -> Error {
    match temp
        .table
        .reaper()
        .listen(Address::parse(&socket.address()).unwrap(), None)
        .spawn()
    {
        Ok(reaper) => {
            reaper.stop().unwrap();
            panic!("the listener started")
        }
        Err(e) => e,
    }
}

#[test]
fn a_planted_symlink_or_foreign_file_beside_the_table_is_refused_and_never_written() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let temp = TempTable::new("session-planted", &long_options());
    let socket = SocketPath::new("session-planted");
    let beside = format!("/dev/shm/{}.sessions", temp.name);
    // (In /dev/shm, so that a hard link to it can be planted too.)
    let victim_name = format!("{}.victim", unique_name("planted"));
    let _removed = common::UnlinkOnDrop(victim_name.clone()); // even if the test fails
    let victim = format!("/dev/shm/{victim_name}");
    std::fs::write(&victim, b"root's own").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A symbolic link to another file: never followed.
    std::os::unix::fs::symlink(&victim, &beside).unwrap();
    let refused = listener_refused(&temp, &socket).to_string();
    assert!(
        refused.contains(&beside) && refused.contains("symbolic link"),
        "{refused}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's own");
    std::fs::remove_file(&beside).unwrap();

    // A file another user made, open to everyone: its secrets would be theirs.
    std::fs::write(&beside, b"").unwrap();
    std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&beside, Some(65534), Some(65534)).unwrap();
    let refused = listener_refused(&temp, &socket).to_string();
    assert!(
        refused.contains(&beside) && refused.contains("owned by uid 65534"),
        "{refused}"
    );
    assert_eq!(
        std::fs::metadata(&beside).unwrap().len(),
        0,
        "written through"
    );
    std::fs::remove_file(&beside).unwrap();

    // A second name of another file (a hard link planted where the records go).
    std::fs::hard_link(&victim, &beside).unwrap();
    let refused = listener_refused(&temp, &socket).to_string();
    assert!(refused.contains("linked under 2 names"), "{refused}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's own");
    std::fs::remove_file(&beside).unwrap();

    // With nothing planted, the listener makes its own, mode 0600.
    let reaper = temp
        .table
        .reaper()
        .listen(Address::parse(&socket.address()).unwrap(), None)
        .spawn()
        .unwrap();
    assert_eq!(std::fs::metadata(&beside).unwrap().mode() & 0o777, 0o600);
    reaper.stop().unwrap();
}

#[test]
fn a_symlink_planted_at_a_table_name_is_not_followed() {
    let temp = TempTable::new("planted-table", &long_options());
    let link = unique_name("planted-link");
    std::os::unix::fs::symlink(
        format!("/dev/shm/{}", temp.name),
        format!("/dev/shm/{link}"),
    )
    .unwrap();
    let refused = livereg::Table::open(&link).map(drop).unwrap_err();
    let _ = std::fs::remove_file(format!("/dev/shm/{link}"));
    assert!(matches!(refused, Error::Permission(_)), "{refused}");
    assert!(refused.to_string().contains("symbolic link"), "{refused}");
}

#[test]
fn a_client_frozen_while_reconnecting_reclaims_from_a_reaper_that_came_after_the_thaw() {
    let temp = TempTable::new("session-frozen-reconnect", &one_second());
    let socket = SocketPath::new("session-frozen-reconnect");
    let (reaper, _) = with_events(&temp.table, &socket.address(), None);
    let mut client = Isolated::spawn(&socket.address(), 11, "ping", None);
    client.line("registered");
    // The reaper goes; the client's sender backs off between dials, and is
    // stopped there for 2.5 timeouts.
    reaper.stop().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    client.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    client.signal(libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(100));
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    // The thawed client reclaims its registration: nothing ends, for twice
    // the timeout.
    no_event(&events, Duration::from_secs(2));
    let live = temp.table.status().unwrap();
    assert_eq!(live.tracked_instances, 1, "{live:?}");
    // Held by the new listener: its socket's closing is its end.
    client.signal(libc::SIGKILL);
    let (event, _) = next_event(&events, Duration::from_secs(5));
    assert_eq!(
        (event.instance_id, event.reason),
        (11, Reason::Disconnected)
    );
    reaper.stop().unwrap();
}

#[test]
fn a_timeout_ended_by_a_listener_reports_its_silence_to_the_reaper_that_drops_it() {
    let temp = TempTable::new("session-silence-handed-over", &one_second());
    // A reaper whose listener ends the session, and which dies before any
    // scan of it handles the drop. (Over `tcp://`: a `unix:` client beats
    // in a region, which the scans judge.)
    let tcp = tcp_address();
    let first = temp
        .table
        .reaper()
        .listen(Address::parse(&tcp).unwrap(), Some(b"s3cret".to_vec()))
        .build()
        .unwrap();
    let options = ConnectOptions {
        token: Some(b"s3cret".to_vec()),
        ..ConnectOptions::default()
    };
    let worker = connect(&tcp, 21, "w", &options).unwrap();
    worker.heartbeat().unwrap();
    let last_beat = Instant::now();
    // The engine loop hangs; the sender tells the listener, which ends it.
    wait_for(|| {
        temp.table
            .status()
            .unwrap()
            .registrations
            .iter()
            .any(|r| r.instance_id == 21 && r.state == livereg::RegistrationState::Ending)
    });
    let silent = last_beat.elapsed();
    drop(first);
    let (sender, events) = mpsc::channel();
    let mut second = temp
        .table
        .reaper()
        .on_drop(move |event| Ok(sender.send(event.clone())?))
        .build()
        .unwrap();
    second.scan().unwrap();
    let event = events.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((event.instance_id, event.reason), (21, Reason::Timeout));
    let timeout = temp.table.reap_timeout();
    assert!(
        event.silent_for >= timeout && event.silent_for <= silent + Duration::from_secs(1),
        "{event:?}, ended after {silent:?} of silence"
    );
}

/// A listener that refuses the question's version after most of its
/// timeout, then never answers the previous version's: the question still
/// ends within its timeout in all, not twice it.
#[test]
fn a_question_asked_again_in_the_previous_version_ends_within_its_timeout() {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("tcp://{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (mut first, _) = listener.accept().unwrap();
        let _ = first.read(&mut [0u8; 1024]);
        std::thread::sleep(Duration::from_millis(1600));
        let refusal = livereg::wire::Frame::Refused {
            code: Error::Incompatible(String::new()).code() as u8,
            message: "session protocol version 99, this reaper speaks 1 to 1: upgrade the reaper"
                .into(),
            reason: None,
        };
        let _ = first.write_all(&refusal.encode());
        // The second try is read and never answered.
        let (mut second, _) = listener.accept().unwrap();
        let _ = second.read(&mut [0u8; 1024]);
        std::thread::sleep(Duration::from_secs(3));
    });
    let options = ConnectOptions {
        token: Some(b"t".to_vec()),
        connect_timeout: Some(Duration::from_secs(2)),
        ..ConnectOptions::default()
    };
    let started = Instant::now();
    let error = livereg::remote_status(&address, Some(1), &options).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, Error::Timeout(_)), "{error}");
    assert!(
        took < Duration::from_millis(3000),
        "answered after {took:?}"
    );
    server.join().unwrap();
}

#[test]
fn a_client_stopped_before_its_first_beat_ends_timeout_over_frames_and_grace_in_a_region() {
    let temp = TempTable::new("session-never-beat", &one_second());
    let socket = SocketPath::new("session-never-beat");
    let tcp = tcp_address();
    let (reaper, events) = with_events(&temp.table, &socket.address(), None);
    reaper
        .listen(Address::parse(&tcp).unwrap(), Some(b"s3cret".to_vec()))
        .unwrap();
    let (timeout, grace) = (temp.table.reap_timeout(), Duration::from_secs(3));
    // Registered, its engine never beats (the slot holds no beat at all),
    // then stopped. Over `tcp://` its sender's forwards were its signals:
    // its listener ends it `timeout` once unheard, long before the grace.
    // Over `unix:` it beats in a region the reaper reads as a table
    // registration: no beat, so judged by the registration grace.
    for (instance, address, token, reason, budget) in [
        (6, tcp.as_str(), Some("s3cret"), Reason::Timeout, timeout),
        (7, socket.address().as_str(), None, Reason::Grace, grace),
    ] {
        let spawned = Instant::now();
        let mut quiet = Isolated::spawn(address, instance, "quiet", token);
        quiet.line("registered");
        std::thread::sleep(Duration::from_millis(200));
        quiet.signal(libc::SIGSTOP);
        let (event, handled) = next_event(&events, Duration::from_secs(10));
        quiet.signal(libc::SIGCONT);
        assert_eq!((event.instance_id, event.reason), (instance, reason));
        assert_eq!(event.last_heartbeat_ns, None, "{event:?}");
        // Its silence counts from its registration, its last signal (made
        // after the spawn).
        assert!(
            event.silent_for >= budget && event.silent_for <= handled - spawned,
            "{event:?}, handled {:?} after the spawn",
            handled - spawned
        );
    }
    reaper.stop().unwrap();
}

/// A reaper listening at `address` that sends every dying and drop event,
/// tagged, on one channel.
fn with_dying_and_drops(
    table: &livereg::Table,
    address: &str,
) -> (
    livereg::ReaperThread,
    mpsc::Receiver<(&'static str, DropEvent, Instant)>,
) {
    let (sender, events) = mpsc::channel();
    let dying = sender.clone();
    let reaper = table
        .reaper()
        .on_dying(move |event| Ok(dying.send(("dying", event.clone(), Instant::now()))?))
        .on_drop(move |event| Ok(sender.send(("drop", event.clone(), Instant::now()))?))
        .listen(Address::parse(address).unwrap(), None)
        .spawn()
        .unwrap();
    (reaper, events)
}

#[test]
fn an_isolated_unix_client_killed_is_dying_before_its_socket_closes_and_a_tcp_one_is_not() {
    let temp = TempTable::new("session-dying", &long_options());
    let socket = SocketPath::new("session-dying");
    let tcp = tcp_address();
    let (reaper, events) = with_dying_and_drops(&temp.table, &socket.address());
    reaper
        .listen(Address::parse(&tcp).unwrap(), Some(b"s3cret".to_vec()))
        .unwrap();
    for (instance, address, token) in [(1, socket.address(), None), (2, tcp, Some("s3cret"))] {
        let mut client = Isolated::spawn(&address, instance, "ping", token);
        client.line("registered");
        // Time for its death thread to claim the region's word.
        std::thread::sleep(Duration::from_millis(500));
        let killed = Instant::now();
        client.signal(libc::SIGKILL);
        let (kind, event, _) = events.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(event.instance_id, instance);
        if instance == 1 {
            assert_eq!(kind, "dying", "{event:?}");
            assert_eq!(event.reason, Reason::ProcessExited);
            let (kind, event, handled) = events.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!((kind, event.instance_id), ("drop", instance));
            assert_eq!(event.reason, Reason::Disconnected);
            assert!(
                handled - killed < Duration::from_secs(2),
                "{:?}",
                handled - killed
            );
        } else {
            // Over tcp: nothing is shared; the close says it.
            assert_eq!((kind, event.reason), ("drop", Reason::Disconnected));
        }
    }
    reaper.stop().unwrap();
    assert!(events.try_recv().is_err(), "more events than the kills");
}

#[test]
fn an_isolated_unix_client_whose_forked_child_exits_is_not_dying() {
    let temp = TempTable::new("session-fork", &long_options());
    let socket = SocketPath::new("session-fork");
    let (reaper, events) = with_dying_and_drops(&temp.table, &socket.address());
    let mut client = Isolated::spawn(&socket.address(), 3, "fork", None);
    client.line("registered");
    client.line("forked");
    if let Ok((kind, event, _)) = events.recv_timeout(Duration::from_secs(2)) {
        panic!("a {kind} event after a forked child exited: {event:?}");
    }
    assert!(temp
        .table
        .status()
        .unwrap()
        .registrations
        .iter()
        .any(|r| r.instance_id == 3));
    // Its own death is seen: the word was there to mark.
    client.signal(libc::SIGKILL);
    let (kind, event, _) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((kind, event.instance_id), ("dying", 3));
    let (kind, _, _) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(kind, "drop");
    reaper.stop().unwrap();
}

#[test]
fn a_client_writing_every_byte_of_its_region_changes_nothing_but_its_own_registration() {
    let temp = TempTable::new("session-hostile", &long_options());
    let socket = SocketPath::new("session-hostile");
    let (reaper, events) = with_dying_and_drops(&temp.table, &socket.address());
    let local = temp.table.register(40, "local").unwrap();
    let mut honest = Isolated::spawn(&socket.address(), 41, "ping", None);
    honest.line("registered");
    let mut hostile = Isolated::spawn(&socket.address(), 42, "hostile", None);
    hostile.line("registered");
    // Its forged death word: its own registration is reported dying, and
    // status says so, while it runs; nothing of another's.
    hostile.line("marked");
    let (kind, event, _) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((kind, event.instance_id), ("dying", 42), "{event:?}");
    let status = temp.table.status().unwrap();
    assert!(
        status
            .registrations
            .iter()
            .any(|r| r.instance_id == 42 && r.state == livereg::RegistrationState::Dying),
        "{status:?}"
    );
    hostile.go();
    // While it forges: the listener serves new sessions, the others live.
    let started = Instant::now();
    let mut served = 0;
    while started.elapsed() < Duration::from_secs(2) {
        let worker = connect(
            &socket.address(),
            50 + served,
            "probe",
            &ConnectOptions::default(),
        )
        .expect("the listener serves while a client forges its region");
        worker.heartbeat().unwrap();
        worker.deregister().unwrap();
        served += 1;
        local.heartbeat().unwrap();
    }
    hostile.line("forged");
    assert!(served > 0);
    let mut seen = Vec::new();
    while let Ok((kind, event, _)) = events.recv_timeout(Duration::from_secs(1)) {
        seen.push((kind, event.instance_id, event.reason));
    }
    for (kind, instance, reason) in &seen {
        assert!(
            *instance == 42
                || (*kind == "drop" && *instance >= 50 && *reason == Reason::Deregistered),
            "an event of another registration: {seen:?}"
        );
    }
    // Reported dying once, whatever its word said since.
    assert!(
        !seen.iter().any(|(kind, _, _)| *kind == "dying"),
        "{seen:?}"
    );
    let status = temp.table.status().unwrap();
    for live in [40, 41] {
        assert!(
            status
                .registrations
                .iter()
                .any(|r| r.instance_id == live && r.state == livereg::RegistrationState::Live),
            "instance {live} not live: {status:?}"
        );
    }
    // The forger's registration is its own: it ends when it goes.
    drop(hostile);
    let deadline = Instant::now() + Duration::from_secs(10);
    while temp
        .table
        .status()
        .unwrap()
        .registrations
        .iter()
        .any(|r| r.instance_id == 42)
    {
        assert!(
            Instant::now() < deadline,
            "the forger's registration never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    local.deregister().unwrap();
    reaper.stop().unwrap();
}

/// Reads what a listener sent on `socket` with `recvmsg`, keeping the
/// descriptor that came with it (a region's memfd).
fn receive_with_fd(
    socket: &std::os::unix::net::UnixStream,
    buf: &mut [u8],
) -> (usize, Option<std::os::fd::OwnedFd>) {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 16];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `message` names `buf` and `control`, live for the call.
    let read = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, 0) };
    assert!(read > 0, "recvmsg: {}", std::io::Error::last_os_error());
    // SAFETY: the kernel filled the control bytes; an SCM_RIGHTS header's
    // data holds a descriptor now open in this process.
    let fd = unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (!header.is_null() && (*header).cmsg_type == libc::SCM_RIGHTS).then(|| {
            std::os::fd::OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                libc::CMSG_DATA(header).cast::<libc::c_int>(),
            ))
        })
    };
    (read as usize, fd)
}

#[test]
fn a_unix_client_beating_in_its_region_sends_no_frame_and_is_sent_none() {
    use livereg::wire::{Frame, VERSION};
    use std::io::Read;
    let temp = TempTable::new("session-region-raw", &one_second());
    let socket = SocketPath::new("session-region-raw");
    let reaper = temp
        .table
        .reaper()
        .listen(Address::parse(&socket.address()).unwrap(), None)
        .spawn()
        .unwrap();
    let mut stream = std::os::unix::net::UnixStream::connect(&socket.0).unwrap();
    let hello = Frame::Hello {
        version: VERSION,
        instance_id: 70,
        pid: std::process::id(),
        token: Vec::new(),
        label: "raw".into(),
        host: "here".into(),
        reclaim: None,
    };
    std::io::Write::write_all(&mut stream, &hello.encode()).unwrap();
    // The welcome, and the region's memfd with it.
    let mut bytes = vec![0u8; 8192];
    let (mut have, mut region) = (0, None);
    let region_bytes = loop {
        let (n, fd) = receive_with_fd(&stream, &mut bytes[have..]);
        have += n;
        region = region.or(fd);
        match Frame::decode(&bytes[..have]).unwrap() {
            Some((Frame::Welcome { region_bytes, .. }, _)) => break region_bytes,
            Some((Frame::Info { .. }, used)) => {
                bytes.drain(..used);
                have -= used;
            }
            Some((other, _)) => panic!("expected a welcome, found {other:?}"),
            None => {}
        }
    };
    let region = std::fs::File::from(region.expect("a memfd with the welcome"));
    assert_eq!(region.metadata().unwrap().len(), region_bytes);
    // The layout docs/sessions.md gives: a table of one slot (its slot at
    // HEADER_SIZE, the beat count 16 bytes in), then, a page further, the
    // death words (128 + 16 + 16 bytes) and the sender's pulse.
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let death_offset = livereg::table_size(1).div_ceil(page) * page;
    // SAFETY: a shared map of the region, of its size.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            region_bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&region),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: both words are inside the map, 8-byte aligned; atomics, as
    // the listener reads them.
    let (beats, pulse) = unsafe {
        (
            &*base
                .cast::<u8>()
                .add(livereg::HEADER_SIZE + 16)
                .cast::<std::sync::atomic::AtomicU64>(),
            &*base
                .cast::<u8>()
                .add(death_offset + 160)
                .cast::<std::sync::atomic::AtomicU64>(),
        )
    };
    // Three reap timeouts of beats as stores: no frame sent, none heard.
    stream.set_nonblocking(true).unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        beats.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        pulse.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        match stream.read(&mut bytes) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the listener sent something: {other:?}"),
        }
    }
    let status = temp.table.status().unwrap();
    let row = status
        .registrations
        .iter()
        .find(|r| r.instance_id == 70)
        .expect("alive after three timeouts of beats without frames");
    assert!(row.heartbeats > 0, "{row:?}");
    assert_eq!(row.state, livereg::RegistrationState::Live);
    // Its beats stop: it times out, as a local registration would.
    let stopped = Instant::now();
    let ended = loop {
        let mut byte = [0u8; 64];
        match stream.read(&mut byte) {
            Ok(n) if n > 0 => break Frame::decode(&byte[..n]).unwrap(),
            Ok(_) => panic!("closed without a word"),
            Err(_) => {}
        }
        assert!(stopped.elapsed() < Duration::from_secs(10), "never ended");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        matches!(
            ended,
            Some((
                Frame::Ended {
                    reason: Reason::Timeout
                },
                _
            ))
        ),
        "{ended:?}"
    );
    assert!(
        stopped.elapsed() >= Duration::from_millis(900),
        "{:?}",
        stopped.elapsed()
    );
    // SAFETY: the map made above, unmapped once.
    unsafe { libc::munmap(base, region_bytes as usize) };
    reaper.stop().unwrap();
}
