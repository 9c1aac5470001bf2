//! `livereg reap --metrics-addr [HOST:]PORT`: the table's metrics on HTTP
//! `GET /metrics` (OpenMetrics text) and this daemon's health on
//! `GET /healthz`, from a thread beside the reaper.

use crate::support::cluster::Ends;
use crate::support::duration;
use livereg::{ProcessMetrics, SessionRefusals, Status, Table};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether this process holds the table's reaper role, and what its
/// reaper knows beside the table while it does: set by the daemon once its
/// reaper runs, cleared when it stops.
#[derive(Clone, Default)]
pub struct Role(Arc<Mutex<Option<Reaping>>>);

/// What the reaper role brings to the metrics: its listeners' refusals,
/// the ends its etcd publisher (if any) is fed.
pub struct Reaping {
    pub refusals: SessionRefusals,
    pub ends: Ends,
}

impl Role {
    pub fn take(&self, reaping: Reaping) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(reaping);
    }

    pub fn release(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn held(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// What the metrics add to the table's: nothing while standing by.
    fn process_metrics(&self) -> ProcessMetrics {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(reaping) => ProcessMetrics {
                session_refusals: Some(reaping.refusals.clone()),
                etcd_connected: reaping.ends.etcd_connected(),
            },
            None => ProcessMetrics::default(),
        }
    }
}

/// The listening endpoint; stops on [`MetricsServer::stop`].
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

/// `PORT` alone means `127.0.0.1:PORT`: the endpoint is local unless the
/// operator names an address.
pub fn bind_address(given: &str) -> String {
    let port = given.strip_prefix(':').unwrap_or(given);
    if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        format!("127.0.0.1:{port}")
    } else {
        given.to_owned()
    }
}

impl MetricsServer {
    /// Binds `address` and serves `table`'s metrics, and this daemon's
    /// health as `role` says it.
    ///
    /// # Errors
    ///
    /// One line naming the address and the cause when it cannot be bound.
    pub fn start(address: &str, table: Table, role: Role) -> Result<MetricsServer, String> {
        let address = bind_address(address);
        let server = tiny_http::Server::http(address.as_str())
            .map(Arc::new)
            .map_err(|e| format!("cannot serve metrics on {address}: {e}"))?;
        log::info!(
            "table '{}': serving metrics on http://{}/metrics",
            table.name(),
            server.server_addr()
        );
        let serving = server.clone();
        let thread = std::thread::Builder::new()
            .name("livereg-metrics".into())
            .spawn(move || answer_scrapes(&serving, &table, &role))
            .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
        Ok(MetricsServer {
            server,
            thread: Some(thread),
        })
    }

    /// Stops listening and waits for the thread.
    pub fn stop(mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// This daemon's health, from what it knows and the table's snapshot: `Ok`
/// with a line while it holds the reaper role and has scanned within two
/// scan intervals, else `Err` with the one-line reason.
pub fn health(table: &str, role_held: bool, status: &Status) -> Result<String, String> {
    if !role_held {
        return Err(if status.reaper_alive {
            format!(
                "standing by: another reaper (pid {}) holds table '{table}'",
                status.reaper_pid
            )
        } else {
            format!("not reaping table '{table}' (not started, or stopping)")
        });
    }
    let interval = Duration::try_from_secs_f64(status.scan_interval_seconds).unwrap_or_default();
    match status.reaper_heartbeat_age_seconds {
        None => Err(format!("table '{table}': no scan yet")),
        Some(age) if age > 2.0 * status.scan_interval_seconds => Err(format!(
            "table '{table}': last scan {} ago, more than two scan intervals ({}): a handler stuck, or the process stopped",
            duration::age(age),
            duration::show(interval)
        )),
        Some(age) => Ok(format!(
            "ok: reaping table '{table}', last scan {} ago",
            duration::age(age)
        )),
    }
}

fn healthz(table: &Table, role: &Role) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let verdict = match table.status() {
        Ok(status) => health(table.name(), role.held(), &status),
        Err(e) => Err(e.to_string()),
    };
    match verdict {
        Ok(line) => tiny_http::Response::from_string(line + "\n"),
        Err(line) => tiny_http::Response::from_string(line + "\n").with_status_code(503),
    }
}

fn answer_scrapes(server: &tiny_http::Server, table: &Table, role: &Role) {
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or_default();
        let response = match (request.method(), path) {
            (tiny_http::Method::Get, "/healthz") => healthz(table, role),
            (tiny_http::Method::Get, "/metrics") => match table
                .metrics_text_with(&role.process_metrics())
            {
                Ok(text) => tiny_http::Response::from_string(text).with_header(
                    tiny_http::Header::from_bytes("Content-Type", OPENMETRICS)
                        .expect("a valid header"),
                ),
                Err(e) => tiny_http::Response::from_string(format!("{e}\n")).with_status_code(500),
            },
            (tiny_http::Method::Get, _) => tiny_http::Response::from_string(
                "not found: livereg serves /metrics and /healthz\n",
            )
            .with_status_code(404),
            _ => tiny_http::Response::from_string("method not allowed\n").with_status_code(405),
        };
        let _ = request.respond(response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::sample_status::status;

    #[test]
    fn healthy_only_while_holding_the_role_and_scanning() {
        let mut table = status(Vec::new());
        assert!(health("t", true, &table)
            .unwrap()
            .starts_with("ok: reaping table 't'"));
        assert_eq!(
            health("t", false, &table).unwrap_err(),
            "standing by: another reaper (pid 42) holds table 't'"
        );
        table.reaper_heartbeat_age_seconds = Some(0.6); // over two 250 ms intervals
        assert!(health("t", true, &table)
            .unwrap_err()
            .contains("last scan 600ms ago, more than two scan intervals (250ms)"));
        table.reaper_heartbeat_age_seconds = None;
        assert_eq!(
            health("t", true, &table).unwrap_err(),
            "table 't': no scan yet"
        );
        table.reaper_alive = false;
        assert!(health("t", false, &table)
            .unwrap_err()
            .starts_with("not reaping"));
    }

    #[test]
    fn a_port_alone_binds_loopback() {
        assert_eq!(bind_address("9464"), "127.0.0.1:9464");
        assert_eq!(bind_address(":0"), "127.0.0.1:0");
        assert_eq!(bind_address("0.0.0.0:9464"), "0.0.0.0:9464");
        assert_eq!(bind_address("[::1]:9464"), "[::1]:9464");
    }
}
