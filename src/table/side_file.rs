//! The files beside a shared table (its death words, its owned-file
//! records): made with the table, with its mode, never through a link; and
//! opened only when they are what this build makes (a regular file of the
//! table's owner, of the size expected), else left alone.

use std::fs::{File, OpenOptions, Permissions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Makes the file at `path`, `size` bytes of zeros with permissions
/// `mode`. A name, never followed: a link planted there is removed, not
/// its target.
pub(crate) fn create(path: &Path, size: usize, mode: u32) -> std::io::Result<File> {
    let _ = std::fs::remove_file(path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
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
    let fits = found.file_type().is_file()
        && found.uid() == table_meta.uid()
        && found.len() == size as u64;
    fits.then_some(file)
}
