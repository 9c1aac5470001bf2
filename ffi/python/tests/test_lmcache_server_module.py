"""livereg.lmcache's server module and engine plugin, with doubles of
LMCache's modules (the real server: tests_lmcache/)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Set

import pytest
from conftest import python_child, unique

import livereg
import livereg.lmcache
from livereg.lmcache import LiveregServerModule, build_server_modules

T = 0.4


class TransferDouble:
    """A transfer module as LMCache's: per instance a context, freed by
    ``unregister_kv_cache``; touches recorded; holds an id until freed."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.held: Set[int] = set()
        self.touched: List[int] = []
        self.unregistered: List[int] = []
        self.dropped: List[int] = []

    def context_entries_snapshot(self) -> Dict[int, object]:
        with self.lock:
            return {i: object() for i in self.held}

    def unregister_kv_cache(self, instance_id: int) -> None:
        with self.lock:
            self.held.discard(instance_id)
            self.unregistered.append(instance_id)
            self.lock.notify_all()

    def touch_instance(self, instance_id: int) -> None:
        with self.lock:
            self.touched.append(instance_id)

    def reap_stale_instances(self, timeout: float, grace: float) -> List[int]:
        return []

    def tracked_instance_count(self) -> int:
        with self.lock:
            return len(self.held)

    def drop_instance_state(self, instance_id: int) -> None:
        with self.lock:
            self.dropped.append(instance_id)
            self.lock.notify_all()


@pytest.fixture
def table_name() -> Iterator[str]:
    name = unique("server-module")
    yield name
    try:
        livereg.unlink(name)
    except livereg.NotFoundError:
        pass


def module(table: str, *targets: Any, ctx: Any = None, **config: Any) -> LiveregServerModule:
    return LiveregServerModule(ctx or SimpleNamespace(chunk_size=256), targets,
                               {"table": table, "reap_timeout_seconds": T, **config})


KILLED_ENGINE = """
import sys, time, livereg
worker = livereg.open(sys.argv[1]).register(int(sys.argv[2]))
worker.ping()
print("registered", flush=True)
time.sleep(3600)
"""


def test_a_killed_engine_is_unregistered_at_once_where_held_and_dropped_once_on_every_target(table_name: str) -> None:
    holding, other = TransferDouble(), TransferDouble()
    holding.held.add(7)
    with_server = module(table_name, holding, other)
    try:
        engine = subprocess.Popen(python_child(KILLED_ENGINE, table_name, "7"), stdout=subprocess.PIPE, text=True)
        assert engine.stdout is not None and engine.stdout.readline().strip() == "registered"
        killed = time.monotonic()
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        with holding.lock:
            assert holding.lock.wait_for(lambda: holding.dropped == [7], 5)
            assert holding.unregistered == [7] and not holding.held
        assert time.monotonic() - killed < 2  # at once, not after a timeout (generous on a loaded machine)
        assert other.unregistered == [], "a target that never held it was asked to unregister it"
        time.sleep(3 * T)
        assert holding.dropped == [7] and other.dropped == [7], "each target drops each ended registration once"
    finally:
        with_server.close()


def test_a_live_idle_engine_is_touched_every_quarter_timeout_and_never_after_its_end(table_name: str) -> None:
    target = TransferDouble()
    with_server = module(table_name, target)
    try:
        with livereg.open(table_name) as engines:
            worker = engines.register(9)
            for _ in range(8):  # beating, as an engine's daemon thread does; no RPC
                worker.ping()
                time.sleep(T / 4)
            with target.lock:
                assert target.touched.count(9) >= 3, target.touched
            worker.deregister()
            with target.lock:
                assert target.lock.wait_for(lambda: 9 in target.dropped, 5)
                touched = len(target.touched)
            time.sleep(2 * T)
            with target.lock:
                assert len(target.touched) == touched, "touched after its registration ended"
    finally:
        with_server.close()


def test_construction_needs_only_what_can_be_published_and_many_modules_live_in_one_process() -> None:
    names = [unique("many") for _ in range(3)]
    built = [module(name, ctx=SimpleNamespace(chunk_size=SimpleNamespace())) for name in names]
    try:
        for name, made in zip(names, built):
            info = json.loads(made.table.info())
            assert set(info) == {"server"}, "a chunk size that is not an int is not published"
            assert made.report_status()["livereg"]["table"] == name and made.report_status()["livereg"]["reaper_alive"]
        assert len({json.loads(m.table.info())["server"] for m in built}) == 3
    finally:
        for made, name in zip(built, names):
            made.close()
            livereg.unlink(name)


def test_the_factory_drives_every_liveness_target_lmcache_built_and_refuses_unknown_config(table_name: str) -> None:
    target, lookup = TransferDouble(), SimpleNamespace(report_status=dict)
    context = SimpleNamespace(server_context=SimpleNamespace(chunk_size=256), modules=(lookup, target),
                              config={"table": table_name, "reap_timeout_seconds": T})
    [made] = build_server_modules(context)
    try:
        assert made.context is context.server_context
        assert json.loads(made.table.info())["chunk_size"] == 256
    finally:
        made.close()
    context.config = {"table": table_name, "reap_timeout": 3}
    with pytest.raises(ValueError, match="unknown config key.*reap_timeout"):
        build_server_modules(context)


def test_install_without_lmcache_logs_nothing_and_waits_for_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="livereg.lmcache")
    livereg.lmcache.install()
    livereg.lmcache.install()  # idempotent
    assert [r.getMessage() for r in caplog.records] == []


def test_vllm_finds_install_among_its_general_plugins() -> None:
    from importlib.metadata import entry_points

    plugins = [e for e in entry_points(group="vllm.general_plugins") if e.name == "livereg_lmcache"]
    assert len(plugins) == 1 and plugins[0].load() is livereg.lmcache.install


def test_a_token_file_others_can_read_is_refused_naming_its_mode(table_name: str, tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o644)
    with pytest.raises(PermissionError, match="readable by everyone \\(mode 0644\\)"):
        module(table_name, listen="tcp://127.0.0.1:0", token_file=str(token))
    token.chmod(0o640)
    module(table_name, listen="tcp://127.0.0.1:0", token_file=str(token)).close()
