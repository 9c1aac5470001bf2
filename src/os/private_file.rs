//! Files that livereg keeps beside a table, in a directory anyone may write
//! to (`/dev/shm`): opened without following a symbolic link, and accepted
//! only if no other user can have planted them or can read them.
//!
//! The kernel's own guards (`fs.protected_symlinks`, `fs.protected_regular`)
//! are off on many machines and in many containers, so they are not relied
//! on.

use crate::os::refused_file::{self, Expected};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading and writing, creating it with mode 0600 if it
/// does not exist, and checks what was opened: a regular file with one
/// name, owned by this process's effective user, that nobody else may read
/// or write.
///
/// # Errors
///
/// [`io::ErrorKind::PermissionDenied`] naming the path, what was expected,
/// what was found (a symbolic link, another kind of file, another owner, a
/// mode open to others, a second name; looked at again with `lstat` when
/// the open itself failed) and who may remove it; other OS errors with the
/// path.
pub(crate) fn open_or_create(path: &Path) -> io::Result<File> {
    // SAFETY:
    // - `geteuid` has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    let expected = Expected {
        owner: own,
        owner_is: "this process's user, who keeps it",
        forbidden: 0o077,
        size: None,
        one_name: true,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| refused_file::open_failed(path, e, &expected))?;
    check(path, &file, &expected)?;
    Ok(file)
}

/// Opens `path` read-only without following a symbolic link, and accepts it
/// only if it is a regular file with one name, owned by `owner` (the
/// table's owner), that no one but its owner may write.
///
/// # Errors
///
/// As [`open_or_create`]; [`io::ErrorKind::NotFound`] if it does not exist.
pub(crate) fn open_owned_by(path: &Path, owner: u32) -> io::Result<File> {
    let expected = Expected {
        owner,
        owner_is: "the table's owner",
        forbidden: 0o022,
        size: None,
        one_name: true,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| refused_file::open_failed(path, e, &expected))?;
    check(path, &file, &expected)?;
    Ok(file)
}

/// Refuses an opened file that is not what `expected` wants.
fn check(path: &Path, file: &File, expected: &Expected<'_>) -> io::Result<()> {
    let metadata = file.metadata()?;
    match refused_file::mismatch(path, &metadata, expected) {
        None => Ok(()),
        Some(found) => Err(refused_file::refused(path, &found, metadata.uid())),
    }
}
