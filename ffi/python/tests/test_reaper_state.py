"""The reaper's life from Python: ``Table.reaper_state`` (serving with its
boot token and pid, dying, absent), ``Table.wait_reaper_state`` woken when
the reaper's process is SIGKILLed, and a new reaper seen with a new token;
``WorkerLiveness(on_server=...)`` told of each."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable, List

import livereg
from livereg.lmcache import WorkerLiveness

from conftest import python_child

REAPER = """
import sys, livereg
table = livereg.open(sys.argv[1])
reaper = table.start_reaper()
print("serving", flush=True)
sys.stdin.read()
"""


def reaper_process(table: livereg.Table) -> "subprocess.Popen[bytes]":
    child = subprocess.Popen(python_child(REAPER, table.name), stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"serving"
    return child


def test_a_table_without_a_reaper_says_absent_and_one_with_says_its_token_and_pid(
    make_table: Callable[..., livereg.Table],
) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    assert table.reaper_state == livereg.ReaperState("absent")
    assert not table.reaper_state.serving
    with table.start_reaper():
        state = table.reaper_state
        assert state.serving and state.state == "serving"
        assert state.pid == os.getpid()
        assert state.boot_token == table.probe()
    assert table.reaper_state.state == "absent"


def test_a_killed_reaper_process_is_seen_at_once_and_its_successor_by_a_new_token(
    make_table: Callable[..., livereg.Table],
) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    child = reaper_process(table)
    before = table.reaper_state
    assert before.serving and before.pid == child.pid
    seen: List[livereg.ReaperState] = []
    waiter = threading.Thread(target=lambda: seen.append(table.wait_reaper_state(before, 20.0)))
    waiter.start()
    time.sleep(0.05)
    killed = time.monotonic()
    child.send_signal(signal.SIGKILL)
    waiter.join(20.0)
    after = time.monotonic() - killed
    assert seen and seen[0].state in ("dying", "absent"), seen
    # Generous (a loaded machine); the C test reports the figures.
    assert after < 2.0, after
    child.wait()
    now = seen[0]
    deadline = time.monotonic() + 20.0
    while now.state != "absent":
        assert time.monotonic() < deadline, now
        now = table.wait_reaper_state(now, 1.0)
    successor = reaper_process(table)
    try:
        now = table.wait_reaper_state(now, 20.0)
        assert now.serving and now.pid == successor.pid
        assert now.boot_token != before.boot_token
    finally:
        successor.kill()
        successor.wait()


def test_a_wait_returns_the_known_state_when_nothing_changes(make_table: Callable[..., livereg.Table]) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    started = time.monotonic()
    assert table.wait_reaper_state(livereg.ReaperState("absent"), 0.1).state == "absent"
    assert time.monotonic() - started >= 0.1


def test_worker_liveness_tells_on_server_of_a_killed_server_and_of_its_successor(
    make_table: Callable[..., livereg.Table],
) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    child = reaper_process(table)
    told: List[livereg.ReaperState] = []
    changed = threading.Condition()

    def on_server(state: livereg.ReaperState) -> None:
        with changed:
            told.append(state)
            changed.notify_all()

    def until(what: Callable[[livereg.ReaperState], bool]) -> livereg.ReaperState:
        with changed:
            assert changed.wait_for(lambda: any(what(s) for s in told), 20.0), told
            return next(s for s in told if what(s))

    liveness = WorkerLiveness(table, 5, on_server=on_server)
    try:
        first = until(lambda s: s.serving)
        assert first.pid == child.pid
        child.send_signal(signal.SIGKILL)
        until(lambda s: s.state in ("dying", "absent"))
        child.wait()
        successor = reaper_process(table)
        try:
            second = until(lambda s: s.serving and s.boot_token != first.boot_token)
            assert second.pid == successor.pid
        finally:
            successor.kill()
            successor.wait()
    finally:
        liveness.close()


def test_a_session_worker_says_serving_while_connected_and_absent_once_the_server_is_gone(
    make_table: Callable[..., livereg.Table], tmp_path: "os.PathLike[str]",
) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    address = f"unix:{os.path.join(tmp_path, 'server.sock')}"
    reaper = table.start_reaper(listen=[address])
    worker = livereg.connect(address, 4)
    try:
        state = worker.reaper_state
        assert state == livereg.ReaperState("serving", table.probe(), 0)
        reaper.stop()
        assert worker.wait_reaper_state(state, 20.0).state == "absent"
    finally:
        worker.deregister()
