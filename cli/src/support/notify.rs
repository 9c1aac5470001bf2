//! systemd's readiness protocol (`sd_notify(3)`), the few lines it takes: one
//! datagram per state change on the socket `NOTIFY_SOCKET` names (a path, or
//! an abstract name after `@`), and the watchdog `WATCHDOG_USEC` asks for.
//! No libsystemd.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The service manager's notification socket.
pub struct Notifier {
    socket: UnixDatagram,
    address: SocketAddr,
}

impl Notifier {
    /// The socket `NOTIFY_SOCKET` names; `None` when it is unset (not run by
    /// systemd with `Type=notify`).
    ///
    /// # Errors
    ///
    /// A clear message when the variable names no usable socket.
    pub fn from_env() -> Result<Option<Notifier>, String> {
        let Some(name) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let name = name.to_string_lossy().into_owned();
        let address = match name.strip_prefix('@') {
            Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
            None if name.starts_with('/') => SocketAddr::from_pathname(&name),
            None => {
                return Err(format!(
                    "NOTIFY_SOCKET '{name}' is not a socket path or an @abstract name"
                ))
            }
        }
        .map_err(|e| format!("NOTIFY_SOCKET '{name}': {e}"))?;
        let socket = UnixDatagram::unbound().map_err(|e| format!("a notification socket: {e}"))?;
        Ok(Some(Notifier { socket, address }))
    }

    /// Sends `state` (`READY=1`, `STATUS=...`, newline-separated); a
    /// manager that went away is not the daemon's failure.
    pub fn send(&self, state: &str) {
        let _ = self.socket.send_to_addr(state.as_bytes(), &self.address);
    }
}

/// How often the service manager expects `WATCHDOG=1`, when it asks this
/// process for it (`WATCHDOG_USEC`, and `WATCHDOG_PID` unset or ours).
pub fn watchdog_interval() -> Option<Duration> {
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}
