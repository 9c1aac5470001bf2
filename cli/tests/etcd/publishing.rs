//! What a reaper publishes: keys per registration, ends with their reason, a dead host gone with its lease, the cluster view.

use super::*;

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

#[test]
fn a_round_longer_than_the_lease_keeps_the_lease_alive_as_it_writes() {
    // Two operations per transaction: 8,000 registrations take 4,000 of them,
    // each a commit of its own: a round several times the 2 s TTL.
    let etcd = EtcdServer::start_with("long-round", &["--max-txn-ops", "2"]);
    let prefix = prefix("long-round");
    let options = TableOptions {
        capacity: 8192,
        ..common::long_options()
    };
    let table = Table::in_memory(&options).unwrap();
    let _workers: Vec<_> = (1..=8000)
        .map(|id| table.register(id, "w").unwrap())
        .collect();
    let mut publishing = EtcdOptions::new([etcd.address()]);
    publishing.prefix.clone_from(&prefix);
    publishing.host = "long".into();
    publishing.ttl = TTL;
    let publisher = Publisher::start(&table, publishing).unwrap();
    let mut reader = Reader::new(&etcd);
    let under = format!("{prefix}/long/");
    let started = Instant::now();
    wait_for("all 8,000 keys", Duration::from_secs(90), || {
        reader.ids(&under).len() == 8000
    });
    let took = started.elapsed();
    // One lease all along: it never expired under the writes.
    let leases: std::collections::BTreeSet<i64> = reader
        .keys(&under)
        .values()
        .map(|(_, lease)| *lease)
        .collect();
    assert_eq!(leases.len(), 1, "keys under {leases:?} after {took:?}");
    std::thread::sleep(TTL + Duration::from_secs(1));
    assert_eq!(reader.ids(&under).len(), 8000, "the lease lived on");
    assert!(publisher.is_connected());
}
