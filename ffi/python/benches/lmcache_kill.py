"""SIGKILL of an LMCache engine → its entry gone from the real 0.5.6
server's transfer module: with livereg's server module, beside stock
LMCache in the same run.

Both servers run LMCache's own ``run_cache_server`` on CPU with its reap
timeout at its floor, 30 s (grace 30 s); the engines are built from
LMCache's own worker code (``create_transfer_context`` + ``register``,
engine-driven) and PING every 10 s as its heartbeat thread does. The
livereg engines also run ``livereg.lmcache.install()``; livereg's own
timeout is 1 s. "Gone" is read from the server's ``report_status()`` every
10 ms (see ``tests_lmcache/lmcache_server.py``).

Usage (in the LMCache environment, after ``ffi/python/test-lmcache`` built
it): ``python benches/lmcache_kill.py [--runs N] [--quick]``; ``--quick``
runs livereg only, 3 engines. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests_lmcache"))
from conftest import Engine, Server, free_port, unique  # noqa: E402

import livereg  # noqa: E402

LMCACHE_TIMEOUT = 30.0
PING_EVERY = 10.0


def start_engines(server: Server, first_id: int, count: int, install: bool) -> List[Engine]:
    """``count`` engines started side by side (each blocks until held)."""
    engines: List[Optional[Engine]] = [None] * count

    def start(index: int) -> None:
        engines[index] = Engine(server, first_id + index, install=install, ping=PING_EVERY)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(engines), "an engine did not start"
    return [e for e in engines if e is not None]


def kill_each(server: Server, engines: List[Engine], together: bool) -> List[float]:
    """SIGKILL → gone, in seconds, per engine: one at a time, or all at once."""
    if together:
        killed = [e.signal(signal.SIGKILL) for e in engines]
        return [server.wait_gone(e.instance_id, 3 * LMCACHE_TIMEOUT) - k for e, k in zip(engines, killed)]
    latencies = []
    for engine in engines:
        time.sleep(0.2)
        reaped: List[float] = []
        def reap(process: "subprocess.Popen[str]" = engine.process) -> None:
            process.wait()
            reaped.append(time.monotonic())

        waiter = threading.Thread(target=reap)
        waiter.start()
        killed_at = engine.signal(signal.SIGKILL)
        latencies.append(server.wait_gone(engine.instance_id, 10) - killed_at)
        waiter.join()
        EXITS.append(reaped[0] - killed_at)
    return latencies


#: SIGKILL → the engine process reaped by its parent (this script): the
#: kernel's own exit of a torch process, before which no one can see it dead.
EXITS: List[float] = []


def measure(runs: int, with_livereg: bool) -> List[float]:
    table = unique("bench")
    module = {"table": table, "reap_timeout_seconds": 1.0} if with_livereg else None
    server = Server(free_port(), table, module=module, timeout=LMCACHE_TIMEOUT)
    engines: List[Engine] = []
    try:
        engines = start_engines(server, 1000, runs, install=with_livereg)
        # livereg: one at a time (each its own detection); stock: together
        # (each waits out the same timeout, so they are independent).
        return kill_each(server, engines, together=not with_livereg)
    finally:
        for engine in engines:
            engine.kill()
        server.kill()
        try:
            livereg.unlink(table)
        except livereg.NotFoundError:
            pass


def row(name: str, latencies: List[float]) -> str:
    ms = [1000 * x for x in latencies]
    return f"| {name} | {len(ms)} | {statistics.median(ms):,.1f} | {max(ms):,.1f} | {min(ms):,.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    runs = 3 if options.quick else options.runs
    ours = measure(runs, with_livereg=True)
    stock = None if options.quick else measure(runs, with_livereg=False)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, lmcache 0.5.6")
    print()
    print("| SIGKILL → entry gone from the transfer module | runs | median ms | max ms | min ms |")
    print("|---|---:|---:|---:|---:|")
    print(row("SIGKILL → process reaped by its parent (the kernel's exit: the floor)", EXITS))
    print(row("livereg server module (livereg timeout 1 s)", ours))
    if stock is not None:
        print(row(f"stock LMCache 0.5.6 (timeout {LMCACHE_TIMEOUT:.0f} s, pings every {PING_EVERY:.0f} s)", stock))
        print()
        print(f"stock median / livereg median: {statistics.median(stock) / statistics.median(ours):,.0f}x")
    print(f"livereg median / the floor's median: {statistics.median(ours) / statistics.median(EXITS):.2f}x")


if __name__ == "__main__":
    main()
