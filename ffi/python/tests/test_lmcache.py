"""livereg.lmcache: the drop-in for a KV-cache server's management module."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from conftest import python_child, unique

import livereg
from livereg.lmcache import LiveregManagement, WorkerLiveness


class Target:
    """A liveness target that records when each instance's state was dropped."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.dropped: List[Tuple[int, float]] = []
        self.touched: List[int] = []
        self.changed = threading.Condition()

    def touch_instance(self, instance_id: int) -> None:
        self.touched.append(instance_id)

    def drop_instance_state(self, instance_id: int) -> None:
        with self.changed:
            self.dropped.append((instance_id, time.monotonic()))
            self.changed.notify_all()
        if self.fail:
            raise RuntimeError(f"target failed for {instance_id}")

    def ids(self) -> List[int]:
        with self.changed:
            return [instance_id for instance_id, _ in self.dropped]

    def wait_for(self, instance_id: int, timeout: float = 5.0) -> float:
        """When ``instance_id`` was dropped (waits for it)."""
        with self.changed:
            found = self.changed.wait_for(lambda: instance_id in self.ids(), timeout)
            assert found, f"{instance_id} never dropped; dropped {self.dropped}"
            return next(at for dropped, at in self.dropped if dropped == instance_id)


@pytest.fixture
def table_name() -> Iterator[str]:
    name = unique("lmcache")
    yield name
    try:
        livereg.unlink(name)
    except livereg.NotFoundError:
        pass


def management(name: str, *targets: Target, **options: Any) -> LiveregManagement:
    options.setdefault("worker_reap_timeout_seconds", 0.4)
    options.setdefault("worker_registration_grace_seconds", 0.8)
    return LiveregManagement(table=name, liveness_targets=targets, **options)


def test_the_reference_operations_answer_as_the_reference(table_name: str) -> None:
    target = Target()
    with management(table_name, target, chunk_size=256) as server:
        assert server.ping(None) is True
        assert server.debug() == "OK"
        assert server.get_chunk_size() == 256
        liveness = server.report_status()["worker_liveness"]
        assert liveness["enabled"] is True
        assert liveness["tracked_instances"] == 0
        assert liveness["reap_timeout_seconds"] == 0.4
        assert liveness["registration_grace_seconds"] == 0.8
        for key in ("reaper_alive", "ended", "handler_failures", "target_failures"):
            assert key in liveness
        with WorkerLiveness(table_name, 3) as worker:
            assert worker.chunk_size == 256  # from the info area
            assert server.report_status()["worker_liveness"]["tracked_instances"] == 1
    with LiveregManagement(table=table_name, worker_reap_timeout_seconds=0.4,
                           worker_registration_grace_seconds=0.8) as bare:
        assert bare.report_status() == {}  # no targets: as the reference


def test_a_table_with_other_settings_is_refused_naming_both(table_name: str) -> None:
    with management(table_name, Target()):
        with pytest.raises(livereg.IncompatibleError, match="reap_timeout"):
            management(table_name, Target(), worker_reap_timeout_seconds=5.0)
    with pytest.raises(TypeError, match="drop_instance_state"):
        LiveregManagement(table=table_name, liveness_targets=[object()])


def test_an_idle_but_alive_worker_is_not_reaped_over_several_timeouts(table_name: str) -> None:
    target = Target()
    with management(table_name, target) as server, WorkerLiveness(table_name, 5) as worker:
        time.sleep(2.0)  # five timeouts of an engine doing nothing
        assert target.ids() == []
        assert worker.registrations == 1
        assert server.report_status()["worker_liveness"]["tracked_instances"] == 1


CHILD = """
import sys, time, livereg
from livereg.lmcache import WorkerLiveness
name, instance_id, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if shape == 'no-beat':
    table = livereg.open(name)
    worker = table.register(instance_id)   # crashes before its first heartbeat
else:
    worker = WorkerLiveness(name, instance_id)
print('registered', flush=True)
time.sleep(60)
"""


def killed_latency(table_name: str, shape: str, targets: List[Target]) -> float:
    with subprocess.Popen(python_child(CHILD, table_name, "9", shape), stdout=subprocess.PIPE) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"registered"
        time.sleep(0.1)
        killed = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        return max(target.wait_for(9) for target in targets) - killed


@pytest.mark.parametrize("shape", ["beating", "no-beat"])
def test_a_sigkilled_worker_is_dropped_on_every_target_within_50_ms(table_name: str, shape: str) -> None:
    # The reference's defaults: only the exit, not a timeout, can be this fast.
    targets = [Target(), Target()]
    with management(table_name, *targets, worker_reap_timeout_seconds=120.0,
                    worker_registration_grace_seconds=3600.0) as server:
        latency = killed_latency(table_name, shape, targets)
        deadline = time.monotonic() + 5  # counted once the drop returned
        while server.report_status()["worker_liveness"]["ended"]["process_exited"] != 1:
            assert time.monotonic() < deadline, server.report_status()
            time.sleep(0.01)
    assert latency < 0.05, f"dropped {latency * 1000:.1f} ms after SIGKILL"


def test_a_raising_target_does_not_stop_the_others_and_is_counted(
    table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    failing, healthy = Target(fail=True), Target()
    with management(table_name, failing, healthy) as server:
        with WorkerLiveness(table_name, 11):
            pass
        healthy.wait_for(11)
        assert failing.ids() == [11]
        liveness = server.report_status()["worker_liveness"]
        assert liveness["target_failures"] == 1
        assert liveness["handler_failures"] == 0  # the adapter isolated it
    assert any("drop_instance_state(11)" in r.getMessage() for r in caplog.records if r.name == "livereg.lmcache")


def test_clear_ends_every_registration_and_workers_come_back(table_name: str) -> None:
    target = Target()
    why: List[str] = []
    with management(table_name, target) as server:
        with WorkerLiveness(table_name, 1, on_register=why.append), WorkerLiveness(table_name, 2) as second:
            server.clear()
            assert sorted(target.ids()) == [1, 2]  # dropped before clear returns
            deadline = time.monotonic() + 5
            while server.report_status()["worker_liveness"]["tracked_instances"] < 2:
                assert time.monotonic() < deadline, "workers never came back"
                time.sleep(0.02)
            assert why == ["start", "evicted"] and second.registrations == 2
        assert server.report_status()["worker_liveness"]["ended"]["cleared"] == 2


def test_a_server_restart_makes_workers_register_again(table_name: str) -> None:
    why: List[str] = []
    first = management(table_name, Target())
    with WorkerLiveness(table_name, 4, on_register=why.append) as worker:
        first.close()
        target = Target()
        with management(table_name, target) as second:  # same settings: opens the table
            deadline = time.monotonic() + 5
            while "server restarted" not in why:
                assert time.monotonic() < deadline, why
                time.sleep(0.02)
            assert worker.registrations == 2
            assert second.report_status()["worker_liveness"]["tracked_instances"] == 1


def test_a_pinged_id_is_kept_alive_on_its_behalf_and_dropped_when_pings_stop(table_name: str) -> None:
    target = Target()
    with management(table_name, target) as server:
        for _ in range(10):
            assert server.ping(21) is True
            time.sleep(0.1)
        assert target.ids() == [] and target.touched.count(21) == 10
        assert server.report_status()["worker_liveness"]["tracked_instances"] == 1
        stopped = time.monotonic()
        target.wait_for(21)
        assert time.monotonic() - stopped >= 0.3  # the timeout, not at once
        assert server.ping(21) is True  # comes back at the next ping
        assert server.report_status()["worker_liveness"]["tracked_instances"] == 1


def test_reaping_disabled_drops_nothing(table_name: str) -> None:
    target = Target()
    with management(table_name, target, worker_reap_timeout_seconds=0.0) as server:
        assert server.report_status()["worker_liveness"]["enabled"] is False
        with WorkerLiveness(table_name, 6, interval=0.05):
            time.sleep(0.3)
        server.ping(7)
        server.clear()
        time.sleep(0.3)
        assert target.ids() == []
        assert server.table.probe() is None
