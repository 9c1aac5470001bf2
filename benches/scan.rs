//! One reaper sweep over N live registrations: the heartbeat sweep alone (a
//! heap table has no exit locks) and with the process-exit check per
//! registration (a shared table: one F_OFD_GETLK each).

mod support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use livereg::{Clock, Table, TableOptions};
use std::time::Duration;
use support::{quick, BenchTable};

fn options(capacity: u32) -> TableOptions {
    TableOptions {
        capacity,
        reap_timeout: Duration::from_secs(3600),
        registration_grace: Duration::from_secs(3600),
        ..TableOptions::default()
    }
}

/// Registers and beats `n` workers (recording `pid` if given); the handles
/// are kept alive by the caller.
fn fill(table: &Table, n: u32, pid: Option<u32>) -> Vec<livereg::Worker> {
    (1..=u64::from(n))
        .map(|id| {
            let registration = table.registration(id).label("scan");
            let worker = match pid {
                Some(pid) => registration.pid(pid),
                None => registration,
            }
            .register()
            .unwrap();
            worker.heartbeat().unwrap();
            worker
        })
        .collect()
}

fn sizes(largest: u32) -> Vec<u32> {
    let all = [1_024, 4_096, 16_384, 65_536];
    all.into_iter()
        .filter(|n| *n <= largest)
        .take(if quick() { 1 } else { 4 })
        .collect()
}

fn sweep(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan");
    for n in sizes(65_536) {
        group.throughput(Throughput::Elements(u64::from(n)));
        let manual = Clock::manual(1_000_000_000);
        let table = Table::in_memory(&options(n))
            .unwrap()
            .with_clock(manual.clock());
        let workers = fill(&table, n, None);
        let mut reaper = table.reaper().build().unwrap();
        group.bench_with_input(
            BenchmarkId::new("heartbeat sweep, live slots", n),
            &n,
            |b, _| b.iter(|| reaper.scan_once(manual.now_ns()).unwrap()),
        );
        drop(reaper);
        drop(workers);
        let empty = Table::in_memory(&options(n)).unwrap();
        let mut reaper = empty.reaper().build().unwrap();
        group.bench_with_input(
            BenchmarkId::new("heartbeat sweep, free slots", n),
            &n,
            |b, _| b.iter(|| reaper.scan().unwrap()),
        );
    }
    // The sweep with progress judged (SPEC 1.19): every worker busy, its
    // progress word read and remembered per slot.
    for n in sizes(65_536) {
        group.throughput(Throughput::Elements(u64::from(n)));
        let manual = Clock::manual(1_000_000_000);
        let table = Table::in_memory(&TableOptions {
            progress_timeout: Duration::from_secs(3600),
            ..options(n)
        })
        .unwrap()
        .with_clock(manual.clock());
        let workers = fill(&table, n, None);
        for worker in &workers {
            worker.set_busy(true).unwrap();
        }
        let mut reaper = table.reaper().build().unwrap();
        group.bench_with_input(
            BenchmarkId::new("heartbeat sweep with progress judged, busy slots", n),
            &n,
            |b, _| b.iter(|| reaper.scan_once(manual.now_ns()).unwrap()),
        );
        drop(reaper);
        drop(workers);
    }
    // A server's reaper on its own loop: one scan of 8 live registrations of
    // this process on a shared table, steady state (pidfds watching, no
    // exit), as `livereg_reaper_scan` does it.
    {
        let bench = BenchTable::new("scan-driven-8", &options(8));
        let workers = fill(&bench.table, 8, None);
        let mut reaper = bench.table.reaper().build().unwrap();
        reaper.scan().unwrap();
        group.throughput(Throughput::Elements(8));
        group.bench_function("driven scan, 8 live registrations (shared table)", |b| {
            b.iter(|| reaper.scan().unwrap())
        });
        drop(reaper);
        drop(workers);
    }
    // Exit checks hold a lock descriptor per registration and the reaper a
    // pidfd per watched registration: 4,096 of each fits the usual limit of
    // 20,000 open files, 16,384 does not.
    for n in sizes(4_096) {
        group.throughput(Throughput::Elements(u64::from(n)));
        let bench = BenchTable::new(&format!("scan-{n}"), &options(n));
        let workers = fill(&bench.table, n, None);
        let mut reaper = bench.table.reaper().build().unwrap();
        reaper.scan().unwrap(); // the first scan opens and verifies the pidfds
        group.bench_with_input(
            BenchmarkId::new("sweep + exit check, pidfd-watched (same PID namespace)", n),
            &n,
            |b, _| b.iter(|| reaper.scan().unwrap()),
        );
        drop(reaper);
        drop(workers);
    }
    // Registrations no pidfd can watch (another PID namespace; here forced
    // by recording a pid that is not the registrant's): one F_OFD_GETLK each
    // per scan, and the kernel walks the table's lock list for each.
    group.sample_size(10);
    for n in sizes(4_096) {
        group.throughput(Throughput::Elements(u64::from(n)));
        let bench = BenchTable::new(&format!("scan-lock-{n}"), &options(n));
        let workers = fill(&bench.table, n, Some(1));
        let mut reaper = bench.table.reaper().build().unwrap();
        group.bench_with_input(
            BenchmarkId::new("sweep + exit check, lock only (other PID namespace)", n),
            &n,
            |b, _| b.iter(|| reaper.scan().unwrap()),
        );
        drop(reaper);
        drop(workers);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = sweep
}
criterion_main!(benches);
