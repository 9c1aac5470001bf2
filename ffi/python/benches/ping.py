"""Python heartbeat cost, against its baselines in the same run:

- ``time.monotonic_ns()``: the cheapest thing a Python loop can do with time;
- ``Worker.ping()``: a livereg heartbeat through the native extension;
- a ZMQ REQ/REP ping to a server process over ``ipc://`` (the message-queue
  ping the reference's workers send).

Usage: python benches/ping.py [--quick]. Prints a Markdown table.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import sys
import tempfile
import time
import timeit
from typing import Callable, Dict

import livereg


def per_call_ns(call: Callable[[], object], number: int, repeat: int) -> float:
    """The best of ``repeat`` runs of ``number`` calls, per call."""
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e9


def zmq_server(address: str, ready: "multiprocessing.synchronize.Event") -> None:
    import zmq

    socket = zmq.Context().socket(zmq.REP)
    socket.bind(address)
    ready.set()
    while True:
        message = socket.recv()
        if message == b"stop":
            socket.send(b"bye")
            return
        socket.send(b"pong")


def zmq_ping_ns(number: int, repeat: int) -> float:
    import zmq

    address = f"ipc://{tempfile.gettempdir()}/livereg-bench-{os.getpid()}"
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=zmq_server, args=(address, ready))
    server.start()
    ready.wait(10)
    socket = zmq.Context().socket(zmq.REQ)
    socket.connect(address)

    def ping() -> None:
        socket.send(b"ping")
        socket.recv()

    try:
        return per_call_ns(ping, number, repeat)
    finally:
        socket.send(b"stop")
        socket.recv()
        server.join()


def main() -> None:
    quick = "--quick" in sys.argv
    number, repeat = (100_000, 3) if quick else (2_000_000, 7)
    name = f"livereg-bench-python-{os.getpid()}"
    results: Dict[str, float] = {}
    with livereg.create(name, reap_timeout=10.0) as table:
        try:
            with table.register(1, label="bench") as worker:
                # Interleaved, so both see the same machine.
                for _ in range(2):
                    results["monotonic"] = min(
                        results.get("monotonic", 1e18), per_call_ns(time.monotonic_ns, number, repeat)
                    )
                    results["ping"] = min(results.get("ping", 1e18), per_call_ns(worker.ping, number, repeat))
        finally:
            livereg.unlink(name)
    results["zmq"] = zmq_ping_ns(2_000 if quick else 20_000, repeat)
    print(f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs")
    print()
    print("| figure | per call | ratio |")
    print("|---|---|---|")
    print(f"| `time.monotonic_ns()` | {results['monotonic']:.1f} ns | 1.00x (baseline) |")
    print(f"| `Worker.ping()` | {results['ping']:.1f} ns | **{results['ping'] / results['monotonic']:.2f}x** `monotonic_ns` |")
    print(
        f"| ZMQ REQ/REP ping over `ipc://`, two processes | {results['zmq'] / 1000:.1f} µs "
        f"| {results['zmq'] / results['ping']:,.0f}x `Worker.ping()` |"
    )


if __name__ == "__main__":
    main()
