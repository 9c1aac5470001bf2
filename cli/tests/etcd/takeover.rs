//! A reaper taking over from another: its own lease, no gap, its predecessor's ends published.

use super::*;

#[test]
fn a_standby_that_takes_over_republishes_under_its_own_lease_without_a_gap() {
    let etcd = EtcdServer::start("standby");
    let prefix = prefix("standby");
    let (name, _guard) = table("standby", "1s");
    let mut first = reaper(&name, &etcd, &prefix, "node", &[]);
    let _second = Daemon::spawn(&[
        "reap",
        &name,
        "--standby",
        "--etcd",
        &etcd.address(),
        "--etcd-prefix",
        &prefix,
        "--host",
        "node",
        "--etcd-ttl",
        "2s",
    ]);
    let _worker = worker(&name, 1, "kept");
    let key = format!("{prefix}/node/{name}/1");
    let mut reader = Reader::new(&etcd);
    wait_for("the key", Duration::from_secs(5), || {
        reader.keys(&prefix).contains_key(&key)
    });
    let first_lease = reader.keys(&prefix)[&key].1;
    let events = etcd.watch(&prefix);

    first.kill();
    wait_for(
        "the key under the standby's lease",
        Duration::from_secs(5),
        || {
            reader
                .keys(&prefix)
                .get(&key)
                .is_some_and(|(_, lease)| *lease != first_lease)
        },
    );
    // The first lease expires meanwhile; the key, moved off it, stays.
    std::thread::sleep(TTL + Duration::from_secs(1));
    assert!(reader.keys(&prefix).contains_key(&key));
    let deletes = events
        .try_iter()
        .filter(|e| e.kind == EventType::Delete)
        .count();
    assert_eq!(deletes, 0, "the key never blinked");
}

#[test]
fn a_reaper_that_takes_over_publishes_the_end_of_a_registration_its_predecessor_published() {
    let etcd = EtcdServer::start("takeover-end");
    let prefix = prefix("takeover-end");
    let (name, _table) = table("takeover-end", "5s");
    // A lease long enough that only the second reaper can delete the key.
    let (address, ttl) = (etcd.address(), "20s");
    let reap = [
        "reap",
        name.as_str(),
        "--etcd",
        &address,
        "--etcd-prefix",
        &prefix,
    ];
    let reap = [&reap[..], &["--host", "h", "--etcd-ttl", ttl]].concat();
    let mut first = Daemon::spawn(&reap);
    wait_for("the reaper", Duration::from_secs(10), || {
        livereg(&["probe", &name]).status.success()
    });
    let mut doomed = worker(&name, 4, "doomed");
    let key = format!("{prefix}/h/{name}/4");
    let mut reader = Reader::new(&etcd);
    wait_for("the key", Duration::from_secs(10), || {
        reader.keys(&key).contains_key(&key)
    });
    let events = etcd.watch(&prefix);
    // The reaper dies with its lease alive; then its worker dies.
    first.signal(libc::SIGKILL);
    first.kill();
    doomed.signal(libc::SIGKILL);
    doomed.kill();
    let _second = Daemon::spawn(&reap);
    let (_, last) = wait_deleted(&events, &key);
    assert_eq!(last["ended"], "process_exited", "{last}");
}
