"""What puts one of LMCache's multiprocess adapters in its own degraded
mode and holds it there: its health events replaced by :class:`Gate` (only
the plugin sets one it closed), and :func:`fail_pending`, the requests still
waiting on a gone server failed with LMCache's own timeout error."""

from __future__ import annotations

import importlib
import threading
from typing import Any, Dict, List

#: Requests left pending when the server is gone: the worker adapter's own
#: degraded drain reports them, and it reads them unguarded when healthy.
_DRAINED = frozenset({"store", "retrieve"})


class Gate(threading.Event):
    """An adapter's health event that only :meth:`reopen` sets while it is
    closed: a heartbeat's PING answered by a dying server, or by a new one
    that does not hold the KV caches yet, cannot make the adapter healthy."""

    def __init__(self, healthy: bool) -> None:
        super().__init__()
        self.open = True
        if healthy:
            super().set()

    def set(self) -> None:
        if self.open:
            super().set()

    def close(self) -> None:
        """Cleared, and held cleared until :meth:`reopen`."""
        self.open = False
        super().clear()

    def reopen(self) -> None:
        self.open = True
        super().set()


def gates(adapter: Any) -> List[Gate]:
    """The adapter's health events, replaced by gates (once)."""
    found: List[Gate] = []
    event = getattr(adapter, "_health_event", None)
    if isinstance(event, threading.Event):
        if not isinstance(event, Gate):
            event = Gate(event.is_set())
            adapter._health_event = event
        found.append(event)
    events = getattr(adapter, "_health_events", None)
    if isinstance(events, dict):
        for url, each in list(events.items()):
            if isinstance(each, threading.Event):
                if not isinstance(each, Gate):
                    each = Gate(each.is_set())
                    events[url] = each
                found.append(each)
    return found


def _clients(adapter: Any) -> List[Any]:
    clients = [getattr(adapter, "req_client", None), *getattr(adapter, "req_clients", {}).values()]
    unique: Dict[int, Any] = {id(c): c for c in clients if c is not None}
    return list(unique.values())


def _timeout_error(message: str) -> BaseException:
    """LMCache's own timeout error (its callers catch it as the server not
    answering), else the builtin."""
    try:
        kind = getattr(importlib.import_module("lmcache.v1.mp_observability.errors"), "LMCacheTimeoutError")
        made = kind(message)
    except Exception:
        return TimeoutError(message)
    return made if isinstance(made, BaseException) else TimeoutError(message)


def fail_pending(adapter: Any, why: str) -> int:
    """Fails the requests of ``adapter``'s clients still waiting on the
    server (but stores and retrieves: see :data:`_DRAINED`); how many."""
    failed = 0
    for client in _clients(adapter):
        queue = getattr(client, "_message_queue_client", client)
        pending = getattr(queue, "pending_futures", None)
        if not isinstance(pending, dict):
            continue
        entries: List[Any] = []
        for _ in range(5):  # the client's own thread changes the dict
            try:
                entries = list(pending.values())
                break
            except RuntimeError:
                continue
        for entry in entries:
            future, spec = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
            if getattr(spec, "operation", None) in _DRAINED:
                continue
            try:
                if future.query():
                    continue
                future.set_exception(_timeout_error(why))
            except Exception:
                continue
            failed += 1
    return failed
