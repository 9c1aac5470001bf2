//! Many hosts that lost etcd together come back spread out, not in
//! lockstep (each publisher's wait is its own random point of the delay).

use super::*;

#[test]
fn publishers_that_lost_etcd_together_come_back_apart() {
    let mut etcd = EtcdServer::start("reconnects");
    let prefix = prefix("reconnects");
    let publishers: Vec<(Table, Publisher)> = (0..20)
        .map(|i| {
            let table = Table::in_memory(&common::long_options()).unwrap();
            let mut options = EtcdOptions::new([etcd.address()]);
            options.prefix.clone_from(&prefix);
            options.host = format!("h{i}");
            options.ttl = Duration::from_secs(30);
            let publisher = Publisher::start(&table, options).unwrap();
            (table, publisher)
        })
        .collect();
    wait_for("every publisher connected", Duration::from_secs(10), || {
        publishers.iter().all(|(_, p)| p.is_connected())
    });
    etcd.kill();
    wait_for("every publisher cut off", Duration::from_secs(15), || {
        publishers.iter().all(|(_, p)| !p.is_connected())
    });
    // Long enough for a few failed tries each: the delay is past 1 s.
    std::thread::sleep(Duration::from_secs(3));
    etcd.resume();
    let resumed = Instant::now();
    let mut back: Vec<Option<Duration>> = vec![None; publishers.len()];
    while back.iter().any(Option::is_none) {
        assert!(
            resumed.elapsed() < Duration::from_secs(20),
            "not every publisher back within 20 s: {back:?}"
        );
        for (i, (_, publisher)) in publishers.iter().enumerate() {
            if back[i].is_none() && publisher.is_connected() {
                back[i] = Some(resumed.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut back: Vec<Duration> = back.into_iter().flatten().collect();
    back.sort();
    let spread = back[back.len() - 1] - back[0];
    // Lockstep would bring them back within a few milliseconds of each
    // other; waits drawn from [delay / 2, delay] with a delay over 1 s
    // spread them over hundreds.
    assert!(spread > Duration::from_millis(200), "back at {back:?}");
    let within_50_ms = back
        .windows(2)
        .filter(|w| w[1] - w[0] < Duration::from_millis(50))
        .count();
    assert!(within_50_ms < back.len() - 1, "back at {back:?}");
}
