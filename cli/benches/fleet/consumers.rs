//! The fleet's consumers: `ClusterWatch`es on threads of their own (a
//! router, a scheduler, a KV-cache controller), each telling the bench
//! every change it reads and when, and at the end its view.

use livereg::etcd::{ClusterChange, ClusterEvent, ClusterWatch, EtcdOptions};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One change one consumer read, and when.
pub struct Read {
    pub consumer: usize,
    pub at: Instant,
    pub change: ClusterChange,
}

pub struct Consumers {
    reads: Receiver<Read>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<BTreeSet<String>>>,
}

impl Consumers {
    /// `count` consumers, each with its snapshot read when this returns;
    /// every snapshot must hold `expected` registrations.
    pub fn start(count: usize, options: &EtcdOptions, expected: usize) -> Consumers {
        let (sender, reads) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..count)
            .map(|consumer| {
                let fleet = ClusterWatch::start(options).expect("a consumer's watch");
                assert_eq!(
                    fleet.live().count(),
                    expected,
                    "consumer {consumer}'s snapshot"
                );
                follow(consumer, fleet, sender.clone(), stop.clone())
            })
            .collect();
        Consumers {
            reads,
            stop,
            threads,
        }
    }

    /// When each consumer read the first change `wanted` accepts, once all
    /// have (other changes read meanwhile are passed over).
    pub fn all_read(
        &self,
        within: Duration,
        mut wanted: impl FnMut(&ClusterEvent) -> bool,
    ) -> Vec<Instant> {
        let deadline = Instant::now() + within;
        let mut at: Vec<Option<Instant>> = vec![None; self.threads.len()];
        while at.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let read = self
                .reads
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("not every consumer read it within {within:?}"));
            if at[read.consumer].is_none() && wanted(&read.change.event) {
                at[read.consumer] = Some(read.at);
            }
        }
        at.into_iter().flatten().collect()
    }

    /// Stops them: each one's view (`host/id`).
    pub fn stop(self) -> Vec<BTreeSet<String>> {
        self.stop.store(true, Ordering::SeqCst);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("a consumer"))
            .collect()
    }
}

fn follow(
    consumer: usize,
    mut fleet: ClusterWatch,
    reads: Sender<Read>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<BTreeSet<String>> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            if let Ok(Some(change)) = fleet.next(Duration::from_millis(50)) {
                let at = Instant::now();
                let _ = reads.send(Read {
                    consumer,
                    at,
                    change,
                });
            }
        }
        fleet
            .live()
            .map(|r| format!("{}/{}", r.host, r.instance_id))
            .collect()
    })
}
