"""What the engines and servers these tests run leave in /dev/shm, and
how a harness ends them so that nothing stays.

An engine's processes make names in /dev/shm (Python's shared memory
``psm_*`` and semaphores ``sem.mp-*``, vLLM's ``vllm_*``, LMCache's
``lmcache_*``). With livereg's plugin each process owns what it makes and
the table's reaper removes it once that process has ended: a harness waits
for every process of the tree to end while the reaper still runs (the
server is stopped only after). An engine run without livereg on purpose
(stock) leaves them: its harness removes them itself. CI's last step fails
on any such name made during the run."""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Dict, Iterable, List, Set

#: The names an engine's (or LMCache's server's) processes make in /dev/shm.
ENGINE_MADE = ("psm_", "sem.mp-", "vllm_", "lmcache_")
SHM = "/dev/shm/"


def engine_made() -> Set[str]:
    """The engine-made names in /dev/shm now."""
    return {name for name in os.listdir(SHM) if name.startswith(ENGINE_MADE)}


def children(pid: int) -> List[int]:
    """Every descendant of ``pid``."""
    found: List[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as file:
                kids = [int(kid) for kid in file.read().split()]
        except OSError:
            continue
        found += kids
        stack += kids
    return found


def referenced(pids: Iterable[int]) -> Set[str]:
    """The names in /dev/shm the processes ``pids`` map or hold open."""
    names: Set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(None, 5)[-1]
                    if path.startswith(SHM) and not path.endswith(" (deleted)"):
                        names.add(path[len(SHM):])
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(SHM) and not target.endswith(" (deleted)"):
                    names.add(target[len(SHM):])
        except OSError:
            continue  # ended meanwhile, or a kernel thread
    return names


def referenced_by_anyone() -> Set[str]:
    """The names in /dev/shm any process on the machine maps or holds open."""
    return referenced(int(entry) for entry in os.listdir("/proc") if entry.isdigit())


def remove(names: Iterable[str]) -> None:
    for name in names:
        try:
            os.unlink(SHM + name)
        except FileNotFoundError:
            pass


class Tree:
    """A process tree a harness started, every process of which it has
    seen held by a pidfd, so that its end is known even for processes
    that are not this one's children. ``before``: the engine-made names in
    /dev/shm before it started (taken with :func:`engine_made`)."""

    def __init__(self, root: int, before: Set[str]) -> None:
        self.root = root
        self.before = before
        self._pidfds: Dict[int, int] = {}

    def pids(self) -> List[int]:
        """The tree's processes now (each held from here on)."""
        pids = [self.root, *children(self.root)]
        for pid in pids:
            if pid not in self._pidfds:
                try:
                    self._pidfds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    pass
        return pids

    def kill(self) -> List[int]:
        """SIGKILLs every process of the tree (a stopped one too)."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def wait_ended(self, timeout: float = 60.0) -> None:
        """Until every process of the tree ever seen has ended."""
        deadline = time.monotonic() + timeout
        try:
            for pid, pidfd in self._pidfds.items():
                left = deadline - time.monotonic()
                readable, _, _ = select.select([pidfd], [], [], max(0.0, left))
                assert readable, f"process {pid} of the tree under {self.root} still runs after {timeout}s"
        finally:
            for pidfd in self._pidfds.values():
                os.close(pidfd)
            self._pidfds.clear()

    def left(self) -> Set[str]:
        """The engine-made names made since the tree started that no
        process maps or holds open."""
        return (engine_made() - self.before) - referenced_by_anyone()

    def settle(self, owned: bool, timeout: float = 30.0) -> None:
        """Once the tree has ended: with livereg owning what it made, until
        the reaper has removed it (at most ``timeout``: what stays is for
        CI's last check to name); without (a stock engine), removes it."""
        if owned:
            deadline = time.monotonic() + timeout
            while self.left() and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            remove(self.left())
