//! The demo's scenarios, in the order they run: workers start, one is
//! killed, one hangs, one exits cleanly, a clear keeps the rest, a reset
//! ends them and they come back, the hung one resumes, a busy one stalls;
//! then the shutdown.

use super::stage::{
    eviction_bound, scan_interval, signal, spawn_worker, Demo, DemoEvent, Step, WorkerProcess,
    BEAT_EVERY, PROGRESS_TIMEOUT, SLACK, TIMEOUT,
};
use crate::support::duration;
use livereg::Reason;
use std::sync::mpsc;
use std::time::{Duration, Instant};

impl Demo {
    /// A clear: the server's clear handler runs once, and the workers `kept`
    /// stay registered, beating.
    fn clear_keeps_workers(&mut self, kept: std::ops::RangeInclusive<u64>) -> Step {
        self.say("a clear is requested through the table: the server's clear handler runs; every worker keeps its registration.");
        let cleared_at = Instant::now();
        self.table.clear(Duration::from_secs(5))?;
        let handler = self
            .wait_for("the clear handler", Duration::from_secs(2), |heard| {
                matches!(heard, DemoEvent::Cleared)
            })
            .map(|(_, at)| at.saturating_duration_since(cleared_at));
        self.say(&format!(
            "  clear handler ran after {}; clear completed in {}",
            handler.map(duration::show).unwrap_or("never".into()),
            duration::show(cleared_at.elapsed())
        ));
        self.expect(
            "clear",
            0,
            "clear handler ran",
            handler,
            Duration::from_millis(5),
        );
        let live: Vec<u64> = self
            .table
            .status()?
            .registrations
            .iter()
            .map(|r| r.instance_id)
            .collect();
        for id in kept {
            let registered = live.contains(&id);
            self.say(&format!(
                "  worker {id} {}",
                if registered {
                    "is still registered"
                } else {
                    "LOST its registration"
                }
            ));
            self.expect(
                "clear keeps the worker",
                id,
                "still registered",
                registered.then_some(Duration::ZERO),
                Duration::ZERO,
            );
        }
        Ok(())
    }

    /// The story, step by step; each step checks what it showed.
    pub(super) fn scenarios(&mut self, workers: &mut [WorkerProcess]) -> Step {
        self.start(workers)?;
        self.go_on()?;
        self.crash(workers)?;
        self.go_on()?;
        self.hang(workers)?;
        self.go_on()?;
        self.clean_exit(workers)?;
        self.go_on()?;
        self.clear_keeps_workers(4..=workers.len() as u64)?;
        self.go_on()?;
        self.reset_ends_workers(workers)?;
        self.go_on()?;
        self.resume_hung(workers)?;
        self.go_on()?;
        self.stall(workers)?;
        self.shutdown(workers)
    }

    /// Every worker registers and beats; a full timeout evicts none.
    fn start(&mut self, workers: &[WorkerProcess]) -> Step {
        self.say(&format!(
            "starting {} workers, each beating every {}",
            workers.len(),
            duration::show(BEAT_EVERY)
        ));
        for worker in workers.iter() {
            let id = worker.id;
            let at = self
                .said(id, "registered", Duration::from_secs(10))
                .ok_or(format!("worker {id} never registered"))?;
            let registered = at.saturating_duration_since(self.started);
            self.say(&format!(
                "  worker {id} (gpu{id}, pid {}) registered after {}",
                worker.child.id(),
                duration::show(registered)
            ));
        }
        std::thread::sleep(TIMEOUT);
        let status = self.table.status()?;
        self.say(&format!(
            "{} workers live and beating; nobody evicted after a full timeout",
            status.tracked_instances
        ));
        Ok(())
    }

    /// SIGKILL: the crash is seen at once (pidfd), at the next scan at worst.
    fn crash(&mut self, workers: &[WorkerProcess]) -> Step {
        let scan = scan_interval();
        self.say(
            "SIGKILL worker 1: a crash. Its pidfd wakes the reaper at once; its slot lock, dropped by the kernel, confirms it.",
        );
        let killed_at = Instant::now();
        signal(&workers[0], libc::SIGKILL);
        self.expect_drop(
            "killed (SIGKILL)",
            1,
            Reason::ProcessExited,
            killed_at,
            scan,
            &format!("next scan <= {}", duration::show(scan)),
        );
        Ok(())
    }

    /// SIGSTOP: a hang is evicted by the timeout, never before it.
    fn hang(&mut self, workers: &[WorkerProcess]) -> Step {
        let bound = eviction_bound();
        self.say("SIGSTOP worker 2: a hang. Alive, holding its lock, silent: only the timeout catches it.");
        let stopped_at = Instant::now();
        signal(&workers[1], libc::SIGSTOP);
        self.expect_drop(
            "hung (SIGSTOP)",
            2,
            Reason::Timeout,
            stopped_at,
            bound,
            &format!(
                "silent {}..{}",
                duration::show(TIMEOUT),
                duration::show(bound)
            ),
        );
        Ok(())
    }

    /// A clean exit deregisters and wakes the idle reaper.
    fn clean_exit(&mut self, workers: &mut [WorkerProcess]) -> Step {
        self.say("worker 3 exits cleanly: it deregisters, and the idle reaper is woken at once.");
        let closed_at = Instant::now();
        workers[2].stdin = None;
        self.expect_drop(
            "clean exit",
            3,
            Reason::Deregistered,
            closed_at,
            Duration::from_millis(5),
            "5ms (wake-up)",
        );
        Ok(())
    }

    /// A reset ends every registration; each worker hears it and comes back.
    fn reset_ends_workers(&mut self, workers: &[WorkerProcess]) -> Step {
        self.say("a reset is requested through the table: every live registration ends.");
        let cleared_at = Instant::now();
        self.table.reset(Duration::from_secs(5))?;
        self.say(&format!(
            "  reset completed in {}",
            duration::show(cleared_at.elapsed())
        ));
        for id in 4..=workers.len() as u64 {
            self.expect_drop(
                "reset",
                id,
                Reason::Cleared,
                cleared_at,
                Duration::from_millis(5),
                "5ms (wake-up)",
            );
        }
        for id in 4..=workers.len() as u64 {
            let back = self
                .said(id, "registered", TIMEOUT + SLACK)
                .map(|at| at.saturating_duration_since(cleared_at));
            self.say(&format!(
                "  worker {id} was told 'evicted' at its next beat and registered again after {}",
                back.map(duration::show).unwrap_or("never".into())
            ));
            self.expect("reset, came back", id, "registered again", back, BEAT_EVERY);
        }
        Ok(())
    }

    /// The hung worker, resumed, learns it was evicted and registers again.
    fn resume_hung(&mut self, workers: &[WorkerProcess]) -> Step {
        self.say("SIGCONT worker 2: its next heartbeat returns Evicted, so it registers again.");
        let resumed_at = Instant::now();
        signal(&workers[1], libc::SIGCONT);
        let told = self
            .said(2, "evicted", Duration::from_secs(2))
            .map(|at| at.saturating_duration_since(resumed_at));
        let back = self
            .said(2, "registered", Duration::from_secs(2))
            .map(|at| at.saturating_duration_since(resumed_at));
        self.say(&format!(
            "  worker 2 told 'evicted' after {}, registered again after {}",
            told.map(duration::show).unwrap_or("never".into()),
            back.map(duration::show).unwrap_or("never".into())
        ));
        self.expect(
            "hung, resumed, came back",
            2,
            "registered again",
            back,
            BEAT_EVERY,
        );
        Ok(())
    }

    /// A busy worker whose engine loop hangs (its heartbeat beats on) ends stalled.
    fn stall(&mut self, workers: &[WorkerProcess]) -> Step {
        let scan = scan_interval();
        let stuck_id = workers.len() as u64 + 1;
        let name = self.table.name().to_owned();
        self.say(&format!(
            "worker {stuck_id} starts busy, makes progress, and after 300ms its engine loop hangs while its heartbeat thread beats on."
        ));
        let (tell, heard) = mpsc::channel();
        let mut stuck = spawn_worker(
            &name,
            stuck_id,
            &tell,
            &["--busy", "--stall-after", "300ms"],
        )?;
        // Its last step is when the reaper's budget starts.
        let mut last_step = None;
        loop {
            match heard.recv_timeout(Duration::from_secs(5)) {
                Ok((DemoEvent::Said(_, line), at)) if line == "step" => last_step = Some(at),
                Ok((DemoEvent::Said(_, line), _)) if line == "hung" => break,
                Ok(_) => {}
                Err(_) => return Err("the stuck worker never hung".into()),
            }
        }
        let hang = last_step.ok_or("the stuck worker made no progress")?;
        self.expect_drop(
            "busy, no progress",
            stuck_id,
            Reason::Stalled,
            hang,
            PROGRESS_TIMEOUT + 2 * scan,
            &format!(
                "stuck {}..{}",
                duration::show(PROGRESS_TIMEOUT),
                duration::show(PROGRESS_TIMEOUT + 2 * scan)
            ),
        );
        let _ = stuck.child.kill();
        let _ = stuck.child.wait();
        drop(stuck.stdin.take());
        self.say(
            "the other workers never said they were busy: idle, they are never judged by progress, however long they wait.",
        );
        Ok(())
    }

    /// The survivors stop cleanly: each deregisters.
    fn shutdown(&mut self, workers: &mut [WorkerProcess]) -> Step {
        let live = self.table.status()?;
        self.say(&format!(
            "{} workers live again; stopping them cleanly",
            live.tracked_instances
        ));
        let survivors: Vec<u64> = std::iter::once(2).chain(4..=workers.len() as u64).collect();
        for worker in workers.iter_mut().filter(|w| survivors.contains(&w.id)) {
            worker.stdin = None;
        }
        let stopping = Instant::now();
        for id in survivors {
            self.expect_drop(
                "shutdown",
                id,
                Reason::Deregistered,
                stopping,
                Duration::from_millis(50),
                "50ms",
            );
        }
        Ok(())
    }
}
