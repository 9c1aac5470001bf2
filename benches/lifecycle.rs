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
        "a process's first registration (its death thread started)",
        |b| {
            // As a process's first registration is: after its last one's
            // thread has ended and the reaper has settled (outside the
            // timing), not on the heels of the previous iteration's.
            b.iter_batched(
                || std::thread::sleep(Duration::from_millis(2)),
                |()| {
                    id += 1;
                    bench.table.register(id, "first").unwrap()
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.bench_function(
        "a process's last deregistration (its death thread ended)",
        |b| {
            b.iter_batched(
                || {
                    id += 1;
                    bench.table.register(id, "last").unwrap()
                },
                |worker| worker.deregister().unwrap(),
                BatchSize::PerIteration,
            )
        },
    );
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

/// One registration of a new id, deregistered at once.
fn cycle(table: &Table, id: &mut u64) {
    *id += 1;
    table.register(*id, "bench").unwrap().deregister().unwrap();
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = lifecycle
}
criterion_main!(benches);
