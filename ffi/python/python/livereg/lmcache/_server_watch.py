"""The LMCache server's life as one process of an engine sees it: the table's
reaper state (the server module runs the table's reaper, so the reaper's
life is the server's), watched from one daemon thread per process that
sleeps in :meth:`livereg.Table.wait_reaper_state` and tells its listeners of
each change: :func:`server_watch`.

A table is watched only when its info area is the server module's (an
LMCache server published its id there) and only once it was seen serving:
a table whose reaper is something else (``livereg run``, another tool)
says nothing about the cache server, and the engine keeps LMCache's own
heartbeats alone. Over a listener's address (no table mapped) there is no
watch either.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, List, Optional

import livereg
from livereg.lmcache._common import default_table, logger, read_info

#: How long one wait for a change may sleep before the watch looks whether
#: it was stopped (a change wakes it at once).
_LOOK = 1.0

Listener = Callable[[livereg.ReaperState, Optional[livereg.ReaperState]], object]


class ServerWatch:
    """The cache server's state in ``table``, and since when (wall clock):
    ``listen(f)`` calls ``f(new, old)`` from the watch's thread at each
    change once the server was seen serving."""

    def __init__(self, table: livereg.Table) -> None:
        self._table = table
        self._lock = threading.Lock()
        self._listeners: List[Listener] = []
        self._stopping = threading.Event()
        state = table.reaper_state
        #: The current state, and when it began (``time.time()``; a dying
        #: server and the absence that follows count as one: gone since).
        self.state: livereg.ReaperState = state
        self.since = time.time()
        #: Whether a server was seen serving in this table (its changes are
        #: told from then on).
        self.armed = state.serving and _ours(table)
        self._thread = threading.Thread(target=self._run, name="livereg-kv-server", daemon=True)
        self._thread.start()

    @property
    def table(self) -> livereg.Table:
        return self._table

    def listen(self, listener: Listener) -> None:
        """``listener(new, old)`` at each change from now on."""
        with self._lock:
            self._listeners.append(listener)

    def serving_token(self) -> Optional[int]:
        """The serving server's boot token, read now (None if none serves)."""
        state = self._table.reaper_state
        return state.boot_token if state.serving else None

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(_LOOK + 1.0)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                changed = self._table.wait_reaper_state(self.state, _LOOK)
            except livereg.Error:
                logger.exception("livereg: the LMCache server's state cannot be read; looking again")
                self._stopping.wait(_LOOK)
                continue
            if changed == self.state:
                continue
            old = self.state
            gone_before = not old.serving and self.armed
            with self._lock:
                self.state = changed
                if not (gone_before and not changed.serving):
                    self.since = time.time()  # dying then absent: gone since the first
                if changed.serving and not self.armed:
                    self.armed = _ours(self._table)
                armed, listeners = self.armed, list(self._listeners)
            if not armed:
                continue
            for listener in listeners:
                try:
                    listener(changed, old)
                except Exception:
                    logger.exception("livereg: a listener of the LMCache server's state raised")


def _ours(table: livereg.Table) -> bool:
    """Whether LMCache's server module serves ``table`` (it published its
    id in the info area)."""
    try:
        return read_info(table.info()).get("server") is not None
    except livereg.Error:
        return False


_lock = threading.Lock()
_watch: Optional[ServerWatch] = None
_tried = False


def server_watch() -> Optional[ServerWatch]:
    """This process's watch of the default table (started at the first
    call), or None (logged once) when the table is an address or cannot be
    opened."""
    global _watch, _tried
    with _lock:
        if _watch is not None or _tried:
            return _watch
        _tried = True
        target = default_table()
        if livereg.is_address(target):
            logger.info("livereg: %s is a listener's address: the LMCache server's death is left to LMCache's "
                        "heartbeats", target)
            return None
        try:
            _watch = ServerWatch(livereg.open(target))
        except (livereg.Error, OSError, ValueError) as error:
            logger.warning("livereg: table '%s' cannot be watched (%s); the LMCache server's death is left to "
                           "LMCache's heartbeats", target, error)
            return None
        return _watch


def _forget_after_fork() -> None:
    """A forked child watches on its own (the parent's thread did not cross
    the fork)."""
    global _lock, _watch, _tried
    _lock = threading.Lock()
    _watch, _tried = None, False


os.register_at_fork(after_in_child=_forget_after_fork)
