//! A process owns files: [`Table::own_file`] declares a file the process
//! made that must not outlive it, and the reaper removes it once the
//! process has ended (`reaper/owned_removal.rs`). The records are in the
//! file beside the table (`owned_records.rs`).
//!
//! A process takes an owner record the first time it declares a file, and
//! with it a lock on the table's byte of that record, on a descriptor of
//! its own (close-on-exec, dropped by a forked child): the kernel releases
//! the lock when the process has ended, or has exec'd, and that is when
//! the reaper removes what it owns. The record is taken lock first, state
//! second, so a reaper never mistakes a process still taking it for one
//! that has ended. A declaration lasts until its process ends or disowns
//! it, whether or not the process keeps the table open: a handle dropped
//! while it owns files leaves its descriptor open for the rest of the
//! process's life.
//!
//! Never the wrong file: a declaration records the file's device, inode
//! and birth time, looked at by name in an allowed directory without
//! following a link; it is refused unless the file is a regular file of
//! the process's user (or the process is root), the process could remove
//! its name itself, and the file can be told from a later one given the
//! same inode number (`removal_rules.rs`); the reaper removes the name
//! only if it still holds that same file and every rule holds again.

use crate::error::{Error, Result};
use crate::os::fork::{self, LockDescriptor};
use crate::os::lock;
use crate::os::process;
use crate::os::same_file::{self, DirFacts, Found};
use crate::table::handle::Table;
use crate::os::refused_file::{self, Expected};
use crate::table::location;
use crate::table::owned_records::{
    self, owner_lock, FileRecord, OwnedRecords, OwnerHold, OwnerRecord, DECLARED, FILES, FREE, GROUPS,
    HELD, PROCESSES,
};
use crate::table::removal_rules::{self, Declared, Declarer, NAME_MAX};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

impl Table {
    /// Declares that this process owns the file at `path`: the reaper
    /// removes it once this process has ended (killed, crashed, exited, or
    /// replaced by `exec`), whether or not it holds a registration then.
    /// Declaring it again updates the file's identity (a file made anew
    /// under the same name); [`Table::disown_file`] or removing the file
    /// yourself forgets it.
    ///
    /// The file must be a regular file, named directly in one of the
    /// directories the table's creator allowed (`TableOptions::owned_dirs`,
    /// default `/dev/shm`), owned by this process's user unless the process
    /// is root. A forked child owns nothing of its parent's.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: a path not directly in an allowed
    ///   directory, a name over 255 bytes, a link or anything but a
    ///   regular file; a heap table.
    /// - [`Error::NotFound`]: nothing at `path`.
    /// - [`Error::Permission`]: the file belongs to another user.
    /// - [`Error::Full`]: this process owns 64 files in the table already,
    ///   or 256 processes own files in it.
    /// - [`Error::Incompatible`]: a table made by an earlier build (it has
    ///   no owned-file records).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let table = livereg::Table::open("engine")?;
    /// std::fs::write("/dev/shm/engine-ring-0", b"...")?;
    /// table.own_file("/dev/shm/engine-ring-0")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn own_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let records = self.owned_records()?;
        let (dir, name) = place(records, path)?;
        let look = |step: &str, e: std::io::Error| {
            Error::os(&self.memory.name, &format!("{step} of the file to own"), e)
        };
        let handle = same_file::open_dir(&records.dirs()[dir as usize])
            .map_err(|e| look("open the directory", e))?;
        let facts = same_file::dir_facts(&handle).map_err(|e| look("look at the directory", e))?;
        let found = same_file::look(&handle, name).map_err(|e| look("look at the name", e))?;
        let identity = match found {
            Found::File(identity) => identity,
            Found::Missing => {
                return Err(Error::NotFound(format!(
                    "cannot own '{}': no such file",
                    path.display()
                )))
            }
            Found::NotRegular => {
                return Err(Error::InvalidArgument(format!(
                    "cannot own '{}': expected a regular file, found a link, directory or device (never followed, never owned)",
                    path.display()
                )))
            }
        };
        let (user, groups) = process::credentials();
        let declarer = Declarer {
            uid: user,
            groups: &groups,
        };
        if identity.uid != user && user != 0 {
            return Err(Error::Permission(format!(
                "cannot own '{}': it belongs to uid {}, expected this process's user (uid {user}): a process owns only files it could remove itself",
                path.display(),
                identity.uid
            )));
        }
        if !removal_rules::directory_allows(&facts, identity.uid, &declarer) {
            return Err(Error::Permission(format!(
                "cannot own '{}': uid {user} may not remove names from its directory (owner uid {}, group {}, mode {:o}): a process owns only files it could remove itself",
                path.display(),
                facts.uid,
                facts.gid,
                facts.mode & 0o7777
            )));
        }
        if !removal_rules::identifiable(&identity, &facts) {
            return Err(Error::InvalidArgument(format!(
                "cannot own '{}': its file system (type {:#x}) keeps no birth time and reuses inode numbers, so a later file under the name could not be told from it; allow a directory on a tmpfs or on a file system with birth times (ext4, xfs, btrfs)",
                path.display(),
                facts.fs_type
            )));
        }
        if user == 0 && !records.trust().root_only {
            return Err(Error::Permission(format!(
                "cannot own '{}': root owns files only in a table no one else may write (a root-owned table without group or other write): any writer of this one could name root's files in its records",
                path.display()
            )));
        }
        if !removal_rules::owner_allows(records.trust(), identity.uid, &declarer) {
            return Err(Error::Permission(format!(
                "cannot own '{}': it belongs to uid {}, and the reaper removes only files of the table's owner (unless only root may write the table)",
                path.display(),
                identity.uid
            )));
        }
        let hold = self.hold(|| groups_for(records, &groups))?;
        let owner = hold.as_ref().expect("held").index;
        let corrupt = |e: std::io::Error| self.records_cut_short(e);
        let files = records.files(owner).map_err(corrupt)?;
        let slot = find(&files, dir, name)
            .or_else(|| (0..FILES).find(|&f| files[f as usize].state == FREE))
            .ok_or_else(|| Error::Full {
                message: format!(
                    "cannot own '{}': this process owns {FILES} files in table '{}' already (the limit); disown one first",
                    path.display(),
                    self.memory.name
                ),
                capacity: Some(FILES),
            })?;
        let declared = Declared::of(&identity);
        let record = FileRecord {
            state: DECLARED,
            dir,
            dev: declared.dev,
            ino: declared.ino,
            born_ns: declared.born_ns,
            name: name.as_bytes().to_vec(),
        };
        records.write_file(owner, slot, &record).map_err(corrupt)
    }

    /// Forgets a declaration of this process's ([`Table::own_file`]): the
    /// file stays. Returns whether it was owned.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a path no declaration could name;
    /// [`Error::Incompatible`] for a table without owned-file records.
    pub fn disown_file(&self, path: impl AsRef<Path>) -> Result<bool> {
        let records = self.owned_records()?;
        let (dir, name) = place(records, path.as_ref())?;
        let hold = self.lock_hold();
        let Some(owner) = hold.as_ref().filter(|h| h.epoch == fork::epoch()) else {
            return Ok(false);
        };
        let corrupt = |e: std::io::Error| self.records_cut_short(e);
        let files = records.files(owner.index).map_err(corrupt)?;
        Ok(match find(&files, dir, name) {
            Some(slot) => {
                records
                    .set_file_state(owner.index, slot, FREE)
                    .map_err(corrupt)?;
                true
            }
            None => false,
        })
    }

    fn owned_records(&self) -> Result<&OwnedRecords> {
        self.memory.owned_records().ok_or_else(|| match &self.memory.owned {
            None if self.memory.file().is_none() => Error::InvalidArgument(format!(
                "table '{}' is in this process's memory: no reaper outlives its files",
                self.memory.name
            )),
            None => Error::Incompatible(match self.records_refused() {
                Some(why) => format!(
                    "table '{}' has no usable owned-file records: {why}; re-create the table to own files",
                    self.memory.name
                ),
                None => format!(
                    "table '{}' has no owned-file records (made by an earlier build): re-create it to own files",
                    self.memory.name
                ),
            }),
            Some(_) => Error::Corrupt(format!(
                "table '{}': its owned-file records were truncated",
                self.memory.name
            )),
        })
    }

    /// What is at the records' name, when something is and it was not
    /// opened (a link, another user's file, another build's size).
    fn records_refused(&self) -> Option<String> {
        let table = location::resolve(&self.memory.name).ok()?;
        let path = owned_records::beside(&table);
        let found = std::fs::symlink_metadata(&path).ok()?;
        let owner = self.memory.file()?.metadata().ok()?.uid();
        let expected = Expected {
            owner,
            owner_is: "the table's owner",
            forbidden: 0,
            size: Some(owned_records::size() as u64),
            one_name: false,
        };
        let why = refused_file::mismatch(&path, &found, &expected)
            .unwrap_or_else(|| "of another format (not what this build makes)".to_owned());
        Some(format!("{} is {why}", path.display()))
    }

    fn records_cut_short(&self, e: std::io::Error) -> Error {
        Error::Corrupt(format!(
            "table '{}': its owned-file records cannot be read or written whole ({e}): cut short under this handle?",
            self.memory.name
        ))
    }

    fn lock_hold(&self) -> std::sync::MutexGuard<'_, Option<OwnerHold>> {
        self.memory
            .owner_hold
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// This process's owner record, taken if it has none yet (a forked
    /// child takes its own), recording the groups `groups` gives.
    fn hold(
        &self,
        groups: impl FnOnce() -> Vec<u32>,
    ) -> Result<std::sync::MutexGuard<'_, Option<OwnerHold>>> {
        let mut hold = self.lock_hold();
        let epoch = fork::install();
        if hold.as_ref().is_some_and(|h| h.epoch == epoch) {
            return Ok(hold);
        }
        if let Some(mut inherited) = hold.take() {
            // The parent's: its descriptor already points at /dev/null here.
            inherited.lock = None;
        }
        let records = self.owned_records()?;
        let name = &self.memory.name;
        let groups = groups();
        let own = LockDescriptor::new(
            lock::reopen(records.file())
                .map_err(|e| Error::os(name, "open for the owner lock", e))?,
        );
        for index in 0..PROCESSES {
            // The lock first: a reaper that sees the record held and its
            // lock free knows its holder has ended.
            if !lock::try_lock(&own, owner_lock(index))
                .map_err(|e| Error::os(name, "take an owner lock", e))?
            {
                continue;
            }
            // Held by no live process: the record is ours alone to write
            // (one HELD with its lock free waits for the reaper).
            let corrupt = |e: std::io::Error| self.records_cut_short(e);
            if records.owner(index).map_err(corrupt)?.state != FREE {
                let _ = lock::unlock(&own, owner_lock(index));
                continue;
            }
            let record = OwnerRecord {
                state: HELD,
                pid: std::process::id(),
                uid: process::credentials().0,
                groups: groups.clone(),
            };
            records.write_owner(index, &record).map_err(corrupt)?;
            *hold = Some(OwnerHold {
                epoch,
                index,
                lock: Some(own),
            });
            return Ok(hold);
        }
        Err(Error::Full {
            message: format!(
                "table '{name}': {PROCESSES} processes own files in it already (the limit)"
            ),
            capacity: Some(PROCESSES),
        })
    }
}

/// The allowed directory `path` is directly in, and its file name; or why
/// it cannot be owned.
fn place<'p>(records: &OwnedRecords, path: &'p Path) -> Result<(u32, &'p OsStr)> {
    let refused = |rule: &str| {
        Err(Error::InvalidArgument(format!(
            "cannot own '{}': {rule}",
            path.display()
        )))
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return refused("expected the absolute path of a file");
    };
    if name.len() > NAME_MAX {
        return refused(&format!("its name is {} bytes, expected at most {NAME_MAX}", name.len()));
    }
    if !removal_rules::plain_name(name.as_bytes()) {
        return Err(Error::InvalidArgument(format!(
            "cannot own \"{}\": its name holds a control character, expected none (names are written in the reaper's log)",
            path.as_os_str().as_bytes().escape_ascii()
        )));
    }
    if path.as_os_str().as_bytes().ends_with(b"/") || !path.is_absolute() {
        return refused("expected the absolute path of a file");
    }
    match records.dirs().iter().position(|dir| dir.as_path() == parent) {
        Some(dir) => Ok((dir as u32, name)),
        None => refused(&format!(
            "expected a file directly in an allowed directory ({}), found one in '{}'",
            allowed(records),
            parent.display()
        )),
    }
}

/// The allowed directories, for messages.
fn allowed(records: &OwnedRecords) -> String {
    if let Some(refused) = records.dirs_refused() {
        return format!("none: {refused}");
    }
    match records.dirs() {
        [] => "none: the table's creator allowed none".to_owned(),
        dirs => dirs
            .iter()
            .map(|dir| dir.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The file record among `files` declaring `name` in directory `dir`.
fn find(files: &[FileRecord], dir: u32, name: &OsStr) -> Option<u32> {
    (0..FILES).find(|&f| {
        let record = &files[f as usize];
        record.state == DECLARED && record.dir == dir && record.name == name.as_bytes()
    })
}

/// What an owner record keeps of a declarer's groups: its effective group,
/// then the supplementary groups that own an allowed directory (the only
/// ones the directory rule can ask of), at most [`GROUPS`].
fn groups_for(records: &OwnedRecords, groups: &[u32]) -> Vec<u32> {
    let owning: Vec<u32> = records
        .dirs()
        .iter()
        .filter_map(|dir| same_file::open_dir(dir).ok())
        .filter_map(|handle| same_file::dir_facts(&handle).ok())
        .map(|facts: DirFacts| facts.gid)
        .collect();
    let mut kept: Vec<u32> = groups.first().copied().into_iter().collect();
    for &group in &groups[1.min(groups.len())..] {
        if owning.contains(&group) && !kept.contains(&group) && kept.len() < GROUPS {
            kept.push(group);
        }
    }
    kept
}
