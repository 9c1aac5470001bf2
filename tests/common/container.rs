//! A "container" for a test's or a bench's client process: `unshare` with
//! new mount (a private tmpfs on `/dev/shm`), PID and IPC namespaces, and a
//! network namespace where asked (loopback only: for `unix:` clients). The
//! client is `unshare`'s child, killed with it (`--kill-child`).

use std::ffi::OsStr;
use std::process::Command;

/// `program` in a container of its own; add its arguments to the command.
pub fn contained(program: impl AsRef<OsStr>, own_network: bool) -> Command {
    let mut command = Command::new("unshare");
    command.args(["--mount", "--pid", "--ipc"]);
    if own_network {
        command.arg("--net");
    }
    command
        .args(["--fork", "--kill-child", "sh", "-c"])
        .arg("mount -t tmpfs contained /dev/shm && exec \"$0\" \"$@\"")
        .arg(program);
    command
}
