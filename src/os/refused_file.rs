//! Why a file livereg keeps beside a table was refused, in words: which
//! file, what its name holds (looked at with `lstat`: a link is never
//! followed), what was expected of it, and what to do.
//!
//! `/dev/shm` is writable by everyone, so another user can make a name
//! there before livereg does: a link to a file of someone else's, or a file
//! of their own that livereg would then trust. Such a file is never used;
//! the refusal says whose it is, so that whoever may remove it (its owner,
//! or root: the directory is sticky) can.

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// What a file beside a table must be.
pub(crate) struct Expected<'a> {
    /// The user who must own it.
    pub owner: u32,
    /// Who that user is, in words (`the table's owner`).
    pub owner_is: &'a str,
    /// Mode bits it must not have.
    pub forbidden: u32,
    /// Its length in bytes, where one is expected.
    pub size: Option<u64>,
    /// Whether it must have one name only (a second name would be another
    /// user's way to the same file).
    pub one_name: bool,
}

/// What the file `found` at `path` is, where it is not what `expected`
/// wants (`None`: it is).
pub(crate) fn mismatch(path: &Path, found: &Metadata, expected: &Expected<'_>) -> Option<String> {
    let owner = found.uid();
    let wanted = format!("uid {} ({})", expected.owner, expected.owner_is);
    let mode = found.mode() & 0o7777;
    if !found.file_type().is_file() {
        Some(format!(
            "{}, expected a regular file of {wanted}",
            what(path, found)
        ))
    } else if owner != expected.owner {
        Some(format!("a regular file owned by uid {owner}, expected {wanted}"))
    } else if mode & expected.forbidden != 0 {
        Some(format!(
            "a regular file of mode {mode:04o}, expected none of {:04o} (no other user may use it)",
            expected.forbidden
        ))
    } else if expected.one_name && found.nlink() != 1 {
        Some(format!(
            "a regular file linked under {} names, expected 1",
            found.nlink()
        ))
    } else {
        let size = expected.size.filter(|&size| size != found.len())?;
        Some(format!(
            "a regular file of {} bytes, expected {size} (not what this build makes)",
            found.len()
        ))
    }
}

/// The refusal of the file at `path`, which is `found` (from
/// [`mismatch`]): a [`io::ErrorKind::PermissionDenied`] that names it and
/// says who may remove it.
pub(crate) fn refused(path: &Path, found: &str, owner: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is {found}: refused and left alone (another user may have planted it); {}",
            path.display(),
            remedy(path, owner)
        ),
    )
}

/// `error`, from opening the file at `path`, said with what the name
/// holds when that is not what `expected` wants (a link opened with
/// `O_NOFOLLOW`, another user's file in a sticky directory); otherwise
/// the error with the path.
pub(crate) fn open_failed(path: &Path, error: io::Error, expected: &Expected<'_>) -> io::Error {
    match std::fs::symlink_metadata(path) {
        Ok(found) => match mismatch(path, &found, expected) {
            Some(why) => refused(path, &why, found.uid()),
            None => with_path(path, error),
        },
        Err(_) => with_path(path, error),
    }
}

/// `error`, from creating the file at `path` after trying to remove
/// whatever was there (`error` is the removal's when that failed), said
/// with what the name still holds: a file this process may not remove
/// (another user's, in a sticky directory).
pub(crate) fn create_failed(path: &Path, error: io::Error) -> io::Error {
    match std::fs::symlink_metadata(path) {
        Ok(found) => {
            // SAFETY:
            // - `geteuid` has no preconditions and cannot fail.
            let user = unsafe { libc::geteuid() };
            let why = format!(
                "{} that uid {user} may not remove ({error}), expected nothing there",
                what(path, &found)
            );
            refused(path, &why, found.uid())
        }
        Err(_) => with_path(path, error),
    }
}

/// The kind of file `found` is and its owner: `a symbolic link owned by
/// uid 65534 (to /etc/passwd)`.
fn what(path: &Path, found: &Metadata) -> String {
    let kind = found.file_type();
    let owned = format!("owned by uid {}", found.uid());
    if kind.is_symlink() {
        return match std::fs::read_link(path) {
            Ok(target) => format!("a symbolic link {owned} (to {})", target.display()),
            Err(_) => format!("a symbolic link {owned}"),
        };
    }
    let kind = if kind.is_dir() {
        "a directory".to_owned()
    } else if kind.is_fifo() {
        "a FIFO".to_owned()
    } else if kind.is_socket() {
        "a socket".to_owned()
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device".to_owned()
    } else {
        "a regular file".to_owned()
    };
    format!("{kind} {owned}")
}

/// What to do about a refused file of `owner`'s: remove it, as whoever
/// may, and start again.
fn remedy(path: &Path, owner: u32) -> String {
    // SAFETY:
    // - `geteuid` has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    let who = match owner {
        _ if owner == user => String::new(),
        0 => " as root".to_owned(),
        _ => format!(" as uid {owner} or root"),
    };
    format!(
        "remove it (it is not the table's){who}: rm '{}', and start again",
        path.display()
    )
}

fn with_path(path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn expected() -> Expected<'static> {
        Expected {
            // SAFETY:
            // - `geteuid` has no preconditions and cannot fail.
            owner: unsafe { libc::geteuid() },
            owner_is: "the table's owner",
            forbidden: 0o022,
            size: Some(16),
            one_name: true,
        }
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("livereg-refused-{tag}-{}", std::process::id()))
    }

    #[test]
    #[cfg_attr(miri, ignore)] // needs the file system
    fn a_link_is_named_with_its_target_and_never_followed() {
        let (link, target) = (scratch("link"), scratch("link-target"));
        std::fs::write(&target, [0u8; 16]).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let found = std::fs::symlink_metadata(&link).unwrap();
        let why = mismatch(&link, &found, &expected());
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(&target);
        let why = why.expect("a link refused");
        assert!(why.starts_with("a symbolic link owned by uid "), "{why}");
        assert!(why.contains(&target.display().to_string()), "{why}");
        assert!(why.contains("expected a regular file"), "{why}");
    }

    #[test]
    #[cfg_attr(miri, ignore)] // needs the file system
    fn the_mode_and_the_size_are_named_with_what_was_expected() {
        let file = scratch("mode");
        std::fs::write(&file, [0u8; 16]).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let writable = mismatch(&file, &std::fs::metadata(&file).unwrap(), &expected());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&file, [0u8; 3]).unwrap();
        let short = mismatch(&file, &std::fs::metadata(&file).unwrap(), &expected());
        std::fs::write(&file, [0u8; 16]).unwrap();
        let right = mismatch(&file, &std::fs::metadata(&file).unwrap(), &expected());
        let _ = std::fs::remove_file(&file);
        assert!(writable.unwrap().contains("mode 0666, expected none of 0022"));
        assert!(short.unwrap().contains("3 bytes, expected 16"));
        assert_eq!(right, None);
    }

    #[test]
    fn a_refusal_names_the_file_and_who_may_remove_it() {
        let path = Path::new("/dev/shm/x.sessions");
        let refusal = refused(path, "a regular file owned by uid 65534", 65534).to_string();
        assert!(refusal.starts_with("/dev/shm/x.sessions is a regular file owned by uid 65534"));
        assert!(
            refusal.contains(
                "remove it (it is not the table's) as uid 65534 or root: rm '/dev/shm/x.sessions', and start again"
            ),
            "{refusal}"
        );
    }
}
