//! The fleet as a watcher sees it: the live records by key, and etcd's
//! key events folded into the changes a consumer acts on (registered,
//! ended with its reason, host gone). Pure: no I/O, so every rule is
//! tested here without an etcd.
//!
//! The rules:
//! - a key whose value is a live record announces a registration once: a
//!   rewrite of the same registration (same host, table, instance id, slot
//!   and generation, e.g. after a reaper restart or a publisher's
//!   reconnect) updates the view silently;
//! - a value with `ended` set ends the registration with that reason, and
//!   the delete that follows it says nothing more;
//! - keys deleted without a published end (their lease expired: the
//!   host's reaper is gone) in one revision are one host's if the host has
//!   no key left ([`ClusterEvent::HostGone`]), otherwise each ends with no
//!   reason;
//! - an event at or below the view's revision was seen already (a watch
//!   resumed from a revision it had read past) and is skipped;
//! - a full listing (the first, or after etcd compacted the history a
//!   resumed watch needed) is compared with the view: what it lacks ended
//!   (no reason is known) or its host is gone, what it adds registered.

use super::record::{self, ClusterRecord};
use serde::Serialize;
use std::collections::BTreeMap;

/// One change to the fleet's live registrations, at the etcd revision that
/// made it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterChange {
    /// The etcd revision of the change (for a change found by re-listing,
    /// the listing's revision). Changes come in revision order.
    pub revision: i64,
    /// What changed.
    #[serde(flatten)]
    pub event: ClusterEvent,
}

/// What changed in the fleet.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ClusterEvent {
    /// A registration was published.
    Registered {
        /// Its record.
        record: ClusterRecord,
    },
    /// A registration ended. `record.ended` is the reason its host's reaper
    /// recorded; `None` when its key went without one (its table's lease
    /// expired while the host kept others, the key was deleted by hand, or
    /// the end fell in history etcd had compacted).
    Ended {
        /// Its last record.
        record: ClusterRecord,
    },
    /// A registration's process began to exit (its host's reaper saw its
    /// death word marked): it runs no more of its code; `Ended` follows
    /// once its host sees it has ended.
    Dying {
        /// Its record, `dying` set.
        record: ClusterRecord,
    },
    /// A host's keys all went together without a published end: its lease
    /// expired (the host, or its reaper, stopped keeping it alive).
    HostGone {
        /// The host's name.
        host: String,
        /// Its registrations at the time, each with `ended: None`.
        records: Vec<ClusterRecord>,
    },
}

/// One key event from etcd's watch.
#[derive(Clone, Copy, Debug)]
pub(super) enum KeyEvent<'e> {
    Put {
        key: &'e [u8],
        value: &'e [u8],
        revision: i64,
    },
    Delete {
        key: &'e [u8],
        revision: i64,
    },
}

impl KeyEvent<'_> {
    fn revision(&self) -> i64 {
        match self {
            KeyEvent::Put { revision, .. } | KeyEvent::Delete { revision, .. } => *revision,
        }
    }
}

/// The live records under a prefix, as of one etcd revision.
#[derive(Debug)]
pub(super) struct FleetView {
    prefix: String,
    live: BTreeMap<String, ClusterRecord>,
    revision: i64,
}

impl FleetView {
    pub(super) fn new(prefix: &str) -> FleetView {
        FleetView {
            prefix: record::trim_prefix(prefix).to_owned(),
            live: BTreeMap::new(),
            revision: 0,
        }
    }

    /// The revision every event up to which is in the view.
    pub(super) fn revision(&self) -> i64 {
        self.revision
    }

    /// The live records, by key.
    pub(super) fn live(&self) -> impl Iterator<Item = &ClusterRecord> {
        self.live.values()
    }

    /// Replaces the view with a full listing read at `revision`, and says
    /// how the fleet changed since the view was last current.
    pub(super) fn relist<'k>(
        &mut self,
        kvs: impl IntoIterator<Item = (&'k [u8], &'k [u8])>,
        revision: i64,
    ) -> Vec<ClusterChange> {
        let listed: BTreeMap<String, ClusterRecord> = kvs
            .into_iter()
            .filter_map(|(key, value)| self.live_record(key, value))
            .collect();
        let old = std::mem::replace(&mut self.live, listed);
        let gone = old
            .iter()
            .filter(|(key, was)| !self.live.get(*key).is_some_and(|now| same(was, now)))
            .map(|(_, was)| was.clone())
            .collect();
        let mut changes = self.gone(gone, revision);
        changes.extend(
            self.live
                .iter()
                .filter(|(key, now)| !old.get(*key).is_some_and(|was| same(was, now)))
                .map(|(_, record)| ClusterChange {
                    revision,
                    event: ClusterEvent::Registered {
                        record: record.clone(),
                    },
                }),
        );
        self.revision = self.revision.max(revision);
        changes
    }

    /// Folds one batch of watch events (in revision order) into the view:
    /// the changes they make.
    pub(super) fn apply(&mut self, events: &[KeyEvent<'_>]) -> Vec<ClusterChange> {
        let mut changes = Vec::new();
        // Keys gone without a reason in the revision being read.
        let mut unexplained: Vec<ClusterRecord> = Vec::new();
        let mut at = self.revision;
        for event in events {
            let revision = event.revision();
            if revision <= self.revision {
                continue; // seen before this watch resumed
            }
            if revision != at {
                changes.extend(self.gone(std::mem::take(&mut unexplained), at));
                at = revision;
            }
            match *event {
                KeyEvent::Put { key, value, .. } => {
                    self.put(key, value, revision, &mut changes);
                }
                KeyEvent::Delete { key, .. } => {
                    let key = String::from_utf8_lossy(key);
                    if let Some(record) = self.live.remove(key.as_ref()) {
                        unexplained.push(record);
                    }
                }
            }
        }
        changes.extend(self.gone(unexplained, at));
        self.revision = self.revision.max(at);
        changes
    }

    /// A progress note from etcd: nothing under the prefix changed up to
    /// `revision`.
    pub(super) fn caught_up(&mut self, revision: i64) {
        self.revision = self.revision.max(revision);
    }

    fn put(&mut self, key: &[u8], value: &[u8], revision: i64, changes: &mut Vec<ClusterChange>) {
        let Some(parsed) = self.record(key, value) else {
            return;
        };
        let (key, record) = parsed;
        if record.ended.is_some() {
            if self.live.remove(&key).is_some() {
                changes.push(ClusterChange {
                    revision,
                    event: ClusterEvent::Ended { record },
                });
            }
            return;
        }
        let announced = self.live.get(&key).filter(|was| same(was, &record));
        if announced.is_some_and(|was| record.dying && !was.dying) {
            changes.push(ClusterChange {
                revision,
                event: ClusterEvent::Dying {
                    record: record.clone(),
                },
            });
        }
        if announced.is_none() {
            if let Some(replaced) = self.live.remove(&key) {
                // The id registered again without an end seen in between.
                changes.push(ClusterChange {
                    revision,
                    event: ClusterEvent::Ended { record: replaced },
                });
            }
            changes.push(ClusterChange {
                revision,
                event: ClusterEvent::Registered {
                    record: record.clone(),
                },
            });
        }
        self.live.insert(key, record);
    }

    /// Records gone without a reason at `revision`: a host left with no key
    /// is gone, the others ended without a reason.
    fn gone(&self, records: Vec<ClusterRecord>, revision: i64) -> Vec<ClusterChange> {
        let mut by_host: BTreeMap<String, Vec<ClusterRecord>> = BTreeMap::new();
        for record in records {
            by_host.entry(record.host.clone()).or_default().push(record);
        }
        let mut changes = Vec::new();
        for (host, records) in by_host {
            if self.live.values().any(|r| r.host == host) {
                changes.extend(records.into_iter().map(|record| ClusterChange {
                    revision,
                    event: ClusterEvent::Ended { record },
                }));
            } else {
                changes.push(ClusterChange {
                    revision,
                    event: ClusterEvent::HostGone { host, records },
                });
            }
        }
        changes
    }

    /// A key and its record, if the key is a registration's under the
    /// prefix and its value a record.
    fn record(&self, key: &[u8], value: &[u8]) -> Option<(String, ClusterRecord)> {
        let key = std::str::from_utf8(key).ok()?;
        record::parse_key(&self.prefix, key)?;
        let record = serde_json::from_slice::<ClusterRecord>(value).ok()?;
        Some((key.to_owned(), record))
    }

    /// As [`FleetView::record`], only for a live record.
    fn live_record(&self, key: &[u8], value: &[u8]) -> Option<(String, ClusterRecord)> {
        self.record(key, value)
            .filter(|(_, record)| record.ended.is_none())
    }
}

/// Whether two records are the same registration (a rewrite of it, perhaps
/// by a restarted reaper, is no news).
fn same(a: &ClusterRecord, b: &ClusterRecord) -> bool {
    (&a.host, &a.table, a.instance_id, a.slot, a.generation)
        == (&b.host, &b.table, b.instance_id, b.slot, b.generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Reason;

    fn record(host: &str, id: u64, generation: u32) -> ClusterRecord {
        ClusterRecord {
            host: host.into(),
            table: "kv".into(),
            instance_id: id,
            label: format!("gpu{id}"),
            pid: 100 + id as u32,
            slot: id as u32,
            generation,
            registered_unix_seconds: 1.0,
            boot_token: 7,
            ended: None,
            dying: false,
        }
    }

    fn key(r: &ClusterRecord) -> Vec<u8> {
        record::key("/p", &r.host, &r.table, r.instance_id).into_bytes()
    }

    /// Owned key events, lent to `apply` as `KeyEvent`s.
    enum Owned {
        Put(Vec<u8>, Vec<u8>, i64),
        Delete(Vec<u8>, i64),
    }

    fn put(r: &ClusterRecord, revision: i64) -> Owned {
        Owned::Put(key(r), r.to_json().into_bytes(), revision)
    }

    fn ended(r: &ClusterRecord, reason: Reason, revision: i64) -> Owned {
        let mut last = r.clone();
        last.ended = Some(reason);
        put(&last, revision)
    }

    fn delete(r: &ClusterRecord, revision: i64) -> Owned {
        Owned::Delete(key(r), revision)
    }

    fn apply(view: &mut FleetView, events: &[Owned]) -> Vec<ClusterChange> {
        let lent: Vec<KeyEvent<'_>> = events
            .iter()
            .map(|e| match e {
                Owned::Put(key, value, revision) => KeyEvent::Put {
                    key,
                    value,
                    revision: *revision,
                },
                Owned::Delete(key, revision) => KeyEvent::Delete {
                    key,
                    revision: *revision,
                },
            })
            .collect();
        view.apply(&lent)
    }

    fn kinds(changes: &[ClusterChange]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match &c.event {
                ClusterEvent::Registered { record } => {
                    format!(
                        "{}: registered {}/{}",
                        c.revision, record.host, record.instance_id
                    )
                }
                ClusterEvent::Dying { record } => {
                    format!(
                        "{}: dying {}/{}",
                        c.revision, record.host, record.instance_id
                    )
                }
                ClusterEvent::Ended { record } => format!(
                    "{}: ended {}/{} {:?}",
                    c.revision, record.host, record.instance_id, record.ended
                ),
                ClusterEvent::HostGone { host, records } => {
                    format!("{}: host gone {host} ({})", c.revision, records.len())
                }
            })
            .collect()
    }

    #[test]
    fn a_record_turned_dying_is_told_once_then_its_end() {
        let mut view = FleetView::new("/p");
        let a = record("h1", 1, 1);
        let dying = ClusterRecord {
            dying: true,
            ..a.clone()
        };
        let changes = apply(&mut view, &[put(&a, 2), put(&dying, 3), put(&dying, 4)]);
        assert_eq!(kinds(&changes), ["2: registered h1/1", "3: dying h1/1"]);
        let changes = apply(&mut view, &[ended(&dying, Reason::ProcessExited, 5)]);
        assert_eq!(kinds(&changes), ["5: ended h1/1 Some(ProcessExited)"]);
    }

    #[test]
    fn a_registration_is_announced_once_and_ends_with_its_reason() {
        let mut view = FleetView::new("/p/");
        let a = record("h1", 1, 1);
        let mut rewritten = a.clone();
        rewritten.boot_token = 8; // a restarted reaper rewrites it
        let changes = apply(
            &mut view,
            &[
                put(&a, 5),
                put(&rewritten, 6),
                ended(&a, Reason::ProcessExited, 7),
                delete(&a, 8),
            ],
        );
        assert_eq!(
            kinds(&changes),
            ["5: registered h1/1", "7: ended h1/1 Some(ProcessExited)"]
        );
        assert_eq!((view.live().count(), view.revision()), (0, 8));
    }

    #[test]
    fn keys_gone_together_without_an_end_are_their_host_gone() {
        let mut view = FleetView::new("/p");
        let (a, b, c) = (record("h1", 1, 1), record("h1", 2, 1), record("h2", 3, 1));
        apply(&mut view, &[put(&a, 2), put(&b, 3), put(&c, 4)]);
        let changes = apply(&mut view, &[delete(&a, 9), delete(&b, 9)]);
        assert_eq!(kinds(&changes), ["9: host gone h1 (2)"]);
        // A key of a host that keeps others ends without a reason.
        let d = record("h2", 4, 1);
        apply(&mut view, &[put(&d, 10)]);
        let changes = apply(&mut view, &[delete(&c, 11)]);
        assert_eq!(kinds(&changes), ["11: ended h2/3 None"]);
    }

    #[test]
    fn events_a_resumed_watch_repeats_are_skipped() {
        let mut view = FleetView::new("/p");
        let a = record("h1", 1, 1);
        let b = record("h1", 2, 1);
        apply(&mut view, &[put(&a, 5), put(&b, 6)]);
        let again = apply(
            &mut view,
            &[put(&a, 5), put(&b, 6), ended(&a, Reason::Timeout, 7)],
        );
        assert_eq!(kinds(&again), ["7: ended h1/1 Some(Timeout)"]);
    }

    #[test]
    fn an_id_registered_again_ends_the_registration_it_replaces() {
        let mut view = FleetView::new("/p");
        let first = record("h1", 1, 1);
        let second = record("h1", 1, 2);
        apply(&mut view, &[put(&first, 3)]);
        let changes = apply(&mut view, &[put(&second, 4)]);
        assert_eq!(
            kinds(&changes),
            ["4: ended h1/1 None", "4: registered h1/1"]
        );
    }

    #[test]
    fn a_listing_after_compaction_says_what_changed_and_nothing_else() {
        let mut view = FleetView::new("/p");
        let (kept, ended_meanwhile, host_gone) =
            (record("h1", 1, 1), record("h1", 2, 1), record("h2", 3, 1));
        let (new, replaced) = (record("h3", 4, 1), record("h1", 1, 2));
        apply(
            &mut view,
            &[put(&kept, 2), put(&ended_meanwhile, 3), put(&host_gone, 4)],
        );
        let mut rewritten = kept.clone();
        rewritten.boot_token = 9;
        // The listing: h1/1 rewritten (no news), h1/2 gone, h2 gone, h3 new,
        // a stray key and an ended record's last value ignored.
        let listing = [
            (key(&rewritten), rewritten.to_json().into_bytes()),
            (key(&new), new.to_json().into_bytes()),
            (b"/p/stray".to_vec(), b"x".to_vec()),
        ];
        let changes = view.relist(
            listing.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
            20,
        );
        assert_eq!(
            kinds(&changes),
            [
                "20: ended h1/2 None",
                "20: host gone h2 (1)",
                "20: registered h3/4"
            ]
        );
        assert_eq!(view.revision(), 20);
        // Listed again with h1/1 registered anew: it ended and registered.
        let listing = [
            (key(&replaced), replaced.to_json().into_bytes()),
            (key(&new), new.to_json().into_bytes()),
        ];
        let changes = view.relist(
            listing.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
            21,
        );
        assert_eq!(
            kinds(&changes),
            ["21: ended h1/1 None", "21: registered h1/1"]
        );
    }

    #[test]
    fn changes_serialise_as_one_object_with_their_kind() {
        let change = ClusterChange {
            revision: 4,
            event: ClusterEvent::HostGone {
                host: "h".into(),
                records: vec![record("h", 1, 1)],
            },
        };
        let json = serde_json::to_value(&change).unwrap();
        assert_eq!(json["event"], "host_gone");
        assert_eq!(json["revision"], 4);
        assert_eq!(json["records"][0]["instance_id"], 1);
    }
}
