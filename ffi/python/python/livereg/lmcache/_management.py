"""The module swap: :class:`LiveregManagement` in place of LMCache's
``ManagementModule``, for a server built in code where a ``--server-module``
cannot reach.

Built exactly as the module it replaces, ``LiveregManagement(ctx,
liveness_targets, worker_reap_timeout_seconds,
worker_registration_grace_seconds, experimental_transfer)``, it answers the
same requests with the same effects on ``ctx``, and it is found by every
release as LMCache's own is (see :mod:`livereg.lmcache._compat`). The
targets are driven with livereg as their source of liveness:

- every ``timeout / 4``, every live registration is touched on every target
  (``touch_instance``), so an idle but alive engine is never reaped by a
  target's own silence rule; then every target's
  ``reap_stale_instances(timeout, grace)`` runs (engines that only PING keep
  the stock rules) and each id it returns goes to every target's
  ``drop_instance_state``;
- when livereg ends a registration (a crash seen in about a millisecond, a
  hang, a clean exit, a reset), every target that holds the instance frees it
  at once (see :mod:`livereg.lmcache._targets`), then every target's
  ``drop_instance_state``.

Each target sees each ended registration dropped once, even when its own
reap returns the id again later.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Set, Union

import livereg
from livereg.lmcache._common import Unaccepted, default_table, logger
from livereg.lmcache._compat import adopt, clear_forces_by_default, event_types, handler_types, real_management
from livereg.lmcache._served_table import ServedTable
from livereg.lmcache._targets import Registration, TargetDriver, live_registrations

#: The label of registrations the server holds for engines that only PING.
PING_LABEL = "lmcache-ping"

_REAL = real_management()
#: Whether ``clear()`` without ``force`` forces, as the installed LMCache's.
_CLEAR_FORCES = clear_forces_by_default(_REAL)
_BASE: Any = _REAL if _REAL is not None else object


class _Dropped:
    """Which targets have dropped an id since it was last seen live, and
    which registration of it (slot, generation) ended, if livereg ended it."""

    def __init__(self, registration: Optional[Registration]) -> None:
        self.registration = registration
        self.targets: Set[int] = set()


class LiveregManagement(_BASE):  # type: ignore[misc]
    """The management module of an LMCache server, on livereg.

    Built as the module it replaces: ``ctx`` (the server context, with
    ``storage_manager``, ``chunk_size`` and ``event_bus``), the liveness
    targets, the reap timeout and grace in seconds, and the enabled
    experimental transfers. A timeout of 0 (the default, as there) disables
    reaping: no reaper runs, nothing is dropped. A subclass of the installed
    LMCache's ``ManagementModule`` (when there is one), whose handlers it
    overrides with the same decorations and signatures.

    Keyword-only, livereg's own: ``table`` (default :func:`default_table`),
    ``capacity``, and ``listen`` (addresses such as
    ``"unix:/run/livereg/kv.sock"`` or ``"tcp://0.0.0.0:7071"``) with
    ``token`` (str or bytes; required for ``tcp://``): engines in containers
    that cannot map the table register there and are reaped like the others;
    ``tls://`` addresses take ``tls_cert`` and ``tls_key`` (and
    ``tls_client_ca`` to require client certificates). The table is created,
    or an existing one opened (one with other settings is replaced when
    nothing is registered in it, else reused with its own; the log says
    which); ``ctx.chunk_size`` is published in its info area when it is an
    int.
    """

    def __init__(
        self,
        ctx: Any,
        liveness_targets: Sequence[Any] = (),
        worker_reap_timeout_seconds: float = 0.0,
        worker_registration_grace_seconds: float = 0.0,
        experimental_transfer: Sequence[str] = (),
        *,
        table: Optional[str] = None,
        capacity: int = 256,
        listen: Sequence[str] = (),
        token: Optional[Union[str, bytes]] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        tls_client_ca: Optional[str] = None,
    ) -> None:
        if listen and float(worker_reap_timeout_seconds) <= 0:
            raise ValueError("listen= serves sessions for the reaper: it needs worker_reap_timeout_seconds > 0")
        self._ctx = ctx
        self._clear_lock = threading.Lock()
        self._driver = TargetDriver(liveness_targets)
        self._reap_timeout = float(worker_reap_timeout_seconds)
        self._reap_grace = float(worker_registration_grace_seconds)
        self._experimental_transfer = tuple(experimental_transfer)
        # Guards the maps below; never held while calling out.
        self._lock = threading.Lock()
        self._on_behalf: Dict[int, livereg.Worker] = {}
        self._dropped: Dict[int, _Dropped] = {}
        self._unaccepted = Unaccepted()
        self._served = ServedTable(ctx, table or default_table(), capacity, self._reap_timeout, self._reap_grace)
        self._table = self._served.table
        if self._reap_timeout > 0:
            self._served.start_reaper(
                self._ended, self.clear, listen=list(listen), token=token, tls_cert=tls_cert,
                tls_key=tls_key, tls_client_ca=tls_client_ca,
            )
            if self._driver.targets:
                self._served.repeat(self.reap_cycle, self._reap_timeout / 4, "the reap cycle", "livereg-lmcache-cycle")

    @property
    def context(self) -> Any:
        """The server context (as LMCache exposes it, for tests)."""
        return self._ctx

    @property
    def table(self) -> livereg.Table:
        """The livereg table (for workers' names, status, tests)."""
        return self._table

    # -- the targets -------------------------------------------------------

    def _not_dropped(self, instance_id: int, registration: Optional[Registration]) -> List[int]:
        """The targets that have not dropped ``instance_id`` since it was
        last seen live (or since ``registration`` of it began), now marked
        dropped."""
        with self._lock:
            dropped = self._dropped.get(instance_id)
            if dropped is None or (registration is not None and dropped.registration not in (None, registration)):
                # First drop of the id since it was live, or of a later registration.
                dropped = self._dropped[instance_id] = _Dropped(registration)
            elif registration is not None:
                dropped.registration = registration
            todo = [index for index in range(len(self._driver.targets)) if index not in dropped.targets]
            dropped.targets.update(todo)
        return todo

    def _ended(self, event: livereg.DropEvent) -> None:
        """The reaper's drop handler: whatever ended the registration."""
        with self._lock:
            held = self._on_behalf.get(event.instance_id)
            if held is not None and held.slot == event.slot:
                del self._on_behalf[event.instance_id]
        registration = (event.slot, event.generation)
        todo = self._not_dropped(event.instance_id, registration)
        if todo:
            self._driver.free(event.instance_id, registration, todo)

    def reap_cycle(self) -> List[int]:
        """One cycle, as the reaper thread runs it every ``timeout / 4``:
        touch every live registration on every target (but those held for
        PING-only workers: their pings touch them, as in LMCache), run every
        target's ``reap_stale_instances(timeout, grace)``, and drop each id
        they return on every target that has not dropped it. Returns those
        ids."""
        live = live_registrations(self._table)
        with self._lock:
            pinged = set(self._on_behalf)
            for instance_id, registration in live.items():
                dropped = self._dropped.get(instance_id)
                if dropped is not None and dropped.registration != registration:
                    del self._dropped[instance_id]  # a new registration of the id
        self._driver.touch({i: r for i, r in live.items() if i not in pinged})
        reaped = self._driver.reap(self._reap_timeout, self._reap_grace)
        for instance_id in reaped:
            todo = self._not_dropped(instance_id, live.get(instance_id))
            if todo:
                self._driver.drop(instance_id, todo)
        return reaped

    # -- the requests ------------------------------------------------------

    def ping(self, instance_id: Optional[int]) -> bool:
        """Answers a PING: always True, never waits. ``None`` or 0 is an
        untracked prober. Another id is touched on every target and kept
        alive on the worker's behalf (for workers not yet on livereg):
        registered at its first ping, beaten at every ping, ended by the
        reaper when the pings stop. A worker that registers itself needs no
        ping. Ids livereg cannot hold (negative, past 64 bits) are answered
        and logged once."""
        if instance_id is None or not self._unaccepted.check(instance_id, "ping"):
            return True
        for target in self._driver.targets:
            self._driver.call(target, "touch_instance", instance_id)
        if self._served.reaper is not None:
            self._keep_alive(instance_id)
        return True

    def _keep_alive(self, instance_id: int) -> None:
        with self._lock:
            held = self._on_behalf.get(instance_id)
        if held is not None:
            try:
                held.ping()
                return
            except livereg.EvictedError:
                with self._lock:
                    if self._on_behalf.get(instance_id) is held:
                        del self._on_behalf[instance_id]
        try:
            # Never wait for a pending drop of this id: the next ping retries.
            worker = self._table.register(instance_id, label=PING_LABEL, drop_wait=0.0)
        except (livereg.ExistsError, livereg.BusyError):
            return  # the worker registered itself, or its last drop is running
        except livereg.Error as error:
            logger.warning("ping(%d): not kept alive: %s", instance_id, error)
            return
        try:
            worker.ping()
        except livereg.EvictedError:
            return  # ended at once (a reset): the next ping registers again
        with self._lock:
            self._on_behalf[instance_id] = worker

    def get_chunk_size(self) -> int:
        """``ctx.chunk_size`` (also in the table's info area)."""
        return int(self._ctx.chunk_size)

    def get_experimental(self) -> List[str]:
        """The server's enabled experimental transfers and capabilities."""
        return list(self._experimental_transfer)

    def clear(self, force: bool = _CLEAR_FORCES) -> None:
        """Clears all stored KV cache data from the storage manager
        (``memcheck``, ``clear(force=force)``, ``memcheck``, under a lock),
        as LMCache's. ``force`` defaults as the installed LMCache's (False
        from 0.5.3; until 0.5.2 every clear forced). Registrations are
        untouched. An engine's clear through the table (``livereg_clear``)
        runs this same method on the reaper."""
        with self._clear_lock:
            storage = self._ctx.storage_manager
            storage.memcheck()
            storage.clear(force=force)
            storage.memcheck()

    def reset(self, timeout: float = 5.0) -> None:
        """The heavier form, livereg's own: ends every registration (each
        target drops each worker; workers are told they were evicted and
        register again), then clears as :meth:`clear`.

        Raises :class:`livereg.NoReaperError` when reaping is disabled."""
        self._table.reset(timeout=timeout)

    def debug(self) -> str:
        """A health check: ``"OK"``."""
        return "OK"

    def report_block_allocations(self, instance_id: int, model_name: str, records: List[Any]) -> None:
        """Publishes the engine's block allocation records to
        ``ctx.event_bus`` as LMCache's ``MP_VLLM_BLOCK_ALLOCATION`` event."""
        event, event_type = event_types()
        self._ctx.event_bus.publish(
            event(
                event_type=event_type.MP_VLLM_BLOCK_ALLOCATION,
                metadata={"instance_id": instance_id, "model_name": model_name, "records": records},
            )
        )

    if _REAL is None or not hasattr(_REAL, "get_handlers"):

        def get_handlers(self) -> List[Any]:
            """The request handlers, as LMCache 0.5.0–0.5.2 list them (its
            own types when importable, else stand-ins of the same names).
            Where the installed LMCache has ``get_handlers``, its own runs
            and lists these methods."""
            spec, request, pool = handler_types()
            return [
                spec(request.CLEAR, self.clear, pool.NORMAL),
                spec(request.GET_CHUNK_SIZE, self.get_chunk_size, pool.SYNC),
                spec(request.PING, self.ping, pool.NORMAL),
                spec(request.NOOP, self.debug, pool.SYNC),
                spec(request.REPORT_BLOCK_ALLOCATION, self.report_block_allocations, pool.NORMAL),
            ]

    def report_status(self) -> Dict[str, Any]:
        """``{"worker_liveness": {...}}`` with LMCache's keys (``enabled``,
        ``reap_timeout_seconds``, ``registration_grace_seconds``, and
        ``tracked_instances``, the targets' sum) and livereg's
        (``livereg_tracked_instances``, ``reaper_alive``, ``ended`` by
        reason, ``handler_failures``, ``target_failures``, ``table``). Empty
        without liveness targets, as LMCache's."""
        if not self._driver.targets:
            return {}
        stats = self._table.stats()
        return {
            "worker_liveness": {
                "enabled": self._served.reaper is not None,
                "reap_timeout_seconds": self._reap_timeout,
                "registration_grace_seconds": self._reap_grace,
                "tracked_instances": self._driver.tracked(),
                "livereg_tracked_instances": stats["tracked_instances"],
                "reaper_alive": stats["reaper_alive"],
                "ended": stats["ended"],
                "handler_failures": stats["handler_failures"],
                "target_failures": self._driver.failures,
                "table": self._table.name,
            }
        }

    def close(self) -> None:
        """Stops the reaper and its cycle, and ends the registrations held
        on pingers' behalf. The table stays for workers and the next server."""
        if not self._served.stop():
            return
        with self._lock:
            held, self._on_behalf = self._on_behalf, {}
        for worker in held.values():
            try:
                worker.deregister()
            except livereg.EvictedError:
                pass
        self._served.close()

    def __enter__(self) -> "LiveregManagement":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


for _name in ("ping", "get_chunk_size", "get_experimental", "clear", "debug", "report_block_allocations"):
    adopt(getattr(LiveregManagement, _name), getattr(_REAL, _name, None))
