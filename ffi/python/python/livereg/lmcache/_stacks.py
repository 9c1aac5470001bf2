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

The run directory is ``$LIVEREG_LMCACHE_RUN_DIR``, else
``<tmp>/livereg-<uid>/<engine key>``, where the engine key
(``$LIVEREG_VLLM_ENGINE``) is made by the first process of the engine that
loads the plugin and inherited by the processes it starts.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import re
import secrets
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Dict, List, Optional

#: The variable holding the engine key, shared by an engine's processes.
ENGINE_ENV = "LIVEREG_VLLM_ENGINE"
#: The variable naming the run directory (default: per user and engine key).
RUN_DIR_ENV = "LIVEREG_LMCACHE_RUN_DIR"
#: The signal whose handler dumps the stacks (one of the real-time signals
#: no runtime here uses; ``$LIVEREG_LMCACHE_STACK_SIGNAL`` names another).
STACK_SIGNAL = int(os.environ.get("LIVEREG_LMCACHE_STACK_SIGNAL") or (signal.SIGRTMIN + 7))

_REPORT = re.compile(r"^stall-(\d+)-([0-9a-f]+)\.txt$")
_lock = threading.Lock()
_report: Optional["StallReport"] = None


def engine_key() -> str:
    """This engine's key: inherited, or made here (and passed on to the
    processes this one starts)."""
    key = os.environ.get(ENGINE_ENV)
    if not key:
        key = os.environ[ENGINE_ENV] = secrets.token_hex(6)
    return key


def run_dir(key: Optional[str] = None) -> Path:
    """Where the engine's processes put their stall reports."""
    named = os.environ.get(RUN_DIR_ENV)
    if named:
        return Path(named)
    return Path(tempfile.gettempdir()) / f"livereg-{os.getuid()}" / (key or engine_key())


@dataclass
class StallReport:
    """This process's stall report: the signal to raise and the file the
    stacks are dumped into."""

    signal: int
    path: str
    step_thread: int
    file: IO[str]

    def clear(self) -> None:
        """The process moves again: the report is emptied."""
        try:
            self.file.seek(0)
            self.file.truncate(0)
        except OSError:
            pass


def stall_report() -> Optional[StallReport]:
    """This process's report (made by the first call, from the thread that
    runs the engine's steps); None where it cannot be made."""
    global _report
    with _lock:
        if _report is not None and _report.path.endswith(f"-{os.getpid()}-{_report.step_thread:x}.txt"):
            return _report
        thread = threading.get_ident()
        folder = run_dir()
        try:
            folder.parent.mkdir(mode=0o700, exist_ok=True)
            if not os.environ.get(RUN_DIR_ENV):
                _sweep(folder.parent)
            folder.mkdir(mode=0o700, exist_ok=True)
            path = folder / f"stall-{os.getpid()}-{thread:x}.txt"
            file = open(path, "w+")  # noqa: SIM115 (kept open: faulthandler writes to it)
            faulthandler.register(STACK_SIGNAL, file=file, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError):
            return None
        _report = StallReport(STACK_SIGNAL, str(path), thread, file)
        atexit.register(_remove, path, not os.environ.get(RUN_DIR_ENV))
        return _report


def _sweep(engines: Path) -> None:
    """Removes the reports of processes that are gone (killed: no exit of
    theirs removed them), and the engine folders they leave empty."""
    try:
        folders = [folder for folder in engines.iterdir() if folder.is_dir()]
    except OSError:
        return
    for folder in folders:
        try:
            for entry in folder.iterdir():
                match = _REPORT.match(entry.name)
                if match is not None and not os.path.exists(f"/proc/{match.group(1)}"):
                    entry.unlink()
            folder.rmdir()  # only if empty
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


def stalls(key: Optional[str] = None) -> List[Dict[str, Any]]:
    """The engine's processes stalled now: for each, its pid, title, when
    it was seen stalled and the frame its steps hang in."""
    found: List[Dict[str, Any]] = []
    try:
        entries = list(run_dir(key).iterdir())
    except OSError:
        return found
    for entry in entries:
        match = _REPORT.match(entry.name)
        if match is None:
            continue
        pid, thread = int(match.group(1)), int(match.group(2), 16)
        try:
            info = entry.stat()
            if info.st_size == 0 or not os.path.exists(f"/proc/{pid}"):
                continue
            dump = entry.read_text(errors="replace")[:256 * 1024]
        except OSError:
            continue
        found.append({
            "pid": pid,
            "process": process_title(pid),
            "stalled_since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(info.st_mtime)),
            "stalled_for_seconds": round(max(0.0, time.time() - info.st_mtime), 3),
            "frame": hung_frame(dump, thread),
        })
    return sorted(found, key=lambda stall: stall["pid"])
