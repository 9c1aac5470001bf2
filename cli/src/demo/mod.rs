//! `livereg demo`: the whole system on a private table. Worker processes (this
//! binary in its hidden worker mode) register and beat; one is killed, one
//! hung, one exits cleanly; a clear runs the server's clear handler and leaves
//! the rest registered, a reset ends them and they come back, and the hung
//! one, resumed, learns it was evicted and registers again. Every ended
//! registration is checked against its expected reason and bound.

mod scenarios;
mod stage;

use crate::support::duration;
use crate::support::outcome::Outcome;
use crate::support::signals;
use livereg::{Table, TableOptions};
use stage::{
    spawn_worker, Demo, DemoEvent, Unlink, WorkerProcess, GRACE, PROGRESS_TIMEOUT, TIMEOUT,
};
use std::io::IsTerminal;
use std::sync::mpsc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Number of worker processes (at least 4: killed, hung, clean, cleared).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(4..=64))]
    workers: u64,
}

pub fn run(args: Args) -> Outcome {
    signals::catch_termination();
    let name = format!("livereg-demo-{}", std::process::id());
    let options = TableOptions {
        capacity: 64,
        reap_timeout: TIMEOUT,
        registration_grace: GRACE,
        progress_timeout: PROGRESS_TIMEOUT,
        ..TableOptions::default()
    };
    let table = Table::create(&name, &options)?;
    let _unlink = Unlink(name.clone());
    let (tell, heard) = mpsc::channel();
    let from_reaper = tell.clone();
    let clears = tell.clone();
    let reaper = table
        .reaper()
        .on_drop(move |event| {
            Ok(from_reaper.send((DemoEvent::Dropped(event.clone()), Instant::now()))?)
        })
        .on_clear(move || Ok(clears.send((DemoEvent::Cleared, Instant::now()))?))
        .spawn()?;
    let mut demo = Demo {
        table,
        heard,
        backlog: Vec::new(),
        checks: Vec::new(),
        fancy: std::io::stdout().is_terminal(),
        started: Instant::now(),
        interrupted: false,
    };
    demo.say(&format!(
        "table '{name}': timeout {}, grace {}, reaper scans every {}; a silent worker is evicted within [{}, {}]",
        duration::show(TIMEOUT),
        duration::show(GRACE),
        duration::show(TIMEOUT / livereg::SCANS_PER_TIMEOUT),
        duration::show(TIMEOUT),
        duration::show(TIMEOUT + TIMEOUT / livereg::SCANS_PER_TIMEOUT)
    ));
    let mut workers: Vec<WorkerProcess> = (1..=args.workers)
        .map(|id| spawn_worker(&name, id, &tell, &[]))
        .collect::<Result<_, _>>()?;
    let result = demo.scenarios(&mut workers);
    for worker in &mut workers {
        let _ = worker.child.kill();
        let _ = worker.child.wait();
    }
    reaper.stop()?;
    result?;
    Ok(demo.summary())
}
