"""vLLM's CPU offload region (``/dev/shm/vllm_offload_{engine_id}.mmap``,
its real ``SharedOffloadRegion``) is owned by the process that made it
while it keeps the name. vLLM 0.32.0 runs its offload tier only on CUDA and
XPU (``CPUOffloadingSpec.get_worker`` refuses the CPU platform), so no
engine here makes one: these tests make the region as vLLM's spec does,
in a process that loaded the engine plugin, and kill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import unique

import livereg

MAKER = """
import sys, time
import livereg.lmcache
livereg.lmcache.install()
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
engine_id, mode = sys.argv[1], sys.argv[2]
page = 4096
# Without a barrier (the tiering spec's scheduler side), vLLM keeps the
# name until cleanup(); with one, it unlinks it once every worker mapped it.
barrier = (lambda: None) if mode == "barrier" else None
region = SharedOffloadRegion(engine_id=engine_id, num_chunks=16, rank=0,
                             kv_bytes_per_chunk=page, cpu_page_size=page, barrier=barrier)
region.mmap_obj[:page] = b"x" * page
if mode == "cleanup":
    region.cleanup()
print(region.mmap_path, flush=True)
time.sleep(3600)
"""


@pytest.fixture
def table() -> Iterator[livereg.Table]:
    name = unique("offload")
    made = livereg.create(name, capacity=8)
    yield made
    made.close()
    livereg.unlink(name)


@pytest.fixture
def makers(table: livereg.Table) -> Iterator[List["subprocess.Popen[str]"]]:
    """Makers a test starts: each killed after it, then what they owned
    removed by a reaper's scans (no reaper runs here otherwise)."""
    started: List["subprocess.Popen[str]"] = []
    yield started
    for maker in started:
        maker.kill()
        maker.wait()
    try:
        reaper = table.acquire_reaper()
    except livereg.BusyError:
        return  # the test's own reaper still holds the table
    with reaper:
        deadline = time.monotonic() + 10
        while owned_files(table) and time.monotonic() < deadline:
            reaper.scan_all()
            time.sleep(0.01)


def made(table: livereg.Table, mode: str, makers: List["subprocess.Popen[str]"]) -> Path:
    """A process that made an offload region in ``mode``; its path."""
    engine_id = unique("engine")
    env = dict(os.environ, LIVEREG_LMCACHE_TABLE=table.name)
    maker = subprocess.Popen([sys.executable, "-c", MAKER, engine_id, mode], stdout=subprocess.PIPE, text=True, env=env)
    makers.append(maker)
    assert maker.stdout is not None
    path = Path(maker.stdout.readline().strip())
    assert path == Path(f"/dev/shm/vllm_offload_{engine_id}.mmap")
    return path


def owned_files(table: livereg.Table) -> int:
    owned = table.status().owned_files
    assert owned is not None
    return sum(owner["files"] for owner in owned["owners"])


def test_a_killed_maker_s_offload_region_is_removed(table: livereg.Table, makers: List["subprocess.Popen[str]"]) -> None:
    path = made(table, "kept", makers)
    try:
        assert path.exists()
        assert owned_files(table) == 1
        reaper = table.acquire_reaper()
        reaper.scan_all()
        assert path.exists(), "removed while its maker lives"
        makers[0].send_signal(signal.SIGKILL)
        makers[0].wait()
        deadline = time.monotonic() + 10
        while path.exists():
            assert time.monotonic() < deadline, f"{path} was never removed"
            reaper.scan_all()
            time.sleep(0.01)
        assert owned_files(table) == 0
        reaper.stop()
    finally:
        if path.exists():
            path.unlink()


@pytest.mark.parametrize("mode", ["barrier", "cleanup"])
def test_a_region_vllm_unlinks_itself_is_not_owned(
    table: livereg.Table, makers: List["subprocess.Popen[str]"], mode: str
) -> None:
    path = made(table, mode, makers)
    assert not path.exists()
    assert owned_files(table) == 0
