//! A file named in a directory, looked at and removed without following
//! any link (`statx(AT_SYMLINK_NOFOLLOW)`, `unlinkat` relative to the
//! directory's descriptor), and only while the name still holds the file
//! that was seen: its device, inode and birth time.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What `stat` says of a regular file: who it is and whose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    /// Its size in bytes, and the bytes it holds (`st_blocks` × 512).
    pub size: u64,
    pub held: u64,
    /// Its birth time in nanoseconds since the epoch (`STATX_BTIME`), where
    /// the file system keeps one: with the device and inode, what tells a
    /// file from a later one given the same inode number.
    pub born_ns: Option<u64>,
}

/// What `fstat` and `fstatfs` say of a directory: whose it is, its mode,
/// and whether it is a tmpfs (which never gives an inode number twice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirFacts {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub tmpfs: bool,
    /// The file system's type (`statfs.f_type`), for messages.
    pub fs_type: u64,
}

/// What a name in a directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    Missing,
    /// A link, a directory, a device, a socket: never ours to remove.
    NotRegular,
    File(Identity),
}

/// The outcome of [`remove_if_same`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    Removed(Identity),
    /// The name holds nothing (removed by someone else: done).
    Missing,
    /// The name holds another file than the one expected, or no regular
    /// file: left alone.
    Replaced,
}

/// The directory at `dir`, opened to look in (`O_PATH`: no read access
/// needed, nothing opened through it but by name), following no link on
/// the way (`openat2` with `RESOLVE_NO_SYMLINKS`; on a kernel before 5.6,
/// `open`, which follows the links of the creator's own configuration).
pub(crate) fn open_dir(dir: &Path) -> io::Result<File> {
    let path = c_string(dir.as_os_str())?;
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: an all-zero `open_how` is valid (no flags, no mode, no
    // resolve restrictions) before the fields are set.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: `path` is a NUL-terminated string and `how` a valid
    // `open_how` of the size passed, both outliving the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    } as i32;
    let fd = match fd {
        -1 if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) => {
            // SAFETY: `path` is a NUL-terminated string outliving the call.
            unsafe { libc::open(path.as_ptr(), flags) }
        }
        fd => fd,
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `statx(dir, name, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS | STATX_BTIME)`:
/// what `name` (one path component) holds in `dir`, the name itself looked
/// at, never what a link points to.
pub(crate) fn look(dir: &File, name: &OsStr) -> io::Result<Found> {
    let name = c_string(name)?;
    // SAFETY: an all-zero `statx` is a valid value to be written over.
    let mut stat: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open descriptor, `name` a NUL-terminated string
    // and `stat` a writable `struct statx`, all outliving the call.
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_SYNC_AS_STAT,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut stat,
        )
    };
    if rc != 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOENT) => Ok(Found::Missing),
            _ => Err(error),
        };
    }
    if u32::from(stat.stx_mode) & libc::S_IFMT != libc::S_IFREG {
        return Ok(Found::NotRegular);
    }
    let born_ns = (stat.stx_mask & libc::STATX_BTIME != 0).then(|| {
        (stat.stx_btime.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(u64::from(stat.stx_btime.tv_nsec))
    });
    Ok(Found::File(Identity {
        dev: libc::makedev(stat.stx_dev_major, stat.stx_dev_minor),
        ino: stat.stx_ino,
        uid: stat.stx_uid,
        size: stat.stx_size,
        held: stat.stx_blocks * 512,
        born_ns,
    }))
}

/// `fstat(dir)` and `fstatfs(dir)`: the directory's owner, group, mode and
/// file system.
pub(crate) fn dir_facts(dir: &File) -> io::Result<DirFacts> {
    // SAFETY: an all-zero `statfs` is a valid value to be written over.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open descriptor (`O_PATH` is enough for
    // `fstatfs` since Linux 3.12) and `fs` a writable `struct statfs`.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), &mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let meta = dir.metadata()?;
    Ok(DirFacts {
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode(),
        tmpfs: fs.f_type as u64 == libc::TMPFS_MAGIC as u64,
        fs_type: fs.f_type as u64,
    })
}

/// Removes `name` from `dir` if it still holds a regular file that
/// `is_the_one` accepts (its identity: the file declared, of an owner the
/// rules allow). Between the look and the removal only the file's owner
/// (or the directory's) can put another file under the name of a sticky
/// directory such as `/dev/shm`.
pub(crate) fn remove_if_same(
    dir: &File,
    name: &OsStr,
    is_the_one: impl FnOnce(&Identity) -> bool,
) -> io::Result<Removal> {
    let identity = match look(dir, name)? {
        Found::Missing => return Ok(Removal::Missing),
        Found::File(identity) if is_the_one(&identity) => identity,
        Found::File(_) | Found::NotRegular => return Ok(Removal::Replaced),
    };
    let name = c_string(name)?;
    // SAFETY: `dir` is an open descriptor and `name` a NUL-terminated
    // string, both outliving the call.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOENT) => Ok(Removal::Missing),
            _ => Err(error),
        };
    }
    Ok(Removal::Removed(identity))
}

fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}
