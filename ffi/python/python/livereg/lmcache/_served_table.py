"""What both LMCache server classes keep (:class:`LiveregManagement` and the
server module): the table their engines register in, with the server's info
published in it, its livereg reaper (and listeners), and one thread that runs
a step of theirs on a fixed interval until they close."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

import livereg
from livereg.lmcache._common import create_or_reuse, logger, server_info

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from livereg._native import ServeOptions


class ServedTable:
    """The table ``name`` (created, or an existing one reused or replaced:
    see :func:`create_or_reuse`) with ``ctx``'s info published in it; closed
    again if that fails."""

    def __init__(
        self, ctx: Any, name: str, capacity: int, timeout: float, grace: float, progress_timeout: float = 0.0
    ) -> None:
        self.table = create_or_reuse(name, capacity, timeout, grace, progress_timeout)
        self.reaper: Optional[livereg.Reaper] = None
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        try:
            self.table.set_info(server_info(ctx))
        except BaseException:
            self.table.close()
            raise

    def start_reaper(
        self,
        on_drop: Callable[[livereg.DropEvent], object],
        on_clear: Optional[Callable[[], object]] = None,
        on_dying: Optional[Callable[[livereg.DropEvent], object]] = None,
        **serving: Unpack[ServeOptions],
    ) -> None:
        """Starts the table's reaper, serving sessions as ``serving`` says
        (``Table.start_reaper``'s listener options); the table is closed
        again if it cannot start."""
        try:
            self.reaper = self.table.start_reaper(on_drop, on_clear, on_dying, **serving)
        except BaseException:
            self.table.close()
            raise

    def repeat(self, step: Callable[[], object], every: float, what: str, thread_name: str) -> None:
        """Runs ``step`` every ``every`` seconds on a thread of its own until
        :meth:`stop`; a livereg error is logged (as ``what`` failing) and the
        step tried again at the next interval."""

        def loop() -> None:
            while not self._stopping.wait(every):
                try:
                    step()
                except livereg.Error:
                    logger.exception("livereg: %s failed; trying again in %.3gs", what, every)

        self._thread = threading.Thread(target=loop, name=thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stops the thread and the reaper; ``False`` if already stopped.
        The table stays open (for what its owner still ends), and is left for
        the engines and the next server by :meth:`close`."""
        if self._stopping.is_set():
            return False
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.reaper is not None:
            self.reaper.stop()
            self.reaper = None
        return True

    def close(self) -> None:
        """Closes this server's handle on the table (it stays in place)."""
        self.table.close()
