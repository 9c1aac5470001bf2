"""The library's threads never need the interpreter while a Python thread
that holds it waits for them: their log records are queued, not delivered
on the spot, and a session worker collected mid-reconnect waits for its
sender with the interpreter released."""

from __future__ import annotations

import ctypes
import gc
import logging
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, List

import pytest
from conftest import loopback_address

import livereg

MakeTable = Callable[..., livereg.Table]


def test_a_thread_that_logs_is_never_stuck_on_the_interpreter_its_waiter_holds(
    make_table: MakeTable, caplog: pytest.LogCaptureFixture
) -> None:
    # The listener logs a wrong token at WARNING before it answers. While
    # this thread holds the interpreter (a call through ctypes.PyDLL keeps
    # it), a client with a wrong token must still be answered: the record is
    # queued, and delivered once the interpreter is free.
    caplog.set_level(logging.WARNING, logger="livereg")
    address = loopback_address("tcp")
    table = make_table()
    reaper = table.start_reaper(listen=[address], token="right")
    client = subprocess.Popen(
        [sys.executable, "-c", _WRONG_TOKEN_CLIENT, address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "ready"
        client.stdin.write("go\n")
        client.stdin.flush()
        ctypes.PyDLL(None).usleep(3_000_000)  # the interpreter held throughout
        answered_while_held = client.poll() is not None
        out, _ = client.communicate(timeout=30)
    finally:
        client.kill()
    assert "PermissionDeniedError" in out, out
    assert answered_while_held, "the listener waited for the interpreter to answer"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("wrong or missing token" in r.getMessage() for r in caplog.records):
        time.sleep(0.01)
    assert any(r.name == "livereg" and "wrong or missing token" in r.getMessage() for r in caplog.records)
    reaper.stop()


_WRONG_TOKEN_CLIENT = """
import sys
import livereg
print("ready", flush=True)
sys.stdin.readline()
try:
    livereg.connect(sys.argv[1], 7, token="wrong", timeout=10.0)
except livereg.Error as error:
    print(type(error).__name__, flush=True)
"""


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
