//! SIGKILL of a worker holding 0.25, 1, 4 and 8 GiB of touched 4 KiB pages:
//! how long until a C server's `on_dying` runs, until its `on_drop` runs,
//! and until the kernel's pidfd says the process has ended, in one run of
//! `ffi/tests/c/dying.c` (built against the installed library, as a C
//! server is); then the same at 4 GiB from another PID namespace. Prints a
//! markdown table with the medians and `on_dying` as a ratio of the pidfd.
//! `LIVEREG_BENCH_QUICK=1` runs 256 MiB twice.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn quick() -> bool {
    std::env::var_os("LIVEREG_BENCH_QUICK").is_some()
}

/// The C program, built against the library installed under the target
/// folder.
fn program() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let prefix = target.join("bench-prefix");
    let installed = Command::new(root().join("ffi/install.sh"))
        .arg(&prefix)
        .status()
        .unwrap();
    assert!(installed.success(), "ffi/install.sh failed");
    let binary = target.join("bench-dying");
    let built = Command::new("cc")
        .args(["-std=gnu11", "-O2"])
        .arg(format!("-I{}", prefix.join("include").display()))
        .arg(root().join("ffi/tests/c/dying.c"))
        .arg(format!("-L{}", prefix.join("lib").display()))
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .args(["-llivereg", "-o"])
        .arg(&binary)
        .status()
        .unwrap();
    assert!(built.success(), "cc failed");
    binary
}

/// The medians (µs) of one size: on_dying, on_drop, pidfd.
fn measure(binary: &Path, mib: u64, runs: u32, namespace: &str) -> [f64; 3] {
    let name = format!("livereg-bench-dying-{}-{mib}", std::process::id());
    let output = Command::new(binary)
        .env_remove("LD_LIBRARY_PATH")
        .args([&name, &mib.to_string(), &runs.to_string(), namespace])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let median = stdout
        .lines()
        .find_map(|line| line.strip_prefix("median "))
        .expect("a median line");
    let figures: Vec<f64> = median
        .split(' ')
        .skip(1)
        .step_by(2)
        .map(|figure| figure.parse().unwrap())
        .collect();
    [figures[0], figures[1], figures[2]]
}

fn main() {
    let binary = program();
    let (sizes, runs): (&[u64], u32) = if quick() {
        (&[256], 2)
    } else {
        (&[256, 1024, 4096, 8192], 5)
    };
    println!("| held | namespace | on_dying (median) | on_drop (median) | pidfd readable (median) | on_dying / pidfd |");
    println!("|---|---|---|---|---|---|");
    let mut rows: Vec<(u64, &str)> = sizes.iter().map(|&mib| (mib, "own")).collect();
    if !quick() {
        rows.push((4096, "pidns"));
    }
    for (mib, namespace) in rows {
        let [dying, dropped, pidfd] = measure(&binary, mib, runs, namespace);
        println!(
            "| {mib} MiB | {namespace} | {:.2} ms | {:.1} ms | {:.1} ms | {:.4}x |",
            dying / 1e3,
            dropped / 1e3,
            pidfd / 1e3,
            dying / pidfd
        );
    }
}
