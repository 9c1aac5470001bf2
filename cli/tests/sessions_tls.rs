//! Sessions over TLS (`tls://`): the listener presents a certificate made
//! by the test (rcgen), clients verify it against a CA; a wrong CA, a
//! plaintext client of a TLS listener and a TLS client of a plaintext one
//! each fail in one line; with a client CA, a client without a certificate
//! is refused.

#[path = "../../tests/common/attack.rs"]
mod attack;
#[path = "../../tests/common/certs.rs"]
mod certs;
#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/container.rs"]
mod container;

use certs::TestCerts;
use common::{long_options, TempTable};
use container::contained;
use livereg::{connect, Address, ConnectOptions, Error, Reason, TlsClient, TlsServer};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn server(certs: &TestCerts, client_ca: bool) -> TlsServer {
    TlsServer {
        cert: certs.path("server.pem").into(),
        key: certs.path("server.key").into(),
        client_ca: client_ca.then(|| certs.path("ca.pem").into()),
    }
}

fn client(certs: &TestCerts, ca: &str, with_certificate: bool) -> ConnectOptions {
    ConnectOptions {
        token: Some(b"s3cret".to_vec()),
        tls: Some(TlsClient {
            ca: PathBuf::from(certs.path(ca)),
            cert: with_certificate.then(|| certs.path("client.pem").into()),
            key: with_certificate.then(|| certs.path("client.key").into()),
        }),
        ..ConnectOptions::default()
    }
}

fn one_line(error: &Error) -> String {
    let text = error.to_string();
    assert!(!text.contains('\n'), "more than one line: {text}");
    text
}

#[test]
fn a_client_with_the_right_ca_registers_and_its_death_is_seen_at_once() {
    let certs = TestCerts::new("session-tls");
    let temp = TempTable::new("session-tls", &long_options());
    let address = format!("tls://127.0.0.1:{}", free_port());
    let (sender, events) = mpsc::channel();
    let reaper = temp
        .table
        .reaper()
        .on_drop(move |event| Ok(sender.send((event.clone(), Instant::now()))?))
        .listen(Address::parse(&address).unwrap(), Some(b"s3cret".to_vec()))
        .tls(server(&certs, false))
        .spawn()
        .unwrap();
    // A `livereg worker` in a container of its own (private /dev/shm, own
    // PID and IPC namespaces), verifying the listener against the CA.
    let mut worker = contained(env!("CARGO_BIN_EXE_livereg"), false)
        .args(["worker", &address, "--instance", "1", "--interval", "10ms"])
        .args(["--tls-ca", &certs.path("ca.pem")])
        .env("LIVEREG_TOKEN", "s3cret")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(worker.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("registered"), "{line}");
    let status = temp.table.status().unwrap();
    let remote = status.registrations[0].remote.as_ref().unwrap();
    assert!(remote.peer.starts_with("tls 127.0.0.1:"), "{remote:?}");
    std::thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    worker.kill().unwrap(); // unshare's child gets SIGKILL as its parent-death signal
    let _ = worker.wait();
    let (event, handled) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((event.instance_id, event.reason), (1, Reason::Disconnected));
    assert!(
        handled - killed < Duration::from_secs(2),
        "{:?}",
        handled - killed
    );
    // In process too: ping, info, a clean end.
    let session = connect(&address, 2, "in-process", &client(&certs, "ca.pem", false)).unwrap();
    session.heartbeat().unwrap();
    session.deregister().unwrap();
    let (event, _) = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((event.instance_id, event.reason), (2, Reason::Deregistered));
    reaper.stop().unwrap();
}

#[test]
fn a_wrong_ca_a_plaintext_client_and_a_tls_client_of_a_plaintext_listener_each_fail_in_one_line() {
    let certs = TestCerts::new("session-tls-wrong");
    let temp = TempTable::new("session-tls-wrong", &long_options());
    let tls = format!("tls://127.0.0.1:{}", free_port());
    let plain = format!("tcp://127.0.0.1:{}", free_port());
    let reaper = temp
        .table
        .reaper()
        .listen(Address::parse(&tls).unwrap(), Some(b"s3cret".to_vec()))
        .listen(Address::parse(&plain).unwrap(), Some(b"s3cret".to_vec()))
        .tls(server(&certs, false))
        .spawn()
        .unwrap();
    let wrong_ca = connect(&tls, 1, "", &client(&certs, "other-ca.pem", false)).unwrap_err();
    let text = one_line(&wrong_ca);
    assert!(matches!(wrong_ca, Error::Permission(_)), "{text}");
    assert!(
        text.contains("TLS handshake failed") && text.contains("certificate"),
        "{text}"
    );

    let plaintext = ConnectOptions {
        token: Some(b"s3cret".to_vec()),
        ..ConnectOptions::default()
    };
    let plain_to_tls = connect(&tls.replace("tls://", "tcp://"), 2, "", &plaintext).unwrap_err();
    let text = one_line(&plain_to_tls);
    assert!(
        matches!(plain_to_tls, Error::Incompatible(_) | Error::Io { .. }),
        "{text}"
    );

    let tls_to_plain = connect(
        &plain.replace("tcp://", "tls://"),
        3,
        "",
        &client(&certs, "ca.pem", false),
    )
    .unwrap_err();
    let text = one_line(&tls_to_plain);
    assert!(text.contains("TLS handshake failed"), "{text}");

    let no_ca = connect(&tls, 4, "", &plaintext).unwrap_err();
    assert!(one_line(&no_ca).contains("needs the CA"), "{no_ca}");
    let ca_for_plain = connect(&plain, 5, "", &client(&certs, "ca.pem", false)).unwrap_err();
    assert!(
        one_line(&ca_for_plain).contains("expected tls://"),
        "{ca_for_plain}"
    );

    assert!(temp.table.status().unwrap().registrations.is_empty());
    reaper.stop().unwrap();
}

#[test]
fn with_a_client_ca_a_client_without_a_certificate_is_refused_and_one_with_it_needs_no_token() {
    let certs = TestCerts::new("session-mtls");
    let temp = TempTable::new("session-mtls", &long_options());
    let address = format!("tls://127.0.0.1:{}", free_port());
    let Err(no_certificate) = temp
        .table
        .reaper()
        .listen(Address::parse(&address).unwrap(), None)
        .build()
    else {
        panic!("a tls:// listener started without a certificate");
    };
    assert!(
        one_line(&no_certificate).contains("needs a certificate"),
        "{no_certificate}"
    );
    let reaper = temp
        .table
        .reaper()
        .listen(Address::parse(&address).unwrap(), None)
        .tls(server(&certs, true))
        .spawn()
        .unwrap();
    let refused = connect(&address, 1, "", &client(&certs, "ca.pem", false)).unwrap_err();
    one_line(&refused);
    assert!(temp.table.status().unwrap().registrations.is_empty());
    let mut options = client(&certs, "ca.pem", true);
    options.token = None;
    let worker = connect(&address, 2, "", &options).unwrap();
    worker.heartbeat().unwrap();
    worker.deregister().unwrap();
    reaper.stop().unwrap();
}

/// A listener that accepts and never answers, as a stopped reaper looks
/// (the kernel completes the connection from the backlog): a `tls://`
/// connect gives up within its timeout, as a `tcp://` one does, saying it
/// timed out (not a permission problem).
#[test]
fn a_tls_connect_to_a_listener_that_never_answers_gives_up_within_its_timeout() {
    let certs = TestCerts::new("silent-tls");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let mut options = client(&certs, "ca.pem", false);
    options.token = Some(b"t".to_vec());
    options.connect_timeout = Some(Duration::from_secs(1));
    for scheme in ["tls", "tcp"] {
        let mut options = options.clone();
        if scheme == "tcp" {
            options.tls = None;
        }
        let started = Instant::now();
        let error = connect(&format!("{scheme}://127.0.0.1:{port}"), 1, "w", &options)
            .map(drop)
            .unwrap_err();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{scheme}:// gave up after {took:?}"
        );
        assert!(
            matches!(error, Error::Timeout(_)),
            "{scheme}://: {}",
            one_line(&error)
        );
    }
    drop(silent);
}

/// A `tls://` client whose reaper is stopped (it accepts new connections
/// from the backlog and answers nothing) gives its registration up within a
/// few timeouts, as a `tcp://` one does: its reclaims time out instead of
/// waiting on a TLS handshake forever.
#[test]
fn a_tls_client_whose_reaper_is_stopped_gives_its_registration_up() {
    let certs = TestCerts::new("stopped-tls");
    let options = livereg::TableOptions {
        capacity: 8,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        ..livereg::TableOptions::default()
    };
    let temp = TempTable::new("stopped-tls", &options);
    let address = format!("tls://127.0.0.1:{}", free_port());
    let token_file = std::env::temp_dir().join(format!("{}.token", temp.name));
    std::fs::write(&token_file, "s3cret\n").unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_livereg"))
        .args(["reap", &temp.name, "--listen", &address])
        .args([
            "--tls-cert",
            &certs.path("server.pem"),
            "--tls-key",
            &certs.path("server.key"),
        ])
        .arg("--token-file")
        .arg(&token_file)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let worker = loop {
        match connect(&address, 1, "w", &client(&certs, "ca.pem", false)) {
            Ok(worker) => break worker,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(10),
                "never connected: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    worker.heartbeat().unwrap();
    // SAFETY: `kill` has no memory effects; the daemon is not yet waited for.
    unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGSTOP) };
    let stopped = Instant::now();
    let outcome = loop {
        match worker.heartbeat() {
            Ok(()) if stopped.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            other => break other,
        }
    };
    let gave_up_after = stopped.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGCONT) };
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_file(&token_file);
    assert!(
        matches!(outcome, Err(Error::Evicted { .. })),
        "still {outcome:?} {gave_up_after:?} after the reaper stopped"
    );
    assert!(
        gave_up_after >= Duration::from_secs(1),
        "gave up after {gave_up_after:?}"
    );
}

#[test]
fn a_tls_handshake_gets_in_through_hundreds_of_idle_connections() {
    let certs = TestCerts::new("session-tls-loris");
    let temp = TempTable::new("session-tls-loris", &long_options());
    let port = free_port();
    let address = format!("tls://127.0.0.1:{port}");
    let reaper = temp
        .table
        .reaper()
        .listen(Address::parse(&address).unwrap(), Some(b"s3cret".to_vec()))
        .tls(server(&certs, false))
        .spawn()
        .unwrap();
    // Idle connections from the same address, reopened as soon as closed:
    // a TLS client needs round trips before its `Hello`, and is not closed
    // as the oldest greeting connection meanwhile.
    let holding = attack::slowloris(&format!("tcp://127.0.0.1:{port}"), 400, b"");
    let deadline = Instant::now() + Duration::from_secs(20);
    while holding.work.load(std::sync::atomic::Ordering::Relaxed) < 200 {
        assert!(Instant::now() < deadline, "the attack never got going");
        std::thread::sleep(Duration::from_millis(10));
    }
    let patient = ConnectOptions {
        connect_timeout: Some(Duration::from_secs(5)),
        ..client(&certs, "ca.pem", false)
    };
    for instance in 1..=5u64 {
        let session = connect(&address, instance, "legit", &patient)
            .unwrap_or_else(|e| panic!("hello {instance} refused: {e}"));
        session.deregister().unwrap();
    }
    drop(holding);
    reaper.stop().unwrap();
}

/// A peer that accepts and never says a word: the TLS handshake of a
/// question (`status`, `probe`, `clear`) times out, and says so as a
/// timeout, within the question's timeout.
#[test]
fn a_tls_handshake_that_never_ends_is_a_timeout() {
    let certs = TestCerts::new("silent-peer");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("tls://{}", silent.local_addr().unwrap());
    let holder = std::thread::spawn(move || {
        let (held, _) = silent.accept().unwrap();
        std::thread::sleep(Duration::from_secs(4));
        drop(held);
    });
    let mut options = client(&certs, "ca.pem", false);
    options.connect_timeout = Some(Duration::from_secs(1));
    let started = Instant::now();
    let error = livereg::remote_status(&address, Some(1), &options).unwrap_err();
    assert!(matches!(error, Error::Timeout(_)), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "after {:?}",
        started.elapsed()
    );
    holder.join().unwrap();
}
