//! One sweep over a table's owned-file records: each held owner record
//! whose lock no process holds any more (the kernel released it with the
//! process's last descriptor: it has ended or exec'd) has its declared
//! files removed, each only if its name, looked at without following links
//! in the allowed directory it was declared in, still holds the same file
//! and every rule of `removal_rules.rs` holds; then the record is freed.
//! Anyone who may write the table may write the records, so a round does
//! at most [`FILES_PER_ROUND`] files (the rest wait for the next round).
//! The reaper's thread runs rounds (`reaper/owned_removal.rs`), and so
//! does [`Table::unlink`](crate::Table::unlink) before the records go.

use crate::os::lock;
use crate::os::same_file::{self, DirFacts, Found, Removal};
use crate::os::thread_credentials;
use crate::table::owned_records::{
    owner_lock, Counter, FileRecord, OwnedRecords, OwnerRecord, DECLARED, FREE, HELD,
};
use crate::table::removal_rules::{self, Declared, Declarer, RecordsTrust};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

/// The most declared files one round looks at.
pub(crate) const FILES_PER_ROUND: u32 = 256;

/// What a round did, as it does it.
pub(crate) enum Swept {
    /// A file removed (its size and the bytes it held), owned by `pid`;
    /// told before its owner's record is freed, so whoever finds no owner
    /// left has been told of every removal.
    Removed {
        path: PathBuf,
        size: u64,
        held: u64,
        pid: u32,
    },
    /// A file left in place, and why.
    Refused { pid: u32, why: String },
    /// The records could not be read whole: nothing done.
    Unreadable(std::io::Error),
}

/// What a round found: whether ended owners are left for later rounds
/// (the budget ran out), and the owners still alive.
pub(crate) struct RoundEnd {
    pub more: bool,
    pub live: Vec<u32>,
}

/// What a round counted, added to the records' counters once at its end.
#[derive(Default)]
struct Tally {
    removed: u64,
    freed: u64,
    refused: u64,
}

/// One round over `records`, testing owner locks through `locks` (a
/// description of the records' file that holds none of them), telling
/// `out` what it does.
pub(crate) fn round(
    records: &OwnedRecords,
    locks: &File,
    out: &mut dyn FnMut(Swept),
) -> RoundEnd {
    let mut end = RoundEnd {
        more: false,
        live: Vec::new(),
    };
    let owners = match records.owners() {
        Ok(owners) => owners,
        Err(e) => {
            out(Swept::Unreadable(e));
            return end;
        }
    };
    let mut round = Round {
        records,
        trust: records.trust(),
        dirs: vec![None; records.dirs().len()],
        tally: Tally::default(),
        out,
        users: HashMap::new(),
    };
    let mut budget = FILES_PER_ROUND;
    'owners: for (index, owner) in (0u32..).zip(&owners) {
        if owner.state != HELD {
            continue;
        }
        if lock::held_by_other(locks, owner_lock(index)).unwrap_or(true) {
            end.live.push(owner.pid);
            continue;
        }
        let Ok(files) = records.files(index) else {
            break;
        };
        for (slot, file) in (0u32..).zip(&files) {
            if file.state != DECLARED {
                continue;
            }
            if budget == 0 {
                end.more = true;
                break 'owners;
            }
            budget -= 1;
            round.remove_one(owner, file);
            let _ = records.set_file_state(index, slot, FREE);
        }
        let _ = records.set_owner_state(index, FREE);
    }
    let tally = &round.tally;
    let _ = records.add(Counter::Removed, tally.removed);
    let _ = records.add(Counter::BytesFreed, tally.freed);
    let _ = records.add(Counter::Refused, tally.refused);
    end
}

/// An allowed directory opened to look in, with its facts; or why it
/// cannot be.
type OpenedDir = Result<Arc<(File, DirFacts)>, String>;

/// A round's state: the records, whom they may be believed for, the
/// allowed directories opened so far.
struct Round<'r> {
    records: &'r OwnedRecords,
    trust: RecordsTrust,
    /// Per allowed directory: its handle and facts, or why it cannot be
    /// looked in; opened when a round first needs it.
    dirs: Vec<Option<OpenedDir>>,
    tally: Tally,
    out: &'r mut dyn FnMut(Swept),
    /// The users removals acted as, with their groups from the database.
    users: HashMap<u32, thread_credentials::Identity>,
}

impl Round<'_> {
    /// Removes `file`, declared by `owner`, if every rule allows it.
    fn remove_one(&mut self, owner: &OwnerRecord, file: &FileRecord) {
        let pid = owner.pid;
        let name = OsStr::from_bytes(&file.name);
        if !removal_rules::plain_name(&file.name) {
            return self.refuse(pid, "its record holds no plain file name");
        }
        let Some(dir) = self.dir(file.dir) else {
            return self.refuse(pid, "its record names no allowed directory");
        };
        let dir = match dir {
            Ok(dir) => dir,
            Err(why) => return self.refuse(pid, &why),
        };
        let (handle, facts) = &*dir;
        let path = self.records.dirs()[file.dir as usize].join(name);
        let declared = Declared {
            dev: file.dev,
            ino: file.ino,
            born_ns: file.born_ns,
        };
        let who = match self.acting_for(owner, handle, name) {
            Ok(who) => who,
            Err(e) => return self.refuse(pid, &format!("{}: {e}", path.display())),
        };
        let groups: Vec<u32> = std::iter::once(who.gid).chain(who.groups.iter().copied()).collect();
        let declarer = Declarer {
            uid: owner.uid,
            groups: &groups,
        };
        let acting_as = Declarer {
            uid: who.uid,
            groups: &groups,
        };
        let trust = self.trust;
        // Looked at and removed as `who`: the kernel judges the removal
        // itself, as it happens, so a name made anew between the look and
        // the unlink is never removed beyond what `who` could remove.
        let removal = thread_credentials::act_as(&who).and_then(|_acting| {
            same_file::remove_if_same(handle, name, |found| {
                removal_rules::same_file(&declared, found, facts)
                    && removal_rules::owner_allows(trust, found.uid, &declarer)
                    && removal_rules::directory_allows(facts, found.uid, &acting_as)
            })
        });
        match removal {
            Ok(Removal::Removed(identity)) => {
                self.tally.removed += 1;
                self.tally.freed = self.tally.freed.saturating_add(identity.held);
                (self.out)(Swept::Removed {
                    path,
                    size: identity.size,
                    held: identity.held,
                    pid,
                });
            }
            Ok(Removal::Missing) => {}
            Ok(Removal::Replaced) => self.refuse(
                pid,
                &format!(
                    "{} is no longer the file it declared, or the rules do not let uid {} remove it",
                    path.display(),
                    owner.uid
                ),
            ),
            Err(e) => self.refuse(pid, &format!("{}: {e}", path.display())),
        }
    }

    /// Whom a removal of `name` declared by `owner` acts as: the declarer,
    /// where it is not root, with the groups its record holds where only
    /// root writes the records, else those the system's database gives it
    /// (a record's groups are any writer's word); for a root declarer
    /// (believed only where only root writes the records), root for root's
    /// files and the file's owner for another user's.
    fn acting_for(
        &mut self,
        owner: &OwnerRecord,
        dir: &File,
        name: &OsStr,
    ) -> std::io::Result<thread_credentials::Identity> {
        let uid = match owner.uid {
            0 => match same_file::look(dir, name)? {
                Found::File(found) => found.uid,
                Found::Missing | Found::NotRegular => 0,
            },
            uid => uid,
        };
        if uid == 0 {
            return Ok(thread_credentials::Identity {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
            });
        }
        if self.trust.root_only && owner.uid == uid {
            let (gid, groups) = owner
                .groups
                .split_first()
                .map_or((thread_credentials::NO_GROUP, &[][..]), |(g, rest)| (*g, rest));
            return Ok(thread_credentials::Identity {
                uid,
                gid,
                groups: groups.to_vec(),
            });
        }
        Ok(self
            .users
            .entry(uid)
            .or_insert_with(|| thread_credentials::from_database(uid))
            .clone())
    }

    /// Allowed directory `index` opened, or why it cannot be; `None` for
    /// an index no creator allowed.
    fn dir(&mut self, index: u32) -> Option<OpenedDir> {
        let path = self.records.dirs().get(index as usize)?;
        let entry = self.dirs[index as usize].get_or_insert_with(|| {
            same_file::open_dir(path)
                .and_then(|handle| Ok((same_file::dir_facts(&handle)?, handle)))
                .map(|(facts, handle)| Arc::new((handle, facts)))
                .map_err(|e| format!("its directory {} cannot be looked in: {e}", path.display()))
        });
        Some(entry.clone())
    }

    fn refuse(&mut self, pid: u32, why: &str) {
        self.tally.refused += 1;
        (self.out)(Swept::Refused {
            pid,
            why: why.to_owned(),
        });
    }
}


/// Before the table at `table` (named `name`) goes: the files of owners
/// that have ended are removed now, as its reaper would have (the records
/// go with the table, and no reaper would remove them afterwards), in
/// rounds until none is left. Returns the pids of the owners still alive:
/// their declarations go with the table.
pub(crate) fn settle(table: &std::path::Path, name: &str) -> Vec<u32> {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(table)
    else {
        return Vec::new();
    };
    let Some(records) = OwnedRecords::open(table, &file) else {
        return Vec::new();
    };
    let Ok(locks) = lock::reopen(records.file()) else {
        return Vec::new();
    };
    let (mut removed, mut refused) = (0u64, 0u64);
    let rounds = crate::table::owned_records::PROCESSES * crate::table::owned_records::FILES
        / FILES_PER_ROUND;
    let mut live = Vec::new();
    // On a thread of its own: a removal changes its thread's file-system
    // credentials for a moment, never the caller's.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for _ in 0..=rounds {
                let end = round(&records, &locks, &mut |swept| match swept {
                    Swept::Removed { .. } => removed += 1,
                    Swept::Refused { .. } | Swept::Unreadable(_) => refused += 1,
                });
                live = end.live;
                if !end.more {
                    break;
                }
            }
        });
    });
    if removed + refused > 0 {
        log::info!(
            "table '{name}': before removing it, removed {removed} files of processes that have ended ({refused} left in place by the rules)"
        );
    }
    live
}
