//! The library's `Publisher`, without the command.

use super::*;

#[test]
fn the_library_publisher_reads_back_and_a_clean_stop_revokes_its_keys_at_once() {
    let etcd = EtcdServer::start("library");
    let prefix = prefix("library");
    let table = TempTable::new("library", &common::options());
    let mut options = EtcdOptions::new([etcd.address()]);
    options.prefix.clone_from(&prefix);
    options.host = "lib".into();
    options.ttl = Duration::from_secs(30);
    let (publisher, reaper) = publish_reaped(&table.table, options);
    let events = etcd.watch(&prefix);
    let handle = Table::open(&table.name).unwrap();
    let (nine, ten) = (
        handle.register(9, "nine").unwrap(),
        handle.register(10, "ten").unwrap(),
    );
    let endpoints = [etcd.address()];
    let mut cluster = None;
    wait_for(
        "both registrations read back",
        Duration::from_secs(5),
        || {
            let read = fetch(&endpoints, &prefix);
            let found = read.hosts.first().is_some_and(|h| h.live == 2);
            cluster = Some(read);
            found
        },
    );
    assert!(publisher.is_connected());
    let cluster = cluster.unwrap();
    let host = &cluster.hosts[0];
    assert_eq!((host.host.as_str(), host.tables.len()), ("lib", 1));
    let ids: Vec<u64> = host.tables[0]
        .registrations
        .iter()
        .map(|r| r.instance_id)
        .collect();
    assert_eq!(ids, [9, 10]);
    assert!(
        host.lease_ttl_seconds.is_some_and(|ttl| ttl > 20),
        "{host:?}"
    );

    nine.deregister().unwrap();
    let (_, last) = wait_deleted(&events, &format!("{prefix}/lib/{}/9", table.name));
    assert_eq!(last["ended"], "deregistered");

    // Keys under the prefix that are not registrations are counted, not read.
    let mut reader = Reader::new(&etcd);
    for (key, value) in [
        (format!("{prefix}/stray"), "x"),
        (format!("{prefix}/h/t/x"), "{}"),
        (format!("{prefix}/h/t/1"), "not json"),
    ] {
        reader
            .runtime
            .block_on(reader.client.put(key, value, None))
            .unwrap();
    }
    let read = fetch(&endpoints, &prefix);
    assert_eq!((read.foreign_keys, read.hosts.len()), (3, 1));

    // A clean stop revokes the lease (TTL 30 s): the key goes at once.
    reaper.stop().unwrap();
    publisher.stop();
    let left = reader.keys(&format!("{prefix}/lib/"));
    assert!(left.is_empty(), "{left:?}");
    drop(ten);
}
