//! The calling thread's file-system credentials, changed for a moment so
//! that the kernel judges a removal as another user would be judged
//! (`setfsuid(2)`, `setfsgid(2)`, `setgroups(2)`, each as a raw system
//! call: they change the calling thread only, where glibc's `setgroups`
//! would change every thread of the process), and that user's groups
//! from the system's user and group database (`getpwuid_r(3)`,
//! `getgrouplist(3)`).
//!
//! Only a root process can act as another user; any other acts as itself.

use std::io;

/// A user to act as: its user, its group, its supplementary groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The user who had no group the database knows (`nogroup`).
pub(crate) const NO_GROUP: u32 = 65_534;

/// `uid` with the groups the system's database gives it (its primary group
/// and `getgrouplist`); a user the database does not know has no group
/// (the group `nogroup`, no supplementary group).
pub(crate) fn from_database(uid: u32) -> Identity {
    let Some((name, gid)) = passwd_entry(uid) else {
        return Identity {
            uid,
            gid: NO_GROUP,
            groups: Vec::new(),
        };
    };
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut count = groups.len() as libc::c_int;
        // SAFETY: `name` is NUL-terminated, `groups` has room for `count`
        // entries, and `count` is a valid, writable int; all outlive the
        // call.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            break;
        }
        if groups.len() >= 65_536 {
            groups.clear();
            break;
        }
        groups.resize((count.max(0) as usize).max(groups.len() * 2), 0);
    }
    Identity { uid, gid, groups }
}

/// `getpwuid_r(uid)`: the user's name and primary group.
fn passwd_entry(uid: u32) -> Option<(std::ffi::CString, u32)> {
    let mut buffer = vec![0 as libc::c_char; 4096];
    // SAFETY: an all-zero `passwd` is a valid value to be written over.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: `entry`, `buffer` (of the length passed) and `found` are
    // valid and writable for the call.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || entry.pw_name.is_null() {
        return None;
    }
    // SAFETY: `pw_name` points at a NUL-terminated string in `buffer`,
    // alive here.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) }.to_owned();
    Some((name, entry.pw_gid))
}

/// The calling thread acting as another user until dropped.
pub(crate) struct Acting {
    previous: Option<(u32, u32, Vec<u32>)>,
}

/// Makes the calling thread act as `who` for file-system checks until the
/// guard is dropped. A process that is not root acts as itself (the guard
/// changes nothing): the kernel judges it as it is.
///
/// # Errors
///
/// The OS's, when the groups cannot be set or a credential does not take.
pub(crate) fn act_as(who: &Identity) -> io::Result<Acting> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(Acting { previous: None });
    }
    let groups = own_groups()?;
    set_groups(&who.groups)?;
    // SAFETY: setfsgid and setfsuid take any value and return the previous
    // one; they change only the calling thread's credentials.
    let (gid, uid) = unsafe {
        (
            libc::syscall(libc::SYS_setfsgid, who.gid) as u32,
            libc::syscall(libc::SYS_setfsuid, who.uid) as u32,
        )
    };
    let acting = Acting {
        previous: Some((uid, gid, groups)),
    };
    // SAFETY: as above; -1 changes nothing and returns the current value.
    let (now_uid, now_gid) = unsafe {
        (
            libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32,
            libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32,
        )
    };
    if (now_uid, now_gid) != (who.uid, who.gid) {
        return Err(io::Error::other(format!(
            "could not act as uid {} gid {} (the thread is uid {now_uid} gid {now_gid})",
            who.uid, who.gid
        )));
    }
    Ok(acting)
}

impl Drop for Acting {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = self.previous.take() {
            // SAFETY: as in `act_as`; restoring the file-system user to
            // root first gives the thread back its file-system
            // capabilities.
            unsafe {
                libc::syscall(libc::SYS_setfsuid, uid);
                libc::syscall(libc::SYS_setfsgid, gid);
            }
            let _ = set_groups(&groups);
        }
    }
}

/// `getgroups()`: the calling thread's supplementary groups.
fn own_groups() -> io::Result<Vec<u32>> {
    // SAFETY: with a size of 0, getgroups only counts.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if count < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0 as libc::gid_t; count as usize];
    // SAFETY: `groups` has room for `count` entries, the size passed.
    let written = unsafe { libc::getgroups(count, groups.as_mut_ptr()) };
    if written < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(written as usize);
    Ok(groups)
}

/// `setgroups(groups)` for the calling thread only (the raw system call).
fn set_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: `groups` is valid for `groups.len()` entries for the call.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_thread_acting_as_another_user_is_judged_as_that_user_and_given_back() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = std::env::temp_dir().join(format!("livereg-acting-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::thread::spawn({
            let dir = dir.clone();
            move || {
                let nobody = Identity {
                    uid: 65_534,
                    gid: 65_534,
                    groups: Vec::new(),
                };
                {
                    let _acting = act_as(&nobody).unwrap();
                    let denied = std::fs::write(dir.join("x"), b"x").unwrap_err();
                    assert_eq!(denied.kind(), io::ErrorKind::PermissionDenied);
                }
                std::fs::write(dir.join("x"), b"x").unwrap();
            }
        })
        .join()
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
