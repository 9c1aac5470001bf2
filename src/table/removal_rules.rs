//! Whom the reaper removes an owned file for: the rules a removal must
//! pass, pure (no file system, no clock), each tested at its edge. The
//! callers gather the facts (`os/same_file.rs`) and the records
//! (`owned_records.rs`); these functions only judge.
//!
//! Anyone who may write a table may write its owned-file records, so a
//! record is a claim: it is believed only as far as who could have
//! written it. Where only root may write the records, a declarer's user is
//! the one the kernel gave it; anywhere else any writer could have written
//! any user into a record, so only files of the table's owner are ever
//! removed, and only where the declarer it names could have removed them
//! itself.

use crate::os::same_file::{DirFacts, Identity};

/// How many directories a table's creator may allow.
pub const MAX_DIRS: usize = 4;
/// The longest name of an owned file or an allowed directory, in bytes
/// (`NAME_MAX`; a directory's whole path).
pub const NAME_MAX: usize = 255;

/// Who declared a file, as its owner record says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Declarer<'a> {
    pub uid: u32,
    /// Its effective group and the supplementary groups that own an
    /// allowed directory, as far as the record holds them.
    pub groups: &'a [u32],
}

/// Who could have written the records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordsTrust {
    /// The owner of the table (and of its records).
    pub table_owner: u32,
    /// Whether only root may write the records: a root-owned table without
    /// group or other write.
    pub root_only: bool,
}

impl RecordsTrust {
    /// The trust of records with owner `uid` and permission bits `mode`.
    pub(crate) fn of(uid: u32, mode: u32) -> RecordsTrust {
        RecordsTrust {
            table_owner: uid,
            root_only: uid == 0 && mode & 0o022 == 0,
        }
    }
}

/// The owner rule: a file of `file_uid` declared by `declarer` may be
/// removed if the declarer's user owns it, or the declarer is root, where
/// only root may write the records; elsewhere only a file of the table's
/// owner declared as the table's owner, and never root's (any writer could
/// have written a root declarer into the records).
pub(crate) fn owner_allows(trust: RecordsTrust, file_uid: u32, declarer: &Declarer<'_>) -> bool {
    if trust.root_only {
        file_uid == declarer.uid || declarer.uid == 0
    } else {
        file_uid == declarer.uid && file_uid == trust.table_owner && declarer.uid != 0
    }
}

/// The directory rule: whether `declarer` could remove, by the
/// directory's permission bits, the name of a file of `file_uid` in a
/// directory with `dir`'s facts: write and search permission in the class
/// the declarer falls in (owner, group, other: the first that matches, as
/// the kernel picks it), and in a sticky directory the file or the
/// directory its own. Root may remove any name. ACLs are not consulted: a
/// directory whose ACL grants more than its bits refuses what the bits
/// refuse.
pub(crate) fn directory_allows(dir: &DirFacts, file_uid: u32, declarer: &Declarer<'_>) -> bool {
    if declarer.uid == 0 {
        return true;
    }
    let class = if dir.uid == declarer.uid {
        dir.mode >> 6
    } else if declarer.groups.contains(&dir.gid) {
        dir.mode >> 3
    } else {
        dir.mode
    };
    let write_and_search = class & 0o3 == 0o3;
    let sticky = dir.mode & libc::S_ISVTX != 0;
    write_and_search && (!sticky || file_uid == declarer.uid || dir.uid == declarer.uid)
}

/// The name rule: one path component (not empty, `.` or `..`, no `/`),
/// at most [`NAME_MAX`] bytes, and no control character (a name is
/// printed in the reaper's log, where a newline or an escape could forge a
/// line).
pub(crate) fn plain_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name != b"."
        && name != b".."
        && !name.iter().any(|&b| b == b'/' || b < 0x20 || b == 0x7f)
}

/// What a declaration recorded of its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Declared {
    pub dev: u64,
    pub ino: u64,
    /// Its birth time in nanoseconds since the epoch; 0 where the file
    /// system keeps none (then only a tmpfs is trusted).
    pub born_ns: u64,
}

impl Declared {
    /// What a declaration records of `found`.
    pub(crate) fn of(found: &Identity) -> Declared {
        Declared {
            dev: found.dev,
            ino: found.ino,
            born_ns: found.born_ns.unwrap_or(0),
        }
    }
}

/// The identity rule: whether a file can be told from a later one given
/// the same inode number: it has a birth time, or it is on a tmpfs (which
/// never gives an inode number twice). Disk file systems reuse inode
/// numbers as soon as a file is removed.
pub(crate) fn identifiable(found: &Identity, dir: &DirFacts) -> bool {
    found.born_ns.is_some_and(|born| born != 0) || dir.tmpfs
}

/// Whether `found`, in a directory with `dir`'s facts, is the file that
/// was `declared`: its device and inode, and its birth time where one was
/// recorded (without one, only on a tmpfs).
pub(crate) fn same_file(declared: &Declared, found: &Identity, dir: &DirFacts) -> bool {
    let born = match declared.born_ns {
        0 => dir.tmpfs,
        born => found.born_ns == Some(born),
    };
    (found.dev, found.ino) == (declared.dev, declared.ino) && born
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_ONLY: RecordsTrust = RecordsTrust {
        table_owner: 0,
        root_only: true,
    };

    fn dir(uid: u32, gid: u32, mode: u32) -> DirFacts {
        DirFacts {
            uid,
            gid,
            mode: libc::S_IFDIR | mode,
            tmpfs: false,
            fs_type: 0xef53,
        }
    }

    fn file(ino: u64, born_ns: Option<u64>) -> Identity {
        Identity {
            dev: 1,
            ino,
            uid: 1000,
            size: 0,
            held: 0,
            born_ns,
        }
    }

    #[test]
    fn records_others_may_write_name_only_the_table_owner_s_files() {
        let shared = RecordsTrust::of(1000, 0o660);
        let as_owner = Declarer {
            uid: 1000,
            groups: &[],
        };
        let as_root = Declarer {
            uid: 0,
            groups: &[],
        };
        assert!(owner_allows(shared, 1000, &as_owner));
        assert!(!owner_allows(shared, 0, &as_root), "a forged root record");
        assert!(!owner_allows(shared, 1001, &as_owner));
        let root_group_writable = RecordsTrust::of(0, 0o660);
        assert!(!root_group_writable.root_only);
        assert!(!owner_allows(root_group_writable, 1000, &as_root));
        assert!(
            !owner_allows(root_group_writable, 0, &as_root),
            "root's own files, in a table others may write"
        );
    }

    #[test]
    fn records_only_root_may_write_believe_a_root_declarer() {
        assert_eq!(RecordsTrust::of(0, 0o644), ROOT_ONLY);
        let as_root = Declarer {
            uid: 0,
            groups: &[],
        };
        let as_user = Declarer {
            uid: 1000,
            groups: &[],
        };
        assert!(owner_allows(ROOT_ONLY, 1000, &as_root));
        assert!(owner_allows(ROOT_ONLY, 1000, &as_user));
        assert!(!owner_allows(ROOT_ONLY, 1001, &as_user));
    }

    #[test]
    fn a_declarer_removes_only_from_a_directory_it_may_write() {
        let nobody = Declarer {
            uid: 65534,
            groups: &[65534],
        };
        // Root's 0755 directory: no write for others.
        assert!(!directory_allows(&dir(0, 0, 0o755), 65534, &nobody));
        // Its own directory, and one its group may write.
        assert!(directory_allows(&dir(65534, 0, 0o755), 65534, &nobody));
        assert!(directory_allows(&dir(0, 65534, 0o775), 65534, &nobody));
        // Write without search is not enough.
        assert!(!directory_allows(&dir(0, 65534, 0o725), 65534, &nobody));
        // The owner class decides for the owner, even when others may more.
        assert!(!directory_allows(&dir(65534, 0, 0o577), 65534, &nobody));
        // A sticky world-writable directory: only its own files.
        assert!(directory_allows(&dir(0, 0, 0o1777), 65534, &nobody));
        assert!(!directory_allows(&dir(0, 0, 0o1777), 1000, &nobody));
        // Root removes any name.
        let root = Declarer {
            uid: 0,
            groups: &[],
        };
        assert!(directory_allows(&dir(1000, 1000, 0o700), 1000, &root));
    }

    #[test]
    fn a_name_is_one_plain_component_without_control_characters() {
        assert!(plain_name(b"psm_0af3"));
        assert!(plain_name("ségment".as_bytes()));
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\nb", b"a\x1b[0m", b"a\x7f", b"a\0"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
        assert!(!plain_name(&[b'x'; NAME_MAX + 1]));
    }

    #[test]
    fn a_reused_inode_number_is_another_file_where_birth_times_differ() {
        let disk = dir(0, 0, 0o1777);
        let first = file(12, Some(1_000));
        let declared = Declared::of(&first);
        assert!(same_file(&declared, &first, &disk));
        assert!(!same_file(&declared, &file(12, Some(2_000)), &disk));
        assert!(!same_file(&declared, &file(12, None), &disk));
        assert!(!same_file(&declared, &file(13, Some(1_000)), &disk));
    }

    #[test]
    fn without_a_birth_time_only_a_tmpfs_tells_files_apart() {
        let disk = dir(0, 0, 0o1777);
        let tmpfs = DirFacts {
            tmpfs: true,
            ..disk
        };
        let found = file(12, None);
        assert!(!identifiable(&found, &disk));
        assert!(identifiable(&found, &tmpfs));
        assert!(identifiable(&file(12, Some(5)), &disk));
        let declared = Declared::of(&found);
        assert!(!same_file(&declared, &found, &disk));
        assert!(same_file(&declared, &found, &tmpfs));
    }
}
