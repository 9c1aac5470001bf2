//! The built `livereg` run as another user, from wherever the repository was
//! cloned. The build's own binary sits under the clone, which may be a
//! directory only its owner can enter (root's home is mode 0700): another
//! user could not execute it there. Its copy in a fresh temporary directory
//! of mode 0755 is made once per test process and removed when the process
//! exits.
#![allow(dead_code)] // each test binary uses what it needs

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The directory holding the copy, for the exit hook.
static COPY_DIR: OnceLock<PathBuf> = OnceLock::new();

/// A command running the built `livereg` as user `uid` in group `uid`
/// (no supplementary groups: std drops them when root sets a uid).
pub fn livereg_as(uid: u32) -> Command {
    let mut command = Command::new(livereg_others_can_run());
    command.uid(uid).gid(uid);
    command
}

/// The path of a copy of the built `livereg` that every user may execute:
/// every directory above it searchable by all, the file mode 0755.
///
/// # Panics
///
/// If the copy cannot be made, or the temporary directory sits under one
/// that others may not enter (naming it).
pub fn livereg_others_can_run() -> &'static Path {
    static COPY: OnceLock<PathBuf> = OnceLock::new();
    COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!(
            "livereg-test-bin-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        COPY_DIR.set(dir.clone()).unwrap();
        // SAFETY:
        // - `remove_copy` is an `extern "C" fn()` that never unwinds (it
        //   ignores every error), as `atexit` requires.
        // - registered once: `get_or_init` runs this closure once.
        unsafe { libc::atexit(remove_copy) };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join("livereg");
        std::fs::copy(env!("CARGO_BIN_EXE_livereg"), &copy)
            .unwrap_or_else(|e| panic!("copying the built livereg to {}: {e}", copy.display()));
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        for above in dir.ancestors().skip(1) {
            let mode = std::fs::metadata(above).unwrap().mode();
            assert!(
                mode & 0o001 != 0,
                "{} (mode {:o}) keeps other users from {}: set TMPDIR to a directory all may enter",
                above.display(),
                mode & 0o7777,
                copy.display()
            );
        }
        copy
    })
}

/// Removes the copy and its directory at process exit.
extern "C" fn remove_copy() {
    if let Some(dir) = COPY_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
