//! Registering and deregistering, and a reset, with an idle reaper thread.
//! A process's first registration in a shared table starts its death
//! thread and its last deregistration ends it: measured beside the same
//! with the thread already running (another registration held) and with
//! death threads turned off (`LIVEREG_NO_DEATH_THREAD=1`), in one run.

mod support;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use livereg::{Table, TableOptions};
use std::time::Duration;
use support::BenchTable;

/// How a register + deregister cycle runs.
enum Setup {
    /// The process's first and last registration: its death thread starts
    /// and ends.
    FirstAndLast,
    /// Beside a held registration: the death thread runs throughout.
    ThreadRunning,
    /// With death threads turned off.
    NoDeathThread,
}

fn lifecycle(c: &mut Criterion) {
    let options = TableOptions {
        capacity: 8192,
        ..TableOptions::default()
    };
    let bench = BenchTable::new("lifecycle", &options);
    let reaper = bench.table.reaper().spawn().unwrap();
    let mut group = c.benchmark_group("lifecycle");
    let mut id = 0u64;
    for (setup, name) in [
        (
            Setup::FirstAndLast,
            "register + deregister (shared table, reaper running)",
        ),
        (
            Setup::ThreadRunning,
            "register + deregister beside a held one (death thread running)",
        ),
        (
            Setup::NoDeathThread,
            "register + deregister (no death thread)",
        ),
    ] {
        let held = matches!(setup, Setup::ThreadRunning)
            .then(|| bench.table.register(u64::MAX, "held").unwrap());
        if matches!(setup, Setup::NoDeathThread) {
            std::env::set_var("LIVEREG_NO_DEATH_THREAD", "1");
        }
        group.bench_function(name, |b| b.iter(|| cycle(&bench.table, &mut id)));
        std::env::remove_var("LIVEREG_NO_DEATH_THREAD");
        drop(held);
        drained(&bench.table);
    }
    drained(&bench.table);
    group.bench_function(
        "reset of one registration, until completed (idle reaper)",
        |b| {
            b.iter_batched(
                || {
                    id += 1;
                    bench.table.register(id, "reset").unwrap()
                },
                |worker| {
                    bench.table.reset(Duration::from_secs(5)).unwrap();
                    worker
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.finish();
    reaper.stop().unwrap();
}

/// Waits until the reaper has dropped every registration the last bench
/// left (a burst of deregistrations outruns a reaper on two cores), so the
/// next starts on an empty table.
fn drained(table: &Table) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !table.status().unwrap().registrations.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the reaper never caught up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process's first registration and last deregistration, where the
/// death thread starts and ends, beside a registration alone without one:
/// on a table of the default size (the slot search reads every slot, so a
/// larger table costs every registration more).
fn first_and_last(c: &mut Criterion) {
    let first = BenchTable::new("lifecycle-first", &TableOptions::default());
    let reaper = first.table.reaper().spawn().unwrap();
    let mut group = c.benchmark_group("lifecycle");
    let mut id = 0u64;
    std::env::set_var("LIVEREG_NO_DEATH_THREAD", "1");
    group.bench_function(
        "a registration alone, 2 ms after the last one's end (no death thread)",
        |b| {
            b.iter_batched(
                || settle(Duration::from_millis(2)),
                |()| {
                    id += 1;
                    first.table.register(id, "alone").unwrap()
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.bench_function(
        "a registration alone on a handle of its own (no death thread)",
        |b| {
            b.iter_batched(
                || {
                    settle(Duration::from_millis(2));
                    Table::open(&first.name).unwrap()
                },
                |table| {
                    id += 1;
                    (table.register(id, "alone").unwrap(), table)
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.bench_function("a deregistration alone (no death thread)", |b| {
        b.iter_batched(
            || {
                settle(Duration::from_millis(2));
                id += 1;
                first.table.register(id, "alone").unwrap()
            },
            |worker| worker.deregister().unwrap(),
            BatchSize::PerIteration,
        )
    });
    std::env::remove_var("LIVEREG_NO_DEATH_THREAD");
    drained(&first.table);
    group.bench_function(
        "a process's first registration (its death thread started)",
        |b| {
            // Each on a handle of its own, as a process's first is: the
            // thread lives with the handle's mapping, and the previous
            // one's ended with it (outside the timing).
            b.iter_batched(
                || {
                    settle(Duration::from_millis(2));
                    Table::open(&first.name).unwrap()
                },
                |table| {
                    id += 1;
                    (table.register(id, "first").unwrap(), table)
                },
                BatchSize::PerIteration,
            )
        },
    );
    drained(&first.table);
    group.bench_function(
        "a first registration again (its death thread lingering)",
        |b| {
            // After the last one's deregistration, the reaper settled.
            b.iter_batched(
                || settle(Duration::from_millis(2)),
                |()| {
                    id += 1;
                    first.table.register(id, "again").unwrap()
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.bench_function(
        "a process's last deregistration (its death word given back)",
        |b| {
            b.iter_batched(
                || {
                    settle(Duration::from_millis(2));
                    id += 1;
                    first.table.register(id, "last").unwrap()
                },
                |worker| worker.deregister().unwrap(),
                BatchSize::PerIteration,
            )
        },
    );
    group.finish();
    reaper.stop().unwrap();
}

/// Lets `span` pass busy, not asleep: a CPU left idle wakes slowly on a
/// VM, and that wake would be timed as the registration's.
fn settle(span: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < span {
        std::hint::spin_loop();
    }
}

/// One registration of a new id, deregistered at once.
fn cycle(table: &Table, id: &mut u64) {
    *id += 1;
    table.register(*id, "bench").unwrap().deregister().unwrap();
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = lifecycle, first_and_last
}
criterion_main!(benches);
