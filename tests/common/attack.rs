//! A `livereg reap --listen` daemon as its attackers meet it, and the
//! attacks: floods of bytes that are no frame, idle connections held open
//! by the hundred, wrong tokens as fast as they are answered. Shared by the
//! tests that bound what an attack costs and by `cli/benches/session_attacks.rs`
//! that measures it.
#![allow(dead_code)]

use livereg::wire::{Frame, VERSION};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The token every daemon here takes.
pub const TOKEN: &str = "attack-test-token";

/// A `livereg reap NAME --listen ADDRESS --token-file F` process whose
/// drops are written by its `--on-drop` hook to a file, and whose log is a
/// file.
pub struct Daemon {
    pub child: Child,
    pub hook_log: PathBuf,
    pub log: PathBuf,
    token_file: PathBuf,
}

impl Daemon {
    /// Starts the daemon on table `name` (which must exist) listening on
    /// every address of `listen`, and waits until the first one answers.
    pub fn start(bin: &str, name: &str, listen: &[&str]) -> Daemon {
        Daemon::start_with(bin, name, listen, "")
    }

    /// As [`Daemon::start`], the command line run by `sh` after `prefix`
    /// (`ulimit -n 64;`, `umask 000;`).
    pub fn start_with(bin: &str, name: &str, listen: &[&str], prefix: &str) -> Daemon {
        Daemon::start_full(bin, name, listen, prefix, "")
    }

    /// As [`Daemon::start_with`], with `more` options on the daemon's
    /// command line (`--metrics-addr 127.0.0.1:0`).
    pub fn start_full(bin: &str, name: &str, listen: &[&str], prefix: &str, more: &str) -> Daemon {
        let dir = std::env::temp_dir();
        let token_file = dir.join(format!("{name}.token"));
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let hook_log = dir.join(format!("{name}.drops"));
        let log = dir.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&hook_log);
        let listens: String = listen.iter().map(|a| format!(" --listen {a}")).collect();
        let script = format!(
            "{prefix} exec {bin} reap {name}{listens} {more} --token-file {} --on-drop 'echo \"$LIVEREG_INSTANCE_ID $LIVEREG_REASON pid=$LIVEREG_PID claimed=$LIVEREG_CLAIMED_PID\" >> {}'",
            token_file.display(),
            hook_log.display()
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let daemon = Daemon {
            child,
            hook_log,
            log,
            token_file,
        };
        daemon.wait_listening(listen[0]);
        daemon
    }

    fn wait_listening(&self, address: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if open(address).is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "the daemon never listened on {address}: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The daemon's peak resident set, in bytes (`VmHWM`).
    pub fn peak_rss(&self) -> u64 {
        status_field(self.pid(), "VmHWM:") * 1024
    }

    /// The daemon's resident set now, in bytes.
    pub fn rss(&self) -> u64 {
        status_field(self.pid(), "VmRSS:") * 1024
    }

    /// The CPU time the daemon used so far (user and system).
    pub fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after_name.split(' ').collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the name.
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf reads a constant.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_millis(ticks * 1000 / per_second)
    }

    /// The lines its hook wrote: "INSTANCE REASON pid=… claimed=…".
    pub fn drops(&self) -> Vec<String> {
        std::fs::read_to_string(&self.hook_log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill with a pid of our own child.
        unsafe { libc::kill(self.pid() as i32, signal) };
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.hook_log);
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(&self.token_file);
    }
}

fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .unwrap_or(0)
}

/// A connection to a `unix:` or `tcp://` address.
pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(bytes),
            Conn::Tcp(s) => s.write(bytes),
        }
    }

    pub fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }

    pub fn set_timeouts(&self, timeout: Duration) {
        match self {
            Conn::Unix(s) => {
                let _ = s.set_read_timeout(Some(timeout));
                let _ = s.set_write_timeout(Some(timeout));
            }
            Conn::Tcp(s) => {
                let _ = s.set_read_timeout(Some(timeout));
                let _ = s.set_write_timeout(Some(timeout));
            }
        }
    }
}

/// Says hello on `conn` as `instance` (this process's pid, the token) and
/// returns the first frame answered (`None`: closed unanswered, or no frame
/// within 5 s).
pub fn say_hello(conn: &mut Conn, instance: u64) -> Option<Frame> {
    let hello = Frame::Hello {
        version: VERSION,
        instance_id: instance,
        pid: std::process::id(),
        token: TOKEN.as_bytes().to_vec(),
        label: String::new(),
        host: String::new(),
        reclaim: None,
    };
    conn.write(&hello.encode()).ok()?;
    conn.set_timeouts(Duration::from_secs(5));
    let mut received = Vec::new();
    let mut buffer = [0u8; 512];
    loop {
        if let Ok(Some((frame, _))) = Frame::decode(&received) {
            return Some(frame);
        }
        match conn.read(&mut buffer) {
            Ok(0) | Err(_) => return None,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

/// Opens a connection to `address` (`unix:PATH` or `tcp://HOST:PORT`).
pub fn open(address: &str) -> Option<Conn> {
    if let Some(path) = address.strip_prefix("unix:") {
        UnixStream::connect(path).ok().map(Conn::Unix)
    } else {
        let endpoint: SocketAddr = address.strip_prefix("tcp://")?.parse().ok()?;
        TcpStream::connect_timeout(&endpoint, Duration::from_secs(2))
            .ok()
            .map(Conn::Tcp)
    }
}

/// Opens a TCP connection to `address` from the loopback address `from`
/// (`127.0.0.2`: another source than the legitimate clients).
pub fn open_from(address: &str, from: &str) -> Option<Conn> {
    let endpoint: SocketAddr = address.strip_prefix("tcp://")?.parse().ok()?;
    let socket = socket_from(from)?;
    // SAFETY: connect on a socket we own with a valid sockaddr_in.
    let addr = match endpoint {
        SocketAddr::V4(v4) => libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        },
        SocketAddr::V6(_) => return None,
    };
    let rc = unsafe {
        libc::connect(
            socket,
            std::ptr::from_ref(&addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    };
    // SAFETY: `socket` is a descriptor we opened and own from here on.
    let stream = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(socket) };
    (rc == 0).then_some(Conn::Tcp(stream))
}

fn socket_from(from: &str) -> Option<i32> {
    let ip: std::net::Ipv4Addr = from.parse().ok()?;
    // SAFETY: plain socket calls on a descriptor we own.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if socket < 0 {
            return None;
        }
        let local = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        if libc::bind(
            socket,
            std::ptr::from_ref(&local).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        ) != 0
        {
            libc::close(socket);
            return None;
        }
        Some(socket)
    }
}

/// A session client process of `bin` (`livereg run ADDRESS -- sleep`)
/// registered as `instance`, to be killed.
pub fn victim(bin: &str, address: &str, instance: u64) -> Child {
    Command::new(bin)
        .args([
            "run",
            address,
            "--instance",
            &instance.to_string(),
            "--",
            "sleep",
            "600",
        ])
        .env("LIVEREG_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Attackers running until dropped; `work` counts what they did.
pub struct Attack {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    pub work: Arc<AtomicU64>,
}

impl Drop for Attack {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn attack(
    threads: usize,
    body: impl Fn(&AtomicBool, &AtomicU64) + Send + Sync + 'static,
) -> Attack {
    let stop = Arc::new(AtomicBool::new(false));
    let work = Arc::new(AtomicU64::new(0));
    let body = Arc::new(body);
    let threads = (0..threads)
        .map(|_| {
            let (stop, work, body) = (stop.clone(), work.clone(), body.clone());
            std::thread::spawn(move || body(&stop, &work))
        })
        .collect();
    Attack {
        stop,
        threads,
        work,
    }
}

/// `connections` connections each writing 1 MiB writes of zeros (never a
/// frame), reconnecting when closed; `work` counts the bytes written.
pub fn flood(address: &str, connections: usize) -> Attack {
    let address = address.to_owned();
    attack(connections, move |stop, written| {
        let zeros = vec![0u8; 1 << 20];
        while !stop.load(Relaxed) {
            let Some(mut conn) = open(&address) else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            conn.set_timeouts(Duration::from_millis(200));
            while !stop.load(Relaxed) {
                match conn.write(&zeros) {
                    Ok(n) => written.fetch_add(n as u64, Relaxed),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(_) => break,
                };
            }
        }
    })
}

/// `connections` idle connections held open, each reopened as soon as it
/// is closed (what `behaviour` writes first: nothing, or a part-frame);
/// `work` counts the connections opened.
pub fn slowloris(address: &str, connections: usize, first_bytes: &'static [u8]) -> Attack {
    let address = address.to_owned();
    let per_thread = 50;
    let threads = connections.div_ceil(per_thread);
    attack(threads, move |stop, opened| {
        let mut held: Vec<Option<Conn>> = (0..per_thread).map(|_| None).collect();
        while !stop.load(Relaxed) {
            for entry in held.iter_mut() {
                let closed = match entry {
                    None => true,
                    Some(conn) => {
                        let mut byte = [0u8; 64];
                        conn.set_timeouts(Duration::from_micros(100));
                        matches!(conn.read(&mut byte), Ok(0))
                            || matches!(conn.read(&mut byte), Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
                    }
                };
                if closed {
                    *entry = open(&address).map(|mut conn| {
                        if !first_bytes.is_empty() {
                            let _ = conn.write(first_bytes);
                        }
                        conn
                    });
                    opened.fetch_add(1, Relaxed);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}
