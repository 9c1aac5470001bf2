//! What etcd holds for a table, kept in step with it: each round compares a
//! snapshot of the table with what etcd holds and writes the difference
//! (keys of live registrations under the lease, ends with their reasons),
//! while [`LeaseHold`] keeps the lease.

use super::backoff::spread;
use super::error::EtcdError;
use super::lease::{keep_alive_every, lease_news, LeaseConnection, LeaseHold, Wake};
use super::options::EtcdOptions;
use super::plan::{plan, InEtcd, Reasons, Write};
use super::record::{self, ClusterRecord};
use super::shared::{Ended, Shared, ENDS_QUEUE};
use crate::status::report::RegistrationState;
use crate::table::handle::Table;
use crate::table::wake::WakeFd;
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::unix::AsyncFd;

/// How long one etcd request (or the connection) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a stopping publisher waits for etcd to revoke its lease (the
/// keys expire with it anyway).
const REVOKE_TIMEOUT: Duration = Duration::from_secs(1);
/// Operations per transaction: etcd's default `--max-txn-ops`. A request
/// etcd refuses for its size is split in halves, and the smaller size kept.
const TXN_OPS: usize = 128;
/// A look at the table even when nothing woke the publisher.
const BACKSTOP: Duration = Duration::from_secs(1);

/// The thread's state: what etcd holds for this table, as far as it knows.
pub(super) struct Mirror {
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
    pub(super) fn new(table: &Table, options: EtcdOptions, shared: Arc<Shared>) -> Mirror {
        Mirror {
            table: table.clone(),
            options,
            shared,
            published: BTreeMap::new(),
            records: HashMap::new(),
            reasons: Reasons::new(ENDS_QUEUE),
            txn_ops: TXN_OPS,
        }
    }

    pub(super) async fn run(mut self, mut wake: AsyncFd<WakeFd>) {
        let mut hold = LeaseHold::new();
        loop {
            if self.shared.stop.load(Ordering::Acquire) {
                if let Some(mut connection) = hold.connection {
                    let revoke = connection.client.lease_revoke(connection.lease);
                    let _ = tokio::time::timeout(REVOKE_TIMEOUT, revoke).await;
                }
                return;
            }
            self.round(&mut hold).await;
            self.shared
                .connected
                .store(hold.connection.is_some(), Ordering::Release);
            let woke = self.wait(&mut hold, &mut wake).await;
            hold.heed(woke, &self.options.endpoint_list());
        }
    }

    /// Connects if it is time to, then brings etcd in step with the table.
    /// A connection alone ends no outage (nor its backoff): a round that
    /// goes through does.
    async fn round(&mut self, hold: &mut LeaseHold) {
        if hold.connection.is_none() && Instant::now() >= hold.retry.at {
            match self.connect(hold.lease).await {
                Ok(connected) => {
                    hold.lease = Some(connected.lease);
                    hold.connection = Some(connected);
                }
                Err(EtcdError::Stopped) => {}
                Err(error) => hold.retry.failed(&error),
            }
        }
        let Some(connected) = hold.connection.as_mut() else {
            self.take_ends();
            return;
        };
        match self.step(connected).await {
            Ok(()) => hold.retry.succeeded(&self.options.endpoint_list()),
            // The loop's top revokes the lease.
            Err(EtcdError::Stopped) => {}
            Err(error) => {
                hold.retry.failed(&error);
                hold.connection = None;
            }
        }
    }

    /// Waits for what comes first: a request to stop or an end, the table's
    /// wake word, a keep-alive answer, or the next thing due (a keep-alive,
    /// the answer deadline, the backstop, a retry).
    async fn wait(&self, hold: &mut LeaseHold, wake: &mut AsyncFd<WakeFd>) -> Wake {
        let until = match &hold.connection {
            Some(s) => s
                .next_keep_alive
                .min(s.answer_deadline())
                .min(Instant::now() + BACKSTOP),
            None => hold.retry.at,
        };
        // Biased, the keep-alive answers before the timer: answers that
        // came during a long round are read before their deadline is
        // judged.
        tokio::select! {
            biased;
            news = lease_news(hold.connection.as_mut()) => Wake::Lease(news),
            () = self.shared.notify.notified() => Wake::Round,
            ready = wake.readable_mut() => {
                if let Ok(mut ready) = ready {
                    ready.get_inner().drain();
                    ready.clear_ready();
                }
                Wake::Round
            }
            () = tokio::time::sleep_until(until.into()) => Wake::Round,
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
                held = Some((id, left.granted_ttl(), left.ttl()));
            }
        }
        let (lease, ttl) = match held {
            Some((id, granted, _)) => (id, granted),
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
        // A kept lease kept its keys, which are what this publisher last
        // wrote (or, after a write whose answer was lost, what the next
        // round writes again: every write is idempotent). A new lease reads
        // what etcd holds.
        if held.is_none() {
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
        }
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
            // The first keep-alive at a random point of its period (for a
            // kept lease, of half what it has left, if less): hosts that
            // start or reconnect together keep their leases alive each at
            // its own phase, not in bursts.
            next_keep_alive: Instant::now()
                + spread(match held {
                    Some((_, _, left)) => {
                        keep_alive_every(ttl).min(Duration::from_secs(left as u64) / 2)
                    }
                    None => keep_alive_every(ttl),
                }),
            ttl: Duration::from_secs(ttl.max(1) as u64),
            answered: Instant::now(),
        })
    }

    /// One round: the keep-alive if due, then etcd brought in step with the
    /// table.
    async fn step(&mut self, connection: &mut LeaseConnection) -> Result<(), EtcdError> {
        self.keep_alive_if_due(connection).await?;
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
        self.commit(connection, "publish ends", plan.last_values)
            .await?;
        self.commit(connection, "publish registrations", plan.changes)
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
        connection: &mut LeaseConnection,
        context: &str,
        mut operations: Vec<Write>,
    ) -> Result<(), EtcdError> {
        while !operations.is_empty() {
            // A round of many batches (thousands of registrations, a slow
            // etcd) may outlast the lease: it is kept alive between them.
            self.keep_alive_if_due(connection).await?;
            let rest = operations.split_off(operations.len().min(self.txn_ops));
            match self.write(connection, context, operations.clone()).await {
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

    /// Sends a keep-alive if one is due. (Its answer is read where the
    /// loop waits.)
    async fn keep_alive_if_due(&self, connection: &mut LeaseConnection) -> Result<(), EtcdError> {
        if Instant::now() >= connection.next_keep_alive {
            self.ask("keep the lease alive", connection.keeper.keep_alive())
                .await?;
            connection.next_keep_alive = Instant::now() + connection.keep_alive_every;
        }
        Ok(())
    }

    /// Writes one batch: one operation alone as a plain request (etcd
    /// commits it faster than a transaction), more as one transaction.
    async fn write(
        &self,
        connection: &mut LeaseConnection,
        context: &str,
        mut batch: Vec<Write>,
    ) -> Result<(), EtcdError> {
        let put = || Some(PutOptions::new().with_lease(connection.lease));
        if batch.len() == 1 {
            let client = &mut connection.client;
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
        self.ask(context, connection.client.txn(batch))
            .await
            .map(drop)
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
                (RegistrationState::Live | RegistrationState::Dying, _) => {
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
                            dying: false,
                        }
                    });
                    record.dying = registration.state == RegistrationState::Dying;
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
