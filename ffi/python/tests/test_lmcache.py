"""livereg.lmcache: the drop-in for a KV-cache server's management module,
built and driven as the reference builds and drives it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from conftest import contained_python, loopback_address, python_child, unique

import livereg
from livereg.lmcache import LiveregManagement, WorkerLiveness

T = 0.4  # the reap timeout of these tests
GRACE = 0.8


class Mirror:
    """A state mirror (as a blend module): only ``drop_instance_state``."""

    def __init__(self) -> None:
        self.dropped: List[Tuple[int, float]] = []
        self.changed = threading.Condition()

    def drop_instance_state(self, instance_id: int) -> None:
        with self.changed:
            self.dropped.append((instance_id, time.monotonic()))
            self.changed.notify_all()

    def drops_of(self, instance_id: int) -> int:
        with self.changed:
            return sum(1 for dropped, _ in self.dropped if dropped == instance_id)


class Transfer(Mirror):
    """A transfer module as the reference's: a last-seen time per registered
    instance (its GPU context), refreshed by ``touch_instance``; its own
    ``reap_stale_instances`` pops and frees the silent ones;
    ``drop_instance_state`` frees nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.last_seen: Dict[int, Tuple[float, bool]] = {}  # id -> (when, touched since registering)
        self.freed: Dict[int, float] = {}

    def attach(self, instance_id: int) -> None:
        """The worker handed its context over."""
        with self.changed:
            self.last_seen[instance_id] = (time.monotonic(), False)
            self.freed.pop(instance_id, None)

    def touch_instance(self, instance_id: int) -> None:
        with self.changed:
            self.last_seen[instance_id] = (time.monotonic(), True)

    def _free(self, instance_id: int) -> None:
        if self.last_seen.pop(instance_id, None) is not None:
            self.freed[instance_id] = time.monotonic()
            self.changed.notify_all()

    def reap_stale_instances(self, timeout: float, grace: float) -> List[int]:
        now = time.monotonic()
        with self.changed:
            stale = [i for i, (at, touched) in self.last_seen.items() if now - at > (timeout if touched else grace)]
            for instance_id in stale:
                self._free(instance_id)
            return stale

    def tracked_instance_count(self) -> int:
        with self.changed:
            return len(self.last_seen)

    def wait_freed(self, instance_id: int, timeout: float = 5.0) -> float:
        with self.changed:
            assert self.changed.wait_for(lambda: instance_id in self.freed, timeout), f"{instance_id} never freed"
            return self.freed[instance_id]


class EvictingTransfer(Transfer):
    """A transfer module that takes the proposed ``evict_instance``."""

    def evict_instance(self, instance_id: int) -> None:
        with self.changed:
            self._free(instance_id)


class Storage:
    def __init__(self) -> None:
        self.calls: List[Tuple[str, Dict[str, Any]]] = []

    def memcheck(self) -> None:
        self.calls.append(("memcheck", {}))

    def clear(self, **options: Any) -> None:
        self.calls.append(("clear", options))


class EventBus:
    def __init__(self) -> None:
        self.published: List[Any] = []

    def publish(self, event: Any) -> None:
        self.published.append(event)


class Ctx:
    """The server context as the reference's module reads it."""

    def __init__(self) -> None:
        self.storage_manager = Storage()
        self.chunk_size = 256
        self.event_bus = EventBus()


CLEARED = [("memcheck", {}), ("clear", {"force": True}), ("memcheck", {})]


@pytest.fixture
def table_name(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = unique("lmcache")
    monkeypatch.setenv("LIVEREG_LMCACHE_TABLE", name)  # the default both sides find
    yield name
    try:
        livereg.unlink(name)
    except livereg.NotFoundError:
        pass


def management(ctx: Ctx, *targets: Any, timeout: float = T, grace: float = GRACE) -> LiveregManagement:
    """Built exactly as the reference is built."""
    return LiveregManagement(ctx, targets, timeout, grace)


def wait_until(what: str, check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_reference_defaults_disable_reaping(table_name: str) -> None:
    ctx, target = Ctx(), Transfer()
    with LiveregManagement(ctx, [target]) as server:
        assert server.table.name == table_name
        assert server.report_status()["worker_liveness"]["enabled"] is False
        assert server.table.probe() is None  # no reaper
        target.attach(7)
        assert server.ping(7) is True
        time.sleep(0.3)
        assert target.freed == {} and target.dropped == []
        server.clear()  # still clears the cache
        assert ctx.storage_manager.calls == CLEARED
    with LiveregManagement(Ctx()) as bare:
        assert bare.report_status() == {}  # no targets: as the reference


def test_each_method_has_the_reference_effect_on_ctx(table_name: str) -> None:
    ctx, transfer = Ctx(), Transfer()
    with management(ctx, transfer) as server, WorkerLiveness(None, 3) as worker:
        assert server.context is ctx
        assert server.get_chunk_size() == 256
        assert worker.chunk_size == 256  # from the info area, no RPC
        assert server.debug() == "OK"
        server.report_block_allocations(3, "llama", ["r1", "r2"])
        (event,) = ctx.event_bus.published
        assert event.event_type.name == "MP_VLLM_BLOCK_ALLOCATION"
        assert event.metadata == {"instance_id": 3, "model_name": "llama", "records": ["r1", "r2"]}
        handlers = server.get_handlers()
        assert [(h[0].name, h[1], h[2].name) for h in handlers] == [
            ("CLEAR", server.clear, "NORMAL"),
            ("GET_CHUNK_SIZE", server.get_chunk_size, "SYNC"),
            ("PING", server.ping, "NORMAL"),
            ("NOOP", server.debug, "SYNC"),
            ("REPORT_BLOCK_ALLOCATION", server.report_block_allocations, "NORMAL"),
        ]
        transfer.attach(3)
        liveness = server.report_status()["worker_liveness"]
        assert liveness["enabled"] is True
        assert (liveness["reap_timeout_seconds"], liveness["registration_grace_seconds"]) == (T, GRACE)
        assert liveness["tracked_instances"] == 1  # the targets' sum
        assert liveness["livereg_tracked_instances"] == 1
        for key in ("reaper_alive", "ended", "handler_failures", "target_failures"):
            assert key in liveness
    # close() stopped the reaper; the table stays for workers and the next server.
    with livereg.open(table_name) as after:
        assert after.probe() is None


def test_clear_clears_the_storage_and_keeps_every_worker(table_name: str) -> None:
    ctx, transfer, mirror = Ctx(), Transfer(), Mirror()
    with management(ctx, transfer, mirror) as server:
        with WorkerLiveness(table_name, 1) as one, WorkerLiveness(table_name, 2):
            server.clear()
            assert ctx.storage_manager.calls == CLEARED
            # An engine's clear through the table reaches the same code.
            engine_side = livereg.open(table_name)
            engine_side.clear(timeout=5)
            assert ctx.storage_manager.calls == CLEARED * 2
            time.sleep(2 * T)
            assert mirror.dropped == [] and transfer.dropped == []
            assert one.registrations == 1
            assert server.report_status()["worker_liveness"]["livereg_tracked_instances"] == 2
            # A reset drops every worker once, then clears; they come back.
            server.reset()
            assert sorted(i for i, _ in mirror.dropped) == [1, 2]
            assert ctx.storage_manager.calls == CLEARED * 3
            wait_until("workers back", lambda: one.registrations == 2)
            engine_side.close()
        assert server.report_status()["worker_liveness"]["ended"]["cleared"] == 2


CHILD = """
import sys, time, livereg
from livereg.lmcache import WorkerLiveness
name, instance_id = sys.argv[1], int(sys.argv[2])
worker = WorkerLiveness(name, instance_id)
print('registered', flush=True)
time.sleep(60)
"""


def test_a_sigkilled_workers_context_is_freed_at_once_with_evict_and_within_a_timeout_without(
    table_name: str,
) -> None:
    evicting, plain, mirror = EvictingTransfer(), Transfer(), Mirror()
    with management(Ctx(), evicting, plain, mirror):
        with subprocess.Popen(python_child(CHILD, table_name, "9"), stdout=subprocess.PIPE) as child:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"registered"
            evicting.attach(9)
            plain.attach(9)
            time.sleep(T)  # touched by the cycle meanwhile, never freed
            assert evicting.freed == {} and plain.freed == {}
            killed = time.monotonic()
            os.kill(child.pid, signal.SIGKILL)
            at_once = evicting.wait_freed(9) - killed
            by_own_reap = plain.wait_freed(9) - killed
        time.sleep(2 * T)  # the targets' own reaps come round again
        drops = [target.drops_of(9) for target in (evicting, plain, mirror)]
    assert at_once < 0.05, f"evict_instance {at_once * 1000:.1f} ms after SIGKILL"
    # Generous: the bound is T + T/4 after the last touch, plus scheduling.
    assert by_own_reap <= T + T / 4 + 0.25, f"freed by its own reap {by_own_reap:.3f}s after SIGKILL"
    assert drops == [1, 1, 1], "each target dropped the ended registration once"


def test_an_idle_but_alive_worker_is_never_freed(table_name: str) -> None:
    transfer = Transfer()
    with management(Ctx(), transfer), WorkerLiveness(table_name, 5) as worker:
        transfer.attach(5)
        time.sleep(3 * T)  # three timeouts of an engine doing nothing
        assert transfer.freed == {} and transfer.dropped == []
        assert worker.registrations == 1


def test_a_ping_only_worker_stays_while_it_pings_and_is_freed_a_timeout_after(table_name: str) -> None:
    transfer, mirror = Transfer(), Mirror()
    with management(Ctx(), transfer, mirror) as server:
        transfer.attach(21)
        for _ in range(int(3 * T / 0.1)):
            assert server.ping(21) is True
            time.sleep(0.1)
        assert transfer.freed == {} and mirror.dropped == []
        assert server.report_status()["worker_liveness"]["livereg_tracked_instances"] == 1
        stopped = time.monotonic()
        freed = transfer.wait_freed(21) - stopped
        assert T <= freed + 0.1 <= T + T / 4 + 0.35, f"freed {freed:.3f}s after the last ping"
        wait_until("the mirror's drop", lambda: mirror.drops_of(21) == 1)
        time.sleep(2 * T)
        assert (transfer.drops_of(21), mirror.drops_of(21)) == (1, 1)
        assert server.ping(21) is True  # comes back at the next ping


def test_pings_never_wait_on_drops_and_resets_complete_while_workers_ping(table_name: str) -> None:
    mirror = Mirror()
    stop = threading.Event()
    worst: List[float] = []

    def pinger(server: LiveregManagement, instance_id: int) -> None:
        slowest = 0.0
        while not stop.is_set():
            started = time.monotonic()
            server.ping(instance_id)
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.001)
        worst.append(slowest)

    with management(Ctx(), mirror) as server:
        threads = [threading.Thread(target=pinger, args=(server, i)) for i in range(1, 9)]
        for thread in threads:
            thread.start()
        try:
            for _ in range(3):
                wait_until("pingers registered", lambda: server.table.stats()["tracked_instances"] == 8)
                started = time.monotonic()
                server.reset(timeout=5)
                assert time.monotonic() - started < 5
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    assert max(worst) < 1.0, f"a ping took {max(worst):.2f}s"
    assert len(mirror.dropped) >= 24


@pytest.mark.parametrize("instance_id", [0, -1, 2**64, None])
def test_pings_of_any_id_the_reference_accepts_answer_true(
    table_name: str, instance_id: Optional[int], caplog: pytest.LogCaptureFixture
) -> None:
    transfer = Transfer()
    with management(Ctx(), transfer) as server:
        assert server.ping(instance_id) is True
        assert server.ping(instance_id) is True
        assert server.report_status()["worker_liveness"]["livereg_tracked_instances"] == 0
        assert transfer.last_seen == {}  # an untracked prober touches nothing
    logged = [r for r in caplog.records if r.name == "livereg.lmcache" and "not tracked" in r.getMessage()]
    assert len(logged) == (1 if instance_id in (-1, 2**64) else 0)


def test_untrackable_ids_are_logged_once_each_and_the_memory_of_them_is_bounded(
    table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with management(Ctx(), Transfer()) as server:
        for instance_id in range(-1, -2001, -1):
            assert server.ping(instance_id) is True
            assert server.ping(instance_id) is True
    logged = [r for r in caplog.records if r.name == "livereg.lmcache" and "not tracked" in r.getMessage()]
    assert len(logged) == 1024


def test_a_worker_with_id_0_registers_nothing_and_does_not_raise(table_name: str) -> None:
    with management(Ctx(), Transfer()) as server:
        with WorkerLiveness(table_name, 0) as worker:
            assert worker.tracked is False
            assert server.table.stats()["tracked_instances"] == 0


def test_a_raising_target_does_not_stop_the_others_and_is_counted(
    table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Failing(Mirror):
        def drop_instance_state(self, instance_id: int) -> None:
            super().drop_instance_state(instance_id)
            raise RuntimeError(f"target failed for {instance_id}")

    failing, healthy = Failing(), Mirror()
    with management(Ctx(), failing, healthy) as server:
        with WorkerLiveness(table_name, 11):
            pass
        wait_until("the healthy target's drop", lambda: healthy.drops_of(11) == 1)
        assert failing.drops_of(11) == 1
        liveness = server.report_status()["worker_liveness"]
        assert liveness["target_failures"] == 1
        assert liveness["handler_failures"] == 0  # the adapter isolated it
    assert any("drop_instance_state(11)" in r.getMessage() for r in caplog.records if r.name == "livereg.lmcache")


def test_a_table_with_other_settings_is_replaced_when_empty_and_reused_while_engines_are_registered(
    table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="livereg.lmcache")
    management(Ctx(), Mirror(), timeout=5.0).close()  # an earlier server, another timeout
    with management(Ctx(), Mirror()) as restarted:  # nothing registered: the new settings
        assert restarted.table.reap_timeout == pytest.approx(T)
    with livereg.open(table_name) as engines:
        engine = engines.register(3)  # an engine lives: its table's settings stay
        with management(Ctx(), Mirror(), timeout=5.0) as again:
            assert again.table.reap_timeout == pytest.approx(T)
        engine.deregister()
    messages = [r.getMessage() for r in caplog.records if r.name == "livereg.lmcache"]
    assert any("replaced with" in m for m in messages) and any("reused with its own settings" in m for m in messages)
    with pytest.raises(TypeError, match="drop_instance_state"):
        LiveregManagement(Ctx(), [object()])


def test_a_table_held_by_another_live_reaper_with_other_settings_is_refused_naming_both(table_name: str) -> None:
    with management(Ctx(), Mirror()):
        with pytest.raises(livereg.BusyError, match="reap_timeout.*live reaper"):
            management(Ctx(), Mirror(), timeout=5.0)


def test_a_server_restart_tells_workers_and_keeps_their_registration(table_name: str) -> None:
    """Told, never deregistered: an ended registration would have the new
    server free the worker's state, perhaps after the worker (or its
    adapters) registered it with that server already."""
    why: List[str] = []
    first = management(Ctx(), Mirror())
    with WorkerLiveness(table_name, 4, on_register=why.append) as worker:
        first.close()
        mirror = Mirror()
        with management(Ctx(), mirror) as second:  # same settings: opens the table
            wait_until("told", lambda: "server restarted" in why)
            assert worker.registrations == 1, "the registration was ended and taken again"
            assert second.report_status()["worker_liveness"]["livereg_tracked_instances"] == 1
            time.sleep(1.0)  # a scan and its handlers: nothing ended, nothing freed
            assert why == ["start", "server restarted"], why
            assert mirror.drops_of(4) == 0, "the new server dropped a live worker's state"


def test_logging_goes_to_the_livereg_logger(table_name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="livereg.lmcache")
    with management(Ctx(), Mirror()), WorkerLiveness(table_name, 12):
        pass
    assert any("instance 12 registered (start)" in r.getMessage() for r in caplog.records)


ISOLATED_ENGINE = """
import sys, time
from livereg.lmcache import WorkerLiveness
with WorkerLiveness(sys.argv[1], int(sys.argv[2]), label="isolated", token=sys.argv[3]) as liveness:
    print("registered", liveness.chunk_size, flush=True)
    time.sleep(3600)
"""


def test_an_isolated_engine_reaches_the_server_through_its_listener(table_name: str) -> None:
    """The isolated-IPC deployment: the engine's container shares no
    /dev/shm with the server; WorkerLiveness given the server's listening
    address registers there, and its death frees its state at once."""
    address = loopback_address("tcp")
    with pytest.raises(ValueError, match="listen="):
        LiveregManagement(Ctx(), [], 0.0, 0.0, listen=[address], token="t")
    ctx, transfer = Ctx(), EvictingTransfer()
    with LiveregManagement(ctx, [transfer], 30.0, 30.0, listen=[address], token="s3cret") as server:
        engine = contained_python(ISOLATED_ENGINE, address, "9", "s3cret")
        assert engine.stdout is not None
        assert engine.stdout.readline().split() == ["registered", "256"]  # the info area, delivered
        transfer.attach(9)
        assert server.table.status().registrations[0].remote is not None
        killed = time.monotonic()
        engine.send_signal(signal.SIGKILL)  # unshare's parent-death signal kills the engine
        engine.wait()
        freed = transfer.wait_freed(9)
        assert freed - killed < 2.0  # the 30 s timeout cannot explain it
        wait_until("the drop fanned out", lambda: transfer.drops_of(9) == 1)


TLS_ENGINE = """
import sys, time
from livereg.lmcache import WorkerLiveness
address, instance, token, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
with WorkerLiveness(address, instance, label="isolated", token=token, tls_ca=ca) as liveness:
    print("registered", liveness.chunk_size, flush=True)
    liveness.clear()
    print("cleared", flush=True)
    time.sleep(3600)
"""


def test_an_isolated_engine_over_tls_asks_the_server_for_a_clear(table_name: str, tls_files: Dict[str, str]) -> None:
    """The Kubernetes deployment's engine: WorkerLiveness given a tls://
    address and the CA registers from a container; its clear reaches the
    server's ``clear`` (the reference's CLEAR) and evicts nobody; its death
    frees its state at once."""
    files = tls_files
    address = loopback_address("tls")
    ctx, transfer = Ctx(), EvictingTransfer()
    with LiveregManagement(
        ctx,
        [transfer],
        30.0,
        30.0,
        listen=[address],
        token="s3cret",
        tls_cert=files["server.pem"],
        tls_key=files["server.key"],
    ) as server:
        engine = contained_python(TLS_ENGINE, address, "11", "s3cret", files["ca.pem"])
        assert engine.stdout is not None
        assert engine.stdout.readline().split() == ["registered", "256"]
        transfer.attach(11)
        assert engine.stdout.readline().split() == ["cleared"]
        assert ctx.storage_manager.calls == CLEARED
        [row] = server.table.status().registrations
        assert row.instance_id == 11 and row.remote is not None and row.remote["peer"].startswith("tls 127.0.0.1:")
        assert transfer.drops_of(11) == 0  # a clear evicts nobody
        killed = time.monotonic()
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        assert transfer.wait_freed(11) - killed < 2.0
