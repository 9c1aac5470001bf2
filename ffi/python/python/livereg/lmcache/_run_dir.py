"""Where an engine's stall reports live: a directory that only this user can
use, and that no other local user can make first or swap.

The folder of every engine's run directory is, in order:

- ``$LIVEREG_LMCACHE_RUN_DIR``, used as the run directory itself (engines
  naming the same one share it, whatever their engine key);
- ``$XDG_RUNTIME_DIR/livereg``, when ``$XDG_RUNTIME_DIR`` is this user's own
  directory (owned by this user, mode 0700, not a link);
- ``<tmp>/livereg-<uid>`` (``<tmp>``: :func:`tempfile.gettempdir`).

Below the last two, each engine has ``<engine key>``. Each directory of
these is made (mode 0700) when missing, then checked with ``lstat``: a
directory, not a link, owned by this user, no permission for group or
others; and its parent must be owned by this user or root and writable by
no one else, or sticky (as ``/tmp``), so that no one else can rename it
away after the check. Another user who made the path first (a file, a link,
a directory of theirs or one open to them) gets :class:`RunDirError`, never
a directory livereg writes into or reads from.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Optional

#: The variable holding the engine key, shared by an engine's processes.
ENGINE_ENV = "LIVEREG_VLLM_ENGINE"
#: The variable naming the run directory (default: per user and engine key).
RUN_DIR_ENV = "LIVEREG_LMCACHE_RUN_DIR"


class RunDirError(OSError):
    """A run directory livereg will not use: what was found against what
    was expected."""


def named_run_dir() -> Optional[Path]:
    """``$LIVEREG_LMCACHE_RUN_DIR``, if set."""
    named = os.environ.get(RUN_DIR_ENV)
    return Path(named) if named else None


def engines_dir() -> Path:
    """The folder holding one run directory per engine key (when none is
    named)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _problem(Path(runtime)) is None:
        return Path(runtime) / "livereg"
    return Path(tempfile.gettempdir()) / f"livereg-{os.getuid()}"


def run_dir(key: str) -> Path:
    """The run directory of engine ``key`` (not made, not checked)."""
    return named_run_dir() or engines_dir() / key


def private_dir(path: Path, make: bool = True) -> Path:
    """Makes ``path`` (mode 0700) if missing and ``make``, then checks it
    and its parent as the module says.

    Raises :class:`RunDirError` for a path that fails the check,
    ``FileNotFoundError`` for a missing one not to be made, ``OSError`` when
    it cannot be made."""
    parent = path.parent
    try:
        found = os.stat(parent)  # (a link on the way is the parent's owner's choice)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise RunDirError(f"{parent} cannot be read ({error.strerror}); {path} needs it") from error
    uid = os.getuid()
    open_to_others = found.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not found.st_mode & stat.S_ISVTX
    if not stat.S_ISDIR(found.st_mode) or found.st_uid not in (0, uid) or open_to_others:
        raise RunDirError(
            f"{parent} is {_described(found)}: expected a directory of uid {uid} or root that no one else can "
            f"write (or sticky, as /tmp), so that {path} cannot be swapped"
        )
    if make:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    elif not os.path.lexists(path):
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(path))
    problem = _problem(path)
    if problem is not None:
        raise RunDirError(problem)
    return path


def _problem(path: Path) -> Optional[str]:
    """Why ``path`` is not this user's private directory (None if it is)."""
    try:
        found = os.lstat(path)
    except OSError as error:
        return f"{path} cannot be read ({error.strerror})"
    uid = os.getuid()
    if stat.S_ISDIR(found.st_mode) and found.st_uid == uid and not found.st_mode & 0o077:
        return None
    return (f"{path} is {_described(found)}: expected a directory of uid {uid}, mode 0700, not a link "
            f"(another user may have made it first)")


def _described(found: os.stat_result) -> str:
    kind = ("a link" if stat.S_ISLNK(found.st_mode) else "a directory" if stat.S_ISDIR(found.st_mode)
            else "a regular file" if stat.S_ISREG(found.st_mode) else "a special file")
    return f"{kind} of uid {found.st_uid}, mode {stat.S_IMODE(found.st_mode):04o}"
