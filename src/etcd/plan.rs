//! What a publishing round writes: decided from what etcd holds for the
//! table, what the table holds live, and why registrations ended. Pure: no
//! etcd, no clock, so each rule is tested on plain values.

use super::record::ClusterRecord;
use crate::event::Reason;
use std::collections::{BTreeMap, HashMap};

/// One write under the publisher's lease.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Write {
    Put(String, String),
    Delete(String),
}

/// A key etcd holds under this table's prefix: its record (if its value is
/// one) and whether it is under the publisher's own lease.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct InEtcd {
    pub record: Option<ClusterRecord>,
    pub ours: bool,
}

impl InEtcd {
    /// A record this publisher put under its own lease.
    pub fn ours(record: ClusterRecord) -> InEtcd {
        InEtcd {
            record: Some(record),
            ours: true,
        }
    }
}

/// The end reasons not yet published, by key, with the slot and generation
/// they belong to: at most `bound`, the oldest dropped first (its key is
/// still deleted, without a reason).
#[derive(Debug)]
pub(super) struct Reasons {
    by_key: HashMap<String, Ending>,
    next: u64,
    bound: usize,
}

/// Why one registration of a key ended, and when it was recorded.
#[derive(Clone, Copy, Debug)]
struct Ending {
    /// The order it was recorded in (the oldest are forgotten first).
    age: u64,
    slot: u32,
    generation: u32,
    reason: Reason,
}

impl Reasons {
    pub fn new(bound: usize) -> Reasons {
        Reasons {
            by_key: HashMap::new(),
            next: 0,
            bound,
        }
    }

    /// Records why registration (`slot`, `generation`) of `key` ended.
    pub fn insert(&mut self, key: String, slot: u32, generation: u32, reason: Reason) {
        let ending = Ending {
            age: self.next,
            slot,
            generation,
            reason,
        };
        self.by_key.insert(key, ending);
        self.next += 1;
        if self.by_key.len() > self.bound {
            let mut ages: Vec<u64> = self.by_key.values().map(|entry| entry.age).collect();
            ages.sort_unstable();
            let keep_from = ages[ages.len() - self.bound];
            self.by_key.retain(|_, entry| entry.age >= keep_from);
        }
    }

    /// Why `key`'s registration (`slot`, `generation`) ended, if known.
    pub fn of(&self, key: &str, slot: u32, generation: u32) -> Option<Reason> {
        self.by_key
            .get(key)
            .filter(|entry| (entry.slot, entry.generation) == (slot, generation))
            .map(|entry| entry.reason)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Forgets every reason but those of registrations still `live`: their
    /// end is told by a later round.
    pub fn keep_only(&mut self, live: &BTreeMap<String, ClusterRecord>) {
        self.by_key.retain(|key, entry| {
            live.get(key).is_some_and(|record| {
                (record.slot, record.generation) == (entry.slot, entry.generation)
            })
        });
    }
}

/// A round's writes, in the order they go out.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Plan {
    /// The ended keys' last values, with their reasons: written first, so a
    /// watcher sees why before the delete, and the delete's previous value
    /// says it too.
    pub last_values: Vec<Write>,
    /// Then the deletes of keys no longer live and the puts of live
    /// registrations etcd does not hold as they are under this lease.
    pub changes: Vec<Write>,
}

/// The writes that bring etcd (`published`) in step with the table
/// (`live`), telling why the gone ones ended (`ends`). A key held under
/// another lease (a previous reaper's) is still a record whose end can be
/// told, and a live one is moved to this lease.
pub(super) fn plan(
    published: &BTreeMap<String, InEtcd>,
    live: &BTreeMap<String, ClusterRecord>,
    ends: &Reasons,
) -> Plan {
    let mut plan = Plan::default();
    for (key, held) in published {
        if live.contains_key(key) {
            continue;
        }
        if let Some(last) = &held.record {
            if let Some(reason) = ends.of(key, last.slot, last.generation) {
                let last = ClusterRecord {
                    ended: Some(reason),
                    dying: false,
                    ..last.clone()
                };
                plan.last_values
                    .push(Write::Put(key.clone(), last.to_json()));
            }
        }
        plan.changes.push(Write::Delete(key.clone()));
    }
    for (key, record) in live {
        let held_as_is = matches!(
            published.get(key),
            Some(InEtcd { record: Some(held), ours: true }) if held == record
        );
        if !held_as_is {
            plan.changes.push(Write::Put(key.clone(), record.to_json()));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(instance_id: u64, slot: u32, generation: u32) -> ClusterRecord {
        ClusterRecord {
            host: "h".into(),
            table: "t".into(),
            instance_id,
            label: "gpu".into(),
            pid: 7,
            slot,
            generation,
            registered_unix_seconds: 1.0,
            boot_token: 9,
            ended: None,
            dying: false,
        }
    }

    fn ended(record: &ClusterRecord, reason: Reason) -> String {
        ClusterRecord {
            ended: Some(reason),
            dying: false,
            ..record.clone()
        }
        .to_json()
    }

    #[test]
    fn nothing_changed_writes_nothing() {
        let a = record(1, 0, 0);
        let published = BTreeMap::from([("k1".to_owned(), InEtcd::ours(a.clone()))]);
        let live = BTreeMap::from([("k1".to_owned(), a)]);
        assert_eq!(plan(&published, &live, &Reasons::new(8)), Plan::default());
    }

    #[test]
    fn an_ended_registration_is_told_then_deleted_and_a_new_one_put() {
        // Under this publisher's lease, or a previous reaper's (a takeover):
        // the end is told either way, and the live key moves to this lease.
        for ours in [true, false] {
            let (a, b) = (record(1, 0, 0), record(2, 1, 0));
            let held = |record: &ClusterRecord| InEtcd {
                record: Some(record.clone()),
                ours,
            };
            let mut published = BTreeMap::from([("k1".to_owned(), held(&a))]);
            if !ours {
                published.insert("k2".to_owned(), held(&b));
            }
            let live = BTreeMap::from([("k2".to_owned(), b.clone())]);
            let mut ends = Reasons::new(8);
            ends.insert("k1".into(), 0, 0, Reason::ProcessExited);
            let plan = plan(&published, &live, &ends);
            assert_eq!(
                plan.last_values,
                vec![Write::Put("k1".into(), ended(&a, Reason::ProcessExited))]
            );
            assert_eq!(
                plan.changes,
                vec![
                    Write::Delete("k1".into()),
                    Write::Put("k2".into(), b.to_json())
                ]
            );
        }
    }

    #[test]
    fn a_reason_for_another_registration_of_the_id_is_not_told() {
        let a = record(1, 0, 3);
        let published = BTreeMap::from([("k1".to_owned(), InEtcd::ours(a))]);
        let mut ends = Reasons::new(8);
        ends.insert("k1".into(), 0, 2, Reason::Timeout); // an older generation
        let plan = plan(&published, &BTreeMap::new(), &ends);
        assert!(plan.last_values.is_empty());
        assert_eq!(plan.changes, vec![Write::Delete("k1".into())]);
    }

    #[test]
    fn a_key_that_is_not_a_record_is_deleted_without_a_reason() {
        let published = BTreeMap::from([(
            "k9".to_owned(),
            InEtcd {
                record: None,
                ours: false,
            },
        )]);
        let plan = plan(&published, &BTreeMap::new(), &Reasons::new(8));
        assert_eq!(plan.changes, vec![Write::Delete("k9".into())]);
        assert!(plan.last_values.is_empty());
    }

    #[test]
    fn a_reason_outlives_its_round_only_while_its_registration_is_live() {
        // The round's snapshot still held k1 when its reason came: the next
        // round, which sees k1 gone, must still know why.
        let (a, b) = (record(1, 0, 3), record(2, 1, 5));
        let mut ends = Reasons::new(8);
        ends.insert("k1".into(), 0, 3, Reason::Deregistered);
        ends.insert("k2".into(), 1, 4, Reason::Timeout);
        ends.insert("k3".into(), 2, 1, Reason::ProcessExited);
        let live = BTreeMap::from([("k1".to_owned(), a.clone()), ("k2".to_owned(), b)]);
        ends.keep_only(&live);
        assert_eq!(ends.len(), 1, "k2 is a newer registration, k3 is gone");
        let published = BTreeMap::from([("k1".to_owned(), InEtcd::ours(a.clone()))]);
        let plan = plan(&published, &BTreeMap::new(), &ends);
        assert_eq!(
            plan.last_values,
            vec![Write::Put("k1".into(), ended(&a, Reason::Deregistered))]
        );
    }

    #[test]
    fn past_their_bound_the_oldest_reasons_go_first() {
        let mut ends = Reasons::new(3);
        for id in 0..5u32 {
            ends.insert(format!("k{id}"), id, 0, Reason::Timeout);
        }
        assert_eq!(ends.len(), 3);
        assert_eq!(ends.of("k0", 0, 0), None);
        assert_eq!(ends.of("k1", 1, 0), None);
        for id in 2..5u32 {
            assert_eq!(ends.of(&format!("k{id}"), id, 0), Some(Reason::Timeout));
        }
    }
}
