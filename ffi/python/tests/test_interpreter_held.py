"""The library's threads never need the interpreter while a Python thread
that holds it waits for them: their log records are queued, not delivered
on the spot, and a session worker collected mid-reconnect waits for its
sender with the interpreter released."""

from __future__ import annotations

import gc
import logging
import socket
import threading
import time
from typing import Callable, List

import pytest
from conftest import loopback_address

import livereg
from livereg import _native

MakeTable = Callable[..., livereg.Table]


def test_a_thread_that_logs_is_never_stuck_on_the_interpreter_its_waiter_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="livereg")
    marker = f"logged from a library thread {time.monotonic_ns()}"
    assert _native._log_from_a_thread(marker), "the logging thread waited for the interpreter"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(marker in r.getMessage() for r in caplog.records):
        time.sleep(0.01)
    assert any(r.name == "livereg" and marker in r.getMessage() for r in caplog.records)


def test_a_session_worker_collected_while_reconnecting_leaves_the_interpreter_to_others(
    make_table: MakeTable,
) -> None:
    address = loopback_address("tcp")
    host, port = address[len("tcp://") :].rsplit(":", 1)
    table = make_table(reap_timeout=10.0)
    reaper = table.start_reaper(listen=[address], token="s3cret")
    worker = livereg.connect(address, 41, token="s3cret", timeout=5.0)
    reaper.stop()
    # A listener that takes connections and never answers: the sender's
    # reconnect waits in its hello for the connect timeout.
    mute = socket.create_server((host, int(port)))
    held: List[socket.socket] = []
    accepting = threading.Thread(target=lambda: held.append(mute.accept()[0]), daemon=True)
    accepting.start()
    accepting.join(timeout=10)
    assert held, "the worker's sender never reconnected"

    gaps: List[float] = []
    stop = threading.Event()

    def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.1)
    started = time.monotonic()
    del worker
    gc.collect()
    collected_in = time.monotonic() - started
    time.sleep(0.1)
    stop.set()
    ticker.join()
    for conn in held:
        conn.close()
    mute.close()
    assert collected_in > 0.5, "the collection did not wait for the sender: nothing was tested"
    assert max(gaps) < 0.4, f"another thread was kept out for {max(gaps):.2f} s"
