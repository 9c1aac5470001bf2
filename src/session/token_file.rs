//! The one reading of a token file, shared by the CLI (`--token-file`), the
//! Python package (`livereg.read_token_file`, which LMCache's server module
//! and the engine plugin use) and any Rust caller, so a file that admits
//! one of them admits them all.
//!
//! The token is the file's first line, with the whitespace around it (the
//! line ending, a `\r`, spaces, tabs) removed; anything after the first
//! line is ignored. The file may be a symbolic link (Kubernetes mounts its
//! secrets so), but what it names must be a regular file that others than
//! its owner and group cannot read: a token everyone on the host can read
//! admits everyone.

use crate::error::{Error, Result};
use crate::session::wire::TOKEN_MAX;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The most of a token file read: its first line must end well within it.
const READ_MAX: u64 = 64 * 1024;

/// Reads the token in the file at `path`: its first line, trimmed.
///
/// # Errors
///
/// - [`Error::NotFound`]: no such file.
/// - [`Error::Permission`]: it cannot be read, or others can read it (mode
///   `o+r`; expected 0600, 0640 or 0440).
/// - [`Error::InvalidArgument`]: not a regular file, an empty first line,
///   or a token over 256 bytes.
/// - [`Error::Io`]: another OS failure.
///
/// # Examples
///
/// ```
/// use std::os::unix::fs::PermissionsExt;
/// let path = std::env::temp_dir().join(format!("token-doc-{}", std::process::id()));
/// std::fs::write(&path, "s3cret\nanything after the first line is ignored\n")?;
/// std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
/// assert_eq!(livereg::read_token_file(&path)?, b"s3cret");
/// std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_token_file(path: &Path) -> Result<Vec<u8>> {
    let shown = path.display();
    let failed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::NotFound(format!("token file {shown}: no such file ({e})"))
        }
        std::io::ErrorKind::PermissionDenied => {
            Error::Permission(format!("token file {shown}: cannot read it ({e})"))
        }
        _ => Error::Io {
            context: format!("token file {shown}"),
            source: e,
        },
    };
    let file = std::fs::File::open(path).map_err(failed)?;
    let metadata = file.metadata().map_err(failed)?;
    if !metadata.is_file() {
        return Err(Error::InvalidArgument(format!(
            "token file {shown} is not a regular file, expected a file holding the token"
        )));
    }
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o004 != 0 {
        return Err(Error::Permission(format!(
            "token file {shown} is readable by everyone (mode {mode:04o}), expected a mode \
             others cannot read (0600, 0640 or 0440): chmod o-r {shown}"
        )));
    }
    let mut bytes = Vec::new();
    file.take(READ_MAX)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    let first_line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let token = first_line.trim_ascii();
    if token.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "token file {shown} has an empty first line, expected the token there"
        )));
    }
    if token.len() > TOKEN_MAX {
        return Err(Error::InvalidArgument(format!(
            "token file {shown}: the token is {} bytes, expected at most {TOKEN_MAX}",
            token.len()
        )));
    }
    Ok(token.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token file of `mode` holding `text`, removed on drop.
    struct TokenFile(std::path::PathBuf);

    impl TokenFile {
        fn new(tag: &str, text: &[u8], mode: u32) -> TokenFile {
            let path = std::env::temp_dir().join(format!(
                "livereg-token-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            TokenFile(path)
        }
    }

    impl Drop for TokenFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // reads files: Miri's isolation has no file system
    fn the_first_line_trimmed_is_the_token() {
        for (tag, text) in [
            ("plain", &b"abc"[..]),
            ("newline", b"abc\n"),
            ("crlf", b"abc\r\n"),
            ("spaces", b"  abc \t\n"),
            ("second-line", b"abc\nsomething else\n"),
        ] {
            let file = TokenFile::new(tag, text, 0o600);
            assert_eq!(read_token_file(&file.0).unwrap(), b"abc", "{tag}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // reads files: Miri's isolation has no file system
    fn a_file_others_can_read_an_empty_one_or_a_long_one_is_refused() {
        let open = TokenFile::new("open", b"abc\n", 0o644);
        let refused = read_token_file(&open.0).unwrap_err();
        assert!(matches!(refused, Error::Permission(_)), "{refused}");
        assert!(refused.to_string().contains("mode 0644"), "{refused}");
        let empty = TokenFile::new("empty", b"\nabc\n", 0o600);
        let refused = read_token_file(&empty.0).unwrap_err();
        assert!(matches!(refused, Error::InvalidArgument(_)), "{refused}");
        let long = TokenFile::new("long", &[b'x'; TOKEN_MAX + 1], 0o600);
        let refused = read_token_file(&long.0).unwrap_err();
        assert!(refused.to_string().contains("at most 256"), "{refused}");
        let missing = read_token_file(Path::new("/nonexistent/token")).unwrap_err();
        assert!(matches!(missing, Error::NotFound(_)), "{missing}");
    }
}
