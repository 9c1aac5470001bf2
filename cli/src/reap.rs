//! `livereg reap NAME [--on-drop CMD] [--hook-timeout D] [--standby]
//! [--notify] [--metrics-addr A] [--listen ADDRESS … [--token-file F]]
//! [--etcd ENDPOINTS …]`
//!
//! The hook is the drop: it runs (on the reaper's handler thread, never
//! holding up scans) before the registration's slot is freed, so its id
//! cannot come back before the hook ran, and a daemon killed mid-hook leaves
//! the drop for the next reaper to run again (at least once).

use crate::support::cluster::{Ends, Publishing};
use crate::support::duration;
use crate::support::etcd_args::PublishArgs;
use crate::support::metrics_endpoint::{MetricsServer, Reaping, Role};
use crate::support::notify::{self, Notifier};
use crate::support::outcome::Outcome;
use crate::support::signals;
use crate::support::target::TokenArgs;
use livereg::{Address, DropEvent, Error, HandlerError, ReaperThread, Reason, Table, TlsServer};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// How often the daemon looks at its signals and its reaper thread.
const SIGNAL_POLL: Duration = Duration::from_millis(50);
/// How often a standby reaper tries to take the role.
const STANDBY_POLL: Duration = Duration::from_millis(100);
/// How often a running hook is looked at (its exit, its deadline).
const HOOK_POLL: Duration = Duration::from_millis(2);

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
    /// Shell command run (`sh -c`) once per ended registration, with
    /// LIVEREG_INSTANCE_ID, LIVEREG_REASON, LIVEREG_PID, LIVEREG_LABEL,
    /// LIVEREG_SLOT, LIVEREG_GENERATION and LIVEREG_SILENT_SECONDS (how long
    /// it had been silent when the reaper ended it) in its environment. A
    /// session's registration has LIVEREG_CLAIMED_PID (the pid its client
    /// claimed, in its own container, unverified) instead of LIVEREG_PID.
    #[arg(long)]
    on_drop: Option<String>,
    /// How long a hook may run; then its process group is killed and the
    /// drop counts as a handler failure.
    #[arg(long, value_parser = duration::parse, default_value = "30s")]
    hook_timeout: Duration,
    /// If another reaper holds the table, wait and take over when it dies.
    #[arg(long)]
    standby: bool,
    /// Judge progress with this timeout (0: not at all) instead of the one
    /// the table was created with: a busy registration with no step for
    /// that long ends `stalled`. Written into the table, so `status` shows
    /// the value in force.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    progress_timeout: Option<Duration>,
    /// Tell systemd (`Type=notify`, through NOTIFY_SOCKET): READY=1 after the
    /// first scan, a STATUS= summary and (when WatchdogSec= is set)
    /// WATCHDOG=1 at every scan, STOPPING=1 on shutdown. A reaper that stops
    /// scanning stops sending WATCHDOG=1, and systemd restarts it.
    #[arg(long)]
    notify: bool,
    /// Serve the table's metrics (OpenMetrics text) on HTTP `GET /metrics`
    /// and this daemon's health on `GET /healthz` (200 while it reaps and
    /// has scanned within two intervals, else 503 and why) at this address;
    /// a port alone binds 127.0.0.1 (e.g. 9464; 0.0.0.0:9464 for every
    /// interface; port 0: any free port, logged).
    #[arg(long, value_name = "[HOST:]PORT")]
    metrics_addr: Option<String>,
    /// Also serve sessions here, for workers that cannot map the table
    /// (containers sharing no /dev/shm): `unix:/PATH`, `tcp://HOST:PORT` or
    /// `tls://HOST:PORT`. Repeatable. `tcp://` needs a token, `tls://` a
    /// certificate and a token or a client CA.
    #[arg(long, value_name = "ADDRESS", value_parser = parse_address)]
    listen: Vec<Address>,
    /// The certificate chain (PEM) of tls:// listeners.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of tls:// listeners.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Require every tls:// client to present a certificate chaining to this
    /// CA (PEM); such clients need no token.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// The mode of `unix:` listening sockets (who may connect), in octal.
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode, default_value = "660")]
    socket_mode: u32,
    #[command(flatten)]
    token: TokenArgs,
    #[command(flatten)]
    etcd: PublishArgs,
}

fn parse_address(text: &str) -> Result<Address, String> {
    Address::parse(text).map_err(|e| e.to_string())
}

fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| format!("mode '{text}': expected octal digits, 0 to 777"))
}

pub fn run(args: Args) -> Outcome {
    let etcd = Publishing::checked(&args.etcd)?;
    let token = args.token.token()?;
    for address in &args.listen {
        if address.needs_token(args.tls_client_ca.is_some()) && token.is_none() {
            return Err(format!(
                "--listen {address}: a network listener needs a token: --token-file FILE or LIVEREG_TOKEN{}",
                if matches!(address, Address::Tls(_)) { " (or client certificates: --tls-client-ca)" } else { "" }
            )
            .into());
        }
        if matches!(address, Address::Tls(_)) && args.tls_cert.is_none() {
            return Err(format!(
                "--listen {address}: a tls:// listener needs --tls-cert FILE and --tls-key FILE"
            )
            .into());
        }
    }
    signals::catch_termination();
    raise_open_files_limit();
    let table = Table::open(&args.name)?;
    if table.reap_timeout().is_zero() {
        return Err(format!(
            "table '{}': reaping is disabled (its reap timeout is 0)",
            args.name
        )
        .into());
    }
    let role = Role::default();
    let metrics = match &args.metrics_addr {
        Some(address) => Some(MetricsServer::start(address, table.clone(), role.clone())?),
        None => None,
    };
    let ends = Ends::new();
    let Some((mut reaper, scans_before)) = take_role(&table, &args, &ends, token.as_deref())?
    else {
        return Ok(ExitCode::SUCCESS);
    };
    role.take(Reaping {
        refusals: reaper.session_refusals(),
        ends: ends.clone(),
    });
    // Only the reaper that holds the table publishes it.
    let publisher = match etcd {
        Some(publishing) => Some(publishing.start(&table, &ends)?),
        None => None,
    };
    log::info!(
        "table '{}': reaping (timeout {}, grace {}, scan every {}, progress timeout {}, boot token {:#018x})",
        args.name,
        duration::show(table.reap_timeout()),
        duration::show(table.registration_grace()),
        duration::show(table.scan_interval()),
        match table.progress_timeout() {
            off if off.is_zero() => "off".to_owned(),
            timeout => duration::show(timeout),
        },
        table.probe()?
    );
    let mut systemd = Supervisor::new(args.notify, scans_before)?;
    while signals::take().is_none() {
        reaper.check()?;
        systemd.after_poll(&table);
        std::thread::sleep(SIGNAL_POLL);
    }
    systemd.stopping();
    role.release();
    if let Some(metrics) = metrics {
        metrics.stop();
    }
    reaper.stop()?;
    if let Some(publisher) = publisher {
        publisher.stop();
    }
    log::info!("table '{}': reaper stopped", args.name);
    Ok(ExitCode::SUCCESS)
}

/// What `--notify` tells systemd, scan by scan.
struct Supervisor {
    notifier: Option<Notifier>,
    watchdog: bool,
    ready: bool,
    /// The table's scan count when last looked at.
    scans: u64,
}

impl Supervisor {
    /// `scans`: the table's count before this reaper started.
    fn new(notify: bool, scans: u64) -> Result<Supervisor, String> {
        let notifier = if notify { Notifier::from_env()? } else { None };
        if notify && notifier.is_none() {
            log::warn!("--notify: NOTIFY_SOCKET is not set (not run by systemd with Type=notify); not notifying");
        }
        Ok(Supervisor {
            watchdog: notifier.is_some() && notify::watchdog_interval().is_some(),
            notifier,
            ready: false,
            scans,
        })
    }

    /// After each look at the reaper: if it scanned since the last look,
    /// READY=1 (the first time), WATCHDOG=1 and the status line.
    fn after_poll(&mut self, table: &Table) {
        let Some(notifier) = &self.notifier else {
            return;
        };
        let scans = table.scans();
        if scans == self.scans {
            return;
        }
        self.scans = scans;
        let mut state = String::new();
        if !self.ready {
            state += "READY=1\n";
            self.ready = true;
        }
        if self.watchdog {
            state += "WATCHDOG=1\n";
        }
        if let Ok(status) = table.status() {
            state += &format!(
                "STATUS={}/{} live, ended {} ({} process_exited, {} timeout), {} handler failures",
                status.tracked_instances,
                status.capacity,
                status.ended_total,
                status.ended[&Reason::ProcessExited],
                status.ended[&Reason::Timeout],
                status.handler_failures
            );
        }
        notifier.send(&state);
    }

    fn stopping(&self) {
        if let Some(notifier) = &self.notifier {
            notifier.send("STOPPING=1");
        }
    }
}

/// Starts the reaper, or (with `--standby`) waits for the role until a
/// termination signal. `None` means a signal came first. With the reaper,
/// the table's scan count just before it started.
fn take_role(
    table: &Table,
    args: &Args,
    ends: &Ends,
    token: Option<&[u8]>,
) -> Result<Option<(ReaperThread, u64)>, Error> {
    let mut announced = false;
    loop {
        let hook = args.on_drop.clone();
        let ends = ends.clone();
        let hook_timeout = args.hook_timeout;
        let scans_before = table.scans();
        // A standby listens only once it holds the role.
        let mut builder = table.reaper();
        if let Some(timeout) = args.progress_timeout {
            builder = builder.progress_timeout(timeout);
        }
        for address in &args.listen {
            builder = builder.listen(address.clone(), token.map(<[u8]>::to_vec));
        }
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            builder = builder.tls(TlsServer {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            });
        }
        let attempt = builder
            .socket_mode(args.socket_mode)
            // (The library logs every ended registration at info.)
            .on_drop(move |event| {
                // Published first: a watcher learns of the end before a slow
                // hook finishes.
                ends.ended(event);
                match &hook {
                    Some(command) => run_hook(command, event, hook_timeout),
                    None => Ok(()),
                }
            })
            .spawn();
        match attempt {
            Err(Error::Busy { message, .. }) if args.standby => {
                if !announced {
                    log::info!("{message}; standing by to take over");
                    announced = true;
                }
                if signals::take().is_some() {
                    return Ok(None);
                }
                std::thread::sleep(STANDBY_POLL);
            }
            Err(Error::Busy { message, .. }) => {
                return Err(Error::busy(format!(
                    "{message} (use --standby to wait and take over)"
                )))
            }
            other => return other.map(|reaper| Some((reaper, scans_before))),
        }
    }
}

/// Runs the hook for one ended registration and waits for it, up to
/// `timeout`; then kills its process group. A non-zero exit, a failure to
/// start and a timeout are handler failures.
fn run_hook(command: &str, event: &DropEvent, timeout: Duration) -> Result<(), HandlerError> {
    let mut hook = Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("LIVEREG_INSTANCE_ID", event.instance_id.to_string())
        .env("LIVEREG_REASON", event.reason.as_str())
        .env(
            if event.remote {
                "LIVEREG_CLAIMED_PID"
            } else {
                "LIVEREG_PID"
            },
            event.pid.to_string(),
        )
        .env("LIVEREG_LABEL", &event.label)
        .env("LIVEREG_SLOT", event.slot.to_string())
        .env("LIVEREG_GENERATION", event.generation.to_string())
        .env(
            "LIVEREG_SILENT_SECONDS",
            format!("{:.6}", event.silent_for.as_secs_f64()),
        )
        .process_group(0)
        .spawn()
        .map_err(|e| format!("--on-drop hook did not start: {e}"))?;
    let deadline = Instant::now().checked_add(timeout);
    loop {
        if let Some(status) = hook.try_wait()? {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("--on-drop hook {status}").into())
            };
        }
        if deadline.is_some_and(|at| Instant::now() >= at) {
            // SAFETY: `kill` has no memory effects; the group is the hook's
            // own (process_group(0)), its leader not yet reaped.
            unsafe { libc::kill(-(hook.id() as libc::pid_t), libc::SIGKILL) };
            let _ = hook.wait();
            return Err(format!(
                "--on-drop hook still running after {}: its process group was killed",
                duration::show(timeout)
            )
            .into());
        }
        std::thread::sleep(HOOK_POLL);
    }
}

/// Raises the soft limit on open files to the hard limit: the reaper holds a
/// pidfd per registered process. Falls back quietly: running short only
/// delays exit detection to the next scan.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit` for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
