//! The heartbeat against its bare limit (its clock read plus one CAS on a
//! private cache line), the clocks it could use, the RPC pings it replaces,
//! and two threads beating side by side (false sharing).

mod support;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use livereg::{monotonic_coarse_ns, monotonic_ns, StampClock, TableOptions, Worker};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use support::{BenchTable, Line};

fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    group.bench_function("clock_gettime(MONOTONIC)", |b| b.iter(monotonic_ns));
    group.bench_function("clock_gettime(MONOTONIC_COARSE)", |b| {
        b.iter(monotonic_coarse_ns)
    });
    #[cfg(target_arch = "x86_64")]
    group.bench_function("rdtsc", |b| {
        // SAFETY: `rdtsc` has no preconditions on x86_64.
        b.iter(|| unsafe { core::arch::x86_64::_rdtsc() })
    });
    group.finish();
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("heartbeat");
    let line = Line(AtomicU64::new(0));
    for (name, clock) in [
        (
            "bare limit: clock + CAS on a private line",
            monotonic_ns as fn() -> u64,
        ),
        (
            "bare limit: coarse clock + CAS on a private line",
            monotonic_coarse_ns,
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let now = clock();
                let current = line.0.load(Ordering::Relaxed);
                black_box(line.0.compare_exchange(
                    current,
                    now.max(current),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ))
            })
        });
    }
    // The default table (10 s timeout): `StampClock::Auto` stamps coarsely.
    let bench = BenchTable::new("heartbeat", &TableOptions::default());
    assert_eq!(bench.table.stamp_clock(), StampClock::Coarse);
    let worker = bench.table.register(1, "bench").unwrap();
    group.bench_function("Worker::heartbeat (coarse stamps, the default)", |b| {
        b.iter(|| worker.heartbeat().unwrap())
    });
    let precise = BenchTable::new(
        "heartbeat-precise",
        &TableOptions {
            stamp_clock: StampClock::Precise,
            ..TableOptions::default()
        },
    );
    let precise_worker = precise.table.register(1, "bench").unwrap();
    group.bench_function("Worker::heartbeat (table forced to precise stamps)", |b| {
        b.iter(|| precise_worker.heartbeat().unwrap())
    });
    c_ping(&mut group, &bench.name);
    group.finish();
}

/// `livereg_ping` through the C ABI, loaded from target/release/liblivereg.so
/// (built by `cargo bench` with the rest of the workspace).
fn c_ping(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    table: &str,
) {
    type Open = unsafe extern "C" fn(*const libc::c_char, *mut *mut libc::c_void) -> i32;
    type Register = unsafe extern "C" fn(
        *mut libc::c_void,
        u64,
        *const libc::c_char,
        *mut *mut libc::c_void,
    ) -> i32;
    type Ping = unsafe extern "C" fn(*mut libc::c_void) -> i32;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/release/liblivereg.so\0"
    );
    // SAFETY:
    // - `path` is NUL-terminated; the library's initialisers are Rust's;
    // - the symbols are looked up by their C names and called with the
    //   signatures include/livereg.h declares; handles stay valid for the
    //   process (never freed here).
    unsafe {
        let library = libc::dlopen(path.as_ptr().cast(), libc::RTLD_NOW);
        assert!(
            !library.is_null(),
            "{path} is missing: run `cargo build --release` first"
        );
        let symbol = |name: &str| {
            let name = std::ffi::CString::new(name).unwrap();
            let found = libc::dlsym(library, name.as_ptr());
            assert!(!found.is_null(), "{name:?} not exported");
            found
        };
        let open: Open = std::mem::transmute(symbol("livereg_open"));
        let register: Register = std::mem::transmute(symbol("livereg_register"));
        let ping: Ping = std::mem::transmute(symbol("livereg_ping"));
        let name = std::ffi::CString::new(table).unwrap();
        let (mut handle, mut worker) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(open(name.as_ptr(), &mut handle), 0);
        assert_eq!(register(handle, 2, c"c-bench".as_ptr(), &mut worker), 0);
        group.bench_function("livereg_ping (C ABI, coarse stamps)", |b| {
            b.iter(|| assert_eq!(ping(worker), 0))
        });
    }
}

/// Forks a process that echoes one byte for each byte it reads on `fd`. The
/// child closes its copy of `peer`, so it sees end-of-file when we close ours.
fn echo_child(fd: i32, peer: i32) -> libc::pid_t {
    // SAFETY:
    // - the child only calls `close`, `read`, `write` and `_exit`
    //   (async-signal-safe) on its own stack buffer, so forking a threaded
    //   process is sound.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            libc::close(peer);
            let mut byte = 0u8;
            while libc::read(fd, (&mut byte as *mut u8).cast(), 1) == 1 {
                libc::write(fd, (&byte as *const u8).cast(), 1);
            }
            libc::_exit(0);
        }
        pid
    }
}

fn ping_pong(stream: &mut (impl Read + Write)) {
    stream.write_all(&[1]).unwrap();
    let mut byte = [0u8];
    stream.read_exact(&mut byte).unwrap();
}

fn rpc(c: &mut Criterion) {
    let mut group = c.benchmark_group("rpc ping (what the heartbeat replaces)");
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let child = echo_child(theirs.as_raw_fd(), ours.as_raw_fd());
    drop(theirs);
    group.bench_function("unix socket request/response, two processes", |b| {
        b.iter(|| ping_pong(&mut ours))
    });
    drop(ours);

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.set_nodelay(true).unwrap();
    let (server, _) = listener.accept().unwrap();
    server.set_nodelay(true).unwrap();
    let tcp_child = echo_child(server.as_raw_fd(), client.as_raw_fd());
    drop(server);
    group.bench_function("loopback TCP request/response, two processes", |b| {
        b.iter(|| ping_pong(&mut client))
    });
    drop(client);
    group.finish();
    for pid in [child, tcp_child] {
        // SAFETY: reaping our own children; no memory is passed.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
}

/// Runs `beat` `iters` times on each of `targets` from its own thread, all
/// starting together; returns the slowest thread's time.
fn in_parallel<T: Sync>(targets: &[T], iters: u64, beat: impl Fn(&T) + Sync) -> Duration {
    let barrier = Barrier::new(targets.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .map(|target| {
                let (barrier, beat) = (&barrier, &beat);
                scope.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    for _ in 0..iters {
                        beat(target);
                    }
                    started.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

/// Two threads CAS-ing clock stamps into words `distance` bytes apart.
fn stamp_at_distance(distance: usize, iters: u64) -> Duration {
    #[repr(align(256))]
    struct Block([AtomicU64; 32]);
    let block = Block(std::array::from_fn(|_| AtomicU64::new(0)));
    in_parallel(&[&block.0[0], &block.0[distance / 8]], iters, |word| {
        let now = monotonic_ns();
        let current = word.load(Ordering::Relaxed);
        let _ = word.compare_exchange(current, now, Ordering::AcqRel, Ordering::Relaxed);
    })
}

fn false_sharing(c: &mut Criterion) {
    let bench = BenchTable::new("parallel", &TableOptions::default());
    let mut group = c.benchmark_group("parallel heartbeats (per beat, per thread)");
    let workers: Vec<Worker> = (0..2)
        .map(|i| bench.table.register(100 + i, "parallel").unwrap())
        .collect();
    assert_eq!(workers[1].slot(), workers[0].slot() + 1, "adjacent slots");
    for threads in [1, 2] {
        group.bench_function(
            format!("{threads} thread(s), own workers in adjacent slots"),
            |b| {
                b.iter_custom(|iters| {
                    in_parallel(&workers[..threads], iters, |w| w.heartbeat().unwrap())
                })
            },
        );
    }
    for distance in [8, 64, 128] {
        group.bench_function(format!("2 threads, words {distance} bytes apart"), |b| {
            b.iter_custom(|iters| stamp_at_distance(distance, iters))
        });
    }
    // The machine's own 2-thread cost at the heartbeat's size: a coarse
    // clock read and a CAS on a private line per thread, nothing shared.
    for threads in [1, 2] {
        group.bench_function(
            format!("{threads} thread(s), coarse clock + CAS on private lines"),
            |b| b.iter_custom(|iters| coarse_stamps(threads, iters)),
        );
    }
    group.finish();
}

/// `threads` threads each CAS-ing coarse clock stamps into a line of its own.
fn coarse_stamps(threads: usize, iters: u64) -> Duration {
    let lines = [Line(AtomicU64::new(0)), Line(AtomicU64::new(0))];
    in_parallel(&lines[..threads], iters, |line| {
        let now = monotonic_coarse_ns();
        let current = line.0.load(Ordering::Relaxed);
        let _ = line.0.compare_exchange(
            current,
            now.max(current),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    })
}

/// `Worker::progress` (one atomic add, no clock) against a bare
/// atomic add on a private line, same run.
fn progress(c: &mut Criterion) {
    let mut group = c.benchmark_group("progress");
    let line = Line(AtomicU64::new(0));
    group.bench_function("bare limit: one atomic add on a private line", |b| {
        b.iter(|| black_box(line.0.fetch_add(2, Ordering::AcqRel)))
    });
    let bench = BenchTable::new(
        "progress",
        &TableOptions {
            progress_timeout: std::time::Duration::from_secs(10),
            ..TableOptions::default()
        },
    );
    let worker = bench.table.register(1, "bench").unwrap();
    worker.set_busy(true).unwrap();
    group.bench_function("Worker::progress", |b| {
        b.iter(|| worker.progress().unwrap())
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = clock, single_thread, progress, rpc, false_sharing
}
criterion_main!(benches);
