//! Files that livereg keeps beside a table, in a directory anyone may write
//! to (`/dev/shm`): opened without following a symbolic link, and accepted
//! only if no other user can have planted them or can read them.
//!
//! The kernel's own guards (`fs.protected_symlinks`, `fs.protected_regular`)
//! are off on many machines and in many containers, so they are not relied
//! on.

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
/// [`io::ErrorKind::PermissionDenied`] naming the path, what was expected and
/// what was found (a symbolic link, another kind of file, another owner, a
/// mode open to others, a second name); other OS errors as they come.
pub(crate) fn open_or_create(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| refused_link(path, e))?;
    // SAFETY:
    // - `geteuid` has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    check(path, &file, own, 0o077)?;
    Ok(file)
}

/// Opens `path` read-only without following a symbolic link, and accepts it
/// only if it is a regular file with one name, owned by `owner`, that no one
/// but its owner may write.
///
/// # Errors
///
/// As [`open_or_create`]; [`io::ErrorKind::NotFound`] if it does not exist.
pub(crate) fn open_owned_by(path: &Path, owner: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| refused_link(path, e))?;
    check(path, &file, owner, 0o022)?;
    Ok(file)
}

/// `O_NOFOLLOW` on a symbolic link fails with `ELOOP`: said in words.
fn refused_link(path: &Path, error: io::Error) -> io::Error {
    if error.raw_os_error() == Some(libc::ELOOP) {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symbolic link, expected a regular file: refusing to follow it \
                 (remove it if it is not yours)",
                path.display()
            ),
        )
    } else {
        error
    }
}

/// Refuses an opened file that is not a regular file of one name, owned by
/// `owner`, with none of the `forbidden` mode bits.
fn check(path: &Path, file: &File, owner: u32, forbidden: u32) -> io::Result<()> {
    let metadata = file.metadata()?;
    let found = if !metadata.file_type().is_file() {
        Some("not a regular file".to_owned())
    } else if metadata.uid() != owner {
        Some(format!(
            "owned by uid {}, expected uid {owner}",
            metadata.uid()
        ))
    } else if metadata.mode() & forbidden != 0 {
        Some(format!(
            "of mode {:04o}, expected none of {forbidden:04o}",
            metadata.mode() & 0o7777
        ))
    } else if metadata.nlink() != 1 {
        Some(format!(
            "linked under {} names, expected 1",
            metadata.nlink()
        ))
    } else {
        None
    };
    match found {
        None => Ok(()),
        Some(found) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is {found}: refusing a file another user may have planted \
                 (remove it if it is not yours)",
                path.display()
            ),
        )),
    }
}
