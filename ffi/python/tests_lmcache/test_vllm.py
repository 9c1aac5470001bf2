"""livereg inside a real vLLM (PyPI's CPU build, a tiny Llama built here)
with LMCache's connector, against LMCache's real server with livereg's
server module. vLLM loads livereg's plugin from its entry point by itself,
in each of its processes."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Set

import pytest
from conftest import Server, free_port, module_server, unique
from vllm_engines import MARK, Engine, Serve, make_model

import livereg

T = 1.0  # livereg's reap timeout here; LMCache's own is 30 s (its floor)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with module_server("vllm", {"reap_timeout_seconds": T}) as started:
        yield started


@pytest.fixture
def engines() -> Iterator[List[object]]:
    """vLLM process trees a test starts; each killed after it."""
    started: List[object] = []
    yield started
    for engine in started:
        engine.close()  # type: ignore[attr-defined]


def held(server: Server) -> Set[int]:
    with server.changed:
        return set(server.changes[-1]["ids"]) if server.changes else set()


def registration_of(table: str, pid: int) -> livereg.RegistrationStatus:
    """The live livereg registration process ``pid`` holds in ``table``."""
    with livereg.open(table) as opened:
        found = [r for r in opened.status().registrations if r.pid == pid and r.state == "live"]
    assert len(found) == 1, f"process {pid} holds {len(found)} live registrations in '{table}'"
    return found[0]


def ends(table: str) -> Dict[str, int]:
    """How many registrations of ``table`` ended, by reason."""
    with livereg.open(table) as opened:
        return dict(opened.stats()["ended"])


def wait_ended(table: str, reason: str, before: Dict[str, int], timeout: float = 5.0) -> None:
    """Waits for one more registration of ``table`` to end for ``reason``."""
    deadline = time.monotonic() + timeout
    while ends(table).get(reason, 0) <= before.get(reason, 0):
        assert time.monotonic() < deadline, f"no registration ended {reason} within {timeout}s: {ends(table)}"
        time.sleep(0.02)


def ours(output: str) -> List[str]:
    """The lines of an engine's output that mention livereg other than in a
    file path (the environment's own) or in the test script's records."""
    return [line for line in output.splitlines()
            if not line.startswith(MARK) and "livereg" in re.sub(r"\S*/\S*", "", line)]


def let_go_after(server: Server, instance_id: int, act: Callable[[], object]) -> float:
    """Seconds from ``act()`` (a kill, an exit) to LMCache's server letting
    go of ``instance_id``."""
    acted_at = time.monotonic()
    act()
    return server.wait_gone(instance_id, 10) - acted_at


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as file:
        return file.read().rsplit(")", 1)[1].split()[0] == "T"


def test_vllm_starts_with_the_plugin_and_a_stopped_then_killed_worker_is_let_go(
    model: Path, server: Server, engines: List[object]
) -> None:
    engine = Engine(model, server.port, server.table)
    engines.append(engine)
    first = engine.generate()
    assert first and engine.generate() == first, "two generations of one prompt disagree"
    instance_id = registration_of(server.table, engine.worker).instance_id
    assert instance_id in held(server), "LMCache's server does not hold the engine livereg registered"

    stopped_at = time.monotonic()
    os.kill(engine.worker, signal.SIGSTOP)
    # Its silence began at its last beat, which a busy worker (its beat
    # thread waiting for the interpreter, a loaded host) gave a while before
    # the stop: never let go before T of that silence.
    silent_before_stop = registration_of(server.table, engine.worker).last_heartbeat_age_seconds or 0.0
    let_go = server.wait_gone(instance_id, 10 * T) - stopped_at
    assert stopped(engine.worker), "the worker was let go only once it ran again"
    silence = let_go + silent_before_stop
    assert T * 0.95 <= silence and let_go <= 3 * T + 1, (
        f"a stopped worker let go {let_go:.3f}s after SIGSTOP, {silence:.3f}s after its last beat"
    )
    resumed_at = time.monotonic()
    os.kill(engine.worker, signal.SIGCONT)
    back = server.wait_held(instance_id, 10) - resumed_at
    assert back <= 5.0, f"its KV cache registered again {back:.3f}s after SIGCONT"
    assert engine.generate() == first, "a generation after SIGCONT gave other tokens"

    before = ends(server.table)
    let_go = let_go_after(server, instance_id, lambda: os.kill(engine.worker, signal.SIGKILL))
    assert let_go <= 0.5, f"a SIGKILLed worker let go {let_go:.3f}s after"
    wait_ended(server.table, "process_exited", before)


def test_every_vllm_process_killed_is_let_go_within_half_a_second(
    model: Path, server: Server, engines: List[object]
) -> None:
    engine = Engine(model, server.port, server.table)
    engines.append(engine)
    instance_id = registration_of(server.table, engine.worker).instance_id
    let_go = let_go_after(server, instance_id, engine.kill_all)
    assert let_go <= 0.5, f"an engine killed whole let go {let_go:.3f}s after"


def test_a_clean_exit_is_let_go_within_two_seconds_as_deregistered(
    model: Path, server: Server, engines: List[object]
) -> None:
    engine = Engine(model, server.port, server.table)
    engines.append(engine)
    instance_id = registration_of(server.table, engine.worker).instance_id
    before = ends(server.table)
    let_go = let_go_after(server, instance_id, lambda: engine.ask("exit", "exited"))
    assert let_go <= 2.0, f"a clean exit let go {let_go:.3f}s after it was asked"
    wait_ended(server.table, "deregistered", before)


def test_vllm_serve_completes_over_http_and_its_killed_worker_is_let_go(
    model: Path, server: Server, engines: List[object]
) -> None:
    serve = Serve(model, server.port, server.table, free_port())
    engines.append(serve)
    completion = serve.complete("The reaper scans the table " * 80)
    assert completion["choices"][0]["text"], completion
    instance_id = registration_of(server.table, serve.worker).instance_id
    assert instance_id in held(server)
    let_go = let_go_after(server, instance_id, lambda: os.kill(serve.worker, signal.SIGKILL))
    assert let_go <= 0.5, f"vllm serve's SIGKILLed worker let go {let_go:.3f}s after"


def test_an_engine_without_the_connector_imports_no_lmcache_registers_nothing_and_logs_nothing(
    model: Path, server: Server, engines: List[object]
) -> None:
    before = held(server)
    engine = Engine(model, server.port, server.table, connector=False,
                    env={"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}, with_livereg=False)
    engines.append(engine)
    assert engine.generate()
    modules = engine.ask("modules", "main")
    assert "livereg.lmcache" in modules["workers"][0], "the plugin was not loaded in the worker"
    for where, names in [("main", modules["main"]), *(("worker", w) for w in modules["workers"])]:
        assert not [n for n in names if n.startswith("lmcache")], f"the {where} process imported LMCache"
    with livereg.open(server.table) as table:
        assert all(r.pid != engine.worker for r in table.status().registrations)
    assert held(server) == before
    assert ours(engine.output()) == [], "the plugin logged in an engine without LMCache"


def test_an_allow_list_without_livereg_runs_nothing_of_ours(
    model: Path, server: Server, engines: List[object]
) -> None:
    before = held(server)
    engine = Engine(model, server.port, server.table,
                    env={"VLLM_PLUGINS": "not-livereg", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}, with_livereg=False)
    engines.append(engine)
    assert engine.generate()
    assert held(server) - before, "LMCache's server holds no new engine"
    modules = engine.ask("modules", "main")
    for where, names in [("main", modules["main"]), *(("worker", w) for w in modules["workers"])]:
        assert not [n for n in names if n.startswith("livereg")], f"livereg was imported in the {where} process"
    with livereg.open(server.table) as table:
        assert all(r.pid != engine.worker for r in table.status().registrations)


def test_with_no_table_and_no_listener_an_engine_warns_once_and_runs_as_without_livereg(
    model: Path, server: Server, engines: List[object]
) -> None:
    before = held(server)
    engine = Engine(model, server.port, server.table, env={"LIVEREG_LMCACHE_TABLE": unique("nowhere")},
                    with_livereg=False)
    engines.append(engine)
    first = engine.generate()
    assert first and engine.generate() == first
    assert held(server) - before, "LMCache's server holds no new engine"
    warned = engine.lines("runs without livereg")
    assert len(warned) == 1, warned
