//! `livereg probe NAME [--instance N]`: without `--instance`, exit 0 and the
//! boot token if a reaper is alive; with it, exit 0 only if instance N's
//! registration is live and neither silent past the timeout nor stalled (an
//! engine container's exec probe).

use crate::support::duration::age;
use crate::support::outcome::Outcome;
use crate::support::target::SessionArgs;
use livereg::{Address, RegistrationState, Status, Table};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Table name, or a reaper's listener (`unix:PATH`, `tcp://HOST:PORT`)
    /// from a container that cannot map the table.
    name: String,
    /// Probe this instance's registration instead of the reaper.
    #[arg(long, value_name = "N")]
    instance: Option<u64>,
    #[command(flatten)]
    token: SessionArgs,
}

pub fn run(args: Args) -> Outcome {
    if Address::is_address(&args.name) {
        let options = args.token.options()?;
        let status = livereg::remote_status(&args.name, args.instance, &options)?;
        return answer(&status, args.instance);
    }
    let table = Table::open(&args.name)?;
    let Some(instance) = args.instance else {
        let token = table.probe()?;
        out!("{token:#018x}");
        return Ok(ExitCode::SUCCESS);
    };
    answer(&table.status()?, Some(instance))
}

/// Exit 0 and a line if the reaper (or `instance`) is well, else the reason.
fn answer(status: &Status, instance: Option<u64>) -> Outcome {
    let Some(instance) = instance else {
        if !status.reaper_alive {
            return Err(format!("table '{}': no reaper is alive", status.table).into());
        }
        out!("{:#018x}", status.boot_token);
        return Ok(ExitCode::SUCCESS);
    };
    match instance_health(status, instance) {
        Ok(line) => {
            out!("{line}");
            Ok(ExitCode::SUCCESS)
        }
        Err(line) => Err(line.into()),
    }
}

/// Whether `instance` is live in `status`: `Ok` with a line, or `Err` with
/// the one-line reason it is not.
pub fn instance_health(status: &Status, instance: u64) -> Result<String, String> {
    let table = &status.table;
    let live = status
        .registrations
        .iter()
        .filter(|r| r.instance_id == instance)
        .max_by_key(|r| r.state == RegistrationState::Live);
    let Some(r) = live else {
        return Err(format!(
            "instance {instance} is not registered in table '{table}'"
        ));
    };
    if let Some(reason) = r.ended_reason {
        return Err(format!(
            "instance {instance} ended ({reason}); its drop is pending in table '{table}'"
        ));
    }
    match (r.last_heartbeat_age_seconds, r.registered_age_seconds) {
        (Some(silent), _) if status.enabled && silent >= status.reap_timeout_seconds => {
            return Err(format!(
                "instance {instance} has been silent for {}, past the timeout ({}): the reaper will end it",
                age(silent),
                age(status.reap_timeout_seconds)
            ));
        }
        (None, Some(registered))
            if r.heartbeats == 0
                && status.enabled
                && registered >= status.registration_grace_seconds =>
        {
            return Err(format!(
                "instance {instance} registered {} ago and never beat, past the grace ({}): the reaper will end it",
                age(registered),
                age(status.registration_grace_seconds)
            ));
        }
        _ => {}
    }
    if let (true, Some(quiet)) = (r.busy, r.last_progress_age_seconds) {
        if status.progress_timeout_seconds > 0.0 && quiet >= status.progress_timeout_seconds {
            return Err(format!(
                "instance {instance} is busy and has made no progress for {}, past the progress timeout ({})",
                age(quiet),
                age(status.progress_timeout_seconds)
            ));
        }
    }
    let beat = r
        .last_heartbeat_age_seconds
        .map_or("never beat".to_owned(), |s| {
            format!("last beat {} ago", age(s))
        });
    Ok(format!(
        "instance {instance} live in table '{table}' (slot {}, pid {}, {beat})",
        r.slot, r.pid
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::sample_status::{registration, status};
    use livereg::Reason;

    #[test]
    fn a_live_instance_passes_and_an_absent_one_fails_naming_the_table() {
        let table = status(vec![registration(7)]);
        let ok = instance_health(&table, 7).unwrap();
        assert!(ok.starts_with("instance 7 live in table 't'"), "{ok}");
        let absent = instance_health(&table, 8).unwrap_err();
        assert_eq!(absent, "instance 8 is not registered in table 't'");
    }

    #[test]
    fn an_ending_a_silent_and_a_stalled_instance_fail_saying_why() {
        let mut ending = registration(1);
        ending.state = RegistrationState::Ending;
        ending.ended_reason = Some(Reason::ProcessExited);
        let mut silent = registration(2);
        silent.last_heartbeat_age_seconds = Some(1.5);
        let mut stalled = registration(3);
        stalled.busy = true;
        stalled.last_progress_age_seconds = Some(2.5);
        let mut busy = registration(4);
        busy.busy = true;
        busy.last_progress_age_seconds = Some(0.5);
        let mut never = registration(5);
        never.heartbeats = 0;
        never.last_heartbeat_age_seconds = None;
        never.registered_age_seconds = Some(3.0);
        let table = status(vec![ending, silent, stalled, busy, never]);
        assert!(instance_health(&table, 1)
            .unwrap_err()
            .contains("ended (process_exited)"));
        assert!(instance_health(&table, 2)
            .unwrap_err()
            .contains("silent for 1.50s, past the timeout (1.00s)"));
        assert!(instance_health(&table, 3)
            .unwrap_err()
            .contains("no progress for 2.50s, past the progress timeout (2.00s)"));
        assert!(instance_health(&table, 4).is_ok(), "busy and moving");
        assert!(instance_health(&table, 5)
            .unwrap_err()
            .contains("registered 3.00s ago and never beat, past the grace (2.00s)"));
    }
}
