"""Nothing a dead vLLM made stays in /dev/shm: the engine plugin owns, in
every vLLM process, the shared-memory segments (``psm_*``) and named
semaphores (``sem.mp-*``) it makes, and LMCache's server module's reaper
removes them once their maker has ended. Killed whole, or exiting cleanly,
the engine leaves nothing; with only its ``VLLM::Worker`` killed, what the
live EngineCore made stays."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest
from conftest import Server, module_server
from vllm_engines import Engine, make_model

import livereg

#: The names an engine's processes make in /dev/shm.
ENGINE_MADE = ("psm_", "sem.mp-", "vllm_offload_")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with module_server("vllm-owned", {"reap_timeout_seconds": 1.0}) as started:
        yield started


@pytest.fixture
def engines() -> Iterator[List[Engine]]:
    started: List[Engine] = []
    yield started
    for engine in started:
        engine.close()


def engine_made() -> Set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(ENGINE_MADE)}


def owners(table: str) -> Dict[int, Tuple[int, int]]:
    """Each owning process of ``table``: (files, bytes)."""
    with livereg.open(table) as opened:
        owned = opened.status().owned_files
    assert owned is not None
    return {owner["pid"]: (owner["files"], owner["bytes"]) for owner in owned["owners"]}


def settles_to(expected: Set[str], timeout: float = 5.0) -> None:
    """Until the engine-made names in /dev/shm are ``expected``."""
    deadline = time.monotonic() + timeout
    while engine_made() != expected:
        assert time.monotonic() < deadline, f"left in /dev/shm: {sorted(engine_made() - expected)}"
        time.sleep(0.05)


def started(model: Path, server: Server, engines: List[Engine]) -> Tuple[Engine, Set[str]]:
    """An engine that generated once, and the names it made."""
    before = engine_made()
    engine = Engine(model, server.port, server.table)
    engines.append(engine)
    assert engine.generate()
    made = engine_made() - before
    assert made, "the engine made nothing in /dev/shm"
    owned = owners(server.table)
    assert sum(files for files, _ in owned.values()) >= len(made), (made, owned)
    return engine, before


def test_an_engine_killed_whole_leaves_nothing_in_dev_shm(
    model: Path, server: Server, engines: List[Engine]
) -> None:
    engine, before = started(model, server, engines)
    engine.kill_all()
    settles_to(before)


def test_a_clean_exit_leaves_nothing_in_dev_shm(model: Path, server: Server, engines: List[Engine]) -> None:
    engine, before = started(model, server, engines)
    engine.ask("exit", "exited")
    engine.process.wait(timeout=60)
    settles_to(before)


def removed(table: str) -> int:
    """Files ``table``'s reapers removed."""
    with livereg.open(table) as opened:
        owned = opened.status().owned_files
    assert owned is not None
    return int(owned["removed_total"])


def test_a_killed_worker_s_files_go_and_the_live_engine_core_s_stay(
    model: Path, server: Server, engines: List[Engine]
) -> None:
    engine, before = started(model, server, engines)
    core = engine.pid_titled("VLLM::EngineCore")
    owned = owners(server.table)
    assert owned.get(core, (0, 0))[0] > 0, f"EngineCore {core} owns nothing: {owned}"
    assert owned.get(engine.worker, (0, 0))[0] > 0, f"the worker owns nothing: {owned}"
    removed_before = removed(server.table)
    os.kill(engine.worker, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while engine.worker in owners(server.table):
        assert time.monotonic() < deadline, "the worker's files were never removed"
        time.sleep(0.01)
    # Only the dead worker's: the EngineCore's, in use while it lives,
    # were not removed (vLLM's own shutdown of the core may unlink them
    # itself, which disowns them).
    assert removed(server.table) - removed_before == owned[engine.worker][0]
    engine.kill_all()
    settles_to(before)
