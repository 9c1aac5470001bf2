//! `livereg reap --standby`: waiting without cost, taking over.

use super::*;

#[test]
fn a_standby_reaper_costs_the_active_one_no_scans() {
    let (name, _guard) = created("standby-cost", &["--timeout", "2s"]);
    let _active = Background::spawn(&["reap", &name]);
    wait_until("the reaper", || reaper_alive(&name));
    let scans_in = |window: Duration| {
        let before = status_json(&name)["scans"].as_u64().unwrap();
        std::thread::sleep(window);
        status_json(&name)["scans"].as_u64().unwrap() - before
    };
    let alone = scans_in(Duration::from_secs(2));
    let _standby = Background::spawn(&["reap", &name, "--standby"]);
    std::thread::sleep(Duration::from_millis(300)); // it is polling by now
    let beside_a_standby = scans_in(Duration::from_secs(2));
    // Every 500 ms alone: 4 or 5 scans (and one for each status read). A
    // standby polling every 100 ms used to add one per poll (~20).
    assert!(
        beside_a_standby <= alone + 2,
        "{beside_a_standby} scans beside a standby, {alone} alone"
    );
}

#[test]
fn standby_reaper_takes_over_when_the_first_dies() {
    let (name, _guard) = created("standby", &["--timeout", "400ms", "--grace", "800ms"]);
    let first = Background::spawn(&["reap", &name]);
    wait_until("the first reaper", || reaper_alive(&name));
    let token = stdout(&livereg(&["probe", &name]));
    let _second = Background::spawn(&["reap", &name, "--standby"]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        stdout(&livereg(&["probe", &name])),
        token,
        "the first reaper still holds it"
    );
    first.signal(libc::SIGKILL);
    wait_until("the standby to take over", || {
        let now = livereg(&["probe", &name]);
        now.status.success() && stdout(&now) != token
    });
}
