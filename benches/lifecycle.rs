//! Registering and deregistering, opening a table, and a reset, with an
//! idle reaper thread. Opening a shared table starts the process's death
//! thread, parked; a process's first registration wakes it to claim the
//! process's death word, and its last deregistration gives the word back:
//! each measured beside the same with death threads turned off
//! (`LIVEREG_NO_DEATH_THREAD=1`, read when a handle is opened), in one run.

mod support;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use livereg::{Table, TableOptions};
use std::time::Duration;
use support::BenchTable;

/// The death threads' switch, read by `Table::open`.
const OFF: &str = "LIVEREG_NO_DEATH_THREAD";

/// A handle of `name` opened with death threads turned off.
fn without_death_thread(name: &str) -> Table {
    std::env::set_var(OFF, "1");
    let table = Table::open(name).unwrap();
    std::env::remove_var(OFF);
    table
}

fn lifecycle(c: &mut Criterion) {
    let options = TableOptions {
        capacity: 8192,
        ..TableOptions::default()
    };
    let bench = BenchTable::new("lifecycle", &options);
    let plain = without_death_thread(&bench.name);
    let reaper = bench.table.reaper().spawn().unwrap();
    let mut group = c.benchmark_group("lifecycle");
    let mut id = 0u64;
    group.bench_function("register + deregister (no death thread)", |b| {
        b.iter(|| cycle(&plain, &mut id))
    });
    drained(&bench.table);
    group.bench_function(
        "register + deregister as the process's first and last (its word claimed and given back)",
        |b| b.iter(|| cycle(&bench.table, &mut id)),
    );
    drained(&bench.table);
    let held = bench.table.register(u64::MAX, "held").unwrap();
    group.bench_function(
        "register + deregister beside a held one (the word held throughout)",
        |b| b.iter(|| cycle(&bench.table, &mut id)),
    );
    drop(held);
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

/// One at a time, each 2 ms after the last (the reaper settled): opening a
/// table, a process's first registration and its last deregistration,
/// each beside the same without a death thread, on a table of the default
/// size (the slot search reads every slot, so a larger table costs every
/// registration more).
fn first_and_last(c: &mut Criterion) {
    let first = BenchTable::new("lifecycle-first", &TableOptions::default());
    let plain = without_death_thread(&first.name);
    let reaper = first.table.reaper().spawn().unwrap();
    let mut group = c.benchmark_group("lifecycle");
    let mut id = 0u64;
    group.bench_function("open a table (no death thread)", |b| {
        std::env::set_var(OFF, "1");
        b.iter_batched(
            || settle(Duration::from_millis(2)),
            |()| Table::open(&first.name).unwrap(),
            BatchSize::PerIteration,
        );
        std::env::remove_var(OFF);
    });
    group.bench_function("open a table (its death thread started)", |b| {
        b.iter_batched(
            || settle(Duration::from_millis(2)),
            |()| Table::open(&first.name).unwrap(),
            BatchSize::PerIteration,
        )
    });
    for (table, name) in [
        (&plain, "a registration alone (no death thread)"),
        (
            &first.table,
            "a process's first registration (its death thread woken)",
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || settle(Duration::from_millis(2)),
                |()| {
                    id += 1;
                    table.register(id, "first").unwrap()
                },
                BatchSize::PerIteration,
            )
        });
        drained(&first.table);
    }
    for (table, name) in [
        (&plain, "a deregistration alone (no death thread)"),
        (
            &first.table,
            "a process's last deregistration (its death word given back)",
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    settle(Duration::from_millis(2));
                    id += 1;
                    table.register(id, "last").unwrap()
                },
                |worker| worker.deregister().unwrap(),
                BatchSize::PerIteration,
            )
        });
        drained(&first.table);
    }
    // Declaring a file owned: a look at it by name, the record written
    // (the owner record already taken, as for every declaration but a
    // process's first).
    let file = std::path::Path::new("/dev/shm").join(format!("{}-owned", first.name));
    std::fs::write(&file, b"owned").unwrap();
    first.table.own_file(&file).unwrap();
    group.bench_function("stat the file (the baseline of the next)", |b| {
        b.iter(|| std::fs::symlink_metadata(&file).unwrap())
    });
    group.bench_function("declare a file owned (own_file)", |b| {
        b.iter_batched(
            || {
                first.table.disown_file(&file).unwrap();
            },
            |()| first.table.own_file(&file).unwrap(),
            BatchSize::PerIteration,
        )
    });
    first.table.disown_file(&file).unwrap();
    let _ = std::fs::remove_file(&file);
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
