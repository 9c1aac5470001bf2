"""LMCache's multiprocess adapters (vLLM's connector holds a scheduler
adapter in its EngineCore and a worker adapter in each worker) put in
LMCache's own degraded mode the moment the server is gone, and made healthy
again once a new server holds the engine's KV caches.

LMCache's adapters gate every operation on a health event that their
heartbeat thread sets and clears from a PING every ``heartbeat_interval``
(10 s by default): a killed server is noticed up to one interval late, and
requests already sent to it wait for ``mq_timeout`` (300 s by default); a
server restarted between two PINGs is never noticed (both succeed), so the
new server never gets the KV caches. Here, from the table's reaper state
(``_server_watch``; the server module runs the reaper):

- **gone** (``dying`` or ``absent``): each adapter's health event is
  cleared and held cleared (a late PING cannot set it: the event refuses),
  so LMCache's own degraded mode runs (stores skipped, lookups miss,
  retrieves recomputed, pending stores and retrieves drained by the next
  ``get_finished``); every other request waiting on the server (a
  LOOKUP's acknowledgement, a prefetch status, the engine-driven
  transfers' prepare/commit, a registration) fails at once with LMCache's
  own timeout error, as if its ``mq_timeout`` had passed; and so does
  every such request sent while no server serves (a store's commit sent
  after its prepare was failed, a step that passed the health check just
  before it closed), each within :data:`_SWEEP` of its sending.
- **serving with a new boot token** (however fast the restart): the same,
  then the engine's KV caches are registered with the new server (the
  plugin's replay of its transfer context's ``register``, once per server
  whoever asks: this, LMCache's heartbeat recovery or livereg's own
  registration again), and only then the adapters are made healthy.

Each process logs the server's end and return once each. Where an
adapter lacks a piece (an LMCache without the health event), it is left
to LMCache's own behaviour and said once.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from types import ModuleType
from typing import Any, Callable, Optional

import livereg
from livereg.lmcache._common import logger
from livereg.lmcache._degraded import fail_pending, gates
from livereg.lmcache._server_watch import ServerWatch, server_watch

#: The module holding LMCache's multiprocess adapters.
ADAPTERS = "lmcache.integration.vllm.vllm_multi_process_adapter"
WORKER = "LMCacheMPWorkerAdapter"
SCHEDULER = "LMCacheMPSchedulerAdapter"
#: The pause between attempts to register the KV caches with a new server.
_REGISTER_PAUSE = 0.5
#: How often requests sent while no server serves are failed.
_SWEEP = 0.01
_WRAPPED = "__livereg_wrapped__"


def _kind(adapter: Any) -> str:
    return "scheduler" if hasattr(adapter, "_health_events") else "worker"


class Adapters:
    """The LMCache adapters of this process, kept in step with ``watch``."""

    def __init__(self, watch: ServerWatch, register: Optional[Callable[[Any, int], bool]] = None) -> None:
        self.watch = watch
        self._register_one = register or _register
        self._lock = threading.Lock()
        self._adapters: "weakref.WeakSet[Any]" = weakref.WeakSet()
        state = watch.state
        #: The token of the server every adapter is healthy for (None: gone).
        self.healthy_for: Optional[int] = state.boot_token if state.serving else None
        self._gone_at: Optional[float] = None
        self._gone_pid: Optional[int] = None
        #: Seconds the last degrade took once the server's end was seen
        #: (gates closed, requests failed), and from a new server serving to
        #: the adapters healthy again (the last).
        self.degraded_after: Optional[float] = None
        self.healthy_after: Optional[float] = None
        self.restored = threading.Event()
        self._sweeping = False
        watch.listen(self.changed)

    def adopt(self, adapter: Any) -> None:
        """Gates ``adapter``'s health and its heartbeat's recovery."""
        held = gates(adapter)
        if not held:
            logger.warning("livereg: this LMCache's %s has no health event: it is not put in degraded mode when "
                           "its server dies (its own heartbeat and livereg's replay still hold)",
                           type(adapter).__name__)
            return
        if callable(getattr(adapter, "_reregister_kv_caches_callback", None)):
            adapter._reregister_kv_caches_callback = lambda: self._recover(adapter)
        with self._lock:
            self._adapters.add(adapter)
            gone = self.healthy_for is None and self.watch.armed
        if gone:
            for gate in held:
                gate.close()

    def _recover(self, adapter: Any) -> bool:
        """LMCache's heartbeat saw the server answer after it did not: the
        KV caches registered with the serving server, once; the adapter is
        made healthy by the restore (its gate refuses a heartbeat)."""
        token = self.watch.serving_token()
        if token is None:
            return False
        return self._register_one(adapter, token)

    def changed(self, new: livereg.ReaperState, old: Optional[livereg.ReaperState]) -> None:
        if not new.serving:
            self._degrade(old if old is not None and old.serving else new)
        elif new.boot_token != self.healthy_for:
            self._degrade(old if old is not None and old.serving else None)
            threading.Thread(target=self._restore, args=(new,), name="livereg-kv-register", daemon=True).start()

    def _degrade(self, server: Optional[livereg.ReaperState]) -> None:
        with self._lock:
            adapters = list(self._adapters)
            first = self._gone_at is None
            if first:
                self._gone_at = time.monotonic()
                self._gone_pid = server.pid if server is not None else None
                self.restored.clear()
            self.healthy_for = None
        for adapter in adapters:
            for gate in gates(adapter):
                gate.close()
        pid = self._gone_pid
        failed = sum(fail_pending(adapter, f"the LMCache server (pid {pid}) is gone") for adapter in adapters)
        self._sweep_while_gone()
        if not first:
            return
        self.degraded_after = time.monotonic() - (self._gone_at or time.monotonic())
        kinds = ", ".join(sorted({_kind(a) for a in adapters})) or "none yet"
        logger.warning(
            "livereg: the LMCache server (pid %s) is gone: %d LMCache adapter(s) of this process (%s) in degraded "
            "mode (stores skipped, lookups miss, retrieves recomputed), %d request(s) waiting on it failed; the "
            "engine serves without its cache", pid, len(adapters), kinds, failed,
        )

    def _sweep_while_gone(self) -> None:
        """Starts (once at a time) the thread that fails every request sent
        while no server serves: a gone server answers none of them, and its
        caller would wait LMCache's ``mq_timeout`` (300 s by default)."""
        with self._lock:
            if self._sweeping:
                return
            self._sweeping = True
        threading.Thread(target=self._sweep, name="livereg-kv-sweep", daemon=True).start()

    def _sweep(self) -> None:
        try:
            while True:
                with self._lock:
                    if self.watch.serving_token() is not None:
                        self._sweeping = False
                        return
                    adapters, pid = list(self._adapters), self._gone_pid
                for adapter in adapters:
                    fail_pending(adapter, f"the LMCache server (pid {pid}) is gone")
                time.sleep(_SWEEP)
        except Exception:
            with self._lock:
                self._sweeping = False
            logger.exception("livereg: requests sent to the gone LMCache server are left to LMCache's mq_timeout")

    def _restore(self, server: livereg.ReaperState) -> None:
        token = server.boot_token
        assert token is not None
        served_at = time.monotonic()
        attempt = 0
        while True:
            if self.watch.serving_token() != token:
                return  # ended, or replaced: the next change restores
            with self._lock:
                adapters = list(self._adapters)
            done = True
            for adapter in adapters:
                try:
                    done = self._register_one(adapter, token) and done
                except Exception as error:
                    done = False
                    if attempt == 0:
                        logger.warning("livereg: registering the KV caches with the new LMCache server failed (%s); "
                                       "trying again every %.1f s", error, _REGISTER_PAUSE)
            if done:
                break
            attempt += 1
            time.sleep(_REGISTER_PAUSE)
        with self._lock:
            if self.watch.serving_token() != token:
                return
            self.healthy_for = token
            gone_at, self._gone_at = self._gone_at, None
            for adapter in adapters:
                for gate in gates(adapter):
                    gate.reopen()
        now = time.monotonic()
        self.healthy_after = now - served_at
        self.restored.set()
        kinds = sorted({_kind(a) for a in adapters})
        logger.warning(
            "livereg: a new LMCache server (pid %s) serves: %s%d LMCache adapter(s) of this process (%s) healthy "
            "again, %.2f s after it served (%.1f s without the cache)",
            server.pid, "the KV caches registered with it, " if "worker" in kinds else "", len(adapters),
            ", ".join(kinds) or "none yet", self.healthy_after, now - (gone_at or served_at),
        )


def _register(adapter: Any, token: int) -> bool:
    """Registers ``adapter``'s KV caches with the server of ``token``
    unless they are: the plugin's replay when livereg holds the engine,
    else the adapter's own registration again. True for an adapter that
    holds none (a scheduler's, or before its first registration)."""
    instance_id = getattr(adapter, "instance_id", None)
    if _kind(adapter) == "scheduler" or not getattr(adapter, "kv_caches", None):
        return True
    from livereg.lmcache._engine import engine_of

    engine = engine_of(instance_id) if isinstance(instance_id, int) else None
    if engine is not None and engine.context is getattr(adapter, "transfer_ctx", None):
        return engine.register_with(token)
    original = type(adapter).__dict__.get("_reregister_kv_caches_callback")
    return bool(original(adapter)) if callable(original) else True


_lock = threading.Lock()
_adapters: Optional[Adapters] = None


def adapters() -> Optional[Adapters]:
    """This process's adapters, kept in step with its server watch (None
    when there is no watch)."""
    global _adapters
    with _lock:
        if _adapters is None:
            watch = server_watch()
            if watch is None:
                return None
            _adapters = Adapters(watch)
        return _adapters


def _wrap_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            held = adapters()
            if held is not None:
                held.adopt(self)
        except Exception:
            logger.exception("livereg: the LMCache adapter is left to its own heartbeat")

    setattr(__init__, _WRAPPED, original)
    return __init__


def wrap_adapters(module: ModuleType) -> None:
    """Wraps the constructors of LMCache's MP adapters (each once)."""
    for name in (WORKER, SCHEDULER):
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            continue
        init = cls.__dict__.get("__init__")
        if callable(init) and not hasattr(init, _WRAPPED):
            cls.__init__ = _wrap_init(init)  # type: ignore[misc]


def _forget_after_fork() -> None:
    """A forked child keeps its own adapters (and watch)."""
    global _lock, _adapters
    _lock = threading.Lock()
    _adapters = None


os.register_at_fork(after_in_child=_forget_after_fork)
