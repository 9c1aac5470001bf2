//! A fleet on etcd: N hosts (each a real `Publisher` with its own lease
//! over its own table of 8 registrations, several per process) and 3
//! `ClusterWatch` consumers, against a real 3-member etcd cluster on
//! loopback that the bench starts. For each N it reports etcd's load at
//! steady state, how soon every consumer reads an end, how soon a killed
//! host's keys are gone, what killing the etcd leader costs, and whether
//! every consumer's view ends equal to the hosts' tables. Prints a
//! markdown table.
//!
//! N = 100, 300, 1,000 with a 10 s lease TTL; `LIVEREG_FLEET_SIZES=a,b`
//! picks others. `LIVEREG_BENCH_QUICK=1`: 24 hosts, a 3 s TTL, short
//! windows (CI checks it runs, not its figures).

#[path = "../../tests/common/etcd_server.rs"]
mod etcd_server;
#[path = "../../benches/support/mod.rs"]
mod support;

#[path = "fleet/consumers.rs"]
mod consumers;
#[path = "fleet/hosts.rs"]
mod hosts;

use consumers::Consumers;
use etcd_client::{Client, GetOptions};
use etcd_server::EtcdServer;
use hosts::{Host, ProcessHost, PER_HOST};
use livereg::etcd::{ClusterEvent, EtcdOptions};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::quick;

const LIVEREG: &str = env!("CARGO_BIN_EXE_livereg");
/// Hosts that also run a reaper (the ends are told on them).
const REAPED: usize = 16;
/// Consumers following the fleet.
const CONSUMERS: usize = 3;

/// One N's figures.
struct Row {
    hosts: usize,
    ttl: Duration,
    startup: Duration,
    steady_per_host: f64,
    steady_goal_per_host: f64,
    leader_cpu: f64,
    /// The bench process's growth per host (a publisher, its thread and
    /// runtime, its wake-up thread, a table of 16 slots).
    rss_per_host: f64,
    /// The bench process's CPU per host at steady state (fraction of a core).
    cpu_per_host: f64,
    end_to_consumers: Vec<Duration>,
    /// A client's put seen by a bare etcd watch, same cluster, same run.
    bare: Vec<Duration>,
    host_gone: Duration,
    leader_whole: Duration,
    /// The busiest second after the leader was killed, against the steady
    /// mean; and the busiest steady second against it.
    recovery_peak_ratio: f64,
    steady_peak_ratio: f64,
    reconnects: Vec<Duration>,
    /// Keys missing at the worst moment after the leader was killed.
    keys_lost: usize,
    views_equal: bool,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let sizes: Vec<usize> = match std::env::var("LIVEREG_FLEET_SIZES") {
        Ok(list) => list
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect(),
        Err(_) if quick() => vec![24],
        Err(_) => vec![100, 300, 1000],
    };
    let ttl = Duration::from_secs(if quick() { 3 } else { 10 });
    println!("| hosts | up (all keys in etcd) | steady etcd requests/s per host (goal: keep-alives at TTL/3 = {:.2}) | etcd leader CPU | per host: memory, CPU at steady state | end → all 3 consumers p50 / p99 / max | host SIGKILLed → its keys gone at every consumer (TTL {} s) | leader SIGKILLed → every host whole | busiest second / steady mean: recovery (steady's own) | hosts reconnected: count, first / median / last | keys lost meanwhile | views = tables |", 3.0 / ttl.as_secs_f64(), ttl.as_secs());
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        let row = run(n, ttl);
        println!("{}", render(&row));
        assert!(row.views_equal, "a consumer's view differs from the tables");
    }
}

fn run(n: usize, ttl: Duration) -> Row {
    let mut cluster = EtcdServer::cluster("fleet", 3);
    let endpoints: Vec<String> = cluster.iter().map(EtcdServer::address).collect();
    let prefix = format!("/livereg-fleet-{}-{n}", std::process::id());
    let mut options = EtcdOptions::new(endpoints.clone());
    options.prefix.clone_from(&prefix);
    let mut count = KeyCount::new(cluster.iter().map(|m| m.endpoint.clone()), &prefix);

    let rss_before = resident_kib();
    let started = Instant::now();
    let mut hosts: Vec<Host> = (0..n)
        .map(|i| Host::start(i, &options, ttl, i < REAPED))
        .collect();
    let mut process_host = ProcessHost::start(LIVEREG, &endpoints.join(","), &prefix, ttl);
    let expected = n * PER_HOST as usize + 1;
    wait_until("every key in etcd", Duration::from_secs(300), || {
        count.keys() == Some(expected)
    });
    let startup = started.elapsed();
    let rss_per_host = resident_kib().saturating_sub(rss_before) as f64 / n as f64;
    let consumers = Consumers::start(CONSUMERS, &options, expected);

    // Steady state: past the start's keep-alive phase, nothing changing.
    std::thread::sleep(ttl / 3 + Duration::from_secs(1));
    let window = if quick() { 3 } else { 15 };
    let window = Duration::from_secs(window);
    let leader = leader(&cluster);
    let (before, cpu_before) = (requests(&cluster), cpu_seconds(&cluster[leader]));
    let own_cpu_before = own_cpu_seconds();
    let mut steady_peak: f64 = 0.0;
    let mut last_sample = (Instant::now(), before);
    for _ in 0..window.as_secs() {
        std::thread::sleep(Duration::from_secs(1));
        let total = requests(&cluster);
        let (now, (then, previous)) = (Instant::now(), last_sample);
        steady_peak = steady_peak.max((total - previous) / (now - then).as_secs_f64());
        last_sample = (now, total);
    }
    let (after, cpu_after) = (last_sample.1, cpu_seconds(&cluster[leader]));
    let steady = (after - before) / window.as_secs_f64();
    let leader_cpu = (cpu_after - cpu_before) / window.as_secs_f64();
    // This process: the hosts' publishers (each looks at its table every
    // second, and keeps its lease alive), the consumers, the bench's own
    // once-a-second sampling.
    let cpu_per_host = (own_cpu_seconds() - own_cpu_before) / window.as_secs_f64() / n as f64;

    // The baseline: a client's own put, seen by a bare etcd watch.
    let bare = count.bare_puts(&cluster[0], if quick() { 5 } else { 30 });

    // Ends told on reaped hosts, each read by every consumer.
    let ends = if quick() { 6 } else { 60 };
    let mut end_to_consumers = Vec::new();
    for k in 0..ends {
        let host = &mut hosts[k % REAPED.min(n)];
        let (name, id) = (host.name.clone(), (k / REAPED.min(n)) as u64 % PER_HOST + 1);
        let ended = Instant::now();
        host.end(id);
        let read = consumers.all_read(Duration::from_secs(10), |e| {
            matches!(e, ClusterEvent::Ended { record }
                if record.host == name && record.instance_id == id && record.ended.is_some())
        });
        end_to_consumers.push(*read.iter().max().unwrap() - ended);
        host.register_again(id);
        consumers.all_read(Duration::from_secs(10), |e| {
            matches!(e, ClusterEvent::Registered { record }
                if record.host == name && record.instance_id == id)
        });
    }

    // A host's publisher SIGKILLed: its lease expires, its keys go.
    let killed = Instant::now();
    process_host.kill_reaper();
    let gone_host = process_host.name.clone();
    let read = consumers.all_read(ttl + Duration::from_secs(10), |e| match e {
        ClusterEvent::HostGone { host, .. } => *host == gone_host,
        ClusterEvent::Ended { record } => record.host == gone_host,
        ClusterEvent::Registered { .. } | ClusterEvent::Dying { .. } => false,
    });
    let host_gone = *read.iter().max().unwrap() - killed;
    let expected = expected - 1;

    // The etcd leader SIGKILLed, then restarted. Watched for the TTL and
    // more: a host that lost its lease would have its keys gone meanwhile.
    let leader = self::leader(&cluster);
    let killed = Instant::now();
    cluster[leader].kill();
    let survivors: Vec<usize> = (0..cluster.len()).filter(|&i| i != leader).collect();
    let mut count = KeyCount::new(
        survivors.iter().map(|&i| cluster[i].endpoint.clone()),
        &prefix,
    );
    let mut dropped: Vec<Option<Instant>> = vec![None; n];
    let mut back: Vec<Option<Instant>> = vec![None; n];
    let mut last_sample = (Instant::now(), requests_of(&cluster, &survivors));
    let mut peak: f64 = 0.0;
    let mut fewest_keys = expected;
    while killed.elapsed() < ttl + Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        for (i, host) in hosts.iter().enumerate() {
            let connected = host.publisher.is_connected();
            if !connected && dropped[i].is_none() {
                dropped[i] = Some(now);
            }
            if connected && dropped[i].is_some() && back[i].is_none() {
                back[i] = Some(now);
            }
        }
        if now - last_sample.0 >= Duration::from_secs(1) {
            let total = requests_of(&cluster, &survivors);
            peak = peak.max((total - last_sample.1) / (now - last_sample.0).as_secs_f64());
            last_sample = (now, total);
            if let Some(keys) = count.keys() {
                fewest_keys = fewest_keys.min(keys);
            }
        }
    }
    let whole = hosts.iter().all(|h| h.publisher.is_connected()) && count.keys() == Some(expected);
    assert!(whole, "every host whole again within the TTL and 5 s");
    let leader_whole = back
        .iter()
        .flatten()
        .max()
        .map_or(Duration::ZERO, |at| *at - killed);
    let mut reconnects: Vec<Duration> = back.iter().flatten().map(|at| *at - killed).collect();
    reconnects.sort();
    cluster[leader].resume();

    // Every consumer's view against the hosts' tables.
    let tables: BTreeSet<String> = hosts.iter().flat_map(Host::live).collect();
    let views = consumers.stop();
    let views_equal = views.iter().all(|view| *view == tables);
    drop(hosts);
    Row {
        hosts: n,
        ttl,
        startup,
        steady_per_host: steady / (n + 1) as f64,
        steady_goal_per_host: 3.0 / ttl.as_secs_f64(),
        leader_cpu,
        rss_per_host,
        cpu_per_host,
        end_to_consumers,
        bare,
        host_gone,
        leader_whole,
        recovery_peak_ratio: peak / steady.max(f64::MIN_POSITIVE),
        steady_peak_ratio: steady_peak / steady.max(f64::MIN_POSITIVE),
        reconnects,
        keys_lost: expected - fewest_keys,
        views_equal,
    }
}

fn render(row: &Row) -> String {
    let mut ends = row.end_to_consumers.clone();
    ends.sort();
    let at = |q: f64| ends[((ends.len() - 1) as f64 * q).round() as usize];
    let mut bare = row.bare.clone();
    bare.sort();
    let bare_median = bare[bare.len() / 2];
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let s = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let reconnects = match row.reconnects.as_slice() {
        [] => "0".to_owned(),
        r => format!(
            "{}, {} / {} / {}",
            r.len(),
            s(r[0]),
            s(r[r.len() / 2]),
            s(r[r.len() - 1])
        ),
    };
    format!(
        "| {} | {} | {:.3} ({:.2}x the goal) | {:.1} % of a core | {:.0} KiB, {:.1} µs/s | {} / {} / {} (bare put → watch: {}; p50 {:.1}x it) | {} ({}) | {} | {:.2}x ({:.2}x) | {} | {} | {} |",
        row.hosts,
        s(row.startup),
        row.steady_per_host,
        row.steady_per_host / row.steady_goal_per_host,
        row.leader_cpu * 100.0,
        row.rss_per_host,
        row.cpu_per_host * 1e6,
        ms(at(0.5)),
        ms(at(0.99)),
        ms(ends[ends.len() - 1]),
        ms(bare_median),
        at(0.5).as_secs_f64() / bare_median.as_secs_f64(),
        s(row.host_gone),
        if row.host_gone <= row.ttl + Duration::from_secs(1) { "≤ TTL + 1 s" } else { "PAST TTL + 1 s" },
        s(row.leader_whole),
        row.recovery_peak_ratio,
        row.steady_peak_ratio,
        reconnects,
        row.keys_lost,
        if row.views_equal { "yes" } else { "NO" }
    )
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The member that leads now.
fn leader(cluster: &[EtcdServer]) -> usize {
    let start = Instant::now();
    loop {
        if let Some(i) = cluster.iter().position(EtcdServer::is_leader) {
            return i;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no etcd leader");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Requests the whole cluster received (every gRPC message: unary requests
/// and stream messages such as keep-alives), from the members' metrics.
fn requests(cluster: &[EtcdServer]) -> f64 {
    requests_of(cluster, &(0..cluster.len()).collect::<Vec<_>>())
}

fn requests_of(cluster: &[EtcdServer], members: &[usize]) -> f64 {
    members
        .iter()
        .flat_map(|&i| {
            cluster[i]
                .metrics()
                .lines()
                .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// CPU seconds a member's process has used.
fn cpu_seconds(member: &EtcdServer) -> f64 {
    let pid = member.pid().expect("the member runs");
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
}

/// User and system CPU seconds from a `/proc/PID/stat` line.
fn stat_cpu_seconds(stat: &str) -> f64 {
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    // SAFETY: `sysconf` reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / per_second
}

/// This process's resident memory (`VmRSS`), KiB.
fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU seconds this process has used.
fn own_cpu_seconds() -> f64 {
    stat_cpu_seconds(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

/// Counts the keys under the prefix, through any member that answers.
struct KeyCount {
    runtime: tokio::runtime::Runtime,
    client: Client,
    under: String,
}

impl KeyCount {
    fn new(endpoints: impl IntoIterator<Item = String>, prefix: &str) -> KeyCount {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let endpoints: Vec<String> = endpoints.into_iter().collect();
        let client = runtime
            .block_on(Client::connect(endpoints, None))
            .expect("connect to etcd");
        KeyCount {
            runtime,
            client,
            under: format!("{prefix}/"),
        }
    }

    /// `runs` puts of a key of the bench's own, each timed from the call
    /// to a bare watch on `member` seeing it.
    fn bare_puts(&mut self, member: &EtcdServer, runs: usize) -> Vec<Duration> {
        let key = format!("{}bare", self.under.trim_end_matches('/'));
        let events = member.watch(&key);
        (0..runs)
            .map(|run| {
                let put = Instant::now();
                let write = self.client.put(key.as_str(), run.to_string(), None);
                self.runtime.block_on(write).expect("a bare put");
                let seen = events
                    .recv_timeout(Duration::from_secs(10))
                    .expect("the bare put seen");
                seen.at - put
            })
            .collect()
    }

    fn keys(&mut self) -> Option<usize> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let read = self.client.get(self.under.as_str(), Some(options));
        let answer = self
            .runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(2), read).await });
        Some(answer.ok()?.ok()?.count() as usize)
    }
}
