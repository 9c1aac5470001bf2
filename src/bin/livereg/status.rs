//! `livereg status NAME [--json]`

use crate::{duration, Outcome};
use livereg::{Status, Table};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Table name.
    name: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    let status = Table::open(&args.name)?.status()?;
    if args.json {
        out!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        out!("{}", render(&status).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

fn age(seconds: f64) -> String {
    duration::show(Duration::try_from_secs_f64(seconds).unwrap_or_default())
}

/// The human view: a header block, then one line per registration.
pub fn render(status: &Status) -> String {
    let reaper = if status.reaper_stalled {
        format!(
            "STALLED (pid {} holds the table but has not scanned for {}: a handler stuck, or the process stopped)",
            status.reaper_pid,
            age(status.reaper_heartbeat_age_seconds)
        )
    } else if status.reaper_alive {
        format!(
            "alive (pid {}, boot token {:#018x}, last scan {} ago)",
            status.reaper_pid,
            status.boot_token,
            age(status.reaper_heartbeat_age_seconds)
        )
    } else {
        "NONE ALIVE (registrations are not being reaped)".to_owned()
    };
    let ended: Vec<String> = status
        .ended
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    let progress = if status.progress_timeout_seconds > 0.0 {
        format!(
            ", progress timeout {}",
            age(status.progress_timeout_seconds)
        )
    } else {
        String::new()
    };
    let stamps = if status.stamp_resolution_seconds > 0.0 {
        format!(
            ", beats on the coarse clock ({} ticks: evictions up to {} later)",
            age(status.stamp_resolution_seconds),
            age(status.stamp_resolution_seconds * f64::from(livereg::STAMP_LAG_TICKS))
        )
    } else {
        String::new()
    };
    let mut out = format!(
        "table '{}': {}/{} slots live, timeout {}, grace {}{progress}, scan every {}{stamps}\n\
         reaper: {reaper}\n\
         ended: {} (total {}), handler failures {}, handlers overdue {}, corrupt slots {}\n\n",
        status.table,
        status.tracked_instances,
        status.capacity,
        age(status.reap_timeout_seconds),
        age(status.registration_grace_seconds),
        age(status.scan_interval_seconds),
        ended.join(", "),
        status.ended_total,
        status.handler_failures,
        status.handlers_overdue,
        status.corrupt_slots,
    );
    out += &format!(
        "{:>5}  {:>12}  {:<20}  {:>8}  {:<22}  {:>10}  {:>10}  {:>10}  {:<16}\n",
        "SLOT", "INSTANCE", "LABEL", "PID", "STATE", "LAST BEAT", "BEATS", "REGISTERED", "PROGRESS"
    );
    for r in &status.registrations {
        let state = match r.ended_reason {
            Some(reason) => format!("ending ({reason})"),
            None => r.state.as_str().to_owned(),
        };
        // Another time namespace's stamps have no age on this clock.
        let foreign = r.registered_age_seconds.is_none();
        let last = match r.last_heartbeat_age_seconds {
            Some(s) => format!("{} ago", age(s)),
            None if foreign && r.heartbeats > 0 => "other clock".into(),
            None => "never".into(),
        };
        let registered = r
            .registered_age_seconds
            .map(|s| format!("{} ago", age(s)))
            .unwrap_or_else(|| "other clock".into());
        let progress = match (r.busy, r.last_progress_age_seconds) {
            (false, _) => "idle".to_owned(),
            (true, Some(quiet)) => format!("busy, {} quiet", age(quiet)),
            (true, None) => "busy".to_owned(),
        };
        out += &format!(
            "{:>5}  {:>12}  {:<20}  {:>8}  {:<22}  {:>10}  {:>10}  {:>10}  {:<16}\n",
            r.slot, r.instance_id, r.label, r.pid, state, last, r.heartbeats, registered, progress,
        );
    }
    if status.registrations.is_empty() {
        out += "(no registrations)\n";
    }
    out
}
