"""The engine plugin owns what an engine's processes make in /dev/shm: a
process that loaded it makes a ``multiprocessing.shared_memory`` segment
and a ``spawn``-context semaphore (both untracked, as when Python's resource
tracker dies with the engine's process group) and is killed; the reaper
removes both. A segment its maker unlinks is disowned."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, List

import livereg
from conftest import python_child

MakeTable = Callable[..., livereg.Table]

ENGINE = """
import multiprocessing, sys, time
from multiprocessing import resource_tracker, shared_memory
import livereg.lmcache
livereg.lmcache.install()
segment = shared_memory.SharedMemory(create=True, size=1 << 20)
resource_tracker.unregister(segment._name, 'shared_memory')
gone = shared_memory.SharedMemory(create=True, size=4096)
gone.close()
gone.unlink()
lock = multiprocessing.get_context('spawn').Lock()
resource_tracker.unregister(lock._semlock.name, 'semaphore')
print(segment._name.lstrip('/'), 'sem.' + lock._semlock.name.lstrip('/'), flush=True)
time.sleep(3600)
"""


def test_an_engine_process_s_segments_and_semaphores_are_removed_once_it_is_killed(make_table: MakeTable) -> None:
    table = make_table()
    env = dict(os.environ, LIVEREG_LMCACHE_TABLE=table.name)
    child = subprocess.Popen(python_child(ENGINE), stdout=subprocess.PIPE, text=True, env=env)
    paths: List[Path] = []
    try:
        assert child.stdout is not None
        paths = [Path("/dev/shm") / name for name in child.stdout.readline().split()]
        assert len(paths) == 2 and all(path.exists() for path in paths), paths
        owned = table.status().owned_files
        assert owned is not None
        assert [owner["files"] for owner in owned["owners"]] == [2], "the unlinked segment is disowned"
        reaper = table.acquire_reaper()
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 10
        while any(path.exists() for path in paths):
            assert time.monotonic() < deadline, "never removed"
            reaper.scan_all()
            time.sleep(0.01)
        reaper.stop()
    finally:
        child.kill()
        child.wait()
        for path in paths:
            if path.exists():
                path.unlink()
