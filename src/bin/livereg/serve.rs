//! `livereg reap --metrics-addr HOST:PORT`: the table's metrics on HTTP
//! `GET /metrics` (OpenMetrics text), from a thread beside the reaper.

use livereg::Table;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The listening endpoint; stops on [`MetricsServer::stop`].
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `address` and serves `table`'s metrics.
    ///
    /// # Errors
    ///
    /// One line naming the address and the cause when it cannot be bound.
    pub fn start(address: &str, table: Table) -> Result<MetricsServer, String> {
        let server = tiny_http::Server::http(address)
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
            .spawn(move || serve(&serving, &table))
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

fn serve(server: &tiny_http::Server, table: &Table) {
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or_default();
        let response = match (request.method(), path) {
            (tiny_http::Method::Get, "/metrics") => match table.metrics_text() {
                Ok(text) => tiny_http::Response::from_string(text).with_header(
                    tiny_http::Header::from_bytes("Content-Type", OPENMETRICS)
                        .expect("a valid header"),
                ),
                Err(e) => tiny_http::Response::from_string(format!("{e}\n")).with_status_code(500),
            },
            (tiny_http::Method::Get, _) => {
                tiny_http::Response::from_string("not found: livereg serves /metrics\n")
                    .with_status_code(404)
            }
            _ => tiny_http::Response::from_string("method not allowed\n").with_status_code(405),
        };
        let _ = request.respond(response);
    }
}
