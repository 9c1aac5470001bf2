//! Where a table lives: a POSIX shared-memory name or a file path.

use crate::error::{Error, Result};
use std::path::PathBuf;

/// Longest shared-memory name.
const NAME_MAX: usize = 200;

/// The directory where Linux keeps POSIX shared-memory objects:
/// `shm_open("/NAME")` opens `/dev/shm/NAME`.
const SHM_DIR: &str = "/dev/shm";

/// Resolves a table name to the file behind it.
///
/// A name without `/` is a POSIX shared-memory name of 1–200 characters from
/// `[A-Za-z0-9._-]` (not `.` or `..`); C programs reach it with
/// `shm_open("/NAME")`. A name with a `/` is a file path, used as given.
///
/// # Errors
///
/// [`Error::InvalidArgument`] naming the first offending character, or the
/// length found.
pub(crate) fn resolve(name: &str) -> Result<PathBuf> {
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(Error::InvalidArgument(format!(
            "table name '{name}' is {} characters long, expected 1 to {NAME_MAX}",
            name.len()
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-".contains(*c)))
    {
        return Err(Error::InvalidArgument(format!(
            "table name '{name}' contains {bad:?}, expected only A-Z a-z 0-9 . _ - (or a path with '/')"
        )));
    }
    if name == "." || name == ".." {
        return Err(Error::InvalidArgument(format!(
            "table name '{name}' is reserved"
        )));
    }
    Ok(PathBuf::from(SHM_DIR).join(name))
}

/// The file beside a table's where a listener keeps its sessions' records
/// (`NAME.sessions`): removed with the table.
pub(crate) fn sessions_beside(table: &std::path::Path) -> PathBuf {
    let mut path = table.as_os_str().to_owned();
    path.push(".sessions");
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_live_in_dev_shm() {
        assert_eq!(
            resolve("gpu-workers.v1_a").unwrap(),
            PathBuf::from("/dev/shm/gpu-workers.v1_a")
        );
    }

    #[test]
    fn names_with_a_slash_are_paths() {
        assert_eq!(resolve("./t/x").unwrap(), PathBuf::from("./t/x"));
    }

    #[test]
    fn bad_names_are_refused_with_the_reason() {
        for (name, says) in [
            ("", "0 characters"),
            ("a b", "' '"),
            ("..", "reserved"),
            ("é", "'é'"),
        ] {
            let message = resolve(name).unwrap_err().to_string();
            assert!(message.contains(says), "{name:?}: {message}");
        }
        assert!(resolve(&"x".repeat(201)).is_err());
        assert!(resolve(&"x".repeat(200)).is_ok());
    }
}
