"""The reaper on an asyncio loop: ``async for event in reaper.events()``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator

from livereg._native import InvalidArgumentError

if TYPE_CHECKING:
    from livereg._native import DrivenReaper, DropEvent


async def events(reaper: DrivenReaper) -> AsyncIterator[DropEvent]:
    """Drives ``reaper`` on the running loop and yields every registration
    found dying (``event.dying``: its process began to exit) and every drop.

    The loop waits on the reaper's descriptor (readable when a watched process
    exits, a registration ends or a clear is requested) and on its scan timer;
    each scan runs on the loop's default executor, so a long scan or a slow
    callback never blocks the loop. Ends when the reaper is stopped.
    """
    loop = asyncio.get_running_loop()
    fd = reaper.fileno()
    due = asyncio.Event()

    def readable() -> None:
        # One wake-up is enough: the scan that follows drains the descriptor.
        loop.remove_reader(fd)
        due.set()

    try:
        while not reaper.stopped:
            try:
                ended = await loop.run_in_executor(None, reaper.scan_all)
            except InvalidArgumentError:
                if reaper.stopped:
                    return
                raise
            for event in ended:
                yield event
            if reaper.stopped:
                return
            due.clear()
            loop.add_reader(fd, readable)
            try:
                await asyncio.wait_for(due.wait(), reaper.next_scan_in())
            except asyncio.TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)
    finally:
        loop.remove_reader(fd)
