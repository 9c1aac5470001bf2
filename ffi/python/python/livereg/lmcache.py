"""A drop-in for a KV-cache server's management module (the PING-and-reap
kind, as in LMCache's multiprocess server), on a livereg table.

Server side, :class:`LiveregManagement` answers the management operations with
the same names and return values (``ping``, ``get_chunk_size``, ``debug``,
``clear``, ``report_status``, ``close``) and calls ``drop_instance_state(id)``
on every liveness target, once, for every registration that ends, whatever
ended it: a crash (detected in about a millisecond), a hang (the reap
timeout), a clean exit, a clear. Worker side, :class:`WorkerLiveness` keeps a
registration alive from a daemon thread, with no RPC.

Targets are duck-typed: only ``drop_instance_state(instance_id)`` is
required; ``touch_instance(instance_id)`` is called on a ``ping`` if present.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence, Union

import livereg

__all__ = ["LiveregManagement", "WorkerLiveness"]

logger = logging.getLogger("livereg.lmcache")

#: The label of registrations the server holds for workers that only PING.
PING_LABEL = "lmcache-ping"


def _settings_of(table: livereg.Table) -> Dict[str, float]:
    return {
        "capacity": table.capacity,
        "reap_timeout": table.reap_timeout,
        "registration_grace": table.registration_grace,
    }


class LiveregManagement:
    """The management module of a KV-cache server, on livereg.

    Creates table ``table`` (or opens an existing one whose settings match,
    else raises :class:`livereg.IncompatibleError` naming both), owns its
    reaper, and publishes ``chunk_size`` in the table's info area for workers
    to read without RPC. ``worker_reap_timeout_seconds == 0`` disables
    reaping: no reaper runs and nothing is dropped.
    """

    def __init__(
        self,
        table: str,
        liveness_targets: Sequence[Any] = (),
        worker_reap_timeout_seconds: float = 120.0,
        worker_registration_grace_seconds: float = 3600.0,
        chunk_size: Optional[int] = None,
        capacity: int = 256,
    ) -> None:
        for target in liveness_targets:
            if not callable(getattr(target, "drop_instance_state", None)):
                raise TypeError(f"liveness target {target!r} has no drop_instance_state(instance_id)")
        self._targets = tuple(liveness_targets)
        self._reap_timeout = float(worker_reap_timeout_seconds)
        self._reap_grace = max(float(worker_registration_grace_seconds), self._reap_timeout)
        self._chunk_size = chunk_size
        self._lock = threading.Lock()
        self._on_behalf: Dict[int, livereg.Worker] = {}
        self._target_failures = 0
        self._dropped = 0
        self._table = self._create_or_open(table, capacity)
        if chunk_size is not None:
            self._table.set_info(json.dumps({"chunk_size": chunk_size}))
        self._reaper: Optional[livereg.Reaper] = None
        if self._reap_timeout > 0:
            self._reaper = self._table.start_reaper(on_drop=self._drop)

    def _create_or_open(self, name: str, capacity: int) -> livereg.Table:
        wanted = {"capacity": capacity, "reap_timeout": self._reap_timeout, "registration_grace": self._reap_grace}
        try:
            return livereg.create(
                name, capacity=capacity, reap_timeout=self._reap_timeout, registration_grace=self._reap_grace
            )
        except livereg.ExistsError:
            pass
        table = livereg.open(name)
        found = _settings_of(table)
        if any(abs(found[key] - wanted[key]) > 1e-3 for key in wanted):
            table.close()
            raise livereg.IncompatibleError(
                f"table '{name}' exists with {found}, this server asks for {wanted}: "
                f"start it with the table's settings, or remove the table first (livereg rm {name})"
            )
        return table

    @property
    def table(self) -> livereg.Table:
        """The livereg table (for workers' names, status, tests)."""
        return self._table

    def _drop(self, event: livereg.DropEvent) -> None:
        """The reaper's callback: every target's ``drop_instance_state``, each
        isolated; a raising target is logged and counted, the others run."""
        with self._lock:
            held = self._on_behalf.get(event.instance_id)
            if held is not None and held.slot == event.slot:
                del self._on_behalf[event.instance_id]
            self._dropped += 1
        for target in self._targets:
            try:
                target.drop_instance_state(event.instance_id)
            except Exception:
                with self._lock:
                    self._target_failures += 1
                logger.exception(
                    "drop_instance_state(%d) of %r raised (instance ended: %s); the other targets still run",
                    event.instance_id,
                    target,
                    event.reason.name.lower(),
                )

    def ping(self, instance_id: Optional[int]) -> bool:
        """Answers a PING. An id pinged this way is kept alive on the worker's
        behalf (for workers not yet on livereg): registered at its first ping,
        beaten at every ping, ended by the reaper when the pings stop. A
        worker that registers itself needs no ping. Always True."""
        if instance_id is None:
            return True
        for target in self._targets:
            touch = getattr(target, "touch_instance", None)
            if touch is not None:
                try:
                    touch(instance_id)
                except Exception:
                    logger.exception("touch_instance(%d) of %r raised", instance_id, target)
        with self._lock:
            held = self._on_behalf.get(instance_id)
            if held is not None:
                try:
                    held.ping()
                    return True
                except livereg.EvictedError:
                    del self._on_behalf[instance_id]
            try:
                self._on_behalf[instance_id] = self._table.register(instance_id, label=PING_LABEL)
            except livereg.ExistsError:
                pass  # the worker registered itself: its own beats keep it
            except (livereg.BusyError, livereg.TimeoutError):
                pass  # its previous registration's drop is still running
        return True

    def get_chunk_size(self) -> Optional[int]:
        """The chunk size the server was given (also in the table's info area)."""
        return self._chunk_size

    def debug(self) -> str:
        """A health check: ``"OK"``."""
        return "OK"

    def clear(self, timeout: float = 5.0) -> None:
        """Ends every registration: each target's ``drop_instance_state`` runs
        for each before this returns; workers register again by themselves.
        With reaping disabled, nothing is dropped."""
        if self._reaper is None:
            return
        self._table.clear(timeout=timeout)

    def report_status(self) -> Dict[str, Any]:
        """``{"worker_liveness": {...}}`` with the reference's keys
        (``enabled``, ``tracked_instances``, ``reap_timeout_seconds``,
        ``registration_grace_seconds``) and livereg's (``reaper_alive``,
        ``ended`` by reason, ``handler_failures``, ``target_failures``,
        ``table``). Empty without liveness targets, as the reference."""
        if not self._targets:
            return {}
        stats = self._table.stats()
        with self._lock:
            target_failures = self._target_failures
        return {
            "worker_liveness": {
                "enabled": self._reaper is not None,
                "tracked_instances": stats["tracked_instances"],
                "reap_timeout_seconds": self._reap_timeout,
                "registration_grace_seconds": self._reap_grace,
                "reaper_alive": stats["reaper_alive"],
                "ended": stats["ended"],
                "handler_failures": stats["handler_failures"],
                "target_failures": target_failures,
                "table": self._table.name,
            }
        }

    def close(self) -> None:
        """Stops the reaper and ends the registrations held on pingers'
        behalf. The table stays for workers and the next server."""
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        with self._lock:
            held, self._on_behalf = self._on_behalf, {}
        for worker in held.values():
            try:
                worker.deregister()
            except livereg.EvictedError:
                pass
        self._table.close()

    def __enter__(self) -> "LiveregManagement":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkerLiveness:
    """Keeps worker ``instance_id`` registered in ``table`` (a name or an open
    :class:`livereg.Table`): beats from a daemon thread at a third of the
    table's timeout, registers again when evicted or when the server's reaper
    changes (a restart: its boot token changes), and deregisters on
    ``close()``. ``on_register(why)`` is called after every registration
    (``"start"``, ``"evicted"``, ``"server restarted"``): the server dropped
    this worker's state, so send it again there.
    """

    def __init__(
        self,
        table: Union[str, livereg.Table],
        instance_id: int,
        label: Optional[str] = None,
        on_register: Optional[Callable[[str], object]] = None,
        interval: Optional[float] = None,
        wait: float = 10.0,
    ) -> None:
        self._table = livereg.open(table) if isinstance(table, str) else table
        self._owns_table = isinstance(table, str)
        self.instance_id = instance_id
        self._label = label
        self._on_register = on_register
        timeout = self._table.reap_timeout or self._table.registration_grace
        self.interval = interval if interval is not None else max(0.001, timeout / livereg.BEATS_PER_TIMEOUT)
        self.registrations = 0
        self._stopping = threading.Event()
        self._token = self._table.probe()
        self._worker = self._register("start", deadline=time.monotonic() + wait)
        self._thread = threading.Thread(target=self._beat, name=f"livereg-beat-{instance_id}", daemon=True)
        self._thread.start()

    def _register(self, why: str, deadline: Optional[float] = None) -> livereg.Worker:
        while True:
            try:
                worker = self._table.register(self.instance_id, label=self._label)
                break
            except (livereg.ExistsError, livereg.BusyError, livereg.TimeoutError):
                # A live or ending registration of this id (a previous
                # process of this worker, or one the server holds for it).
                if deadline is not None and time.monotonic() > deadline:
                    raise
                if self._stopping.wait(0.05):
                    raise
        worker.ping()
        self.registrations += 1
        logger.info("instance %d registered (%s)", self.instance_id, why)
        if self._on_register is not None:
            try:
                self._on_register(why)
            except Exception:
                logger.exception("instance %d: on_register(%r) raised", self.instance_id, why)
        return worker

    def _beat(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self._beat_once()
            except livereg.Error:
                if self._stopping.is_set():
                    return  # closed while registering again
                logger.exception("instance %d: heartbeat failed; trying again", self.instance_id)

    def _beat_once(self) -> None:
        try:
            self._worker.ping()
        except livereg.EvictedError:
            self._worker = self._register("evicted")
        token = self._table.probe()
        if token is not None and token != self._token:
            if self._token is not None:
                try:
                    self._worker.deregister()
                except livereg.EvictedError:
                    pass
                self._worker = self._register("server restarted")
            self._token = token

    @property
    def chunk_size(self) -> Optional[int]:
        """The server's chunk size, read from the table's info area (no RPC)."""
        info = self._table.info()
        if not info:
            return None
        value = json.loads(info).get("chunk_size")
        return None if value is None else int(value)

    @property
    def worker(self) -> livereg.Worker:
        """The current registration."""
        return self._worker

    def close(self) -> None:
        """Stops beating and deregisters."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self._worker.deregister()
        except livereg.EvictedError:
            pass
        if self._owns_table:
            self._table.close()

    def __enter__(self) -> "WorkerLiveness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
