"""Death seen as it begins, from Python: a SIGKILLed worker is heard dying
(``on_dying``, and an event with ``dying`` set from ``events()``) before its
drop, both with reason ``PROCESS_EXITED``; a worker that still runs never is."""

from __future__ import annotations

import asyncio
import queue
import signal
import subprocess
import time
from typing import Callable, List, Tuple

import livereg
from conftest import python_child

MakeTable = Callable[..., livereg.Table]


def wait_for_death_word(table: livereg.Table, instance_id: int) -> None:
    """Until the worker's death thread holds its process's word (it claims
    it just after the first registration): its death is then seen dying."""
    deadline = time.monotonic() + 10
    while not any(r.death_word for r in table.status().registrations if r.instance_id == instance_id):
        assert time.monotonic() < deadline, "no death word"
        time.sleep(0.002)

# A worker holding 256 MiB of touched pages: the kernel takes a while to
# finish its end, so its death word is seen well before.
WORKER = """
import sys, time, livereg
held = bytearray(256 << 20)
for at in range(0, len(held), 4096):
    held[at] = 1
worker = livereg.open(sys.argv[1]).register(7, label='big')
print('registered', flush=True)
while True:
    worker.ping()
    time.sleep(0.05)
"""


def test_a_killed_worker_is_heard_dying_then_dropped(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)
    heard: "queue.Queue[Tuple[str, livereg.DropEvent]]" = queue.Queue()
    with table.start_reaper(
        on_drop=lambda event: heard.put(("drop", event)),
        on_dying=lambda event: heard.put(("dying", event)),
    ), subprocess.Popen(python_child(WORKER, table.name), stdout=subprocess.PIPE) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"registered"
        wait_for_death_word(table, 7)
        try:
            heard.get(timeout=0.5)
            raise AssertionError("heard a worker that still runs")
        except queue.Empty:
            pass
        child.send_signal(signal.SIGKILL)
        kind, event = heard.get(timeout=20)
        assert (kind, event.dying, event.instance_id) == ("dying", True, 7)
        assert event.reason == livereg.Reason.PROCESS_EXITED and event.pid == child.pid
        kind, event = heard.get(timeout=20)
        assert (kind, event.dying, event.reason) == ("drop", False, livereg.Reason.PROCESS_EXITED)


def test_events_yield_the_dying_event_before_the_drop(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=30.0, registration_grace=30.0)

    async def follow(child: "subprocess.Popen[bytes]") -> List[livereg.DropEvent]:
        seen: List[livereg.DropEvent] = []
        with table.acquire_reaper() as reaper:
            child.send_signal(signal.SIGKILL)
            async for event in reaper.events():
                seen.append(event)
                if not event.dying:
                    break
        return seen

    with subprocess.Popen(python_child(WORKER, table.name), stdout=subprocess.PIPE) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"registered"
        wait_for_death_word(table, 7)
        seen = asyncio.run(asyncio.wait_for(follow(child), 30))
    assert [(e.dying, e.instance_id, e.reason) for e in seen] == [
        (True, 7, livereg.Reason.PROCESS_EXITED),
        (False, 7, livereg.Reason.PROCESS_EXITED),
    ]
