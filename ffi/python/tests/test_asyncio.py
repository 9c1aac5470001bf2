"""The reaper on an asyncio loop: ``async for event in reaper.events()``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from typing import Callable, List

from conftest import python_child
from test_reaping import CHILD_WORKER

import livereg

MakeTable = Callable[..., livereg.Table]


async def largest_stall(stop: asyncio.Event, gaps: List[float]) -> None:
    """Ticks every 5 ms and records the longest gap between ticks."""
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


def test_a_sigkilled_worker_arrives_on_the_loop_through_the_descriptor(make_table: MakeTable) -> None:
    # Scans are 2 s apart: an event within a second came by the wake-up.
    table = make_table(reap_timeout=8.0, registration_grace=8.0)

    async def main() -> float:
        with table.acquire_reaper() as reaper, subprocess.Popen(
            python_child(CHILD_WORKER, table.name), stdout=subprocess.PIPE
        ) as child:
            assert child.stdout is not None
            line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
            assert line.strip() == b"registered"
            events = reaper.events()
            await asyncio.sleep(0.1)
            killed = time.monotonic()
            os.kill(child.pid, signal.SIGKILL)
            event = await asyncio.wait_for(events.__anext__(), 5)
            latency = time.monotonic() - killed
            assert (event.instance_id, event.reason, event.pid) == (42, livereg.Reason.PROCESS_EXITED, child.pid)
            return latency

    latency = asyncio.run(main())
    assert latency < 1.0, f"{latency * 1000:.1f} ms"


def test_the_loop_is_never_blocked_by_scans_or_slow_callbacks(make_table: MakeTable) -> None:
    table = make_table(capacity=512, reap_timeout=0.4, registration_grace=0.8)
    slow_calls: List[int] = []

    def slow_on_drop(event: livereg.DropEvent) -> None:
        slow_calls.append(event.instance_id)
        time.sleep(0.2)  # a slow drop handler: runs off the loop

    async def main() -> List[float]:
        stop = asyncio.Event()
        gaps: List[float] = []
        ticker = asyncio.create_task(largest_stall(stop, gaps))
        workers = [table.register(instance_id) for instance_id in range(1, 301)]
        seen = set()
        with table.acquire_reaper(on_drop=slow_on_drop) as reaper:
            for worker in workers[:3]:
                worker.deregister()
            async for event in reaper.events():
                seen.add(event.instance_id)
                if seen == {1, 2, 3}:
                    break
            for worker in workers[3:]:
                worker.ping()  # the rest beat once: scans now sweep 297 live slots
            await asyncio.sleep(0.3)
        stop.set()
        await ticker
        return gaps

    gaps = asyncio.run(main())
    assert sorted(slow_calls) == [1, 2, 3]
    assert max(gaps) < 0.05, f"the loop stalled {max(gaps) * 1000:.1f} ms"


def test_events_end_when_the_reaper_stops(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)

    async def main() -> List[int]:
        reaper = table.acquire_reaper()
        seen: List[int] = []

        async def consume() -> None:
            async for event in reaper.events():
                seen.append(event.instance_id)

        consumer = asyncio.create_task(consume())
        table.register(5).deregister()
        await asyncio.sleep(0.2)
        reaper.stop()
        await asyncio.wait_for(consumer, 2)
        return seen

    assert asyncio.run(main()) == [5]
    assert table.probe() is None
