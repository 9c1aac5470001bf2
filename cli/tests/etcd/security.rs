//! Options refused in one line; etcd over TLS with a user, and each wrong credential failing in one line.

use super::*;

#[test]
fn bad_etcd_options_are_refused_in_one_line() {
    let (name, _guard) = table("badopts", "1s");
    for (args, says) in [
        (
            vec!["--etcd", "127.0.0.1:2379", "--host", "a/b"],
            "expected a non-empty name without '/'",
        ),
        (
            vec!["--etcd", ",", "--host", "a"],
            "expected at least one (host:port), found none",
        ),
    ] {
        let output = livereg(&[&["reap", &name][..], &args].concat());
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "expected '{says}' in: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let output = livereg(&["status", "--cluster", "--etcd", "127.0.0.1:1"]);
    assert_eq!(output.status.code(), Some(1));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("etcd at 127.0.0.1:1"), "{err}");
}

/// A TLS etcd (server certificate from the test's CA, client certificates
/// required) with authentication on: user `livereg` (password `secret`) may
/// read and write under `prefix`; `root` (password `rootpw`) owns the rest.
fn secure_etcd(certs: &certs::TestCerts, prefix: &str) -> EtcdServer {
    let (server, key, ca) = (
        certs.path("server.pem"),
        certs.path("server.key"),
        certs.path("ca.pem"),
    );
    let etcd = EtcdServer::start_with(
        "secure",
        &[
            "--cert-file",
            &server,
            "--key-file",
            &key,
            "--trusted-ca-file",
            &ca,
            "--client-cert-auth",
        ],
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut root = Client::connect([etcd.endpoint.as_str()], Some(tls_options(certs)))
            .await
            .expect("connect over TLS");
        root.user_add("root", "rootpw", None).await.unwrap();
        root.user_grant_role("root", "root").await.unwrap();
        root.role_add("publisher").await.unwrap();
        let keys = etcd_client::Permission::read_write(prefix.to_owned()).with_prefix();
        root.role_grant_permission("publisher", keys).await.unwrap();
        root.user_add("livereg", "secret", None).await.unwrap();
        root.user_grant_role("livereg", "publisher").await.unwrap();
        root.auth_enable().await.unwrap();
    });
    etcd
}

fn tls_options(certs: &certs::TestCerts) -> etcd_client::ConnectOptions {
    etcd_client::ConnectOptions::new().with_tls(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(certs.read("ca.pem")))
            .identity(etcd_client::Identity::from_pem(
                certs.read("client.pem"),
                certs.read("client.key"),
            )),
    )
}

/// The keys under `prefix`, read as root over TLS.
fn secure_keys(etcd: &EtcdServer, certs: &certs::TestCerts, prefix: &str) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = tls_options(certs).with_user("root", "rootpw");
        let mut root = Client::connect([etcd.endpoint.as_str()], Some(options))
            .await
            .unwrap();
        let found = root
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        found
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect()
    })
}

/// The options that reach the secure etcd: its CA, this client's
/// certificate and key, the user (its password comes separately).
fn secure_flags(certs: &certs::TestCerts) -> Vec<String> {
    vec![
        "--etcd-ca".into(),
        certs.path("ca.pem"),
        "--etcd-cert".into(),
        certs.path("client.pem"),
        "--etcd-key".into(),
        certs.path("client.key"),
        "--etcd-user".into(),
        "livereg".into(),
    ]
}

/// `livereg ARGS`, with `LIVEREG_ETCD_PASSWORD` set to `password`.
fn livereg_with_password(args: &[&str], password: &str) -> Output {
    Command::new(LIVEREG)
        .args(args)
        .env("LIVEREG_ETCD_PASSWORD", password)
        .output()
        .expect("run livereg")
}

/// Asserts exit 1 and one line on stderr containing each of `says`.
fn fails_in_one_line(output: &Output, says: &[&str]) {
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for part in says {
        assert!(err.contains(part), "expected '{part}' in: {err}");
    }
}

#[test]
fn over_tls_with_a_user_publishing_and_the_cluster_view_work() {
    let certs = certs::TestCerts::new("tls-ok");
    let prefix = prefix("tls-ok");
    let etcd = secure_etcd(&certs, &prefix);
    let (name, _table) = table("tls-ok", "5s");
    let password_file = certs.dir.join("password");
    std::fs::write(&password_file, "secret\n").unwrap();
    let endpoint = etcd.endpoint.clone();
    let secure = secure_flags(&certs);
    let secure: Vec<&str> = secure.iter().map(String::as_str).collect();
    let password_flag = password_file.display().to_string();
    let reap = [
        &[
            "reap",
            name.as_str(),
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
        ][..],
        &["--host", "h", "--etcd-password-file", &password_flag],
        &secure,
    ]
    .concat();
    let _reaper = Daemon::spawn(&reap);
    let _worker = worker(&name, 12, "gpu12");
    let key12 = format!("{prefix}/h/{name}/12");
    wait_for("the key over TLS", Duration::from_secs(15), || {
        secure_keys(&etcd, &certs, &prefix).contains(&key12)
    });
    let view = [
        &[
            "status",
            "--cluster",
            "--json",
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
        ][..],
        &secure,
    ]
    .concat();
    let shown = livereg_with_password(&view, "secret");
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let cluster: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(cluster["hosts"][0]["live"], 1, "{cluster}");
}

#[test]
fn a_wrong_ca_a_missing_client_certificate_or_a_wrong_password_fail_in_one_line() {
    let certs = certs::TestCerts::new("tls-bad");
    let prefix = prefix("tls-bad");
    let etcd = secure_etcd(&certs, &prefix);
    let endpoint = etcd.endpoint.clone();
    let (ca, other, cert, key) = (
        certs.path("ca.pem"),
        certs.path("other-ca.pem"),
        certs.path("client.pem"),
        certs.path("client.key"),
    );
    let view = |extra: &[&str], password: &str| {
        let base = [
            "status",
            "--cluster",
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
        ];
        livereg_with_password(&[&base[..], extra].concat(), password)
    };
    let mutual = ["--etcd-cert", cert.as_str(), "--etcd-key", key.as_str()];
    let user = ["--etcd-user", "livereg"];
    // A CA that did not sign etcd's certificate.
    let wrong_ca = view(
        &[&["--etcd-ca", other.as_str()][..], &mutual, &user].concat(),
        "secret",
    );
    fails_in_one_line(&wrong_ca, &[&endpoint, "connect"]);
    // No client certificate, where etcd requires one.
    let no_cert = view(&[&["--etcd-ca", ca.as_str()][..], &user].concat(), "secret");
    fails_in_one_line(&no_cert, &[&endpoint]);
    // The wrong password.
    let wrong_password = view(
        &[&["--etcd-ca", ca.as_str()][..], &mutual, &user].concat(),
        "nope",
    );
    fails_in_one_line(&wrong_password, &[&endpoint, "authentication failed"]);
    // https:// without a CA, and a plaintext endpoint with TLS configured.
    let plain = format!("http://{}", etcd.address());
    fails_in_one_line(
        &livereg(&["status", "--cluster", "--etcd", &endpoint]),
        &["https:// needs a CA", "--etcd-ca"],
    );
    fails_in_one_line(
        &livereg(&["status", "--cluster", "--etcd", &plain, "--etcd-ca", &ca]),
        &["plaintext, but TLS is configured"],
    );

    // A reaper with the wrong password publishes nothing and reaps on.
    let (name, _table) = table("tls-bad", "5s");
    let reaper = Command::new(LIVEREG)
        .args([
            "reap",
            &name,
            "--etcd",
            &endpoint,
            "--etcd-prefix",
            &prefix,
            "--host",
            "h",
        ])
        .args(secure_flags(&certs))
        .env("LIVEREG_ETCD_PASSWORD", "nope")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reaper = Daemon(reaper);
    wait_for("the reaper", Duration::from_secs(10), || {
        livereg(&["probe", &name]).status.success()
    });
    let mut doomed = worker(&name, 13, "doomed");
    doomed.signal(libc::SIGKILL);
    doomed.kill();
    wait_for("the local drop", Duration::from_secs(5), || {
        let status = livereg(&["status", &name, "--json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        status["ended"]["process_exited"] == 1
    });
    assert!(secure_keys(&etcd, &certs, &prefix).is_empty());
    let log = reaper.stderr();
    assert!(log.contains("authentication failed"), "{log}");
    assert_eq!(
        log.matches("local reaping goes on").count(),
        1,
        "one warning for the outage: {log}"
    );
}
