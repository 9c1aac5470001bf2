"""The engine plugin acting on the LMCache server's life (``_adapters``,
``_server_watch``), with adapters shaped as LMCache 0.5.6's (a health event,
a scheduler's events per server, a message-queue client's pending futures)
and the server's reaper a real process SIGKILLed: degraded at once, its
pending requests failed, a late heartbeat refused; a new server's KV caches
registered once before the adapters are healthy again, however fast the
restart."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import livereg
from livereg.lmcache._adapters import Adapters
from livereg.lmcache._degraded import Gate, fail_pending
from livereg.lmcache._health import engine_health
from livereg.lmcache._server_watch import ServerWatch

from conftest import python_child

#: A server module's info area (``_common.server_info``), then a reaper.
REAPER = """
import sys, livereg
table = livereg.open(sys.argv[1])
if sys.argv[2] == "ours":
    table.set_info('{"server": "%s", "chunk_size": 256}' % sys.argv[3])
reaper = table.start_reaper()
print("serving", flush=True)
sys.stdin.read()
"""
#: Generous: a loaded 2-core machine (the figures are in the report).
SOON = 10.0


def reaper_process(table: livereg.Table, ours: bool = True, server: str = "s1") -> "subprocess.Popen[bytes]":
    child = subprocess.Popen(python_child(REAPER, table.name, "ours" if ours else "other", server),
                             stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"serving"
    return child


def kill(child: "subprocess.Popen[bytes]") -> float:
    killed = time.monotonic()
    child.send_signal(signal.SIGKILL)
    child.wait()
    return killed


class Future:
    """LMCache's ``MessagingFuture``, as far as the plugin reads it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.exception: Optional[BaseException] = None

    def query(self) -> bool:
        return self.done.is_set()

    def set_exception(self, exception: BaseException) -> None:
        self.exception = exception
        self.done.set()


class Spec:
    def __init__(self, operation: str) -> None:
        self.operation = operation


class Queue:
    """LMCache's ZMQ ``MessageQueueClient``: its pending futures."""

    def __init__(self) -> None:
        self.pending_futures: Dict[int, Tuple[Future, Spec]] = {}

    def send(self, operation: str) -> Future:
        future = Future()
        self.pending_futures[len(self.pending_futures)] = (future, Spec(operation))
        return future


class Client:
    def __init__(self) -> None:
        self._message_queue_client = Queue()


class WorkerAdapter:
    """``LMCacheMPWorkerAdapter``'s health, client and recovery."""

    def __init__(self, instance_id: int) -> None:
        self.instance_id = instance_id
        self.kv_caches = {"layer.0": object()}
        self.transfer_ctx = object()
        self.req_client = Client()
        self._health_event = threading.Event()
        self._health_event.set()
        self.stock_recoveries = 0

    def _reregister_kv_caches_callback(self) -> bool:
        self.stock_recoveries += 1
        return True

    @property
    def is_healthy(self) -> bool:
        return self._health_event.is_set()


class SchedulerAdapter:
    """``LMCacheMPSchedulerAdapter``: one event per server."""

    def __init__(self) -> None:
        self.req_clients = {"tcp://127.0.0.1:1": Client()}
        self._health_events = {"tcp://127.0.0.1:1": threading.Event()}
        self._health_events["tcp://127.0.0.1:1"].set()

    @property
    def is_healthy(self) -> bool:
        return all(event.is_set() for event in self._health_events.values())


class Registrations:
    """The registrations sent, by token (the plugin's replay, faked)."""

    def __init__(self) -> None:
        self.sent: List[Tuple[int, int]] = []
        self._held: Dict[int, int] = {}
        self.lock = threading.Lock()

    def __call__(self, adapter: Any, token: int) -> bool:
        if not getattr(adapter, "kv_caches", None):
            return True
        with self.lock:
            if self._held.get(adapter.instance_id) != token:
                self.sent.append((adapter.instance_id, token))
                self._held[adapter.instance_id] = token
        return True


def until(check: Callable[[], bool], what: str, timeout: float = SOON) -> float:
    """Seconds until ``check()`` held."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"waited {timeout}s for {what}"
        time.sleep(0.002)
    return time.monotonic() - started


def test_a_killed_server_degrades_every_adapter_at_once_fails_its_waiting_requests_and_refuses_a_late_heartbeat(
    make_table: Callable[..., livereg.Table],
) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    server = reaper_process(table)
    watch = ServerWatch(table)
    try:
        sent = Registrations()
        held = Adapters(watch, register=sent)
        worker, scheduler = WorkerAdapter(7), SchedulerAdapter()
        held.adopt(worker)
        held.adopt(scheduler)
        assert worker.is_healthy and scheduler.is_healthy
        assert isinstance(worker._health_event, Gate)
        queue = worker.req_client._message_queue_client
        prepare, store = queue.send("prepare_store"), queue.send("store")
        lookup = scheduler.req_clients["tcp://127.0.0.1:1"]._message_queue_client.send("lookup")

        killed = kill(server)
        degraded = until(lambda: not worker.is_healthy and not scheduler.is_healthy, "the adapters degraded")
        degraded_after = time.monotonic() - killed
        assert degraded_after < 2.0, f"degraded {degraded_after:.3f}s after the SIGKILL"
        until(lambda: prepare.query() and lookup.query(), "the waiting requests failed")
        assert isinstance(prepare.exception, TimeoutError) and isinstance(lookup.exception, TimeoutError)
        assert "is gone" in str(prepare.exception)
        assert not store.query(), "a store is left to LMCache's own degraded drain"
        # A heartbeat's PING answered by the dying server: refused.
        worker._health_event.set()
        scheduler._health_events["tcp://127.0.0.1:1"].set()
        assert not worker.is_healthy and not scheduler.is_healthy
        # LMCache's heartbeat recovery while no server serves: not healthy.
        assert worker._reregister_kv_caches_callback() is False
        assert worker.stock_recoveries == 0
        assert sent.sent == [] and degraded >= 0
    finally:
        watch.stop()


def test_a_request_sent_after_the_degrade_fails_too_until_a_new_server_serves(
    make_table: Callable[..., livereg.Table],
) -> None:
    """The engine-driven store: its prepare failed by the degrade, the step
    sends the commit; a step that passed the health check just before it
    closed sends its prepare. Neither may wait out LMCache's mq_timeout."""
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    server = reaper_process(table)
    watch = ServerWatch(table)
    successor: Optional["subprocess.Popen[bytes]"] = None
    try:
        held = Adapters(watch, register=Registrations())
        worker = WorkerAdapter(11)
        held.adopt(worker)
        queue = worker.req_client._message_queue_client
        prepare = queue.send("prepare_store")
        kill(server)
        until(lambda: prepare.query(), "the waiting prepare failed")
        time.sleep(0.2)  # well after the degrade's own pass
        commit = queue.send("commit_store")
        until(lambda: commit.query(), "the commit sent after the degrade failed")
        assert isinstance(commit.exception, TimeoutError) and "is gone" in str(commit.exception)
        successor = reaper_process(table, server="s2")
        until(lambda: worker.is_healthy, "the adapter healthy again")
        answered = queue.send("lookup")
        time.sleep(0.2)
        assert not answered.query(), "a request to the serving server was failed"
    finally:
        watch.stop()
        if successor is not None:
            kill(successor)


def test_a_new_server_gets_the_kv_caches_once_before_the_adapters_are_healthy_again(
    make_table: Callable[..., livereg.Table],
) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    server = reaper_process(table)
    watch = ServerWatch(table)
    successor: Optional["subprocess.Popen[bytes]"] = None
    try:
        sent = Registrations()
        held = Adapters(watch, register=sent)
        worker, scheduler = WorkerAdapter(9), SchedulerAdapter()
        held.adopt(worker)
        held.adopt(scheduler)
        kill(server)
        until(lambda: not worker.is_healthy, "the worker adapter degraded")
        successor = reaper_process(table, server="s2")
        token = table.probe()
        healthy = until(lambda: worker.is_healthy and scheduler.is_healthy, "the adapters healthy again")
        assert sent.sent == [(9, token)], "the KV caches were not registered once with the new server"
        assert held.restored.is_set() and held.healthy_after is not None and held.healthy_after < SOON
        # LMCache's heartbeat recovery now: the same server holds them.
        assert worker._reregister_kv_caches_callback() is True
        assert sent.sent == [(9, token)] and worker.stock_recoveries == 0
        assert healthy >= 0
    finally:
        watch.stop()
        if successor is not None:
            kill(successor)


def test_a_restart_between_two_heartbeats_is_a_new_server_all_the_same() -> None:
    """Two PINGs that both succeed are no evidence of one server: a new
    token with no gone state seen between degrades, then registers."""

    class Watch:
        armed = True

        def __init__(self) -> None:
            self.state = livereg.ReaperState("serving", 1, 100)
            self.listeners: List[Any] = []

        def listen(self, listener: Any) -> None:
            self.listeners.append(listener)

        def serving_token(self) -> Optional[int]:
            return self.state.boot_token

    watch = Watch()
    sent = Registrations()
    held = Adapters(watch, register=sent)  # type: ignore[arg-type]
    worker = WorkerAdapter(11)
    held.adopt(worker)
    waiting = worker.req_client._message_queue_client.send("prepare_retrieve")
    old, watch.state = watch.state, livereg.ReaperState("serving", 2, 200)
    held.changed(watch.state, old)
    assert waiting.query(), "a request sent to the old server still waits"
    until(held.restored.is_set, "the restore")
    assert sent.sent == [(11, 2)] and worker.is_healthy


def test_a_table_some_other_reaper_serves_says_nothing_of_the_cache_server(
    make_table: Callable[..., livereg.Table],
) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    server = reaper_process(table, ours=False)
    watch = ServerWatch(table)
    try:
        held = Adapters(watch, register=Registrations())
        worker = WorkerAdapter(13)
        held.adopt(worker)
        killed = kill(server)
        until(lambda: not watch.state.serving, "the reaper's end seen")
        time.sleep(0.2)
        assert worker.is_healthy, "an adapter degraded for a reaper that is not its server"
        assert not watch.armed and killed > 0
    finally:
        watch.stop()


def test_fail_pending_leaves_answered_requests_and_stores_alone() -> None:
    adapter = WorkerAdapter(15)
    queue = adapter.req_client._message_queue_client
    answered, retrieve, register = queue.send("lookup"), queue.send("retrieve"), queue.send("register_kv_cache")
    answered.done.set()
    assert fail_pending(adapter, "gone") == 1
    assert answered.exception is None and not retrieve.query() and isinstance(register.exception, TimeoutError)


def test_the_health_route_says_the_cache_server_is_absent_and_since_when_still_200(
    make_table: Callable[..., livereg.Table], monkeypatch: Any,
) -> None:
    import livereg.lmcache._server_watch as watched

    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    server = reaper_process(table)
    monkeypatch.setenv("LIVEREG_LMCACHE_TABLE", table.name)
    monkeypatch.setattr(watched, "_watch", None)
    monkeypatch.setattr(watched, "_tried", False)
    key = "kvserver" + str(time.monotonic_ns())
    try:
        status, body = engine_health(key, kv_server=True)
        assert body["kv_server"] == "serving" and body["kv_server_pid"] == server.pid, body
        killed_wall = time.time()
        kill(server)
        watch = watched.server_watch()
        assert watch is not None
        until(lambda: engine_health(key, kv_server=True)[1]["kv_server"] == "absent", "absent in the body")
        status, body = engine_health(key, kv_server=True)
        assert status == engine_health(key)[0], "a gone cache server changed the route's status code"
        assert killed_wall - 1.0 <= body["kv_server_since"] <= time.time(), (killed_wall, body)
        assert json.dumps(body)
    finally:
        if watched._watch is not None:
            watched._watch.stop()


class Context:
    """A transfer context as the plugin wraps one: each ``register`` counted."""

    def __init__(self, instance_id: int) -> None:
        self._instance_id = instance_id
        self.registers = 0

    def register(self) -> None:
        self.registers += 1

    def unregister(self) -> None:
        pass


def test_a_new_server_gets_one_registration_whoever_asks_first(
    make_table: Callable[..., livereg.Table], monkeypatch: Any, caplog: Any,
) -> None:
    from livereg.lmcache import _engine

    for name in ("register", "unregister"):
        wrap = _engine._wrap_register if name == "register" else _engine._wrap_end
        monkeypatch.setattr(Context, name, wrap(Context.__dict__[name]))
    table = make_table(reap_timeout=1.5, registration_grace=1.5)
    monkeypatch.setenv("LIVEREG_LMCACHE_TABLE", table.name)
    reaper = table.start_reaper()
    context = Context(21)
    try:
        context.register()
        engine = _engine.engine_of(21)
        assert engine is not None and engine.registered_token == table.probe()
        assert engine.register_with(table.probe() or 0) and context.registers == 1, "the same server asked again"
        reaper.stop()
        reaper = table.start_reaper()
        token = table.probe()
        assert token is not None and engine.register_with(token) and context.registers == 2
        # livereg's own telling (the beat thread sees the new token; the
        # registration holds) replays too: answered by the server that has
        # it already.
        caplog.set_level(logging.WARNING, logger="livereg.lmcache")
        until(lambda: "registering its KV caches again (server restarted)" in caplog.text, "livereg's telling",
              timeout=30.0)
        time.sleep(1.0)
        assert context.registers == 2, f"{context.registers} registrations for two servers"
        assert engine.liveness.registrations == 1, "livereg's registration was ended at the restart"
    finally:
        context.unregister()
        _engine._engines.clear()
        reaper.stop()
