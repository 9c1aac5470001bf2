//! The publisher: one lease, and one key per live registration, kept in
//! step with the table from a thread beside the reaper.
//!
//! It never queues writes: each round compares a snapshot of the table with
//! what etcd holds and writes the difference, in transactions of up to 128
//! operations, so the newest state wins and an outage leaves nothing to
//! replay. The only queue is the end reasons the reaper's drop handler
//! passes on ([`EndSink`]), bounded, oldest dropped.

use super::plan::{plan, InEtcd, Reasons, Write};
use super::record::{self, ClusterRecord};
use super::{EtcdError, EtcdOptions};
use crate::event::{DropEvent, Reason};
use crate::fork;
use crate::status::RegistrationState;
use crate::table::Table;
use crate::wake::WakeFd;
use etcd_client::{Client, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;

/// How long one etcd request (or the connection) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a stopping publisher waits for etcd to revoke its lease (the
/// keys expire with it anyway).
const REVOKE_TIMEOUT: Duration = Duration::from_secs(1);
/// The first retry after a failure; doubled per failure up to `LAST_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between attempts while etcd is away.
const LAST_RETRY: Duration = Duration::from_secs(5);
/// End reasons held for publishing; past this the oldest is dropped (its key
/// is still deleted, without a reason).
const ENDS_QUEUE: usize = 4096;
/// Operations per transaction: etcd's default `--max-txn-ops`. A request
/// etcd refuses for its size is split in halves, and the smaller size kept.
const TXN_OPS: usize = 128;
/// A look at the table even when nothing woke the publisher.
const BACKSTOP: Duration = Duration::from_secs(1);

/// Publishes a table's live registrations to etcd until stopped (see the
/// [module](super)). Stopping revokes the lease: the keys go at once.
///
/// ```no_run
/// use livereg::etcd::{EtcdOptions, Publisher};
/// use livereg::Table;
///
/// let table = Table::open("kv-workers")?;
/// let publisher = Publisher::start(&table, EtcdOptions::new(["127.0.0.1:2379"]))?;
/// let ends = publisher.sink();
/// let reaper = table
///     .reaper()
///     .on_drop(move |event| {
///         ends.ended(event); // publish why it ended
///         Ok(())
///     })
///     .spawn()?;
/// // … serve …
/// reaper.stop()?;
/// publisher.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Publisher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    fork_epoch: u64,
}

/// Passes end reasons from a drop handler to the publisher: cheap, never
/// blocks on etcd.
#[derive(Clone)]
pub struct EndSink(Arc<Shared>);

/// What the publisher's thread shares with its handles.
struct Shared {
    ends: Mutex<VecDeque<Ended>>,
    notify: Notify,
    stop: AtomicBool,
    connected: AtomicBool,
}

/// One ended registration, as the drop handler saw it.
struct Ended {
    instance_id: u64,
    slot: u32,
    generation: u32,
    reason: Reason,
}

impl Publisher {
    /// Starts publishing `table` on a thread of its own. It connects in the
    /// background: an unreachable etcd is logged and retried, never fatal.
    ///
    /// # Errors
    ///
    /// - [`EtcdError::InvalidOptions`]: see [`EtcdOptions::validate`].
    /// - [`EtcdError::Table`]: the table was truncated.
    /// - [`EtcdError::Io`]: the thread, its runtime or its wake-up descriptor
    ///   could not be made.
    pub fn start(table: &Table, options: EtcdOptions) -> Result<Publisher, EtcdError> {
        options.validate()?;
        table.memory.check_size()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let wake = WakeFd::start(table.memory.clone())?;
        let wake = {
            let _inside = runtime.enter();
            // SAFETY: a `WakeFd` owns its eventfd for its whole life and
            // always answers `as_raw_fd` with it; the `AsyncFd` owns the
            // `WakeFd`, so the descriptor outlives the registration.
            unsafe { AsyncFd::register_with_interest(wake, Interest::READABLE) }
                .map_err(std::io::Error::from)?
        };
        let shared = Arc::new(Shared {
            ends: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(false),
        });
        let mirror = Mirror {
            table: table.clone(),
            options,
            shared: shared.clone(),
            published: BTreeMap::new(),
            records: HashMap::new(),
            reasons: Reasons::new(ENDS_QUEUE),
            txn_ops: TXN_OPS,
        };
        let thread = std::thread::Builder::new()
            .name("livereg-etcd".into())
            .spawn(move || runtime.block_on(mirror.run(wake)))?;
        Ok(Publisher {
            shared,
            thread: Some(thread),
            fork_epoch: fork::install(),
        })
    }

    /// A handle for the reaper's drop handler.
    pub fn sink(&self) -> EndSink {
        EndSink(self.shared.clone())
    }

    /// Whether it holds a lease on a reachable etcd now (as
    /// [`EndSink::is_connected`] tells a holder of its sink).
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// Revokes the lease (its keys go at once, if etcd answers within 1 s;
    /// else they expire with it) and ends the thread. With etcd hung, it
    /// waits for the one request in flight (up to 3 s) and the revoke (1 s),
    /// never for the rest of a round.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.fork_epoch != fork::epoch() {
            // A forked child's copy: the thread is the parent's.
            std::mem::forget(thread);
            return;
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.notify.notify_one();
        let _ = thread.join();
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl EndSink {
    /// Whether the publisher it feeds holds a lease on a reachable etcd now
    /// (for a metrics endpoint that holds only the sink).
    pub fn is_connected(&self) -> bool {
        self.0.connected.load(Ordering::Acquire)
    }

    /// Records why a registration ended, for the last value of its key.
    pub fn ended(&self, event: &DropEvent) {
        let mut ends = self.0.ends.lock().unwrap_or_else(PoisonError::into_inner);
        if ends.len() == ENDS_QUEUE {
            ends.pop_front();
        }
        ends.push_back(Ended {
            instance_id: event.instance_id,
            slot: event.slot,
            generation: event.generation,
            reason: event.reason,
        });
        drop(ends);
        self.0.notify.notify_one();
    }
}

/// A connection holding the lease.
struct LeaseConnection {
    client: Client,
    lease: i64,
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
    keep_alive_every: Duration,
    next_keep_alive: Instant,
    /// The lease's TTL: with no keep-alive answer for this long, etcd has
    /// let the lease expire, or is not there (a hung etcd, a black-holed
    /// route): the connection is given up.
    ttl: Duration,
    /// When etcd last answered a keep-alive (or the connection was made).
    answered: Instant,
}

impl LeaseConnection {
    /// When the lease is lost for want of answers.
    fn answer_deadline(&self) -> Instant {
        self.answered + self.ttl
    }
}

/// What woke the publisher's loop.
enum Wake {
    /// A round is due: the table changed, an end came, or a timer ran out.
    Round,
    /// A keep-alive answer came.
    Lease(LeaseNews),
}

/// What a keep-alive answer said.
enum LeaseNews {
    Alive,
    /// etcd no longer has the lease (it expired): its keys are gone.
    Expired,
    /// The connection broke; the lease may live on.
    Broken(String),
}

/// When to try etcd again, and whether it is failing now (to log an outage
/// once, and its end).
struct Retry {
    at: Instant,
    delay: Duration,
    failing: bool,
}

impl Retry {
    fn failed(&mut self, error: &dyn std::fmt::Display) {
        if self.failing {
            log::debug!("{error}; retrying in {:?}", self.delay);
        } else {
            log::warn!(
                "{error}; local reaping goes on, publishing resumes when etcd answers (retrying)"
            );
        }
        self.failing = true;
        self.at = Instant::now() + self.delay;
        self.delay = (self.delay * 2).min(LAST_RETRY);
    }

    /// A round went through: the outage, if any, is over.
    fn succeeded(&mut self, endpoints: &str) {
        if self.failing {
            log::info!("etcd at {endpoints}: publishing again");
        }
        self.failing = false;
        self.delay = FIRST_RETRY;
    }
}

/// The publisher's hold on etcd: its connection (if any), the lease it
/// keeps across reconnects, and when to try again.
struct EtcdHold {
    session: Option<LeaseConnection>,
    lease: Option<i64>,
    retry: Retry,
}

impl EtcdHold {
    fn new() -> EtcdHold {
        EtcdHold {
            session: None,
            lease: None,
            retry: Retry {
                at: Instant::now(),
                delay: FIRST_RETRY,
                failing: false,
            },
        }
    }

    /// Takes in what woke the loop: a keep-alive answer refreshes the
    /// deadline; no answer by the deadline, an expired lease or a broken
    /// stream gives the connection up.
    fn heed(&mut self, woke: Wake, endpoints: &str) {
        let unanswered = self
            .session
            .as_ref()
            .is_some_and(|s| Instant::now() >= s.answer_deadline());
        match woke {
            Wake::Lease(LeaseNews::Alive) => {
                if let Some(s) = self.session.as_mut() {
                    s.answered = Instant::now();
                }
                return;
            }
            Wake::Round if unanswered => {
                let ttl = self.session.as_ref().map_or(Duration::ZERO, |s| s.ttl);
                self.retry.failed(&format_args!(
                    "etcd at {endpoints}: no keep-alive answer within the lease TTL ({ttl:?}); reconnecting"
                ));
            }
            Wake::Round => return,
            Wake::Lease(LeaseNews::Expired) => {
                // etcd answers: a new lease at once, no backoff.
                self.retry.failed(&format_args!(
                    "etcd at {endpoints}: the lease expired (etcd answered TTL 0); taking a new one"
                ));
                self.retry.at = Instant::now();
                self.lease = None;
            }
            // The connection broke: reconnect with backoff.
            Wake::Lease(LeaseNews::Broken(why)) => {
                self.retry
                    .failed(&format_args!("etcd at {endpoints}: {why}"));
            }
        }
        self.session = None;
    }
}

/// The thread's state: what etcd holds for this table, as far as it knows.
struct Mirror {
    table: Table,
    options: EtcdOptions,
    shared: Arc<Shared>,
    /// Keys under this table's prefix in etcd, as last read or written.
    published: BTreeMap<String, InEtcd>,
    /// Records of live registrations by (slot, generation), made once so
    /// that a rewrite is identical.
    records: HashMap<(u32, u32), ClusterRecord>,
    /// End reasons not yet published.
    reasons: Reasons,
    /// Operations per transaction that etcd accepts.
    txn_ops: usize,
}

impl Mirror {
    async fn run(mut self, mut wake: AsyncFd<WakeFd>) {
        let mut link = EtcdHold::new();
        loop {
            if self.shared.stop.load(Ordering::Acquire) {
                if let Some(mut session) = link.session {
                    let revoke = session.client.lease_revoke(session.lease);
                    let _ = tokio::time::timeout(REVOKE_TIMEOUT, revoke).await;
                }
                return;
            }
            self.round(&mut link).await;
            self.shared
                .connected
                .store(link.session.is_some(), Ordering::Release);
            let woke = self.wait(&mut link, &mut wake).await;
            link.heed(woke, &self.options.endpoint_list());
        }
    }

    /// Connects if it is time to, then brings etcd in step with the table.
    /// A connection alone ends no outage (nor its backoff): a round that
    /// goes through does.
    async fn round(&mut self, link: &mut EtcdHold) {
        if link.session.is_none() && Instant::now() >= link.retry.at {
            match self.connect(link.lease).await {
                Ok(connected) => {
                    link.lease = Some(connected.lease);
                    link.session = Some(connected);
                }
                Err(EtcdError::Stopped) => {}
                Err(error) => link.retry.failed(&error),
            }
        }
        let Some(connected) = link.session.as_mut() else {
            self.take_ends();
            return;
        };
        match self.step(connected).await {
            Ok(()) => link.retry.succeeded(&self.options.endpoint_list()),
            // The loop's top revokes the lease.
            Err(EtcdError::Stopped) => {}
            Err(error) => {
                link.retry.failed(&error);
                link.session = None;
            }
        }
    }

    /// Waits for what comes first: a request to stop or an end, the table's
    /// wake word, a keep-alive answer, or the next thing due (a keep-alive,
    /// the answer deadline, the backstop, a retry).
    async fn wait(&self, link: &mut EtcdHold, wake: &mut AsyncFd<WakeFd>) -> Wake {
        let until = match &link.session {
            Some(s) => s
                .next_keep_alive
                .min(s.answer_deadline())
                .min(Instant::now() + BACKSTOP),
            None => link.retry.at,
        };
        tokio::select! {
            () = self.shared.notify.notified() => Wake::Round,
            ready = wake.readable_mut() => {
                if let Ok(mut ready) = ready {
                    ready.get_inner().drain();
                    ready.clear_ready();
                }
                Wake::Round
            }
            () = tokio::time::sleep_until(until.into()) => Wake::Round,
            news = lease_news(link.session.as_mut()) => Wake::Lease(news),
        }
    }

    /// Connects, takes the lease (the previous one if etcd still has it,
    /// else a new one) and reads what etcd holds for this table.
    async fn connect(&mut self, previous: Option<i64>) -> Result<LeaseConnection, EtcdError> {
        let mut client = self
            .ask(
                "connect",
                super::connection::connect(&self.options, REQUEST_TIMEOUT),
            )
            .await?;
        let mut held = None;
        if let Some(id) = previous {
            let left = self
                .ask("read the lease", client.lease_time_to_live(id, None))
                .await?;
            if left.ttl() > 0 {
                held = Some((id, left.granted_ttl()));
            }
        }
        let (lease, ttl) = match held {
            Some(held) => held,
            None => {
                let ttl = self.options.ttl.as_secs_f64().ceil().max(1.0) as i64;
                let granted = self
                    .ask("grant a lease", client.lease_grant(ttl, None))
                    .await?;
                (granted.id(), granted.ttl())
            }
        };
        let (keeper, answers) = self
            .ask("keep the lease alive", client.lease_keep_alive(lease))
            .await?;
        let prefix = self.table_prefix();
        let held_keys = self
            .ask(
                "read this table's keys",
                client.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        self.published = held_keys
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let held = InEtcd {
                    record: serde_json::from_slice(kv.value()).ok(),
                    ours: kv.lease() == lease,
                };
                (key, held)
            })
            .collect();
        log::info!(
            "etcd at {}: publishing table '{}' as host '{}' under {prefix} (lease {lease:x}, {}, TTL {ttl}s, keep-alive every {:?})",
            self.options.endpoint_list(),
            self.table.name(),
            self.options.host,
            if held.is_some() { "kept" } else { "new" },
            keep_alive_every(ttl),
        );
        Ok(LeaseConnection {
            client,
            lease,
            keeper,
            answers,
            keep_alive_every: keep_alive_every(ttl),
            // A kept lease is refreshed at once.
            next_keep_alive: Instant::now(),
            ttl: Duration::from_secs(ttl.max(1) as u64),
            answered: Instant::now(),
        })
    }

    /// One round: the keep-alive if due, then etcd brought in step with the
    /// table.
    async fn step(&mut self, session: &mut LeaseConnection) -> Result<(), EtcdError> {
        if Instant::now() >= session.next_keep_alive {
            self.ask("keep the lease alive", session.keeper.keep_alive())
                .await?;
            session.next_keep_alive = Instant::now() + session.keep_alive_every;
        }
        let live = match self.live() {
            Ok(live) => live,
            Err(error) => {
                log::warn!("etcd publisher: {error}");
                return Ok(());
            }
        };
        // Reasons after the snapshot: the handlers tell a registration's end
        // before its slot is freed, so every registration the snapshot no
        // longer holds has its reason here by now. One that ended after the
        // snapshot keeps its reason for the round that sees it gone.
        self.take_ends();
        let plan = plan(&self.published, &live, &self.reasons);
        self.commit(session, "publish ends", plan.last_values)
            .await?;
        self.commit(session, "publish registrations", plan.changes)
            .await?;
        self.reasons.keep_only(&live);
        self.published = live
            .into_iter()
            .map(|(key, record)| (key, InEtcd::ours(record)))
            .collect();
        Ok(())
    }

    /// Writes `operations` in batches of up to `txn_ops`. A batch etcd
    /// refuses for its size is split in halves (and the smaller size kept),
    /// never sent again as it was.
    async fn commit(
        &mut self,
        session: &mut LeaseConnection,
        context: &str,
        mut operations: Vec<Write>,
    ) -> Result<(), EtcdError> {
        while !operations.is_empty() {
            let rest = operations.split_off(operations.len().min(self.txn_ops));
            match self.write(session, context, operations.clone()).await {
                Ok(()) => operations = rest,
                Err(error) if operations.len() > 1 && too_large(&error) => {
                    self.txn_ops = operations.len() / 2;
                    log::info!(
                        "etcd at {}: {error}; sending at most {} operations per transaction",
                        self.options.endpoint_list(),
                        self.txn_ops
                    );
                    operations.extend(rest);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Writes one batch: one operation alone as a plain request (etcd
    /// commits it faster than a transaction), more as one transaction.
    async fn write(
        &self,
        session: &mut LeaseConnection,
        context: &str,
        mut batch: Vec<Write>,
    ) -> Result<(), EtcdError> {
        let put = || Some(PutOptions::new().with_lease(session.lease));
        if batch.len() == 1 {
            let client = &mut session.client;
            return match batch.pop() {
                Some(Write::Put(key, value)) => self
                    .ask(context, client.put(key, value, put()))
                    .await
                    .map(drop),
                Some(Write::Delete(key)) => {
                    self.ask(context, client.delete(key, None)).await.map(drop)
                }
                None => Ok(()),
            };
        }
        let batch = Txn::new().and_then(
            batch
                .into_iter()
                .map(|write| match write {
                    Write::Put(key, value) => TxnOp::put(key, value, put()),
                    Write::Delete(key) => TxnOp::delete(key, None),
                })
                .collect::<Vec<_>>(),
        );
        self.ask(context, session.client.txn(batch)).await.map(drop)
    }

    /// Moves the drop handler's reasons into `reasons`.
    fn take_ends(&mut self) {
        let ends: Vec<Ended> = {
            let mut queue = self
                .shared
                .ends
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            queue.drain(..).collect()
        };
        for end in ends {
            let key = self.key(end.instance_id);
            self.reasons
                .insert(key, end.slot, end.generation, end.reason);
        }
    }

    /// The table's live registrations as keys and records; those ending
    /// (drop pending) leave their reasons in `reasons`.
    fn live(&mut self) -> Result<BTreeMap<String, ClusterRecord>, crate::error::Error> {
        let status = self.table.status()?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        let mut live = BTreeMap::new();
        let mut seen = HashSet::new();
        for registration in status.registrations {
            let key = self.key(registration.instance_id);
            let id = (registration.slot, registration.generation);
            match (registration.state, registration.ended_reason) {
                (RegistrationState::Live, _) => {
                    let record = self.records.entry(id).or_insert_with(|| {
                        let age = registration.registered_age_seconds.unwrap_or(0.0);
                        ClusterRecord {
                            host: self.options.host.clone(),
                            table: record::table_component(self.table.name()).to_owned(),
                            instance_id: registration.instance_id,
                            label: registration.label.clone(),
                            pid: registration.pid,
                            slot: registration.slot,
                            generation: registration.generation,
                            registered_unix_seconds: ((now - age) * 1000.0).round() / 1000.0,
                            boot_token: status.boot_token,
                            ended: None,
                        }
                    });
                    // The reaper's, now: a publisher may outlive a reaper
                    // restart, or start before its reaper.
                    record.boot_token = status.boot_token;
                    live.insert(key, record.clone());
                    seen.insert(id);
                }
                (RegistrationState::Ending, Some(reason)) => {
                    self.reasons.insert(key, id.0, id.1, reason);
                }
                (RegistrationState::Ending, None) => {}
            }
        }
        self.records.retain(|id, _| seen.contains(id));
        Ok(live)
    }

    fn table_prefix(&self) -> String {
        record::table_prefix(&self.options.prefix, &self.options.host, self.table.name())
    }

    fn key(&self, instance_id: u64) -> String {
        record::key(
            &self.options.prefix,
            &self.options.host,
            self.table.name(),
            instance_id,
        )
    }

    /// Awaits one etcd call with the request timeout.
    async fn ask<T>(
        &self,
        context: &str,
        call: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        // Stopping waits for the request in flight, never for a round's rest.
        if self.shared.stop.load(Ordering::Acquire) {
            return Err(EtcdError::Stopped);
        }
        let endpoints = self.options.endpoint_list();
        match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(source)) => Err(EtcdError::Etcd {
                endpoints,
                context: context.to_owned(),
                source,
            }),
            Err(_) => Err(EtcdError::Timeout {
                endpoints,
                context: context.to_owned(),
                timeout: REQUEST_TIMEOUT,
            }),
        }
    }
}

/// Whether etcd refused a request for its size (more operations than its
/// `--max-txn-ops`, or more bytes than its `--max-request-bytes`).
fn too_large(error: &EtcdError) -> bool {
    let EtcdError::Etcd { source, .. } = error else {
        return false;
    };
    let text = source.to_string();
    text.contains("too many operations in txn request") || text.contains("request is too large")
}

/// A third of the lease's TTL.
fn keep_alive_every(ttl_seconds: i64) -> Duration {
    Duration::from_secs(ttl_seconds.max(1) as u64) / 3
}

/// The next keep-alive answer. Never returns without a session.
async fn lease_news(session: Option<&mut LeaseConnection>) -> LeaseNews {
    let Some(session) = session else {
        return std::future::pending().await;
    };
    match session.answers.message().await {
        Ok(Some(answer)) if answer.ttl() > 0 => LeaseNews::Alive,
        Ok(Some(_)) => LeaseNews::Expired,
        Ok(None) => LeaseNews::Broken("the keep-alive stream ended".into()),
        Err(error) => LeaseNews::Broken(format!("the keep-alive stream broke: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(instance_id: u64) -> DropEvent {
        DropEvent {
            instance_id,
            slot: 0,
            generation: 0,
            reason: Reason::Timeout,
            pid: 1,
            remote: false,
            label: String::new(),
            registered_ns: 0,
            last_heartbeat_ns: None,
            silent_for: Duration::ZERO,
        }
    }

    #[test]
    fn the_end_queue_is_bounded_and_keeps_the_newest() {
        let shared = Arc::new(Shared {
            ends: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(false),
        });
        let sink = EndSink(shared.clone());
        for id in 0..ENDS_QUEUE as u64 + 10 {
            sink.ended(&ended(id));
        }
        let ends = shared.ends.lock().unwrap();
        assert_eq!(ends.len(), ENDS_QUEUE);
        assert_eq!(ends.front().map(|e| e.instance_id), Some(10));
        assert_eq!(
            ends.back().map(|e| e.instance_id),
            Some(ENDS_QUEUE as u64 + 9)
        );
    }
}
