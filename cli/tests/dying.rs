//! Death seen as it begins, across real processes: a SIGKILLed worker is
//! reported dying (its death word marked by the kernel at the start of its
//! exit) before it has ended and is dropped `process_exited`; and never
//! while its process runs: a registering thread that ended, a forked child
//! that exited, a worker stopped with SIGSTOP. `exec` ends the robust list
//! (dying, then ended); a process with more registrations than a robust
//! list walks is dying whole (one word per process); a reaper that starts
//! while a process is dying reports it once; pthread robust mutexes beside
//! a death thread keep working; a worker in another PID namespace is seen
//! dying too; so are processes past the words one wait takes.

#[path = "../../tests/common/mod.rs"]
mod common;

#[path = "support/worker_process.rs"]
mod worker_process;

use common::{long_options, wait_for_death_word, TempTable};
use livereg::{DropEvent, Reason, Table, TableOptions};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use worker_process::WorkerProcess;

/// What a reaper thread heard, in order, with when.
#[derive(Debug)]
enum Heard {
    Dying(DropEvent),
    Dropped(DropEvent),
}

/// A reaper thread sending every dying and drop event, with its time.
fn reaper(table: &Table) -> (livereg::ReaperThread, mpsc::Receiver<(Heard, Instant)>) {
    let (dying, heard) = mpsc::channel();
    let dropped = dying.clone();
    let reaper = table
        .reaper()
        .on_dying(move |event| Ok(dying.send((Heard::Dying(event.clone()), Instant::now()))?))
        .on_drop(move |event| Ok(dropped.send((Heard::Dropped(event.clone()), Instant::now()))?))
        .spawn()
        .unwrap();
    (reaper, heard)
}

/// Nothing heard for `how_long` (a live process is never dying).
fn hears_nothing_for(heard: &mpsc::Receiver<(Heard, Instant)>, how_long: Duration) {
    if let Ok((event, _)) = heard.recv_timeout(how_long) {
        panic!("heard {event:?} of a process that still runs");
    }
}

/// The dying event, then the drop, of instance `id`: returns both times.
fn dying_then_dropped(heard: &mpsc::Receiver<(Heard, Instant)>, id: u64) -> (Instant, Instant) {
    let (first, dying_at) = heard.recv_timeout(Duration::from_secs(20)).expect("dying");
    let Heard::Dying(event) = first else {
        panic!("expected dying first, heard {first:?}");
    };
    assert_eq!(
        (event.instance_id, event.reason),
        (id, Reason::ProcessExited)
    );
    let (second, dropped_at) = heard
        .recv_timeout(Duration::from_secs(20))
        .expect("dropped");
    let Heard::Dropped(event) = second else {
        panic!("expected the drop after dying, heard {second:?}");
    };
    assert_eq!(
        (event.instance_id, event.reason),
        (id, Reason::ProcessExited)
    );
    (dying_at, dropped_at)
}

#[test]
fn a_sigkilled_worker_is_dying_before_it_has_ended_then_dropped_process_exited() {
    let temp = TempTable::new("dying-kill", &long_options());
    let (_reaper, heard) = reaper(&temp.table);
    let mut worker = WorkerProcess::worker(&temp.name, 7, &["--hold-mib", "512"]);
    worker.wait_for("registered");
    wait_for_death_word(&temp.table, 7);
    let killed = Instant::now();
    worker.signal(libc::SIGKILL);
    let (dying_at, dropped_at) = dying_then_dropped(&heard, 7);
    assert!(dying_at <= dropped_at);
    // Generous: a loaded machine; the figures are in BENCHMARKS.md.
    assert!(
        dying_at - killed < Duration::from_secs(5),
        "{:?}",
        dying_at - killed
    );
}

#[test]
fn a_worker_whose_registering_thread_ended_is_never_dying() {
    let temp = TempTable::new("dying-thread", &long_options());
    let (_reaper, heard) = reaper(&temp.table);
    let mut worker = WorkerProcess::worker(&temp.name, 8, &["--register-from-a-thread"]);
    worker.wait_for("registered");
    wait_for_death_word(&temp.table, 8);
    hears_nothing_for(&heard, Duration::from_millis(800));
    assert_eq!(temp.table.status().unwrap().registrations.len(), 1);
    worker.signal(libc::SIGKILL);
    dying_then_dropped(&heard, 8);
}

#[test]
fn a_worker_whose_forked_child_exited_is_never_dying() {
    let temp = TempTable::new("dying-fork", &long_options());
    let (_reaper, heard) = reaper(&temp.table);
    let mut worker = WorkerProcess::worker(&temp.name, 9, &["--fork-child"]);
    worker.wait_for("registered");
    wait_for_death_word(&temp.table, 9);
    let line = worker.wait_for("forked");
    let child: libc::pid_t = line["forked ".len()..].parse().unwrap();
    // SAFETY: `kill` and `waitpid`-free reaping: the grandchild is the
    // worker's, killed by pid while the worker (its parent) lives.
    unsafe { libc::kill(child, libc::SIGKILL) };
    hears_nothing_for(&heard, Duration::from_millis(800));
    assert_eq!(temp.table.status().unwrap().registrations.len(), 1);
    worker.signal(libc::SIGKILL);
    dying_then_dropped(&heard, 9);
}

#[test]
fn a_stopped_worker_is_not_dying() {
    let temp = TempTable::new("dying-stop", &long_options());
    let (_reaper, heard) = reaper(&temp.table);
    let mut worker = WorkerProcess::worker(&temp.name, 10, &[]);
    worker.wait_for("registered");
    wait_for_death_word(&temp.table, 10);
    worker.signal(libc::SIGSTOP);
    hears_nothing_for(&heard, Duration::from_millis(800));
    worker.signal(libc::SIGCONT);
    hears_nothing_for(&heard, Duration::from_millis(200));
    worker.signal(libc::SIGKILL);
    dying_then_dropped(&heard, 10);
}

#[test]
fn exec_ends_the_robust_list_so_the_registration_is_dying_then_ended() {
    let temp = TempTable::new("dying-exec", &long_options());
    let (_reaper, heard) = reaper(&temp.table);
    let mut worker = WorkerProcess::worker(&temp.name, 11, &["--exec-sleep"]);
    worker.wait_for("registered");
    dying_then_dropped(&heard, 11);
}

#[test]
fn a_process_with_more_registrations_than_a_robust_list_walks_is_dying_whole() {
    let registrations = 2_100;
    let options = TableOptions {
        capacity: 2_200,
        ..long_options()
    };
    let temp = TempTable::new("dying-many", &options);
    let (_reaper, heard) = reaper(&temp.table);
    let also = (registrations - 1).to_string();
    let mut worker = WorkerProcess::worker(&temp.name, 1, &["--also", &also]);
    worker.wait_for(&format!("also {}", registrations - 1));
    let deadline = Instant::now() + Duration::from_secs(20);
    while temp
        .table
        .status()
        .unwrap()
        .registrations
        .iter()
        .filter(|r| r.death_word)
        .count()
        < registrations
    {
        assert!(Instant::now() < deadline, "not all registered");
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.signal(libc::SIGKILL);
    let (mut dying, mut dropped) = (0, 0);
    while dropped < registrations {
        match heard
            .recv_timeout(Duration::from_secs(20))
            .expect("every one heard")
        {
            (Heard::Dying(_), _) => dying += 1,
            (Heard::Dropped(event), _) => {
                assert_eq!(event.reason, Reason::ProcessExited);
                dropped += 1;
            }
        }
    }
    assert_eq!(
        dying, registrations,
        "one word speaks for every registration"
    );
}

#[test]
fn a_reaper_taking_over_while_a_process_is_dying_reports_it_once() {
    let temp = TempTable::new("dying-takeover", &long_options());
    let mut worker = WorkerProcess::worker(&temp.name, 12, &["--hold-mib", "1024"]);
    worker.wait_for("registered");
    wait_for_death_word(&temp.table, 12);
    let mut first = temp.table.reaper().build().unwrap();
    worker.signal(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut reports = Vec::new();
    let dying = loop {
        let report = first.scan().unwrap();
        if !report.dying.is_empty() {
            break report;
        }
        assert!(Instant::now() < deadline, "never dying");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(dying.dying.len(), 1);
    reports.push(dying);
    drop(first);
    let mut next = temp.table.reaper().build().unwrap();
    while reports.iter().all(|r| r.ended.is_empty()) {
        reports.push(next.scan().unwrap());
        assert!(Instant::now() < deadline, "never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    let dying: usize = reports.iter().map(|r| r.dying.len()).sum();
    assert_eq!(dying, 1, "reported once across the two reapers");
    let ended = reports.iter().flat_map(|r| &r.ended).next().unwrap();
    assert_eq!(
        (ended.instance_id, ended.reason),
        (12, Reason::ProcessExited)
    );
}

#[test]
fn a_process_killed_while_no_reaper_ran_is_reported_dying_once_by_the_next() {
    let temp = TempTable::new("dying-noreaper", &long_options());
    let mut worker = WorkerProcess::worker(&temp.name, 13, &[]);
    worker.wait_for("registered");
    wait_for_death_word(&temp.table, 13);
    worker.signal(libc::SIGKILL);
    let _ = worker.child.wait();
    let mut reaper = temp.table.reaper().build().unwrap();
    let report = reaper.scan().unwrap();
    assert_eq!(report.dying.len(), 1);
    assert_eq!(report.ended.len(), 1);
    assert!(reaper.scan().unwrap().dying.is_empty());
}

#[test]
fn pthread_robust_mutexes_keep_working_beside_a_death_thread() {
    let temp = TempTable::new("dying-mutex", &long_options());
    let worker = temp.table.register(14, "this process").unwrap();
    // SAFETY: a robust mutex initialised, locked by a thread that exits
    // holding it, then locked here: glibc's robust list (per thread, which
    // the death thread leaves alone) reports the owner dead.
    unsafe {
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        libc::pthread_mutexattr_init(&mut attr);
        libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        let mutex = Box::into_raw(Box::new(std::mem::zeroed::<libc::pthread_mutex_t>()));
        libc::pthread_mutex_init(mutex, &attr);
        let address = mutex as usize;
        std::thread::spawn(move || {
            assert_eq!(
                libc::pthread_mutex_lock(address as *mut libc::pthread_mutex_t),
                0
            );
        })
        .join()
        .unwrap();
        assert_eq!(libc::pthread_mutex_lock(mutex), libc::EOWNERDEAD);
        libc::pthread_mutex_consistent(mutex);
        libc::pthread_mutex_unlock(mutex);
        libc::pthread_mutex_destroy(mutex);
        drop(Box::from_raw(mutex));
    }
    worker.deregister().unwrap();
}

#[test]
fn a_worker_in_another_pid_namespace_is_seen_dying_too() {
    let temp = TempTable::new("dying-pidns", &long_options());
    let (_reaper, heard) = reaper(&temp.table);
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        println!("LIMITATION: cannot create a PID namespace here: {probe:?}");
        return;
    }
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_livereg"))
        .args([
            "worker",
            &temp.name,
            "--instance",
            "15",
            "--interval",
            "50ms",
        ]);
    let mut worker = WorkerProcess::spawn(&mut command);
    worker.wait_for("registered");
    wait_for_death_word(&temp.table, 15);
    // SIGKILL to unshare, which (--kill-child) kills the namespace's init,
    // the worker, and with it the namespace.
    worker.signal(libc::SIGKILL);
    dying_then_dropped(&heard, 15);
}

/// Whether process `pid`, a child of this one, has ended: it is a zombie
/// (`WNOWAIT` leaves it one, for its `Child` to wait for).
fn has_ended(pid: u32) -> bool {
    // SAFETY: `info` is a zeroed, writable siginfo_t; with WNOWAIT the call
    // reaps nothing; `si_pid` is read after a successful call.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        libc::waitid(libc::P_PID, pid, &mut info, flags) == 0 && info.si_pid() != 0
    }
}

#[test]
fn processes_past_the_words_one_wait_takes_are_dying_before_they_have_ended() {
    // One futex_waitv takes 128 words: 126 process words beside the watch's
    // stop and wake words.
    let fillers = 130;
    let options = TableOptions {
        capacity: 200,
        reap_timeout: Duration::from_secs(600),
        registration_grace: Duration::from_secs(600),
        ..long_options()
    };
    let temp = TempTable::new("dying-past-one-wait", &options);
    // Each dying event with whether its process had ended by then.
    let (dying, heard) = mpsc::channel();
    let dropped = dying.clone();
    let _reaper = temp
        .table
        .reaper()
        .on_dying(move |event| Ok(dying.send((event.instance_id, Some(has_ended(event.pid))))?))
        .on_drop(move |event| Ok(dropped.send((event.instance_id, None))?))
        .spawn()
        .unwrap();
    let mut holding: Vec<WorkerProcess> = (1..=fillers)
        .map(|id| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_livereg"));
            command.args(["worker", &temp.name, "--instance", &id.to_string()]);
            WorkerProcess::spawn(command.arg("--never-beat"))
        })
        .collect();
    for process in &mut holding {
        process.wait_for("registered");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while temp
        .table
        .status()
        .unwrap()
        .registrations
        .iter()
        .filter(|r| r.death_word)
        .count()
        < fillers as usize
    {
        assert!(Instant::now() < deadline, "not every filler holds a word");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Words are claimed lowest first: each of these holds one past the
    // fillers'. Big, so that the kernel takes its time to end them (about
    // 0.1 s here, against about 2 ms to hear them dying; a watch that only
    // looks at such a word once a second hears it with its end).
    for id in 1001..=1006 {
        let mut worker = WorkerProcess::worker(&temp.name, id, &["--hold-mib", "1024"]);
        worker.wait_for("registered");
        wait_for_death_word(&temp.table, id);
        let killed = Instant::now();
        worker.signal(libc::SIGKILL);
        let first = heard.recv_timeout(Duration::from_secs(20)).expect("dying");
        let dying_after = killed.elapsed();
        assert_eq!(
            first,
            (id, Some(false)),
            "dying, before it had ended ({dying_after:?} after the kill)"
        );
        let second = heard
            .recv_timeout(Duration::from_secs(20))
            .expect("dropped");
        assert_eq!(second, (id, None), "then dropped");
    }
}
