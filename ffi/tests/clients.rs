//! The C API as clients see it: installed with `ffi/install.sh`, found with
//! pkg-config, compiled as C99, C++11 and statically; the Python module; and
//! the example engines, which must register again after a clear and after a
//! reaper restart.

#[cfg(feature = "tls")]
#[path = "../../tests/common/certs.rs"]
mod certs;
#[path = "../../tests/common/container.rs"]
mod container;

use container::contained;
use livereg::{Table, TableOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The build's target folder, wherever `CARGO_TARGET_DIR` puts it: the
/// test binary runs from `<target>/<profile>/deps/`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    std::fs::create_dir_all(&target).unwrap();
    target
}

/// Installs the library once per test run under `<target>/ffi-test-prefix`.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        // A build with the tls feature is installed apart, built with it.
        let (name, features) = if cfg!(feature = "tls") {
            ("ffi-test-prefix-tls", "tls")
        } else {
            ("ffi-test-prefix", "")
        };
        let prefix = target_dir().join(name);
        // Test processes run side by side (nextest): one installs at a time.
        let lock = std::fs::File::create(target_dir().join(format!("{name}.lock"))).unwrap();
        // SAFETY: flock on a descriptor this function owns; released when
        // `lock` is dropped at the end of the initialisation.
        assert_eq!(
            unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
            0
        );
        let output = Command::new(root().join("ffi/install.sh"))
            .arg(&prefix)
            .env("LIVEREG_FEATURES", features)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "install.sh failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        for file in [
            "include/livereg.h",
            "lib/liblivereg.so",
            "lib/liblivereg.so.1",
            "lib/liblivereg.a",
            "lib/pkgconfig/livereg.pc",
        ] {
            assert!(
                prefix.join(file).exists(),
                "install.sh did not install {file}"
            );
        }
        prefix
    })
}

fn pkg_config(args: &[&str]) -> Vec<String> {
    let output = Command::new("pkg-config")
        .args(args)
        .arg("livereg")
        .env("PKG_CONFIG_PATH", prefix().join("lib/pkgconfig"))
        .output()
        .expect("pkg-config is installed (.ci/run installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn check(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Compiles `source` with `compiler` and `flags` against the installed library.
fn compile(compiler: &str, flags: &[&str], source: &Path, out: &str, link: &[String]) -> PathBuf {
    let binary = target_dir().join(out);
    let output = Command::new(compiler)
        .args(flags)
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic"])
        .args(pkg_config(&["--cflags"]))
        .arg(source)
        .args(link)
        .arg("-o")
        .arg(&binary)
        .output()
        .unwrap();
    check(
        &output,
        &format!("{compiler} {flags:?} {}", source.display()),
    );
    binary
}

/// A client program, loading the installed library (cargo's LD_LIBRARY_PATH
/// would otherwise win over the program's RUNPATH).
fn client(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    command.env_remove("LD_LIBRARY_PATH");
    command
}

fn run(binary: &Path) {
    let output = client(binary).output().unwrap();
    check(&output, &binary.display().to_string());
    assert!(String::from_utf8_lossy(&output.stdout).contains("all C API checks passed"));
}

#[test]
fn c99_program_passes_the_api_checks() {
    let source = root().join("ffi/tests/c/test_api.c");
    let libs = pkg_config(&["--libs"]);
    run(&compile(
        "cc",
        &["-std=c99", "-D_DEFAULT_SOURCE"],
        &source,
        "ffi-test-c99",
        &libs,
    ));
}

/// `ffi/tests/abi/old_header.c` built against the header of an earlier
/// release (`ffi/tests/abi/<era>/livereg.h`), with `defines`, linked
/// against today's installed library.
fn old_header_program(era: &str, defines: &[&str]) -> PathBuf {
    let include = format!("-I{}", root().join("ffi/tests/abi").join(era).display());
    let mut flags = vec!["-std=gnu11", include.as_str()];
    flags.extend_from_slice(defines);
    let source = root().join("ffi/tests/abi/old_header.c");
    let libs = pkg_config(&["--libs"]);
    compile(
        "cc",
        &flags,
        &source,
        &format!("ffi-test-old-header-{era}"),
        &libs,
    )
}

/// Runs an old-header program on a table of its own; its output. Told to
/// expect dying, it says when its worker is registered and waits to be
/// told that the worker's death word is claimed before killing it.
fn run_old_header(binary: &Path, tag: &str, expect_dying: bool, env: &[(&str, &str)]) -> Output {
    use std::io::{BufRead, Write};
    let name = format!("livereg-c-old-header-{tag}-{}", std::process::id());
    let mut child = client(binary)
        .args([name.as_str(), if expect_dying { "1" } else { "0" }])
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    if expect_dying {
        stdout.read_line(&mut printed).unwrap();
        if printed == "registered\n" {
            let table = Table::open(&name).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !table
                .status()
                .unwrap()
                .registrations
                .iter()
                .any(|r| r.death_word)
            {
                assert!(std::time::Instant::now() < deadline, "no death word");
                std::thread::sleep(Duration::from_millis(2));
            }
            child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        }
    }
    std::io::Read::read_to_string(&mut stdout, &mut printed).unwrap();
    let mut output = child.wait_with_output().unwrap();
    output.stdout = printed.into_bytes();
    let _ = Table::unlink(&name);
    let _ = Table::unlink(&format!("{name}-driven"));
    output
}

/// A program built against the header of the release before `on_dying`
/// (three-word callbacks, each struct it passes ending where its memory
/// ends) runs unchanged against today's library: a SIGKILLed worker
/// reaches its on_drop, it is never told of dying, and nothing past any of
/// its structs is read or written (that would be a SIGSEGV).
#[test]
fn a_program_built_before_on_dying_gets_its_drops_and_nothing_past_its_structs_is_read() {
    let binary = old_header_program("before-dying", &[]);
    let output = run_old_header(&binary, "before", false, &[]);
    check(&output, "old_header.c (before-dying)");
    assert!(String::from_utf8_lossy(&output.stdout).contains("old header: all checks passed"));
}

/// A program built against the last header before sizes travelled (four
/// words with on_dying, the plain entry points) runs unchanged too: its
/// drops arrive; the library cannot tell its struct from the three-word
/// one, so it is told of dying only where its environment says its struct
/// has on_dying.
#[test]
fn a_program_built_with_on_dying_but_no_sizes_gets_its_drops_and_dying_where_told() {
    let binary = old_header_program("with-dying", &["-DHEADER_HAS_ON_DYING"]);
    let output = run_old_header(&binary, "with", false, &[]);
    check(&output, "old_header.c (with-dying)");
    let output = run_old_header(
        &binary,
        "with-told",
        true,
        &[("LIVEREG_LEGACY_CALLBACKS_HAVE_ON_DYING", "1")],
    );
    check(&output, "old_header.c (with-dying, told)");
    assert!(String::from_utf8_lossy(&output.stdout).contains("old header: all checks passed"));
}

/// And the check can fail: a library that read the fourth word of the
/// three-word struct would hit the unmapped page. The program built
/// against the header before on_dying, told its struct has four words,
/// dies of it.
#[test]
fn reading_past_an_old_programs_callbacks_is_caught() {
    let binary = old_header_program("before-dying", &[]);
    let output = run_old_header(
        &binary,
        "caught",
        false,
        &[("LIVEREG_LEGACY_CALLBACKS_HAVE_ON_DYING", "1")],
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGSEGV),
        "{:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The C program that kills workers and times their on_dying, on_drop and
/// pidfd (`ffi/tests/c/dying.c`), built against the installed library.
fn dying_program() -> PathBuf {
    let source = root().join("ffi/tests/c/dying.c");
    let libs = pkg_config(&["--libs"]);
    compile("cc", &["-std=gnu11"], &source, "ffi-test-dying", &libs)
}

/// A C server through `livereg.h` alone hears a SIGKILLed worker dying
/// before its drop (both `PROCESS_EXITED`; the program checks the order
/// and reasons), in this PID namespace and from another sharing the table;
/// and a SIGKILLed client in a container of its own registered through the
/// server's `unix:` listener dying, then dropped `DISCONNECTED` at its
/// socket's close, never dying before the kill (not even after a forked
/// child of it exited).
/// The bound is generous (a loaded machine): the figures are in
/// BENCHMARKS.md (`cargo bench -p livereg-ffi --bench dying`).
#[test]
fn a_c_server_hears_a_killed_worker_dying_before_its_drop() {
    let binary = dying_program();
    for namespace in ["own", "pidns", "session", "session-fork"] {
        let name = format!("livereg-c-dying-{}-{namespace}", std::process::id());
        let output = client(&binary)
            .args([&name, "256", "3", namespace])
            .output()
            .unwrap();
        let _ = Table::unlink(&name);
        check(&output, &format!("dying.c ({namespace})"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let median = stdout
            .lines()
            .find_map(|line| line.strip_prefix("median dying_us "))
            .and_then(|rest| rest.split(' ').next())
            .and_then(|us| us.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no median in:\n{stdout}"));
        assert!(
            median < 1_000_000.0,
            "{namespace}: dying after {median} us:\n{stdout}"
        );
    }
}

/// A C engine through `livereg.h` alone learns that its table's reaper
/// process was SIGKILLed (`DYING`, or `ABSENT` once ended) in every one of
/// its waiting threads and in another waiting process, and learns the new
/// boot token when a new reaper serves (the program checks both). The
/// figures it prints are the time from the kill to each waiter's return;
/// the bound asserted is generous (a loaded machine): the median of the
/// slowest waiter within 50 ms, every run within 1 s.
#[test]
fn a_c_engine_learns_its_reaper_was_killed_and_the_new_token() {
    let source = root().join("ffi/tests/c/server_state.c");
    let libs = pkg_config(&["--libs"]);
    let binary = compile(
        "cc",
        &["-std=gnu11"],
        &source,
        "ffi-test-server-state",
        &libs,
    );
    let name = format!("livereg-c-server-state-{}", std::process::id());
    let output = client(&binary).args([&name, "256", "5"]).output().unwrap();
    let _ = Table::unlink(&name);
    check(&output, "server_state.c");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    let figure = |prefix: &str, at: usize| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(prefix))
            .and_then(|rest| rest.split(' ').nth(at))
            .and_then(|us| us.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no '{prefix}' in:\n{stdout}"))
    };
    let (median_last, max) = (figure("median learnt_us ", 1), figure("max learnt_us ", 0));
    assert!(median_last < 50_000.0, "median {median_last} us:\n{stdout}");
    assert!(max < 1_000_000.0, "max {max} us:\n{stdout}");
}

#[test]
fn cxx11_program_passes_the_api_checks() {
    let source = root().join("ffi/tests/c/test_api.c");
    let libs = pkg_config(&["--libs"]);
    run(&compile(
        "g++",
        &["-std=c++11", "-x", "c++"],
        &source,
        "ffi-test-cxx11",
        &libs,
    ));
}

#[test]
fn c99_program_passes_the_api_checks_under_address_sanitizer() {
    let source = root().join("ffi/tests/c/test_api.c");
    let libs = pkg_config(&["--libs"]);
    run(&compile(
        "cc",
        &[
            "-std=c99",
            "-D_DEFAULT_SOURCE",
            "-fsanitize=address",
            "-fno-omit-frame-pointer",
        ],
        &source,
        "ffi-test-c99-asan",
        &libs,
    ));
}

#[test]
fn statically_linked_program_passes_the_api_checks() {
    let source = root().join("ffi/tests/c/test_api.c");
    let mut libs = vec![prefix().join("lib/liblivereg.a").display().to_string()];
    libs.extend(
        pkg_config(&["--static", "--libs-only-l"])
            .into_iter()
            .filter(|l| l != "-llivereg"),
    );
    run(&compile(
        "cc",
        &["-std=c99", "-D_DEFAULT_SOURCE"],
        &source,
        "ffi-test-static",
        &libs,
    ));
}

/// Runs an example engine for 3 s beside a reaper; clears the table at 1 s and
/// restarts the reaper at 2 s. The engine must register again after each.
fn example_engine_comes_back(mut engine: Command, tag: &str) {
    let name = format!("livereg-example-{tag}-{}", std::process::id());
    let options = TableOptions {
        reap_timeout: Duration::from_millis(400),
        registration_grace: Duration::from_millis(800),
        ..TableOptions::default()
    };
    let table = Table::create(&name, &options).unwrap();
    struct Unlink(String);
    impl Drop for Unlink {
        fn drop(&mut self) {
            let _ = Table::unlink(&self.0);
        }
    }
    let _unlink = Unlink(name.clone());
    let reaper = table.reaper().spawn().unwrap();
    let child = engine
        .args([&name, "5", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    table.reset(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    reaper.stop().unwrap();
    let _restarted = table.reaper().spawn().unwrap();
    let output = child.wait_with_output().unwrap();
    check(&output, tag);
    let lines = String::from_utf8_lossy(&output.stdout).into_owned();
    for expected in [
        "registered (start)",
        "registered (after eviction)",
        "registered (reaper restarted)",
        "stopped",
    ] {
        assert!(
            lines.contains(expected),
            "{tag}: missing '{expected}' in:\n{lines}"
        );
    }
}

#[test]
fn c_example_engine_registers_again_after_eviction_and_restart() {
    let source = root().join("ffi/examples/engine.c");
    let mut libs = pkg_config(&["--libs"]);
    libs.push("-lpthread".into());
    let binary = compile(
        "cc",
        &["-std=c99", "-D_DEFAULT_SOURCE"],
        &source,
        "ffi-example-engine",
        &libs,
    );
    example_engine_comes_back(client(&binary), "c");
}

/// Lines a child prints, readable with a timeout.
fn lines_of(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let (sender, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

fn expect_line(lines: &std::sync::mpsc::Receiver<String>, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line == want => return,
            Ok(_) => {}
            Err(_) => panic!("no line '{want}'"),
        }
    }
}

#[test]
fn c_example_server_owns_the_reaper_on_its_epoll_loop() {
    let link = {
        let mut libs = pkg_config(&["--libs"]);
        libs.push("-lpthread".into());
        libs
    };
    let flags = ["-std=c99", "-D_DEFAULT_SOURCE"];
    let server = compile(
        "cc",
        &flags,
        &root().join("ffi/examples/server.c"),
        "ffi-example-server",
        &link,
    );
    let engine = compile(
        "cc",
        &flags,
        &root().join("ffi/examples/engine.c"),
        "ffi-example-engine-for-server",
        &link,
    );
    let name = format!("livereg-example-server-{}", std::process::id());
    // Generous: on a loaded machine a worker that misses a 400 ms timeout
    // is evicted, registers again, and is stopped within its grace
    // (`freed 2 grace`), and the line the test waits for never comes.
    let options = TableOptions {
        reap_timeout: Duration::from_secs(2),
        registration_grace: Duration::from_secs(4),
        ..TableOptions::default()
    };
    let table = Table::create(&name, &options).unwrap();
    struct Cleanup(String, Vec<std::process::Child>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for child in &mut self.1 {
                // SAFETY: `kill` has no memory effects.
                unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
                let _ = child.kill();
                let _ = child.wait();
            }
            let _ = Table::unlink(&self.0);
        }
    }
    let mut cleanup = Cleanup(name.clone(), Vec::new());
    let mut serving = client(&server)
        .args([name.as_str(), "30", "1", "2", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let served = lines_of(&mut serving);
    cleanup.1.push(serving);
    expect_line(&served, "serving");
    assert_eq!(table.info().unwrap(), br#"{"chunk_size": 256}"#);
    for id in ["1", "2", "3"] {
        let mut worker = client(&engine)
            .args([name.as_str(), id, "30"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        expect_line(&lines_of(&mut worker), "registered (start)");
        cleanup.1.push(worker);
    }
    let pid = |at: usize| cleanup.1[at].id() as i32;
    // SAFETY: `kill` has no memory effects; the pids are our children's.
    unsafe { libc::kill(pid(1), libc::SIGKILL) };
    expect_line(&served, "freed 1 process_exited");
    // SAFETY: as above.
    unsafe { libc::kill(pid(2), libc::SIGSTOP) };
    expect_line(&served, "freed 2 timeout");
    table.reset(Duration::from_secs(5)).unwrap();
    expect_line(&served, "freed 3 cleared");
}

/// A table with a 30 s timeout and grace (only a socket's closing can end a
/// registration within a test), removed on drop.
struct LongTable {
    name: String,
    table: Table,
}

impl LongTable {
    fn new(tag: &str) -> LongTable {
        let name = format!("livereg-{tag}-{}", std::process::id());
        let options = TableOptions {
            reap_timeout: Duration::from_secs(30),
            registration_grace: Duration::from_secs(30),
            ..TableOptions::default()
        };
        let table = Table::create(&name, &options).unwrap();
        LongTable { name, table }
    }
}

impl Drop for LongTable {
    fn drop(&mut self) {
        let _ = Table::unlink(&self.name);
    }
}

/// A C engine in its own container (mount namespace with a private
/// /dev/shm, PID, IPC and network namespaces) registers through a
/// listener's Unix socket; killed, it is dropped `disconnected` at once
/// (the table's timeout is 30 s); a reset reaches another one.
#[test]
fn an_isolated_c_engine_registers_over_a_socket_and_its_death_is_seen_at_once() {
    use livereg::{Address, Reason};
    use std::io::{BufRead, BufReader};
    use std::time::Instant;
    let temp = LongTable::new("c-session");
    let (table, socket) = (&temp.table, format!("/tmp/{}.sock", temp.name));
    let (sender, events) = std::sync::mpsc::channel();
    let reaper = table
        .reaper()
        .on_drop(move |event| Ok(sender.send((event.clone(), Instant::now()))?))
        .listen(Address::parse(&format!("unix:{socket}")).unwrap(), None)
        .spawn()
        .unwrap();
    let engine = |instance: &str| {
        let mut child = contained(session_client(), true)
            .args([&format!("unix:{socket}"), instance])
            .env_remove("LD_LIBRARY_PATH")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        assert_eq!(first, "registered");
        (child, lines)
    };
    let (mut killed, _) = engine("11");
    std::thread::sleep(Duration::from_millis(100));
    let at = Instant::now();
    // `unshare --kill-child` gave the engine SIGKILL as its parent-death signal.
    Command::new("kill")
        .args(["-KILL", &killed.id().to_string()])
        .status()
        .unwrap();
    let _ = killed.wait();
    let (event, handled) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (event.instance_id, event.reason),
        (11, Reason::Disconnected)
    );
    assert!(handled - at < Duration::from_secs(2), "{:?}", handled - at);

    let (mut reset, mut lines) = engine("12");
    table.reset(Duration::from_secs(5)).unwrap();
    let (event, _) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((event.instance_id, event.reason), (12, Reason::Cleared));
    assert_eq!(lines.next().unwrap().unwrap(), "evicted LIVEREG_EVICTED");
    let _ = reset.wait();
    reaper.stop().unwrap();
    let _ = std::fs::remove_file(&socket);
}

/// The C engine of the session tests (`ffi/tests/c/session_client.c`),
/// compiled once per run.
fn session_client() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        compile(
            "cc",
            &["-std=c99", "-D_DEFAULT_SOURCE"],
            &root().join("ffi/tests/c/session_client.c"),
            "ffi-session-client",
            &pkg_config(&["--libs"]),
        )
    })
}

#[cfg(feature = "tls")]
/// A `tls://` listener for the test certificates on a free loopback port:
/// its address, and the reaper serving it with `token`, requiring client
/// certificates of the test CA if `client_ca`, its drops sent to `events`.
fn tls_reaper(
    table: &Table,
    certs: &certs::TestCerts,
    token: Option<&[u8]>,
    client_ca: bool,
) -> (
    String,
    livereg::ReaperThread,
    std::sync::mpsc::Receiver<(livereg::DropEvent, std::time::Instant)>,
) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("tls://127.0.0.1:{port}");
    let (sender, events) = std::sync::mpsc::channel();
    let reaper = table
        .reaper()
        .on_drop(move |event| Ok(sender.send((event.clone(), std::time::Instant::now()))?))
        .listen(
            livereg::Address::parse(&address).unwrap(),
            token.map(<[u8]>::to_vec),
        )
        .tls(livereg::TlsServer {
            cert: certs.path("server.pem").into(),
            key: certs.path("server.key").into(),
            client_ca: client_ca.then(|| certs.path("ca.pem").into()),
        })
        .spawn()
        .unwrap();
    (address, reaper, events)
}

/// A client started with its output piped, once it said its first line
/// (returned beside it).
#[cfg(feature = "tls")]
fn first_line(mut command: Command) -> (std::process::Child, String) {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    (child, line.trim_end().to_owned())
}

#[cfg(feature = "tls")]
/// A C engine verifies a tls:// listener against the CA in its options
/// (`tls_ca_file`): with the right CA it registers, and its SIGKILL is
/// seen at once; with another CA it is refused in one line.
#[test]
fn a_c_engine_reaches_a_tls_listener_with_its_ca_and_is_refused_with_another() {
    use livereg::Reason;
    use std::time::Instant;
    let certs = certs::TestCerts::new("c-tls");
    let temp = LongTable::new("c-tls");
    let (address, reaper, events) = tls_reaper(&temp.table, &certs, Some(b"s3cret"), false);
    let engine = |ca: &str| {
        let mut command = client(session_client());
        command
            .args([address.as_str(), "21"])
            .env("LIVEREG_TOKEN", "s3cret")
            .env("LIVEREG_TLS_CA", certs.path(ca));
        command
    };
    let refused = engine("other-ca.pem").output().unwrap();
    let said = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert!(said.starts_with("refused LIVEREG_PERMISSION"), "{said}");
    assert!(
        said.contains("TLS handshake failed") && said.trim_end().lines().count() == 1,
        "{said}"
    );
    let (mut engine, said) = first_line(engine("ca.pem"));
    assert_eq!(said, "registered");
    let killed = Instant::now();
    engine.kill().unwrap();
    let _ = engine.wait();
    let (event, handled) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (event.instance_id, event.reason),
        (21, Reason::Disconnected)
    );
    assert!(
        handled - killed < Duration::from_secs(2),
        "{:?}",
        handled - killed
    );
    reaper.stop().unwrap();
}

#[cfg(feature = "tls")]
/// With client certificates required (and no token), a C engine presenting
/// its own (`tls_cert_file`, `tls_key_file`) registers; one without is
/// refused in one line and registers nothing.
#[test]
fn a_c_engine_presents_its_client_certificate_to_a_listener_that_requires_one() {
    let certs = certs::TestCerts::new("c-mtls");
    let temp = LongTable::new("c-mtls");
    let table = &temp.table;
    let (address, reaper, _events) = tls_reaper(table, &certs, None, true);
    let engine = |with_certificate: bool| {
        let mut command = client(session_client());
        command
            .args([address.as_str(), "22"])
            .env("LIVEREG_TLS_CA", certs.path("ca.pem"));
        if with_certificate {
            command
                .env("LIVEREG_TLS_CERT", certs.path("client.pem"))
                .env("LIVEREG_TLS_KEY", certs.path("client.key"));
        }
        command
    };
    let refused = engine(false).output().unwrap();
    let said = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert!(said.starts_with("refused LIVEREG_PERMISSION"), "{said}");
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    assert!(table.status().unwrap().registrations.is_empty());
    let (mut engine, said) = first_line(engine(true));
    assert_eq!(said, "registered");
    let rows = table.status().unwrap().registrations;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].instance_id, 22);
    engine.kill().unwrap();
    let _ = engine.wait();
    reaper.stop().unwrap();
}
