//! One reaper sweep over N live registrations: the heartbeat sweep alone (a
//! heap table has no exit locks), with pidfd-watched registrations, and with
//! registrations only their locks can judge (another PID namespace): steady,
//! and in a lock round after a registrant let go; beside the two ways a
//! round can test the locks; and one process in another PID namespace holding
//! every registration, as an engine in a sibling container does.

#[path = "../../benches/support/mod.rs"]
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

/// `F_OFD_GETLK` on the first `n` registration lock bytes (slot `i`,
/// generation 0 or 1), as a round without a snapshot would.
fn test_each_lock(file: &std::fs::File, n: u32) -> u32 {
    use std::os::fd::AsRawFd;
    let mut held = 0;
    for index in 0..n {
        // SAFETY: an all-zero `flock` is valid; fields are set below.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = ((1i64 << 40) + (i64::from(index) << 16)) as libc::off_t;
        lock.l_len = 1;
        // SAFETY: the descriptor is open; `lock` is a valid, writable flock.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
        held += u32::from(lock.l_type != libc::F_UNLCK as libc::c_short);
    }
    held
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
    // The sweep with progress judged: every worker busy, its
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
    // by recording a pid that is not the registrant's). Their locks are
    // tested only in a round: after a descriptor on the table was closed (a
    // registrant died or let go), or on the backstop every 16 scans.
    group.sample_size(10);
    for n in sizes(4_096) {
        group.throughput(Throughput::Elements(u64::from(n)));
        let bench = BenchTable::new(&format!("scan-lock-{n}"), &options(n));
        let mut workers = fill(&bench.table, n, Some(1));
        let mut reaper = bench.table.reaper().build().unwrap();
        reaper.scan().unwrap(); // the first scan is a round
        group.bench_with_input(
            BenchmarkId::new(
                "steady scan, lock only (other PID namespace; a round every 16)",
                n,
            ),
            &n,
            |b, _| b.iter(|| reaper.scan().unwrap()),
        );
        // A registrant lets go before each scan (its lock's descriptor
        // closes): the scan is a lock round over all of them.
        let mut next = u64::from(n) + 1;
        group.bench_with_input(
            BenchmarkId::new("scan after a registrant let go: lock round, lock only", n),
            &n,
            |b, _| {
                b.iter_custom(|iterations| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        workers.remove(0).deregister().unwrap();
                        std::thread::sleep(Duration::from_millis(2)); // the close is heard
                        let started = std::time::Instant::now();
                        reaper.scan().unwrap(); // also frees the slot let go
                        total += started.elapsed();
                        let worker = bench.table.registration(next).pid(1).register().unwrap();
                        workers.push(worker);
                        next += 1;
                    }
                    total
                })
            },
        );
        // The two ways a round can test n held locks, on this very table.
        let file = std::fs::File::open(format!("/dev/shm/{}", bench.name)).unwrap();
        group.bench_with_input(
            BenchmarkId::new("test every lock with F_OFD_GETLK (the alternative)", n),
            &n,
            |b, _| b.iter(|| test_each_lock(&file, n)),
        );
        group.bench_with_input(
            BenchmarkId::new(
                "read every held lock from /proc/locks (a round's choice)",
                n,
            ),
            &n,
            |b, _| b.iter(|| std::fs::read_to_string("/proc/locks").unwrap().len()),
        );
        drop(reaper);
        drop(workers);
    }
    // The deployment: one engine process in a sibling container (here: pid 1
    // of a new PID namespace, `livereg worker --also`) holding n
    // registrations. A round tests one lock per registering process.
    for n in sizes(4_096) {
        group.throughput(Throughput::Elements(u64::from(n)));
        let bench = BenchTable::new(&format!("scan-process-{n}"), &options(n + 1));
        let Some(_engine) = Engine::spawn(&bench, n) else {
            break;
        };
        let mut reaper = bench.table.reaper().build().unwrap();
        reaper.scan().unwrap(); // the first scan tests every lock it first sees
        group.bench_with_input(
            BenchmarkId::new(
                "lock round after a close, one process in another PID namespace",
                n,
            ),
            &n,
            |b, _| {
                b.iter_custom(|iterations| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        let own = bench.table.register(u64::from(n) + 1, "closer").unwrap();
                        own.deregister().unwrap(); // closes a descriptor on the table
                        std::thread::sleep(Duration::from_millis(2)); // the close is heard
                        let started = std::time::Instant::now();
                        reaper.scan().unwrap();
                        total += started.elapsed();
                    }
                    total
                })
            },
        );
        let status = bench.table.status().unwrap();
        assert_eq!(
            status.tracked_instances, n as usize,
            "a live registration was dropped"
        );
        drop(reaper);
    }
    group.finish();
}

/// `livereg worker` as pid 1 of a new PID namespace, holding `n`
/// registrations; killed on drop. `None` (and a note) where PID namespaces
/// cannot be made.
struct Engine(std::process::Child);

impl Engine {
    fn spawn(bench: &BenchTable, n: u32) -> Option<Engine> {
        use std::io::BufRead;
        let child = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(env!("CARGO_BIN_EXE_livereg"))
            .args(["worker", &bench.name, "--instance", "1", "--interval", "1s"])
            .args(["--also", &(n - 1).to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn();
        let Ok(mut child) = child else {
            println!("LIMITATION: no unshare here; the one-process bench is skipped");
            return None;
        };
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        if lines.take(n as usize).filter(|l| l.is_ok()).count() < n as usize {
            println!(
                "LIMITATION: cannot create a PID namespace here; the one-process bench is skipped"
            );
            let _ = child.kill();
            return None;
        }
        Some(Engine(child))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = sweep
}
criterion_main!(benches);
