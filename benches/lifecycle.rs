//! Registering and deregistering, and a reset, with an idle reaper thread.

mod support;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use livereg::TableOptions;
use std::time::Duration;
use support::BenchTable;

fn lifecycle(c: &mut Criterion) {
    let options = TableOptions {
        capacity: 1024,
        ..TableOptions::default()
    };
    let bench = BenchTable::new("lifecycle", &options);
    let reaper = bench.table.reaper().spawn().unwrap();
    let mut group = c.benchmark_group("lifecycle");
    let mut id = 0u64;
    group.bench_function(
        "register + deregister (shared table, reaper running)",
        |b| {
            b.iter(|| {
                id += 1;
                bench
                    .table
                    .register(id, "bench")
                    .unwrap()
                    .deregister()
                    .unwrap()
            })
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

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = lifecycle
}
criterion_main!(benches);
