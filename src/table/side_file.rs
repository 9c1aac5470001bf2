//! The files beside a shared table (its death words, its owned-file
//! records): made with the table, with its mode, never through a link; and
//! opened only when they are what this build makes (a regular file of the
//! table's owner, of the size expected), else left alone. A name that
//! cannot be made is refused naming the file, what is there and who may
//! remove it (`os/refused_file.rs`).

use crate::os::refused_file::{self, Expected};
use std::fs::{File, OpenOptions, Permissions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Makes the file at `path`, `size` bytes of zeros with permissions
/// `mode`. A name, never followed: a link planted there is removed, not
/// its target.
///
/// # Errors
///
/// [`std::io::ErrorKind::PermissionDenied`] naming the file, what the name
/// still holds and who may remove it, when something this process may not
/// remove is there (another user's, in a sticky directory); other OS
/// errors with the path.
pub(crate) fn create(path: &Path, size: usize, mode: u32) -> std::io::Result<File> {
    let removed = std::fs::remove_file(path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            let cause = removed.err().filter(|r| r.kind() != ErrorKind::NotFound);
            refused_file::create_failed(path, cause.unwrap_or(e))
        })?;
    file.set_permissions(Permissions::from_mode(mode))?;
    file.set_len(size as u64)?;
    Ok(file)
}

/// The file at `path` if it is a regular file of `table_file`'s owner and
/// `size` bytes long (a link is never followed).
pub(crate) fn open(path: &Path, table_file: &File, size: usize) -> Option<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let (found, table_meta) = (file.metadata().ok()?, table_file.metadata().ok()?);
    let expected = Expected {
        owner: table_meta.uid(),
        owner_is: "the table's owner",
        forbidden: 0,
        size: Some(size as u64),
        one_name: false,
    };
    refused_file::mismatch(path, &found, &expected)
        .is_none()
        .then_some(file)
}
