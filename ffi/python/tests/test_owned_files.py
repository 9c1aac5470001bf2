"""Files a process owns, from Python: a child interpreter owns a segment it
made with ``multiprocessing.shared_memory`` (untracked, as when Python's
resource tracker dies with the engine) and is killed; the reaper
removes it once the child has ended, never while it runs. Declarations the
rules refuse raise the error naming the path and the rule."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

import livereg
from conftest import python_child, unique

MakeTable = Callable[..., livereg.Table]

CHILD = """
import sys, time, livereg
from multiprocessing import shared_memory
from multiprocessing import resource_tracker
segment = shared_memory.SharedMemory(name=sys.argv[2], create=True, size=1 << 20)
# As when the tracker dies with the engine's process group: nobody else
# removes it.
resource_tracker.unregister(segment._name, 'shared_memory')
livereg.open(sys.argv[1]).own_file('/dev/shm/' + sys.argv[2])
print('owned', flush=True)
time.sleep(3600)
"""


def test_a_killed_process_s_segment_is_removed_once_it_has_ended(make_table: MakeTable) -> None:
    table = make_table()
    segment = unique("segment")
    path = Path("/dev/shm") / segment
    child = subprocess.Popen(python_child(CHILD, table.name, segment), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "owned"
        status = table.status()
        assert status.owned_files is not None
        assert [owner["files"] for owner in status.owned_files["owners"]] == [1]
        reaper = table.acquire_reaper()
        for _ in range(5):
            reaper.scan_all()
            time.sleep(0.02)
        assert path.exists(), "removed while its maker lives"
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 10
        while path.exists():
            assert time.monotonic() < deadline, "never removed"
            reaper.scan_all()
            time.sleep(0.01)
        owned = table.status().owned_files
        assert owned is not None and owned["removed_total"] == 1
        reaper.stop()
    finally:
        child.kill()
        child.wait()
        if path.exists():
            os.unlink(path)


def test_declarations_the_rules_refuse_name_the_path(make_table: MakeTable, tmp_path: Path) -> None:
    table = make_table()
    outside = tmp_path / "ring"
    outside.write_bytes(b"x")
    with pytest.raises(livereg.InvalidArgumentError, match="allowed directory"):
        table.own_file(outside)
    missing = Path("/dev/shm") / unique("missing")
    with pytest.raises(livereg.NotFoundError, match=str(missing)):
        table.own_file(missing)
    made = Path("/dev/shm") / unique("made")
    made.write_bytes(b"x")
    try:
        table.own_file(str(made))
        assert table.disown_file(made) is True
        assert table.disown_file(made) is False
    finally:
        made.unlink()
