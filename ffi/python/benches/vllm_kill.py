"""SIGKILL of a real vLLM engine's worker (``VLLM::Worker``, PyPI's CPU
build, with LMCache's connector) → LMCache's real 0.5.6 server lets go of
the engine: with livereg's server module, beside the kernel's own word that
the process ended and beside stock LMCache, in the same run.

Each run also records when the worker's registration is first seen
``dying`` in the table (its death word marked by the kernel as the process
began to exit), before the pidfd.

Each run starts one engine (``tests_lmcache/vllm_engine.py``: vLLM's
three-process layout, livereg's plugin loaded by vLLM from its entry point),
opens a pidfd on its worker, SIGKILLs the worker and records when the pidfd
became readable (the kernel's floor: nothing can see the death earlier) and
when the server's transfer module stopped holding the engine (read from its
``report_status()`` every 10 ms). The livereg server runs the server module
with livereg's timeout at 1 s; the stock one runs LMCache's own reap timeout
at its 30 s floor, with the engine's livereg pointed at a table that does
not exist (the plugin then does nothing).

Usage (in the environment ``ffi/python/vllm-env`` makes, with this
package's wheel installed, as ``ffi/python/test-lmcache`` leaves it):
``python benches/vllm_kill.py [--runs N] [--stock-runs M] [--quick]``;
``--quick``: one livereg run, no stock. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Set

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests_lmcache"))
from conftest import Server, free_port, unique  # noqa: E402
from vllm_engines import Engine, make_model  # noqa: E402

import livereg  # noqa: E402

LMCACHE_TIMEOUT = 30.0
LIVEREG_TIMEOUT = 1.0


def held(server: Server) -> Set[int]:
    with server.changed:
        return set(server.changes[-1]["ids"]) if server.changes else set()


def dying_seen(table: str, instance_id: int, found: List[float]) -> None:
    """Appends when the table first shows ``instance_id``'s registration
    ``dying`` (its worker's death word marked), looking every millisecond
    for up to 30 s; nothing if it never does (a table without death words)."""
    try:
        handle = livereg.open(table)
    except livereg.Error:
        return
    until = time.monotonic() + 30
    while time.monotonic() < until:
        states = {r.state for r in handle.status().registrations if r.instance_id == instance_id}
        if livereg.RegistrationState.DYING in states:
            found.append(time.monotonic())
            return
        time.sleep(0.001)


def kill_once(server: Server, model: Path, table: str, wait: float, with_livereg: bool = True) -> Dict[str, float]:
    """One engine started, its worker SIGKILLed: seconds from the kill to
    its registration seen dying, to the pidfd readable and to the server
    letting go. The rest of its tree is killed after, and waited for
    (what a stock engine left in /dev/shm is removed then)."""
    before = held(server)
    engine = Engine(model, server.port, table, with_livereg=with_livereg)
    try:
        server.wait_for(lambda: bool(held(server) - before), 30, "the engine to be held")
        [instance_id] = held(server) - before
        pidfd = os.pidfd_open(engine.worker)
        dying: List[float] = []
        watching = threading.Thread(target=dying_seen, args=(table, instance_id, dying))
        watching.start()
        try:
            killed_at = time.monotonic()
            os.kill(engine.worker, signal.SIGKILL)
            select.select([pidfd], [], [], 30)
            exited_at = time.monotonic()
        finally:
            os.close(pidfd)
        gone_at = server.wait_gone(instance_id, wait)
        watching.join()
        seen = {"dying": dying[0] - killed_at} if dying else {}
        return {"exited": exited_at - killed_at, "gone": gone_at - killed_at, **seen}
    finally:
        engine.close()


def row(what: str, seconds: List[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (f"| {what} | {len(ms)} | {statistics.median(ms):,.1f} | {max(ms):,.1f} | {min(ms):,.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--stock-runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    runs, stock_runs = (1, 0) if options.quick else (options.runs, options.stock_runs)
    with tempfile.TemporaryDirectory(prefix="livereg-bench-model-") as folder:
        measure(make_model(Path(folder)), runs, stock_runs)


def measure(model: Path, runs: int, stock_runs: int) -> None:
    table = unique("bench")
    server = Server(free_port(), table, module={"table": table, "reap_timeout_seconds": LIVEREG_TIMEOUT},
                    timeout=LMCACHE_TIMEOUT)
    try:
        ours = [kill_once(server, model, table, 10) for _ in range(runs)]
    finally:
        server.kill()
        try:
            livereg.unlink(table)
        except livereg.NotFoundError:
            pass
    stock: List[Dict[str, float]] = []
    if stock_runs:
        nowhere = unique("nowhere")
        server = Server(free_port(), nowhere, timeout=LMCACHE_TIMEOUT)
        try:
            stock = [kill_once(server, model, nowhere, 3 * LMCACHE_TIMEOUT, with_livereg=False)
                     for _ in range(stock_runs)]
        finally:
            server.kill()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}")
    print("| SIGKILL of VLLM::Worker → | runs | median ms | max ms | min ms |")
    print("|---|---:|---:|---:|---:|")
    floor = [r["exited"] for r in ours]
    dying = [r["dying"] for r in ours if "dying" in r]
    if dying:
        print(row("its registration seen dying (its death word marked)", dying))
    print(row("its pidfd readable (the kernel's word that it ended)", floor))
    print(row(f"livereg server module lets go (timeout {LIVEREG_TIMEOUT:g} s)", [r["gone"] for r in ours]))
    if stock:
        print(row(f"stock LMCache 0.5.6 lets go (timeout {LMCACHE_TIMEOUT:g} s)", [r["gone"] for r in stock]))
    livereg_median = statistics.median(r["gone"] for r in ours)
    print(f"\nlivereg / floor (medians): {livereg_median / statistics.median(floor):.2f}x")
    if stock:
        print(f"stock / livereg (medians): {statistics.median(r['gone'] for r in stock) / livereg_median:,.0f}x")


if __name__ == "__main__":
    main()
