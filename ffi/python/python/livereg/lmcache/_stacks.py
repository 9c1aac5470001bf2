"""A stalled engine's stacks: where each process dumps them, and how the
health route reads them back.

Each process of an engine that publishes progress has a report file,
``stall-PID-THREAD.txt`` in the engine's run directory (THREAD: the
``threading.get_ident()`` of the thread that runs its steps, in hex).
``faulthandler`` is registered to dump every thread's stack into it on
:data:`STACK_SIGNAL`; livereg's native beat thread raises that signal in
itself when the registration ends ``STALLED`` (the dump is complete when
it returns, even while the hung thread holds the GIL), then copies the file
to stderr. The file is emptied when the process moves again and removed at
its exit (a killed process's, by the next process of any engine of the same
user that makes its own): a non-empty file of a live process is a stall in
progress. (Processes are told alive by ``/proc``: engines sharing a run
directory share a PID namespace.)

A process that cannot make its report logs why and, where the run
directory is usable, leaves ``unreported-PID.txt`` saying it: its stalls
would go unseen, so the health route calls the engine's state unknown.
Nothing here follows a link: reports are opened with ``O_NOFOLLOW`` and
the sweep enters no linked folder.

The run directory and its checks: ``livereg.lmcache._run_dir``.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import re
import secrets
import signal
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Tuple

from livereg.lmcache._run_dir import ENGINE_ENV, RUN_DIR_ENV, engines_dir, named_run_dir, private_dir
from livereg.lmcache._run_dir import run_dir as _engine_run_dir

__all__ = ["ENGINE_ENV", "RUN_DIR_ENV", "STACK_SIGNAL", "StallReport", "engine_key", "hung_frame",
           "process_title", "read_reports", "run_dir", "stall_report"]

#: The signal whose handler dumps the stacks (one of the real-time signals
#: no runtime here uses; ``$LIVEREG_LMCACHE_STACK_SIGNAL`` names another).
STACK_SIGNAL = int(os.environ.get("LIVEREG_LMCACHE_STACK_SIGNAL") or (signal.SIGRTMIN + 7))

_REPORT = re.compile(r"^stall-(\d+)-([0-9a-f]+)\.txt$")
_UNREPORTED = re.compile(r"^unreported-(\d+)\.txt$")
#: The most of a report read back.
_READ_MAX = 256 * 1024
_logger = logging.getLogger("livereg.lmcache")
_lock = threading.Lock()
_report: Optional["StallReport"] = None
#: Why this process has no report (the last failure logged).
_failure: Optional[str] = None


def engine_key() -> str:
    """This engine's key: inherited, or made here (and passed on to the
    processes this one starts)."""
    key = os.environ.get(ENGINE_ENV)
    if not key:
        key = os.environ[ENGINE_ENV] = secrets.token_hex(6)
    return key


def run_dir(key: Optional[str] = None) -> Path:
    """Where the engine's processes put their stall reports."""
    return _engine_run_dir(key or engine_key())


@dataclass
class StallReport:
    """This process's stall report: the signal to raise and the file the
    stacks are dumped into."""

    signal: int
    path: str
    step_thread: int
    file: IO[str]

    def clear(self) -> None:
        """The process moves again: the report is emptied (if it is not
        already: an empty one is not written again)."""
        try:
            if os.fstat(self.file.fileno()).st_size:
                self.file.seek(0)
                self.file.truncate(0)
        except (OSError, ValueError):
            pass


def stall_report() -> Optional[StallReport]:
    """This process's report (made by the first call, from the thread that
    runs the engine's steps); None where it cannot be made (logged once per
    reason, and said in the run directory when it is usable)."""
    global _report, _failure
    with _lock:
        if _report is not None and _report.path.endswith(f"-{os.getpid()}-{_report.step_thread:x}.txt"):
            return _report
        thread = threading.get_ident()
        folder: Optional[Path] = None
        try:
            for attempt in range(3):
                folder = _made_run_dir()
                path = folder / f"stall-{os.getpid()}-{thread:x}.txt"
                try:
                    fd = _open_own(path)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise  # (an empty folder is swept by another engine's process: made again)
            file = os.fdopen(fd, "w+")  # kept open: faulthandler writes to it
            try:
                faulthandler.register(STACK_SIGNAL, file=file, all_threads=True, chain=False)
            except BaseException:
                file.close()
                os.unlink(path)
                raise
        except (OSError, ValueError, RuntimeError) as error:
            why = f"no stall report can be made in pid {os.getpid()}: {error}"
            if why != _failure:
                _failure = why
                _logger.warning("livereg: %s; its stalls are not reported, and /livereg/health answers 503 "
                                "(stall state unknown) while it lives", why)
            if folder is not None:
                _say_unreported(folder, why)
            return None
        _failure = None
        try:
            os.unlink(path.parent / f"unreported-{os.getpid()}.txt")  # an earlier failure's word
        except OSError:
            pass
        _report = StallReport(STACK_SIGNAL, str(path), thread, file)
        atexit.register(_remove, path, named_run_dir() is None)
        return _report


def report_failure() -> Optional[str]:
    """Why this process could not make its report (None if it has one or
    never tried)."""
    return _failure


def _made_run_dir() -> Path:
    """This engine's run directory, made and checked; the reports of gone
    processes are swept first."""
    named = named_run_dir()
    if named is not None:
        return private_dir(named)
    engines = private_dir(engines_dir())
    own = engines / engine_key()
    _sweep(engines, keep=own.name)
    return private_dir(own)


def _open_own(path: Path) -> int:
    """Opens (truncates) ``path`` for this process alone, never through a
    link."""
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def _say_unreported(folder: Path, why: str) -> None:
    """Leaves ``unreported-PID.txt`` for the health route (best effort)."""
    path = folder / f"unreported-{os.getpid()}.txt"
    try:
        with os.fdopen(_open_own(path), "w") as file:
            file.write(why)
    except OSError:
        return
    atexit.register(_remove, path, False)


def _sweep(engines: Path, keep: str = "") -> None:
    """Removes the reports of processes that are gone (killed: no exit of
    theirs removed them), and the engine folders they leave empty, but
    ``keep``'s. Enters no link and removes only regular files."""
    try:
        with os.scandir(engines) as found:
            folders = [entry.path for entry in found if entry.name != keep and entry.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for folder in folders:
        try:
            with os.scandir(folder) as found:
                entries = [entry for entry in found if entry.is_file(follow_symlinks=False)]
            for entry in entries:
                match = _REPORT.match(entry.name) or _UNREPORTED.match(entry.name)
                if match is not None and not os.path.exists(f"/proc/{match.group(1)}"):
                    os.unlink(entry.path)
            os.rmdir(folder)  # only if empty
        except OSError:
            pass


def _remove(path: Path, own_folder: bool) -> None:
    try:
        path.unlink()
        if own_folder:
            path.parent.rmdir()  # the last process of the engine takes the folder
    except OSError:
        pass


def hung_frame(dump: str, thread: int) -> Optional[str]:
    """The innermost frame of ``thread`` in a ``faulthandler`` dump."""
    heading = f"thread 0x{thread:016x}"
    lines = iter(dump.splitlines())
    for line in lines:
        lowered = line.lower()
        if lowered.startswith(heading) or lowered.startswith("current " + heading):
            for frame in lines:
                if not frame.strip():
                    return None
                if frame.strip().startswith("File "):
                    return frame.strip()
    return None


def process_title(pid: int) -> str:
    """The process's command line as it shows it (``VLLM::Worker``...)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def read_reports(key: Optional[str] = None) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The engine's processes stalled now (each: its pid, title, when it
    was seen stalled, the frame its steps hang in), and those alive that
    could make no report (each: pid, title, why).

    Raises :class:`livereg.lmcache._run_dir.RunDirError` when the run
    directory (or the folder above it) is not this user's private one: no
    report in it can be trusted, nor written. A missing one holds none."""
    folder = run_dir(key)
    try:
        if named_run_dir() is None:
            private_dir(folder.parent, make=False)
        private_dir(folder, make=False)
        with os.scandir(folder) as found:
            entries = list(found)
    except FileNotFoundError:
        return [], []
    stalled: List[Dict[str, Any]] = []
    unreported: List[Dict[str, Any]] = []
    for entry in entries:
        report, missing = _REPORT.match(entry.name), _UNREPORTED.match(entry.name)
        match = report or missing
        if match is None or not os.path.exists(f"/proc/{match.group(1)}"):
            continue
        pid = int(match.group(1))
        read = _read_own(entry.path)
        if read is None:
            continue
        text, modified = read
        if missing is not None:
            unreported.append({"pid": pid, "process": process_title(pid), "reason": text.strip()})
        elif report is not None and text:
            stalled.append({
                "pid": pid,
                "process": process_title(pid),
                "stalled_since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(modified)),
                "stalled_for_seconds": round(max(0.0, time.time() - modified), 3),
                "frame": hung_frame(text, int(report.group(2), 16)),
            })
    return sorted(stalled, key=lambda s: s["pid"]), sorted(unreported, key=lambda u: u["pid"])


def _read_own(path: str) -> Optional[Tuple[str, float]]:
    """A regular file's text (bounded) and modification time, never through
    a link; None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            return file.read(_READ_MAX).decode(errors="replace"), info.st_mtime
        except OSError:
            return None
