//! The directories a table's creator allowed owned files in: a small file
//! beside the table (`NAME.owned-dirs`) that only the table's owner may
//! write, whatever the table's mode. The owned-file records themselves are
//! written by every process that maps the table, so where the reaper may
//! remove can never come from them: a declaration names one of these
//! directories by its index, and the reaper resolves it here.
//!
//! Its text: the line `livereg owned-file directories 1`, then one
//! absolute path a line, at most [`MAX_DIRS`]. It is read (never mapped)
//! and believed only if it is a regular file, not a link, of the table's
//! owner, and writable by no one else; otherwise no directory is allowed
//! and the reason is kept for the messages.

use crate::os::refused_file;
use crate::table::removal_rules::{MAX_DIRS, NAME_MAX};
use std::ffi::OsString;
use std::fs::{File, OpenOptions, Permissions};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

const FIRST_LINE: &str = "livereg owned-file directories 1";
/// The largest file believed: the first line and four names of
/// [`NAME_MAX`] bytes fit.
const MAX_SIZE: u64 = 2048;

/// The allowed directories, or why none is.
#[derive(Clone, Debug, Default)]
pub(crate) struct AllowedDirs {
    pub dirs: Vec<PathBuf>,
    /// Why the file was not believed (no directory is allowed then).
    pub refused: Option<String>,
}

/// The file beside the table at `table`.
pub(crate) fn beside(table: &Path) -> PathBuf {
    let mut path = table.as_os_str().to_owned();
    path.push(".owned-dirs");
    PathBuf::from(path)
}

/// Writes the list beside the table at `table`: the table's `mode`
/// without group or other write. A link planted at the name is removed,
/// never followed.
pub(crate) fn write(table: &Path, dirs: &[PathBuf], mode: u32) -> std::io::Result<()> {
    let path = beside(table);
    let mode = mode & 0o644;
    let removed = std::fs::remove_file(&path);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            let cause = removed
                .err()
                .filter(|r| r.kind() != std::io::ErrorKind::NotFound);
            refused_file::create_failed(&path, cause.unwrap_or(e))
        })?;
    file.set_permissions(Permissions::from_mode(mode))?;
    let mut text = format!("{FIRST_LINE}\n").into_bytes();
    for dir in dirs {
        text.extend(dir.as_os_str().as_bytes());
        text.push(b'\n');
    }
    file.write_all(&text)
}

/// The list beside the table at `table`, believed only if it is what
/// [`write`] makes, of `table_file`'s owner.
pub(crate) fn read(table: &Path, table_file: &File) -> AllowedDirs {
    let path = beside(table);
    match believed(&path, table_file) {
        Ok(dirs) => AllowedDirs {
            dirs,
            refused: None,
        },
        Err(why) => AllowedDirs {
            dirs: Vec::new(),
            refused: Some(format!(
                "the allowed directories' file {} {why}: no directory is allowed",
                path.display()
            )),
        },
    }
}

fn believed(path: &Path, table_file: &File) -> Result<Vec<PathBuf>, String> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "is a symbolic link, expected a regular file (never followed)".to_owned(),
            Some(libc::ENOENT) => "is missing (the table was made by an earlier build, or it was removed)".to_owned(),
            _ => format!("cannot be opened: {e}"),
        })?;
    let (meta, table) = (
        file.metadata().map_err(|e| format!("cannot be looked at: {e}"))?,
        table_file
            .metadata()
            .map_err(|e| format!("cannot be checked against the table: {e}"))?,
    );
    if !meta.file_type().is_file() {
        return Err("is not a regular file".to_owned());
    }
    if meta.uid() != table.uid() {
        return Err(format!(
            "belongs to uid {}, expected the table's owner (uid {})",
            meta.uid(),
            table.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "may be written by its group or others (mode {:o}), expected by its owner only",
            meta.mode() & 0o777
        ));
    }
    if meta.len() > MAX_SIZE {
        return Err(format!("is {} bytes, expected at most {MAX_SIZE}", meta.len()));
    }
    let mut text = Vec::new();
    Read::by_ref(&mut file)
        .take(MAX_SIZE)
        .read_to_end(&mut text)
        .map_err(|e| format!("cannot be read: {e}"))?;
    parse(&text)
}

/// The directories in `text`, or what is wrong with it.
fn parse(text: &[u8]) -> Result<Vec<PathBuf>, String> {
    let mut lines = text.strip_suffix(b"\n").unwrap_or(text).split(|&b| b == b'\n');
    if lines.next() != Some(FIRST_LINE.as_bytes()) {
        return Err(format!("does not start with '{FIRST_LINE}'"));
    }
    let dirs: Vec<PathBuf> = lines
        .map(|line| PathBuf::from(OsString::from_vec(line.to_vec())))
        .collect();
    if dirs.len() > MAX_DIRS {
        return Err(format!("names {} directories, expected at most {MAX_DIRS}", dirs.len()));
    }
    match dirs.iter().find(|dir| !usable(dir)) {
        Some(dir) => Err(format!(
            "names '{}', expected an absolute path of at most {NAME_MAX} bytes without '..'",
            dir.display()
        )),
        None => Ok(dirs),
    }
}

/// An absolute path of at most [`NAME_MAX`] bytes without `..`, a
/// newline or a NUL: what a creator may allow.
pub(crate) fn usable(dir: &Path) -> bool {
    let bytes = dir.as_os_str().as_bytes();
    dir.is_absolute()
        && bytes.len() <= NAME_MAX
        && !bytes.contains(&b'\n')
        && !bytes.contains(&0)
        && dir.components().all(|c| !matches!(c, Component::ParentDir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_write_makes_parses_back() {
        let text = format!("{FIRST_LINE}\n/dev/shm\n/var/lib/engine\n");
        assert_eq!(
            parse(text.as_bytes()).unwrap(),
            vec![PathBuf::from("/dev/shm"), PathBuf::from("/var/lib/engine")]
        );
        assert_eq!(parse(format!("{FIRST_LINE}\n").as_bytes()).unwrap(), Vec::<PathBuf>::new());
    }

    #[test]
    fn anything_else_is_refused_naming_what_was_found() {
        assert!(parse(b"/dev/shm\n").unwrap_err().contains("does not start"));
        let upward = format!("{FIRST_LINE}\n/dev/shm/../etc\n");
        assert!(parse(upward.as_bytes()).unwrap_err().contains("/dev/shm/../etc"));
        let relative = format!("{FIRST_LINE}\nshm\n");
        assert!(parse(relative.as_bytes()).is_err());
        let five = format!("{FIRST_LINE}\n/a\n/b\n/c\n/d\n/e\n");
        assert!(parse(five.as_bytes()).unwrap_err().contains("5 directories"));
    }
}
