//! etcd restarted, hung, unreachable, or silent on keep-alives: local reaping never waits, nothing is lost.

use super::*;

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
