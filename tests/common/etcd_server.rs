//! A real etcd for the tests and benches: on loopback, free ports, a
//! temporary data dir; stopped and removed on drop.
//!
//! The binary is `$LIVEREG_ETCD`, else `etcd` on the PATH (Debian's
//! `etcd-server`; `.ci/run` installs it). Without one the caller fails,
//! saying so: a test of the cluster view never passes without etcd.
#![allow(dead_code)] // each includer uses its part

use etcd_client::{Client, EventType, WatchOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long etcd may take to answer its health check after starting.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// One event a watcher saw.
pub struct Seen {
    pub kind: EventType,
    pub key: String,
    /// The value put, or for a delete the key's previous value.
    pub value: Vec<u8>,
    /// When it reached the watcher.
    pub at: Instant,
}

pub struct EtcdServer {
    /// `http://127.0.0.1:PORT` (`https://` with TLS).
    pub endpoint: String,
    client_port: u16,
    peer_port: u16,
    /// A plaintext listener for `/health` (the client port may speak TLS).
    health_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// Flags beyond the defaults (e.g. `--max-txn-ops 2`).
    extra: Vec<String>,
    /// Its member name, and every member's `name=peer URL`.
    name: String,
    initial_cluster: String,
}

impl EtcdServer {
    pub fn start(tag: &str) -> EtcdServer {
        EtcdServer::start_with(tag, &[])
    }

    /// As [`EtcdServer::start`], with `extra` flags.
    pub fn start_with(tag: &str, extra: &[&str]) -> EtcdServer {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "livereg-etcd-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("make etcd's data dir");
        let (client_port, peer_port, health_port) = (free_port(), free_port(), free_port());
        let scheme = if extra.contains(&"--cert-file") {
            "https"
        } else {
            "http"
        };
        let mut server = EtcdServer {
            endpoint: format!("{scheme}://127.0.0.1:{client_port}"),
            client_port,
            peer_port,
            health_port,
            dir,
            child: None,
            extra: extra.iter().map(|flag| flag.to_string()).collect(),
            name: "test".into(),
            initial_cluster: format!("test=http://127.0.0.1:{peer_port}"),
        };
        server.resume();
        server
    }

    /// A cluster of `members` plaintext members on loopback, every one
    /// healthy (a leader elected) when this returns.
    pub fn cluster(tag: &str, members: usize) -> Vec<EtcdServer> {
        let ports: Vec<(u16, u16, u16)> = (0..members)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, _))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers: Vec<EtcdServer> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, peer_port, health_port))| {
                let dir = std::env::temp_dir()
                    .join(format!("livereg-etcd-{tag}-{}-m{i}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("make etcd's data dir");
                EtcdServer {
                    endpoint: format!("http://127.0.0.1:{client_port}"),
                    client_port,
                    peer_port,
                    health_port,
                    dir,
                    child: None,
                    extra: Vec::new(),
                    name: format!("m{i}"),
                    initial_cluster: initial_cluster.clone(),
                }
            })
            .collect();
        for server in &mut servers {
            server.spawn();
        }
        for server in &servers {
            server.wait_healthy();
        }
        servers
    }

    /// Whether this member leads its cluster now (from its metrics).
    pub fn is_leader(&self) -> bool {
        self.get(self.health_port, "/metrics")
            .lines()
            .any(|l| l.trim() == "etcd_server_is_leader 1")
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `127.0.0.1:PORT`, as `--etcd` takes it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd (SIGKILL: an abrupt outage); its data dir stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops or continues the process (SIGSTOP / SIGCONT: a hung etcd).
    pub fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("etcd is running");
        // SAFETY: `kill` has no memory effects; the child is not yet waited for.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    }

    /// Starts etcd (again) on the same ports and data and waits until healthy.
    pub fn resume(&mut self) {
        self.spawn();
        self.wait_healthy();
    }

    /// Starts the process (a cluster's member is healthy only once a quorum
    /// runs: see [`EtcdServer::wait_healthy`]).
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "etcd already runs");
        let binary = std::env::var("LIVEREG_ETCD").unwrap_or_else(|_| "etcd".into());
        let client = self.endpoint.clone();
        let health = format!("http://127.0.0.1:{}", self.health_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.join("etcd.log")).expect("etcd's log");
        let child = Command::new(&binary)
            .args(["--name", &self.name, "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--listen-metrics-urls", &health])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "could not start etcd ('{binary}': {e}): install Debian's etcd-server \
                     (apt-get install etcd-server) or set LIVEREG_ETCD to its path"
                )
            });
        self.child = Some(child);
    }

    /// Waits until `/health` says healthy (for a cluster's member: a leader
    /// is elected).
    fn wait_healthy(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        while !self.healthy() {
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy within {START_TIMEOUT:?}; its log: {}",
                std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /health` answers `"health":"true"`.
    fn healthy(&self) -> bool {
        self.get(self.health_port, "/health")
            .contains(r#""health":"true""#)
    }

    /// `GET path` on a port of this member's; empty if it does not answer.
    fn get(&self, port: u16, path: &str) -> String {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        let mut answer = String::new();
        if stream.write_all(request.as_bytes()).is_err() {
            return String::new();
        }
        let _ = stream.read_to_string(&mut answer);
        answer
    }

    /// A client of this etcd, with the runtime to drive it.
    pub fn client(&self) -> (tokio::runtime::Runtime, Client) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(Client::connect([self.endpoint.as_str()], None))
            .expect("connect to etcd");
        (runtime, client)
    }

    /// Watches every key under `prefix` (with previous values) from a thread
    /// of its own; returns once the watch is in place.
    pub fn watch(&self, prefix: &str) -> Receiver<Seen> {
        let (sender, events) = mpsc::channel();
        let (ready, started) = mpsc::channel();
        let (endpoint, prefix) = (self.endpoint.clone(), prefix.to_owned());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut client = Client::connect([endpoint], None).await.unwrap();
                let options = WatchOptions::new().with_prefix().with_prev_key();
                let mut stream = client.watch(prefix, Some(options)).await.unwrap();
                ready.send(()).unwrap();
                while let Ok(Some(answer)) = stream.message().await {
                    let at = Instant::now();
                    for event in answer.events() {
                        let kind = event.event_type();
                        let kv = match kind {
                            EventType::Put => event.kv(),
                            EventType::Delete => event.prev_kv(),
                        };
                        let key = event.kv().map(|kv| String::from_utf8_lossy(kv.key()));
                        let seen = Seen {
                            kind,
                            key: key.unwrap_or_default().into_owned(),
                            value: kv.map(|kv| kv.value().to_vec()).unwrap_or_default(),
                            at,
                        };
                        if sender.send(seen).is_err() {
                            return;
                        }
                    }
                }
            });
        });
        started
            .recv_timeout(Duration::from_secs(10))
            .expect("the watch started");
        events
    }

    /// etcd's own metrics (`GET /metrics`), Prometheus text; empty while it
    /// does not answer.
    pub fn metrics(&self) -> String {
        self.get(self.client_port, "/metrics")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGCONT);
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
