"""Reapers: eviction, clear, probe, callbacks and their failures, the GIL,
collection and interpreter exit."""

from __future__ import annotations

import gc
import logging
import os
import queue
import select
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, List, Tuple

import pytest
from conftest import python_child

import livereg

MakeTable = Callable[..., livereg.Table]


def reaped(make_table: MakeTable) -> Tuple[livereg.Table, livereg.Reaper, "queue.Queue[livereg.DropEvent]", "queue.Queue[bool]"]:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    clears: "queue.Queue[bool]" = queue.Queue()
    reaper = table.start_reaper(on_drop=drops.put, on_clear=lambda: clears.put(True))
    return table, reaper, drops, clears


def test_status_has_the_reference_keys(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    stats = table.stats()
    assert stats["enabled"] is True
    assert stats["reap_timeout_seconds"] == 0.4
    assert stats["registration_grace_seconds"] == 0.8
    assert stats["tracked_instances"] == 0
    for key in ("reaper_alive", "boot_token", "ended", "handler_failures", "handlers_overdue", "scans"):
        assert key in stats
    assert "registrations" not in stats and table.status().registrations == []
    assert (table.reap_timeout, table.registration_grace) == (0.4, 0.8)


def test_probe_clear_and_reset_without_a_reaper(make_table: MakeTable) -> None:
    table = make_table()
    assert table.probe() is None
    with pytest.raises(livereg.NoReaperError):
        table.clear(timeout=0.1)
    with pytest.raises(livereg.NoReaperError):
        table.reset(timeout=0.1)


def test_probe_busy_and_clear(make_table: MakeTable) -> None:
    table, reaper, drops, clears = reaped(make_table)
    with reaper:
        token = table.probe()
        assert isinstance(token, int)
        with livereg.open(table.name) as other, pytest.raises(livereg.BusyError):
            other.start_reaper()
        worker = table.register(10, label="cleared")
        worker.ping()
        # A clear runs the clear handler once and leaves the registration.
        table.clear(timeout=5)
        assert clears.get(timeout=5)
        assert clears.empty() and drops.empty()
        worker.ping()
        assert table.stats()["tracked_instances"] == 1
        # A reset ends it (CLEARED), then runs the clear handler.
        table.reset(timeout=5)
        assert clears.get(timeout=5)
        event = drops.get(timeout=5)
        assert (event.instance_id, event.reason, event.label) == (10, livereg.Reason.CLEARED, "cleared")
        with pytest.raises(livereg.EvictedError):
            worker.ping()
        table.register(10).deregister()
    assert table.probe() is None


def test_a_silent_worker_is_evicted_and_told(make_table: MakeTable) -> None:
    table, reaper, drops, _ = reaped(make_table)
    with reaper:
        worker = table.register(11)
        worker.ping()
        event = drops.get(timeout=5)
        assert (event.instance_id, event.reason) == (11, livereg.Reason.TIMEOUT)
        assert event.silent_ns >= 400_000_000
        assert event.last_heartbeat_ns is not None
        with pytest.raises(livereg.EvictedError, match="timeout"):
            worker.ping()


def test_an_eviction_is_logged_once_at_info_through_python_logging(
    make_table: MakeTable, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="livereg")
    table, reaper, drops, _ = reaped(make_table)
    with reaper:
        worker = table.register(14, "gpu14")
        worker.ping()
        drops.get(timeout=5)
    ended = [r for r in caplog.records if r.name == "livereg" and "instance 14 (gpu14" in r.getMessage()]
    assert len(ended) == 1, [r.getMessage() for r in caplog.records]
    assert ended[0].levelno == logging.INFO
    assert "timeout" in ended[0].getMessage() and "silent" in ended[0].getMessage()


def test_a_raising_callback_is_counted_and_logged_and_the_reaper_goes_on(
    make_table: MakeTable, caplog: pytest.LogCaptureFixture
) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    seen: "queue.Queue[int]" = queue.Queue()

    def on_drop(event: livereg.DropEvent) -> None:
        seen.put(event.instance_id)
        raise RuntimeError("handler bug")

    caplog.set_level(logging.WARNING, logger="livereg")
    with table.start_reaper(on_drop=on_drop):
        table.register(12).deregister()
        table.register(13).deregister()
        assert {seen.get(timeout=5), seen.get(timeout=5)} == {12, 13}
        deadline = time.monotonic() + 5
        while table.stats()["handler_failures"] < 2:
            assert time.monotonic() < deadline, table.stats()
            time.sleep(0.01)
        assert table.probe() is not None
        table.register(14).deregister()
        assert seen.get(timeout=5) == 14
    raised = [r for r in caplog.records if r.name == "livereg" and r.exc_info is not None]
    assert len(raised) >= 2, caplog.records
    assert any("handler bug" in r.getMessage() + repr(r.exc_info) for r in raised)


def test_stop_from_a_callback_fails_cleanly_and_the_reaper_stops_after_it(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    outcome: "queue.Queue[str]" = queue.Queue()
    holder: Dict[str, livereg.Reaper] = {}

    def on_drop(event: livereg.DropEvent) -> None:
        try:
            holder["reaper"].stop()
            outcome.put("stopped")
        except livereg.BusyError as error:
            outcome.put(f"busy: {error}")

    holder["reaper"] = table.start_reaper(on_drop=on_drop)
    table.register(14).deregister()
    assert outcome.get(timeout=5).startswith("busy: ")
    deadline = time.monotonic() + 5
    while table.probe() is not None:
        assert time.monotonic() < deadline, "the reaper never stopped"
        time.sleep(0.01)
    holder["reaper"].stop()  # already stopped: nothing to do


def test_a_driven_reaper_refuses_a_scan_or_stop_from_its_own_callback(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    errors: List[str] = []
    holder: Dict[str, livereg.DrivenReaper] = {}

    def on_drop(event: livereg.DropEvent) -> None:
        for call in (holder["reaper"].stop, holder["reaper"].scan):
            try:
                call()
            except livereg.BusyError as error:
                errors.append(str(error))

    with table.acquire_reaper(on_drop=on_drop) as reaper:
        holder["reaper"] = reaper
        table.register(15).deregister()
        ended = reaper.scan()
        assert [event.instance_id for event in ended] == [15]
        assert len(errors) == 2 and "own scan" in errors[0]
        assert not reaper.stopped
    assert reaper.stopped and table.probe() is None


def test_clear_releases_the_gil_while_it_waits(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    ticks = [0]
    done = threading.Event()

    def count() -> None:
        while not done.is_set():
            ticks[0] += 1

    with table.acquire_reaper():  # holds the role, never scans: the clear waits
        counter = threading.Thread(target=count)
        counter.start()
        time.sleep(0.05)
        started, before = time.monotonic(), ticks[0]
        with pytest.raises(livereg.DeadlineExceededError):
            table.clear(timeout=1.0)
        waited, counted = time.monotonic() - started, ticks[0] - before
        done.set()
        counter.join()
    assert waited >= 0.9
    # Holding the GIL through the wait would have frozen the counter (this
    # thread took it back only after the call); released, it counted on.
    assert counted > 100_000, counted


def test_a_driven_reaper_keeps_its_token_and_wakes_for_a_deregistration(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    dropped: List[livereg.DropEvent] = []
    with table.acquire_reaper(on_drop=dropped.append) as reaper:
        token = table.probe()
        for _ in range(10):
            reaper.scan()
            assert reaper.next_scan_in() <= 0.1
        assert table.probe() == token
        worker = table.register(16)
        reaper.scan()
        worker.deregister()
        readable, _, _ = select.select([reaper], [], [], 5)
        assert readable == [reaper]
        ended = reaper.scan()
        assert [(e.instance_id, e.reason) for e in ended] == [(16, livereg.Reason.DEREGISTERED)]
        assert [(e.instance_id, e.reason) for e in dropped] == [(16, livereg.Reason.DEREGISTERED)]
    assert table.probe() is None
    with pytest.raises(livereg.InvalidArgumentError, match="stopped"):
        reaper.scan()


def test_a_collected_reaper_stops(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    reaper = table.start_reaper(on_drop=lambda event: None)
    assert table.probe() is not None
    del reaper
    gc.collect()
    assert table.probe() is None
    driven = table.acquire_reaper()
    del driven
    gc.collect()
    assert table.probe() is None


CHILD_WORKER = """
import sys, time, livereg
table = livereg.open(sys.argv[1])
worker = table.register(42, label='python child')
print('registered', flush=True)
while True:
    worker.ping()
    time.sleep(0.05)
"""


def test_a_worker_killed_with_sigkill_is_dropped(make_table: MakeTable) -> None:
    table, reaper, drops, _ = reaped(make_table)
    with reaper, subprocess.Popen(python_child(CHILD_WORKER, table.name), stdout=subprocess.PIPE) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"registered"
        child.send_signal(signal.SIGKILL)
        event = drops.get(timeout=5)
        assert (event.instance_id, event.reason, event.pid) == (42, livereg.Reason.PROCESS_EXITED, child.pid)
        assert not event.remote


def test_deregistration_is_seen_promptly_by_an_idle_reaper(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=20.0, registration_grace=20.0)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    with table.start_reaper(on_drop=drops.put):
        time.sleep(0.05)
        started = time.monotonic()
        table.register(14).deregister()
        event = drops.get(timeout=5)
        assert event.reason == livereg.Reason.DEREGISTERED
        assert time.monotonic() - started < 2.0  # the next periodic scan is 5 s away


EXITS_WITH_A_RUNNING_REAPER = """
import sys, threading, time, livereg
name, shape = sys.argv[1], sys.argv[2]
table = livereg.create(name, reap_timeout=0.4, registration_grace=0.8)
dropping = threading.Event()
def on_drop(event):
    dropping.set()
    time.sleep(0.3)  # still running when the interpreter exits
reaper = table.start_reaper(on_drop=on_drop)
table.register(1).deregister()
if shape == 'in-callback':
    dropping.wait(5)
elif shape == 'daemon-pinger':
    worker = table.register(2)
    def beat():
        while True:
            worker.ping()
            time.sleep(0.001)
    threading.Thread(target=beat, daemon=True).start()
    time.sleep(0.1)
livereg.unlink(name)
print('exiting', flush=True)
"""


@pytest.mark.parametrize("shape", ["in-callback", "daemon-pinger", "plain"])
def test_interpreter_exit_with_a_running_reaper_neither_hangs_nor_crashes(shape: str) -> None:
    name = f"livereg-pytest-exit-{shape}-{os.getpid()}"
    try:
        done = subprocess.run(
            python_child(EXITS_WITH_A_RUNNING_REAPER, name, shape), capture_output=True, timeout=20
        )
    finally:
        try:
            livereg.unlink(name)
        except livereg.NotFoundError:
            pass
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.strip() == b"exiting"
