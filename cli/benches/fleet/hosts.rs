//! The fleet's hosts: each a real `Publisher` with its own lease over a
//! table of its own (in this process's heap) holding 8 registrations; a
//! few also run a reaper, whose drop handler tells the publisher why a
//! registration ended. One more host is a real `livereg reap --etcd`
//! process, to be SIGKILLed.

use livereg::etcd::{EtcdOptions, Publisher};
use livereg::{ReaperThread, Table, TableOptions, Worker};
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Registrations per host.
pub const PER_HOST: u64 = 8;

pub struct Host {
    pub name: String,
    table: Table,
    pub publisher: Publisher,
    registrations: Vec<Option<Worker>>,
    _reaper: Option<ReaperThread>,
}

impl Host {
    /// Host `index` publishing under `options` (its host name set here),
    /// with a reaper if `reaped`.
    pub fn start(index: usize, options: &EtcdOptions, ttl: Duration, reaped: bool) -> Host {
        let table = Table::in_memory(&TableOptions {
            capacity: 2 * PER_HOST as u32,
            // Nobody beats: only an explicit end ends a registration here.
            reap_timeout: Duration::from_secs(3600),
            registration_grace: Duration::from_secs(3600),
            ..TableOptions::default()
        })
        .expect("a host's table");
        let name = format!("host-{index:04}");
        let mut options = options.clone();
        options.host.clone_from(&name);
        options.ttl = ttl;
        let publisher = Publisher::start(&table, options).expect("a host's publisher");
        let reaper = reaped.then(|| {
            let ends = publisher.sink();
            table
                .reaper()
                .on_drop(move |event| {
                    ends.ended(event);
                    Ok(())
                })
                .spawn()
                .expect("a host's reaper")
        });
        let registrations = (0..PER_HOST)
            .map(|i| Some(table.register(i + 1, "engine").expect("register")))
            .collect();
        Host {
            name,
            table,
            publisher,
            registrations,
            _reaper: reaper,
        }
    }

    /// Ends registration `id` (1 to [`PER_HOST`]) through the table
    /// (`deregistered`).
    pub fn end(&mut self, id: u64) {
        let worker = self.registrations[id as usize - 1].take().expect("live");
        worker.deregister().expect("deregister");
    }

    /// Registers `id` again (its previous registration's slot may still be
    /// pending release: retried).
    pub fn register_again(&mut self, id: u64) {
        for _ in 0..1000 {
            if let Ok(worker) = self.table.register(id, "engine") {
                self.registrations[id as usize - 1] = Some(worker);
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("{}: {id} could not register again", self.name);
    }

    /// `host/id` of every live registration.
    pub fn live(&self) -> BTreeSet<String> {
        self.registrations
            .iter()
            .enumerate()
            .filter(|(_, worker)| worker.is_some())
            .map(|(i, _)| format!("{}/{}", self.name, i + 1))
            .collect()
    }
}

/// A host that is a real `livereg reap --etcd` process over a table in
/// /dev/shm with one registration (a `livereg worker`); both killed and
/// the table removed on drop.
pub struct ProcessHost {
    pub name: String,
    table: String,
    reaper: Child,
    worker: Child,
}

impl ProcessHost {
    pub fn start(livereg: &str, endpoints: &str, prefix: &str, ttl: Duration) -> ProcessHost {
        let table = format!("livereg-bench-fleet-{}", std::process::id());
        let run = |args: &[&str]| {
            Command::new(livereg)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run livereg")
        };
        let _ = Command::new(livereg).args(["rm", &table]).output();
        let created = Command::new(livereg)
            .args(["create", &table, "--timeout", "60s"])
            .output()
            .expect("livereg create");
        assert!(created.status.success(), "{created:?}");
        let name = "host-process".to_owned();
        let ttl = format!("{}s", ttl.as_secs());
        let reaper = run(&[
            "reap",
            &table,
            "--etcd",
            endpoints,
            "--etcd-prefix",
            prefix,
            "--host",
            &name,
            "--etcd-ttl",
            &ttl,
        ]);
        let worker = run(&["worker", &table, "--instance", "1", "--until-stdin-closes"]);
        ProcessHost {
            name,
            table,
            reaper,
            worker,
        }
    }

    /// SIGKILLs the reaper (and its publisher with it).
    pub fn kill_reaper(&mut self) {
        let _ = self.reaper.kill();
        let _ = self.reaper.wait();
    }
}

impl Drop for ProcessHost {
    fn drop(&mut self) {
        for child in [&mut self.reaper, &mut self.worker] {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = livereg::Table::unlink(&self.table);
    }
}
