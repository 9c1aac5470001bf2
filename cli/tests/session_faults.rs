//! Sessions through the faults real nodes have: a reaper stopped and
//! resumed, a reaper restarted within the timeout, a path that silently
//! drops everything (a partition: no FIN, no RST), a reset, and a heap
//! table's reaper replaced. Nobody alive is lost; whoever is cut off hears
//! so within a few timeouts.

#[path = "../../tests/common/attack.rs"]
mod attack;
#[path = "../../tests/common/mod.rs"]
mod common;

use attack::{open, say_hello, Daemon, TOKEN};
use common::{hold_registration_lock, unique_name, TempTable};
use livereg::wire::Frame;
use livereg::{connect, Address, ConnectOptions, Error, Reason, Table, TableOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_livereg");

fn one_second() -> TableOptions {
    TableOptions {
        capacity: 8,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        ..TableOptions::default()
    }
}

fn with_token() -> ConnectOptions {
    ConnectOptions {
        token: Some(TOKEN.as_bytes().to_vec()),
        ..ConnectOptions::default()
    }
}

fn socket_address(tag: &str) -> (String, String) {
    let path = format!("/tmp/{}.sock", unique_name(tag));
    (format!("unix:{path}"), path)
}

/// Pings `worker` every `every` for `how_long`, each ping required to pass.
fn keep_pinging(worker: &livereg::Worker, every: Duration, how_long: Duration) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        if let Err(e) = worker.heartbeat() {
            panic!("a ping failed: {e}");
        }
        std::thread::sleep(every);
    }
}

#[test]
fn a_reaper_stopped_for_twice_the_timeout_then_resumed_evicts_no_session() {
    let temp = TempTable::new("paused", &one_second());
    let (address, path) = socket_address("paused");
    let daemon = Daemon::start(BIN, &temp.name, &[&address]);
    let workers: Vec<_> = (1..=3)
        .map(|id| connect(&address, id, "w", &with_token()).unwrap())
        .collect();
    let pinger = |how_long| {
        for _ in 0..(how_long / 50) {
            for worker in &workers {
                worker
                    .heartbeat()
                    .expect("pings never fail while the reaper is away");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    pinger(500);
    daemon.signal(libc::SIGSTOP);
    pinger(2000);
    daemon.signal(libc::SIGCONT);
    pinger(2500);
    assert_eq!(daemon.drops(), Vec::<String>::new(), "{}", daemon.log());
    drop(daemon);
    let _ = std::fs::remove_file(path);
}

/// More sessions than one `epoll_wait` returns (64): after a pause the
/// listener reads them in several batches, and counts none of them applied
/// (their silence, a busy one's progress) before it has read it.
#[test]
fn a_reaper_stopped_with_more_ready_sessions_than_one_wait_returns_evicts_none() {
    let options = TableOptions {
        capacity: 128,
        progress_timeout: Duration::from_secs(1),
        ..one_second()
    };
    let temp = TempTable::new("paused-many", &options);
    let (address, path) = socket_address("paused-many");
    let daemon = Daemon::start(BIN, &temp.name, &[&address]);
    let workers: Vec<_> = (1..=100)
        .map(|id| connect(&address, id, "w", &with_token()).unwrap())
        .collect();
    for worker in &workers {
        worker.set_busy(true).unwrap();
    }
    let stepping = |how_long| {
        for _ in 0..(how_long / 50) {
            for worker in &workers {
                worker.heartbeat().expect("pings never fail");
                worker.progress().expect("steps never fail");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    stepping(500);
    daemon.signal(libc::SIGSTOP);
    stepping(2000);
    daemon.signal(libc::SIGCONT);
    stepping(2500);
    assert_eq!(daemon.drops(), Vec::<String>::new(), "{}", daemon.log());
    drop(daemon);
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_reaper_restarted_within_the_timeout_loses_no_session() {
    let temp = TempTable::new("short-restart", &one_second());
    let (address, path) = socket_address("short-restart");
    let daemon = Daemon::start(BIN, &temp.name, &[&address]);
    let worker = connect(&address, 7, "w", &with_token()).unwrap();
    keep_pinging(
        &worker,
        Duration::from_millis(333),
        Duration::from_millis(700),
    );
    drop(daemon);
    let (worker_ref, stop) = (&worker, AtomicBool::new(false));
    let stop = &stop;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while !stop.load(Relaxed) {
                worker_ref
                    .heartbeat()
                    .expect("pings go on through the restart");
                std::thread::sleep(Duration::from_millis(333));
            }
        });
        std::thread::sleep(Duration::from_millis(700));
        let daemon = Daemon::start(BIN, &temp.name, &[&address]);
        std::thread::sleep(Duration::from_millis(2500));
        stop.store(true, Relaxed);
        assert_eq!(daemon.drops(), Vec::<String>::new(), "{}", daemon.log());
    });
    worker.heartbeat().unwrap();
    let _ = std::fs::remove_file(path);
}

/// A TCP proxy whose connections can be frozen: from then on it forwards
/// nothing on them in either direction and closes nothing (a black hole:
/// a partition, a dead box in between). Connections opened after go
/// through.
struct Proxy {
    address: String,
    /// Incremented by each freeze: a connection made in an earlier epoch
    /// is frozen.
    epoch: Arc<AtomicU64>,
}

impl Proxy {
    fn to(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("tcp://{}", listener.local_addr().unwrap());
        let epoch = Arc::new(AtomicU64::new(0));
        let (target, epochs) = (
            target.trim_start_matches("tcp://").to_owned(),
            epoch.clone(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let born = epochs.load(Relaxed);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let epochs = epochs.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        let _ = from.set_read_timeout(Some(Duration::from_millis(5)));
                        loop {
                            if epochs.load(Relaxed) > born {
                                // Hold both ends open, forward nothing.
                                std::thread::sleep(Duration::from_secs(60));
                                return;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => return,
                                Ok(n) => {
                                    if epochs.load(Relaxed) > born {
                                        std::thread::sleep(Duration::from_secs(60));
                                        return;
                                    }
                                    if to.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                Err(_) => return,
                            }
                        }
                    });
                }
            }
        });
        Proxy { address, epoch }
    }

    /// Freezes every connection open now.
    fn freeze(&self) {
        self.epoch.fetch_add(1, Relaxed);
    }
}

#[test]
fn a_black_holed_path_is_heard_by_the_client_within_a_few_timeouts() {
    let temp = TempTable::new("black-hole", &one_second());
    let listener = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("tcp://{}", l.local_addr().unwrap())
    };
    let (sender, drops) = std::sync::mpsc::channel();
    let reaper = temp
        .table
        .reaper()
        .on_drop(move |event| Ok(sender.send((event.clone(), Instant::now()))?))
        .listen(
            Address::parse(&listener).unwrap(),
            Some(TOKEN.as_bytes().to_vec()),
        )
        .spawn()
        .unwrap();
    let proxy = Proxy::to(&listener);
    let worker = connect(&proxy.address, 11, "w", &with_token()).unwrap();
    keep_pinging(
        &worker,
        Duration::from_millis(20),
        Duration::from_millis(500),
    );
    let frozen = Instant::now();
    proxy.freeze();
    let told = loop {
        match worker.heartbeat() {
            Ok(()) => {}
            Err(Error::Evicted { reason, .. }) => break reason,
            Err(other) => panic!("{other}"),
        }
        assert!(
            frozen.elapsed() < Duration::from_secs(5),
            "the client still pings Ok {:?} after its path went dark",
            frozen.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let heard_after = frozen.elapsed();
    let (event, dropped_at) = drops.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((event.instance_id, event.reason), (11, Reason::Timeout));
    assert!(dropped_at.duration_since(frozen) < Duration::from_secs(2));
    assert_eq!(told, Some(Reason::Timeout), "told after {heard_after:?}");
    assert!(heard_after < Duration::from_millis(3500), "{heard_after:?}");
    reaper.stop().unwrap();
}

#[test]
fn a_reset_through_a_session_is_heard_by_its_very_next_ping() {
    let temp = TempTable::new("reset-now", &one_second());
    let (address, path) = socket_address("reset-now");
    let reaper = temp
        .table
        .reaper()
        .listen(Address::parse(&address).unwrap(), None)
        .spawn()
        .unwrap();
    for id in 1..=5 {
        let worker = connect(&address, id, "w", &ConnectOptions::default()).unwrap();
        worker.heartbeat().unwrap();
        worker.reset(Duration::from_secs(5)).unwrap();
        match worker.heartbeat() {
            Err(Error::Evicted { reason, .. }) => assert_eq!(reason, Some(Reason::Cleared)),
            other => panic!("the ping right after a reset: {other:?}"),
        }
    }
    reaper.stop().unwrap();
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_heap_tables_next_reaper_takes_the_sessions_back() {
    let table = Table::in_memory(&one_second()).unwrap();
    let (address, path) = socket_address("heap-reclaim");
    let listen = || {
        table
            .reaper()
            .listen(Address::parse(&address).unwrap(), None)
            .spawn()
            .unwrap()
    };
    let reaper = listen();
    let worker = connect(&address, 3, "w", &ConnectOptions::default()).unwrap();
    let slot = (worker.slot(), worker.generation());
    reaper.stop().unwrap();
    let reaper = listen();
    keep_pinging(
        &worker,
        Duration::from_millis(20),
        Duration::from_millis(2500),
    );
    assert_eq!((worker.slot(), worker.generation()), slot);
    let live = table.status().unwrap().registrations;
    assert!(live.iter().any(|r| r.instance_id == 3), "{live:?}");
    reaper.stop().unwrap();
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_registration_lock_held_elsewhere_never_freezes_the_listener() {
    let temp = TempTable::new("lock-held", &one_second());
    let (address, path) = socket_address("lock-held");
    let daemon = Daemon::start(BIN, &temp.name, &[&address]);
    let beating = connect(&address, 1, "w", &with_token()).unwrap();
    let held = hold_registration_lock(&temp.name);
    let started = Instant::now();
    let refused = connect(&address, 2, "w", &with_token())
        .map(drop)
        .unwrap_err();
    assert!(matches!(refused, Error::Busy { .. }), "{refused}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused after {:?}",
        started.elapsed()
    );
    // The listener goes on serving the held session for three timeouts.
    keep_pinging(&beating, Duration::from_millis(50), Duration::from_secs(3));
    assert_eq!(daemon.drops(), Vec::<String>::new(), "{}", daemon.log());
    drop(held);
    let admitted = connect(&address, 2, "w", &with_token()).unwrap();
    admitted.deregister().unwrap();
    beating.deregister().unwrap();
    drop(daemon);
    let _ = std::fs::remove_file(path);
}

/// The metrics the daemon serves (its `--metrics-addr`, read off its log).
fn scrape(daemon: &Daemon) -> String {
    let log = daemon.log();
    let address = log
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no metrics address in: {log}"))
        .to_owned();
    let mut stream = TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn refused_busy(metrics: &str) -> f64 {
    metrics
        .lines()
        .find(|line| {
            line.starts_with("livereg_sessions_refused_total{") && line.contains("code=\"BUSY\"")
        })
        .and_then(|line| line.rsplit(' ').next())
        .map_or(0.0, |value| value.parse().unwrap())
}

/// Reclaims queued while the daemon was stopped (the old connections still
/// hold their registrations) are no source held back: BUSY refusals count
/// failed-handshake penalties only.
#[test]
fn sessions_reclaiming_after_a_pause_raise_no_busy_refusal() {
    let temp = TempTable::new("busy-count", &one_second());
    let (address, path) = socket_address("busy-count");
    let daemon = Daemon::start_full(
        BIN,
        &temp.name,
        &[&address],
        "",
        "--metrics-addr 127.0.0.1:0",
    );
    let workers: Vec<_> = (1..=4)
        .map(|id| connect(&address, id, "w", &with_token()).unwrap())
        .collect();
    let pinger = |how_long: u64| {
        for _ in 0..(how_long / 50) {
            for worker in &workers {
                let _ = worker.heartbeat();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    pinger(500);
    daemon.signal(libc::SIGSTOP);
    pinger(2500);
    daemon.signal(libc::SIGCONT);
    pinger(2500);
    assert_eq!(refused_busy(&scrape(&daemon)), 0.0, "{}", daemon.log());
    drop(daemon);
    let _ = std::fs::remove_file(path);
}

/// A writer of the info area that died mid-write leaves its sequence odd:
/// the listener reads the area once and never waits on it, so greetings
/// are answered at once, and the sessions beat on.
#[test]
fn an_info_area_left_mid_write_never_holds_the_listener() {
    let temp = TempTable::new("info-mid-write", &one_second());
    temp.table.set_info(b"published").unwrap();
    let sequence_at =
        (livereg::HEADER_SIZE + temp.table.capacity() as usize * livereg::SLOT_SIZE) as u64;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm/{}", temp.name))
        .unwrap();
    let mut word = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut word, sequence_at).unwrap();
    let odd = u64::from_le_bytes(word) | 1;
    std::os::unix::fs::FileExt::write_all_at(&file, &odd.to_le_bytes(), sequence_at).unwrap();
    let (address, path) = socket_address("info-mid-write");
    let daemon = Daemon::start(BIN, &temp.name, &[&address]);
    let started = Instant::now();
    let workers: Vec<_> = (1..=4)
        .map(|id| connect(&address, id, "w", &with_token()).unwrap())
        .collect();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "four greetings took {:?}",
        started.elapsed()
    );
    for worker in &workers {
        keep_pinging(
            worker,
            Duration::from_millis(50),
            Duration::from_millis(300),
        );
    }
    assert_eq!(daemon.drops(), Vec::<String>::new(), "{}", daemon.log());
    drop(daemon);
    let _ = std::fs::remove_file(path);
}

/// A session registered and never beaten, whose client is gone when its
/// reaper restarts: unheld, it waits the reap timeout for a reclaim, not
/// the (much longer) grace before a first beat.
#[test]
fn an_unheld_session_that_never_beat_is_given_the_timeout_not_the_grace() {
    let options = TableOptions {
        capacity: 8,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(10),
        ..TableOptions::default()
    };
    let temp = TempTable::new("unheld-unbeaten", &options);
    let (address, path) = socket_address("unheld-unbeaten");
    let first = Daemon::start(BIN, &temp.name, &[&address]);
    let mut conn = attack::open(&address).unwrap();
    conn.set_timeouts(Duration::from_secs(2));
    let hello = livereg::wire::Frame::Hello {
        version: livereg::wire::VERSION,
        instance_id: 9,
        pid: 1,
        token: attack::TOKEN.as_bytes().to_vec(),
        label: String::new(),
        host: String::new(),
        reclaim: None,
    };
    conn.write(&hello.encode()).unwrap();
    let mut answer = [0u8; 256];
    assert!(conn.read(&mut answer).unwrap() > 0, "no welcome");
    first.signal(libc::SIGKILL); // gone with its connection: nothing said
    drop(first);
    drop(conn);
    let restarted = Instant::now();
    let second = Daemon::start(BIN, &temp.name, &[&address]);
    while second.drops().is_empty() {
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "an unheld, unbeaten session waited for the grace: {}",
            second.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        second.drops()[0].starts_with("9 disconnected"),
        "{:?}",
        second.drops()
    );
    drop(second);
    let _ = std::fs::remove_file(path);
}

/// A `unix:` listener whose backlog is full (it accepts nothing): a connect
/// gives up within its timeout instead of blocking for as long as it stays
/// full.
#[test]
fn a_unix_connect_to_a_full_backlog_gives_up_within_its_timeout() {
    let (address, path) = socket_address("full-backlog");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // SAFETY: `listen` on a socket this test owns; a backlog of 0 (one).
    unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), 0) };
    for _ in 0..4 {
        let path = path.clone();
        // Those past the backlog block until the listener closes.
        std::thread::spawn(move || std::os::unix::net::UnixStream::connect(path));
    }
    std::thread::sleep(Duration::from_millis(300));
    let options = ConnectOptions {
        connect_timeout: Some(Duration::from_secs(1)),
        ..ConnectOptions::default()
    };
    let started = Instant::now();
    let error = connect(&address, 1, "w", &options).map(drop).unwrap_err();
    assert!(matches!(error, Error::Timeout(_)), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "gave up after {:?}",
        started.elapsed()
    );
    drop(listener);
    let _ = std::fs::remove_file(path);
}

/// A client away past the timeout whose registration ended and whose slot
/// the reaper already freed still hears why when it comes back to reclaim
/// (`timeout`), not a bare `disconnected`: a freed slot's beat word keeps
/// the reason until the slot is claimed again.
#[test]
fn a_late_reclaim_hears_why_its_registration_ended_after_its_slot_was_freed() {
    use livereg::wire::{Frame, Reclaim, OLDEST_SERVED, VERSION};
    let temp = TempTable::new("late-reclaim", &one_second());
    let (address, path) = socket_address("late-reclaim");
    let daemon = Daemon::start(BIN, &temp.name, &[&address]);
    let hello_in = |version, reclaim| Frame::Hello {
        version,
        instance_id: 7,
        pid: 1,
        token: attack::TOKEN.as_bytes().to_vec(),
        label: String::new(),
        host: String::new(),
        reclaim,
    };
    let hello = |reclaim| hello_in(VERSION, reclaim);
    let answer = |conn: &mut attack::Conn| {
        let mut bytes = vec![0u8; 4096];
        let n = conn.read(&mut bytes).unwrap();
        let mut frames = Vec::new();
        let mut at = 0;
        while let Ok(Some((frame, used))) = Frame::decode(&bytes[at..n]) {
            frames.push(frame);
            at += used;
        }
        frames
    };
    let mut first = attack::open(&address).unwrap();
    first.set_timeouts(Duration::from_secs(5));
    // Of the previous protocol: frames, no region (a region's client that
    // never beats is judged by the grace, as a table registration is).
    first
        .write(&hello_in(VERSION - 1, None).encode_for(VERSION - 1))
        .unwrap();
    let claim = answer(&mut first)
        .into_iter()
        .find_map(|frame| match frame {
            Frame::Welcome {
                slot,
                generation,
                secret,
                ..
            } => Some(Reclaim {
                slot,
                generation,
                secret,
            }),
            _ => None,
        })
        .expect("a welcome");
    // Silent: no beat. The listener ends it `timeout`; the reaper frees it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !temp.table.status().unwrap().registrations.is_empty() {
        assert!(Instant::now() < deadline, "never freed: {}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(first);
    let mut again = attack::open(&address).unwrap();
    again.set_timeouts(Duration::from_secs(5));
    again.write(&hello(Some(claim)).encode()).unwrap();
    match answer(&mut again).into_iter().next() {
        Some(Frame::Refused {
            message, reason, ..
        }) => {
            assert_eq!(reason, Some(Reason::Timeout), "{message}");
            assert!(message.contains("'timeout'"), "{message}")
        }
        other => panic!("expected a refusal, found {other:?}"),
    }
    // A client of the previous protocol gets the refusal it reads: no
    // reason code (its message still names it).
    let mut previous = attack::open(&address).unwrap();
    previous.set_timeouts(Duration::from_secs(5));
    let reclaim = hello_in(OLDEST_SERVED, Some(claim)).encode_for(OLDEST_SERVED);
    previous.write(&reclaim).unwrap();
    let mut bytes = vec![0u8; 4096];
    let n = previous.read(&mut bytes).unwrap();
    let (refusal, used) = Frame::decode(&bytes[..n]).unwrap().expect("a refusal");
    assert_eq!(used, n, "one frame");
    match refusal {
        Frame::Refused {
            message, reason, ..
        } => {
            assert_eq!(reason, None, "{message}");
            assert!(message.contains("'timeout'"), "{message}");
            assert_eq!(refusal_frame_len(&message), n);
        }
        other => panic!("expected a refusal, found {other:?}"),
    }
    drop(daemon);
    let _ = std::fs::remove_file(path);
}

/// The length of a `Refused` of version 2 with `message`: prefix, type,
/// code, message length and text; no reason byte.
fn refusal_frame_len(message: &str) -> usize {
    4 + 1 + 1 + 2 + message.len()
}

/// A listener that speaks no version of ours refuses today's hello and
/// each earlier one down to the oldest: the client fails in one line naming
/// the versions and what to upgrade (`INCOMPATIBLE`), having tried each
/// once, newest first.
#[test]
fn a_listener_that_speaks_no_version_of_ours_fails_in_one_line_naming_both() {
    use livereg::wire::{Frame, OLDEST_SERVED, VERSION};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("tcp://{}", listener.local_addr().unwrap());
    let serving = std::thread::spawn(move || {
        let mut versions = Vec::new();
        for _ in OLDEST_SERVED..=VERSION {
            let (mut conn, _) = listener.accept().unwrap();
            let mut bytes = vec![0u8; 1024];
            let n = conn.read(&mut bytes).unwrap();
            if let Ok(Some((Frame::Hello { version, .. }, _))) = Frame::decode(&bytes[..n]) {
                versions.push(version);
                let refusal = Frame::Refused {
                    code: Error::Incompatible(String::new()).code() as u8,
                    message: format!("session protocol version {version}, this reaper speaks 9 to 9: upgrade the client"),
                    reason: None,
                };
                conn.write_all(&refusal.encode()).unwrap();
            }
        }
        versions
    });
    let refused = connect(&address, 1, "w", &with_token())
        .map(drop)
        .unwrap_err();
    let line = refused.to_string();
    assert!(matches!(refused, Error::Incompatible(_)), "{line}");
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains(&format!("protocol {OLDEST_SERVED} to {VERSION}"))
            && line.contains("upgrade the older side"),
        "{line}"
    );
    assert_eq!(
        serving.join().unwrap(),
        (OLDEST_SERVED..=VERSION).rev().collect::<Vec<_>>(),
        "today's version, then each earlier one"
    );
}

#[test]
fn a_close_that_comes_with_the_last_frame_is_seen_at_once() {
    // T = 8 s: a close left unseen would be found only when the listener
    // next writes to the session (its `Heard`, every T/4 = 2 s).
    let temp = TempTable::new(
        "closed-with-frame",
        &TableOptions {
            reap_timeout: Duration::from_secs(8),
            registration_grace: Duration::from_secs(8),
            ..one_second()
        },
    );
    let address = format!("tcp://{}", free_port());
    let daemon = Daemon::start(BIN, &temp.name, &[&address]);
    for instance in 1..=4u64 {
        let mut conn = open(&address).unwrap();
        let welcome = say_hello(&mut conn, instance);
        assert!(
            matches!(welcome, Some(Frame::Welcome { .. })),
            "{welcome:?}"
        );
        // The beat and the close reach the listener while it is stopped:
        // they wake it once, together.
        daemon.signal(libc::SIGSTOP);
        let beat = Frame::Beat {
            heartbeats: 1,
            since_ping_us: 0,
            busy: false,
            steps: 0,
        };
        conn.write(&beat.encode()).unwrap();
        drop(conn);
        std::thread::sleep(Duration::from_millis(50));
        let resumed = Instant::now();
        daemon.signal(libc::SIGCONT);
        let prefix = format!("{instance} disconnected");
        while !daemon.drops().iter().any(|l| l.starts_with(&prefix)) {
            assert!(
                resumed.elapsed() < Duration::from_secs(1),
                "session {instance}: its close not seen after {:?}; drops {:?}",
                resumed.elapsed(),
                daemon.drops()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A loopback address no one listens on now.
fn free_port() -> std::net::SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}
