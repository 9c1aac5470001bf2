//! Following the fleet: `ClusterWatch` and `livereg status --cluster
//! --watch` see each registration, end and host gone once, across a broken
//! connection, a compaction and an etcd restart.

use super::proxy::Proxy;
use super::*;
use livereg::etcd::{ClusterChange, ClusterEvent, ClusterWatch};
use std::sync::mpsc;

/// Every change the watch tells within `within`, then none for a quiet
/// moment after the `expected`-th (a repeat would show there).
fn changes(fleet: &mut ClusterWatch, expected: usize, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while seen.len() < expected && Instant::now() < deadline {
        if let Ok(Some(change)) = fleet.next(Duration::from_millis(100)) {
            seen.push(told(&change));
        }
    }
    let quiet = Instant::now() + Duration::from_millis(700);
    while Instant::now() < quiet {
        if let Ok(Some(change)) = fleet.next(Duration::from_millis(100)) {
            seen.push(told(&change));
        }
    }
    seen
}

/// A change in a few words: `registered host/7`, `ended host/7 timeout`,
/// `host gone host (7)`.
fn told(change: &ClusterChange) -> String {
    match &change.event {
        ClusterEvent::Registered { record } => {
            format!("registered {}/{}", record.host, record.instance_id)
        }
        ClusterEvent::Ended { record } => format!(
            "ended {}/{} {}",
            record.host,
            record.instance_id,
            record.ended.map_or("-".into(), |r| r.to_string())
        ),
        ClusterEvent::Dying { record } => format!("dying {}/{}", record.host, record.instance_id),
        ClusterEvent::HostGone { host, records } => {
            let ids: Vec<String> = records.iter().map(|r| r.instance_id.to_string()).collect();
            format!("host gone {host} ({})", ids.join(","))
        }
    }
}

/// As [`changes`], in order of text: the publisher orders a round's
/// writes as it likes.
fn changes_sorted(fleet: &mut ClusterWatch, expected: usize, within: Duration) -> Vec<String> {
    let mut seen = changes(fleet, expected, within);
    seen.sort();
    seen
}

fn live_ids(fleet: &ClusterWatch) -> Vec<String> {
    fleet
        .live()
        .map(|r| format!("{}/{}", r.host, r.instance_id))
        .collect()
}

/// The lines `command` prints, as they come.
fn lines_of(command: &mut Daemon) -> mpsc::Receiver<String> {
    let (sender, lines) = mpsc::channel();
    let stdout = command.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

/// `livereg status --cluster --watch` (text) on `prefix`, and its lines.
fn watching(etcd: &EtcdServer, prefix: &str) -> (Daemon, mpsc::Receiver<String>) {
    let mut command = Daemon::spawn(&[
        "status",
        "--cluster",
        "--watch",
        "--etcd",
        &etcd.address(),
        "--etcd-prefix",
        prefix,
    ]);
    let lines = lines_of(&mut command);
    (command, lines)
}

fn watch_options(endpoint: &str, prefix: &str) -> EtcdOptions {
    let mut options = EtcdOptions::new([endpoint.to_owned()]);
    options.prefix = prefix.to_owned();
    options
}

#[test]
fn a_watch_tells_registrations_their_ends_and_a_host_gone_as_the_command_does() {
    let etcd = EtcdServer::start("watch");
    let prefix = prefix("watch");
    let (a, _a) = table("watch-a", "1s");
    let (b, _b) = table("watch-b", "1s");
    let _host_a = reaper(&a, &etcd, &prefix, "host-a", &[]);
    let mut host_b = reaper(&b, &etcd, &prefix, "host-b", &[]);
    let (_one, _two) = (worker(&a, 1, "one"), worker(&b, 2, "two"));
    let endpoints = [etcd.address()];
    wait_for("both published", Duration::from_secs(10), || {
        fetch(&endpoints, &prefix)
            .hosts
            .iter()
            .map(|h| h.live)
            .sum::<usize>()
            == 2
    });
    let mut fleet = ClusterWatch::start(&watch_options(&etcd.address(), &prefix)).unwrap();
    assert_eq!(live_ids(&fleet), ["host-a/1", "host-b/2"]);

    // The command follows the same prefix, one JSON object per line.
    let mut command = Daemon::spawn(&[
        "status",
        "--cluster",
        "--watch",
        "--json",
        "--etcd",
        &etcd.address(),
        "--etcd-prefix",
        &prefix,
    ]);
    let lines = lines_of(&mut command);
    let line = |what: &str| -> Value {
        let line = lines
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("the command printed no line for {what}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    for id in [1, 2] {
        let live = line("the snapshot");
        assert_eq!(
            (
                live["event"].as_str(),
                live["record"]["instance_id"].as_u64()
            ),
            (Some("live"), Some(id)),
            "{live}"
        );
    }

    let mut three = worker(&a, 3, "three");
    assert_eq!(
        changes(&mut fleet, 1, Duration::from_secs(10)),
        ["registered host-a/3"]
    );
    three.kill();
    // (Told dying first when its host's publisher saw it so before its end.)
    let mut told = changes(&mut fleet, 1, Duration::from_secs(10));
    if told.first().is_some_and(|first| first == "dying host-a/3") {
        told.remove(0);
    }
    if told.is_empty() {
        told = changes(&mut fleet, 1, Duration::from_secs(10));
    }
    assert_eq!(told, ["ended host-a/3 process_exited"]);
    // A host whose reaper dies: its lease (2 s) expires, its keys go with it.
    let killed = Instant::now();
    host_b.kill();
    assert_eq!(
        changes(&mut fleet, 1, TTL + Duration::from_secs(8)),
        ["host gone host-b (2)"]
    );
    assert!(killed.elapsed() < TTL + Duration::from_secs(8));
    assert_eq!(live_ids(&fleet), ["host-a/1"]);

    let registered = line("registered");
    assert_eq!(
        (
            registered["event"].as_str(),
            registered["record"]["instance_id"].as_u64()
        ),
        (Some("registered"), Some(3)),
        "{registered}"
    );
    let mut ended = line("ended");
    if ended["event"] == "dying" {
        ended = line("ended");
    }
    assert_eq!(
        (ended["event"].as_str(), ended["record"]["ended"].as_str()),
        (Some("ended"), Some("process_exited")),
        "{ended}"
    );
    let gone = line("host gone");
    assert_eq!(
        (gone["event"].as_str(), gone["host"].as_str()),
        (Some("host_gone"), Some("host-b")),
        "{gone}"
    );
    assert!(
        gone["revision"].as_i64() > ended["revision"].as_i64(),
        "{ended} then {gone}"
    );
}

#[test]
fn a_watch_resumed_after_a_break_a_compaction_or_a_restart_loses_and_repeats_nothing() {
    let mut etcd = EtcdServer::start("watch-resume");
    let prefix = prefix("watch-resume");
    let table = TempTable::new("watch-resume", &common::long_options());
    let mut options = watch_options(&etcd.address(), &prefix);
    options.host = "h".into();
    options.ttl = Duration::from_secs(30);
    let (_publisher, _reaper) = publish_reaped(&table.table, options);
    let handle = Table::open(&table.name).unwrap();
    let mut reader = Reader::new(&etcd);
    let under = format!("{prefix}/h/");
    let published = |reader: &mut Reader, ids: &[u64]| {
        let keys: Vec<String> = ids
            .iter()
            .map(|id| format!("{under}{}/{id}", table.name))
            .collect();
        wait_for("etcd to hold the table", Duration::from_secs(10), || {
            let held = reader.keys(&under);
            held.len() == keys.len()
                && keys
                    .iter()
                    .all(|k| held.get(k).is_some_and(|(v, _)| v["ended"].is_null()))
        });
    };

    let one = handle.register(1, "one").unwrap();
    published(&mut reader, &[1]);
    let proxy = Proxy::start(&etcd.address());
    let mut fleet = ClusterWatch::start(&watch_options(&proxy.address, &prefix)).unwrap();
    assert_eq!(live_ids(&fleet), ["h/1"]);
    let two = handle.register(2, "two").unwrap();
    assert_eq!(
        changes(&mut fleet, 1, Duration::from_secs(10)),
        ["registered h/2"]
    );

    // A break: the watch resumes from its revision, with the reasons.
    proxy.cut();
    let three = handle.register(3, "three").unwrap();
    one.deregister().unwrap();
    published(&mut reader, &[2, 3]);
    proxy.mend();
    assert_eq!(
        changes_sorted(&mut fleet, 2, Duration::from_secs(20)),
        ["ended h/1 deregistered", "registered h/3"]
    );
    assert!(fleet.counts().resumed >= 1, "{:?}", fleet.counts());
    assert_eq!(fleet.counts().relisted, 0);

    // A break past which etcd compacts its history: the watch lists again
    // and tells what changed (an end's reason is in the compacted history).
    proxy.cut();
    let four = handle.register(4, "four").unwrap();
    two.deregister().unwrap();
    published(&mut reader, &[3, 4]);
    let revision = reader
        .runtime
        .block_on(reader.client.get(under.as_str(), None))
        .unwrap()
        .header()
        .unwrap()
        .revision();
    reader
        .runtime
        .block_on(reader.client.compact(revision, None))
        .unwrap();
    proxy.mend();
    assert_eq!(
        changes_sorted(&mut fleet, 2, Duration::from_secs(20)),
        ["ended h/2 -", "registered h/4"]
    );
    assert_eq!(fleet.counts().relisted, 1);

    // etcd restarted (its data kept): the watch goes on from where it was.
    etcd.kill();
    etcd.resume();
    let five = handle.register(5, "five").unwrap();
    three.deregister().unwrap();
    assert_eq!(
        changes_sorted(&mut fleet, 2, Duration::from_secs(20)),
        ["ended h/3 deregistered", "registered h/5"]
    );
    let endpoints = [etcd.address()];
    let mut read: Vec<String> = fetch(&endpoints, &prefix).hosts[0].tables[0]
        .registrations
        .iter()
        .map(|r| format!("h/{}", r.instance_id))
        .collect();
    read.sort();
    assert_eq!(live_ids(&fleet), read);
    drop((four, five));
}

#[test]
fn a_watch_on_a_member_that_hangs_says_so_and_goes_on_when_it_answers() {
    let etcd = EtcdServer::start("watch-hang");
    let prefix = prefix("watch-hang");
    let table = TempTable::new("watch-hang", &common::long_options());
    let mut options = watch_options(&etcd.address(), &prefix);
    options.host = "h".into();
    options.ttl = Duration::from_secs(30);
    let (_publisher, _reaper) = publish_reaped(&table.table, options);
    let handle = Table::open(&table.name).unwrap();
    let mut fleet = ClusterWatch::start(&watch_options(&etcd.address(), &prefix)).unwrap();
    let _one = handle.register(1, "one").unwrap();
    assert_eq!(
        changes(&mut fleet, 1, Duration::from_secs(10)),
        ["registered h/1"]
    );

    // A stopped etcd accepts nothing and answers nothing: the watch is
    // quiet, asks for its progress, and gives the member up.
    etcd.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let mut said = None;
    while said.is_none() && stopped.elapsed() < Duration::from_secs(30) {
        if let Err(error) = fleet.next(Duration::from_millis(100)) {
            said = Some(error.to_string());
        }
    }
    let said = said.expect("the watch said nothing of a hung etcd within 30 s");
    assert!(!fleet.is_connected(), "{said}");
    etcd.signal(libc::SIGCONT);
    let _two = handle.register(2, "two").unwrap();
    let seen = changes(&mut fleet, 1, Duration::from_secs(30));
    assert_eq!(seen, ["registered h/2"], "after: {said}");
    assert!(fleet.is_connected());
}

#[test]
fn a_watch_on_a_member_cut_off_from_its_leader_leaves_it() {
    let cluster = EtcdServer::cluster("watch-minority", 3);
    let prefix = prefix("watch-minority");
    let deadline = Instant::now() + Duration::from_secs(20);
    let follower = loop {
        if cluster.iter().any(EtcdServer::is_leader) {
            break cluster.iter().position(|m| !m.is_leader()).unwrap();
        }
        assert!(Instant::now() < deadline, "no leader elected");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut fleet =
        ClusterWatch::start(&watch_options(&cluster[follower].address(), &prefix)).unwrap();
    // Its two peers stop: the member has no leader, and its own store
    // would still answer.
    let peers: Vec<&EtcdServer> = (0..cluster.len())
        .filter(|&i| i != follower)
        .map(|i| &cluster[i])
        .collect();
    for peer in &peers {
        peer.signal(libc::SIGSTOP);
    }
    let stopped = Instant::now();
    let mut said = None;
    while said.is_none() && stopped.elapsed() < Duration::from_secs(40) {
        if let Err(error) = fleet.next(Duration::from_millis(100)) {
            said = Some(error.to_string());
        }
    }
    for peer in &peers {
        peer.signal(libc::SIGCONT);
    }
    let said = said.expect("the watch stayed on a member without a leader for 40 s");
    assert!(!fleet.is_connected(), "{said}");
}

#[test]
fn a_stalled_engine_is_told_to_the_fleet_as_ended_stalled() {
    let etcd = EtcdServer::start("watch-stalled");
    let prefix = prefix("watch-stalled");
    let (name, _table) = table("watch-stalled", "400ms");
    let _reaper = reaper(
        &name,
        &etcd,
        &prefix,
        "host-s",
        &["--progress-timeout", "400ms"],
    );
    let mut fleet = ClusterWatch::start(&watch_options(&etcd.address(), &prefix)).unwrap();
    let (_command, lines) = watching(&etcd, &prefix);
    // An engine that is busy and never makes a step (its beats go on).
    let busy = std::env::temp_dir().join(format!("{name}.busy"));
    std::fs::write(&busy, "busy").unwrap();
    let _engine = Daemon::spawn(&[
        "run",
        &name,
        "--instance",
        "4",
        "--progress-file",
        busy.to_str().unwrap(),
        "--",
        "sleep",
        "30",
    ]);
    // (`run` registers again after each stall: more changes may follow.
    // On a loaded machine the host's 2 s lease may lapse once and be
    // taken again: `host gone`, then `registered` anew, which is no part
    // of this; the first end told for the engine must be `stalled`.)
    let mut told = changes(&mut fleet, 2, Duration::from_secs(15));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !told.iter().any(|c| c.starts_with("ended ")) && Instant::now() < deadline {
        told.extend(changes(&mut fleet, 1, Duration::from_secs(1)));
    }
    let first_end = told.iter().find(|c| c.starts_with("ended "));
    assert_eq!(told[0], "registered host-s/4", "{told:?}");
    assert_eq!(
        first_end.map(String::as_str),
        Some("ended host-s/4 stalled"),
        "{told:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let ended = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("the command printed no ended line");
        if line.contains("ended") {
            break line;
        }
    };
    assert!(
        ended.contains("host-s/") && ended.trim_end().ends_with("stalled"),
        "{ended}"
    );
    let _ = std::fs::remove_file(&busy);
}

/// A SIGKILLed worker holding 1 GiB (whose end the kernel takes a while to
/// finish) is told to the fleet `dying` as soon as its host's reaper sees
/// its death word, then ended `process_exited`; `status --cluster --watch`
/// prints both, in that order.
#[test]
fn a_killed_engine_is_told_to_the_fleet_dying_before_its_end() {
    let etcd = EtcdServer::start("watch-dying");
    let prefix = prefix("watch-dying");
    let (name, _table) = table("watch-dying", "5s");
    let _reaper = reaper(&name, &etcd, &prefix, "host-d", &[]);
    let mut fleet = ClusterWatch::start(&watch_options(&etcd.address(), &prefix)).unwrap();
    let (_command, lines) = watching(&etcd, &prefix);
    let mut engine = Daemon::spawn(&[
        "worker",
        &name,
        "--instance",
        "6",
        "--interval",
        "100ms",
        "--hold-mib",
        "1024",
    ]);
    assert_eq!(
        changes(&mut fleet, 1, Duration::from_secs(30)),
        ["registered host-d/6"]
    );
    // Once its death thread holds the process's word (claimed just after
    // the first registration).
    let table = livereg::Table::open(&name).unwrap();
    wait_for("the death word", Duration::from_secs(10), || {
        table
            .status()
            .unwrap()
            .registrations
            .iter()
            .any(|r| r.instance_id == 6 && r.death_word)
    });
    let _ = engine.0.kill();
    let told = changes(&mut fleet, 2, Duration::from_secs(30));
    assert_eq!(
        told,
        ["dying host-d/6", "ended host-d/6 process_exited"],
        "{told:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut printed = Vec::new();
    let told = |line: &str, what: &str| line.contains(&format!("  {what}  "));
    while !printed.iter().any(|line: &String| told(line, "ended")) {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("the command printed no ended line");
        if told(&line, "dying") || told(&line, "ended") {
            printed.push(line);
        }
    }
    assert!(
        printed.len() == 2 && told(&printed[0], "dying") && printed[0].contains("host-d/"),
        "{printed:?}"
    );
}
