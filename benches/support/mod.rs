//! Shared by the benches: quick mode, unique table names, a private cache line.
#![allow(dead_code)]

use criterion::Criterion;
use livereg::{Table, TableOptions};
use std::time::Duration;

/// `LIVEREG_BENCH_QUICK=1`: run each bench briefly (CI checks they run, not
/// their speed).
pub fn quick() -> bool {
    std::env::var_os("LIVEREG_BENCH_QUICK").is_some()
}

pub fn criterion() -> Criterion {
    let c = Criterion::default().configure_from_args();
    if quick() {
        c.warm_up_time(Duration::from_millis(50))
            .measurement_time(Duration::from_millis(200))
            .sample_size(10)
    } else {
        c.warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
    }
}

/// A table in /dev/shm, unlinked on drop.
pub struct BenchTable {
    pub name: String,
    pub table: Table,
}

impl BenchTable {
    pub fn new(tag: &str, options: &TableOptions) -> BenchTable {
        let name = format!("livereg-bench-{tag}-{}", std::process::id());
        let _ = Table::unlink(&name);
        let table = Table::create(&name, options).expect("create the bench table");
        BenchTable { name, table }
    }
}

impl Drop for BenchTable {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.name);
    }
}

/// A 128-byte aligned atomic: the bare limit's private cache line.
#[repr(align(128))]
pub struct Line(pub std::sync::atomic::AtomicU64);
