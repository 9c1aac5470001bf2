"""A drop-in for a KV-cache server's management module (the PING-and-reap
kind, as in LMCache's multiprocess server), on a livereg table.

Server side, :class:`LiveregManagement` is built exactly as the module it
replaces, ``LiveregManagement(ctx, liveness_targets, worker_reap_timeout_seconds,
worker_registration_grace_seconds)``, and answers the same requests with the
same effects on ``ctx`` (``ping``, ``get_chunk_size``, ``clear``, ``debug``,
``report_block_allocations``, ``get_handlers``, ``report_status``,
``close``). Worker side, :class:`WorkerLiveness` keeps a registration alive
from a daemon thread, with no RPC.

The liveness targets are driven as the replaced module drives them, with
livereg as their source of liveness:

- every ``timeout / 4``, every live registration is touched on every target
  (``touch_instance``), so an idle but alive worker is never reaped by a
  target's own silence rule; then every target's
  ``reap_stale_instances(timeout, grace)`` runs and each id it returns goes to
  every target's ``drop_instance_state``;
- when livereg ends a registration (a crash seen in about a millisecond, a
  hang, a clean exit, a reset), it stops being touched, so a target's own
  reap frees it within one timeout at worst; a target that offers
  ``evict_instance(instance_id)`` is called at once instead, then every
  target's ``drop_instance_state``.

``evict_instance`` is the one-method extension this module proposes to the
targets' protocol: "free this instance's context now, livereg saw it end".
Each target sees each ended registration dropped once, even when its own
reap returns the id again later. Targets are duck-typed: only
``drop_instance_state`` is required.

Workers find the table by name: :data:`DEFAULT_TABLE`, or the environment
variable :data:`TABLE_ENV` on both sides, or ``table=`` here and the first
argument of :class:`WorkerLiveness`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import livereg

__all__ = ["DEFAULT_TABLE", "TABLE_ENV", "LiveregManagement", "WorkerLiveness", "default_table"]

logger = logging.getLogger("livereg.lmcache")

#: The table a server creates and its workers open, unless told otherwise.
DEFAULT_TABLE = "lmcache-workers"
#: The environment variable that names another table, on both sides.
TABLE_ENV = "LIVEREG_LMCACHE_TABLE"
#: The label of registrations the server holds for workers that only PING.
PING_LABEL = "lmcache-ping"
#: Instance ids a registration can have; 0 is the untracked prober's.
_ID_RANGE = range(1, 1 << 64)
#: Distinct untrackable ids logged; past this many, no more are.
_LOGGED_MAX = 1024


#: How an address of a server's listener starts (anything else names a table).
_ADDRESS_SCHEMES = ("unix:", "tcp://", "tls://")


def default_table() -> str:
    """The table name both sides use: ``$LIVEREG_LMCACHE_TABLE``, else
    :data:`DEFAULT_TABLE`."""
    return os.environ.get(TABLE_ENV) or DEFAULT_TABLE


class _Unaccepted:
    """Instance ids livereg cannot track, each logged once (the first
    :data:`_LOGGED_MAX` distinct ones)."""

    def __init__(self) -> None:
        self._logged: Set[object] = set()
        self._lock = threading.Lock()

    def check(self, instance_id: object, where: str) -> bool:
        """Whether ``instance_id`` can be tracked; if not, logs why once."""
        if isinstance(instance_id, int) and not isinstance(instance_id, bool) and instance_id in _ID_RANGE:
            return True
        if instance_id == 0:
            return False  # the untracked prober, as the reference's sentinel
        with self._lock:
            # Bounded: a peer sending endless new bad ids cannot grow it.
            first = instance_id not in self._logged and len(self._logged) < _LOGGED_MAX
            if first:
                self._logged.add(instance_id)
        if first:
            logger.warning(
                "%s: instance id %r is not tracked (expected an int in 1..2**64-1); answered, nothing registered",
                where,
                instance_id,
            )
        return False


class _Dropped:
    """Which targets have dropped an id since it was last seen live, and
    which registration of it (slot, generation) ended, if livereg ended it."""

    def __init__(self, registration: Optional[Tuple[int, int]]) -> None:
        self.registration = registration
        self.targets: Set[int] = set()


# Stand-ins for the reference's types when its package is not importable.
class _RequestType(enum.Enum):
    CLEAR = "CLEAR"
    GET_CHUNK_SIZE = "GET_CHUNK_SIZE"
    PING = "PING"
    NOOP = "NOOP"
    REPORT_BLOCK_ALLOCATION = "REPORT_BLOCK_ALLOCATION"


class _ThreadPoolType(enum.Enum):
    NORMAL = "NORMAL"
    SYNC = "SYNC"


class _HandlerSpec(NamedTuple):
    request_type: Any
    handler: Callable[..., Any]
    thread_pool: Any


class _EventType(enum.Enum):
    MP_VLLM_BLOCK_ALLOCATION = "MP_VLLM_BLOCK_ALLOCATION"


@dataclasses.dataclass
class _Event:
    event_type: Any
    metadata: Dict[str, Any]


def _handler_types() -> Tuple[Any, Any, Any]:
    """``(HandlerSpec, RequestType, ThreadPoolType)``: the reference's own
    when its package is importable, else stand-ins with the same names."""
    try:
        from lmcache.v1.multiprocess.engine_module import HandlerSpec, ThreadPoolType  # type: ignore
        from lmcache.v1.multiprocess.protocols.base import RequestType  # type: ignore
    except ImportError:
        return _HandlerSpec, _RequestType, _ThreadPoolType
    return HandlerSpec, RequestType, ThreadPoolType


def _event_types() -> Tuple[Any, Any]:
    """``(Event, EventType)``: the reference's own, else stand-ins."""
    try:
        from lmcache.v1.mp_observability.event import Event, EventType  # type: ignore
    except ImportError:
        return _Event, _EventType
    return Event, EventType


class LiveregManagement:
    """The management module of a KV-cache server, on livereg.

    Built as the module it replaces: ``ctx`` (the server context, with
    ``storage_manager``, ``chunk_size`` and ``event_bus``), the liveness
    targets, and the reap timeout and grace in seconds. A timeout of 0 (the
    default, as there) disables reaping: no reaper runs, nothing is dropped.

    Keyword-only, livereg's own: ``table`` (default :func:`default_table`),
    ``capacity``, and ``listen`` (addresses such as
    ``"unix:/run/livereg/kv.sock"`` or ``"tcp://0.0.0.0:7071"``) with
    ``token`` (str or bytes; required for ``tcp://``): engines in containers
    that cannot map the table (isolated IPC, no shared ``/dev/shm``) register
    there with :class:`WorkerLiveness` given the address, and are reaped
    like the others; ``tls://`` addresses take ``tls_cert`` and ``tls_key``
    (and ``tls_client_ca`` to require client certificates). The table is created, or an existing one whose settings
    match is opened (else :class:`livereg.IncompatibleError` naming both);
    ``ctx.chunk_size`` is published in its info area for workers to read
    without RPC.
    """

    def __init__(
        self,
        ctx: Any,
        liveness_targets: Sequence[Any] = (),
        worker_reap_timeout_seconds: float = 0.0,
        worker_registration_grace_seconds: float = 0.0,
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
        for target in liveness_targets:
            if not callable(getattr(target, "drop_instance_state", None)):
                raise TypeError(f"liveness target {target!r} has no drop_instance_state(instance_id)")
        self._ctx = ctx
        self._clear_lock = threading.Lock()
        self._targets = tuple(liveness_targets)
        self._reap_timeout = float(worker_reap_timeout_seconds)
        self._reap_grace = float(worker_registration_grace_seconds)
        # Guards the maps and counters below; never held while calling out.
        self._lock = threading.Lock()
        self._on_behalf: Dict[int, livereg.Worker] = {}
        self._dropped: Dict[int, _Dropped] = {}
        self._target_failures = 0
        self._unaccepted = _Unaccepted()
        self._table = self._create_or_open(table or default_table(), capacity)
        chunk_size = getattr(ctx, "chunk_size", None)
        if chunk_size is not None:
            self._table.set_info(json.dumps({"chunk_size": chunk_size}))
        self._reaper: Optional[livereg.Reaper] = None
        self._stopping = threading.Event()
        self._cycle: Optional[threading.Thread] = None
        if self._reap_timeout > 0:
            self._reaper = self._table.start_reaper(
                on_drop=self._ended,
                on_clear=self.clear,
                listen=list(listen),
                token=token,
                tls_cert=tls_cert,
                tls_key=tls_key,
                tls_client_ca=tls_client_ca,
            )
            if self._targets:
                self._cycle = threading.Thread(target=self._cycle_loop, name="livereg-lmcache-cycle", daemon=True)
                self._cycle.start()

    def _create_or_open(self, name: str, capacity: int) -> livereg.Table:
        # livereg needs grace >= timeout; the targets get the values as given.
        timeout, grace = self._reap_timeout, max(self._reap_grace, self._reap_timeout)
        wanted = {"capacity": capacity, "reap_timeout": timeout, "registration_grace": grace}
        try:
            return livereg.create(name, capacity=capacity, reap_timeout=timeout, registration_grace=grace)
        except livereg.ExistsError:
            pass
        table = livereg.open(name)
        found = {
            "capacity": table.capacity,
            "reap_timeout": table.reap_timeout,
            "registration_grace": table.registration_grace,
        }
        if any(abs(found[key] - wanted[key]) > 1e-3 for key in wanted):
            table.close()
            raise livereg.IncompatibleError(
                f"table '{name}' exists with {found}, this server asks for {wanted}: "
                f"start it with the table's settings, or remove the table first (livereg rm {name})"
            )
        return table

    @property
    def context(self) -> Any:
        """The server context (as the reference exposes it, for tests)."""
        return self._ctx

    @property
    def table(self) -> livereg.Table:
        """The livereg table (for workers' names, status, tests)."""
        return self._table

    # -- the targets -------------------------------------------------------

    def _call(self, target: Any, method: str, instance_id: int) -> Any:
        """``target.method(instance_id)`` if the target has it; a raise is
        logged and counted, never passed on."""
        call = getattr(target, method, None)
        if call is None:
            return None
        try:
            return call(instance_id)
        except Exception:
            with self._lock:
                self._target_failures += 1
            logger.exception("%s(%d) of %r raised; the other targets still run", method, instance_id, target)
            return None

    def _free(self, instance_id: int, registration: Optional[Tuple[int, int]], evict: bool) -> None:
        """Drops ``instance_id`` on every target that has not dropped it
        since it was last seen live: ``evict_instance`` first where offered
        (``evict``: livereg saw it end), then ``drop_instance_state``."""
        with self._lock:
            dropped = self._dropped.get(instance_id)
            if dropped is None or (registration is not None and dropped.registration not in (None, registration)):
                # First drop of the id since it was live, or of a later registration.
                dropped = self._dropped[instance_id] = _Dropped(registration)
            elif registration is not None:
                dropped.registration = registration
            todo = [index for index in range(len(self._targets)) if index not in dropped.targets]
            dropped.targets.update(todo)
        if evict:
            for index in todo:
                self._call(self._targets[index], "evict_instance", instance_id)
        for index in todo:
            self._call(self._targets[index], "drop_instance_state", instance_id)

    def _ended(self, event: livereg.DropEvent) -> None:
        """The reaper's drop handler: whatever ended the registration."""
        with self._lock:
            held = self._on_behalf.get(event.instance_id)
            if held is not None and held.slot == event.slot:
                del self._on_behalf[event.instance_id]
        self._free(event.instance_id, (event.slot, event.generation), evict=True)

    def _live(self) -> Dict[int, Tuple[int, int]]:
        """Live registrations: instance id → (slot, generation)."""
        return {
            r.instance_id: (r.slot, r.generation) for r in self._table.status().registrations if r.state == "live"
        }

    def reap_cycle(self) -> List[int]:
        """One cycle, as the reaper thread runs it every ``timeout / 4``:
        touch every live registration on every target (but those held for
        PING-only workers: their pings touch them, as in the reference), run
        every target's ``reap_stale_instances(timeout, grace)``, and drop
        each id they return on every target that has not dropped it. Returns
        those ids."""
        live = self._live()
        with self._lock:
            pinged = set(self._on_behalf)
            for instance_id, registration in live.items():
                dropped = self._dropped.get(instance_id)
                if dropped is not None and dropped.registration != registration:
                    del self._dropped[instance_id]  # a new registration of the id
        for target in self._targets:
            for instance_id in live:
                if instance_id not in pinged:
                    self._call(target, "touch_instance", instance_id)
        reaped: List[int] = []
        for target in self._targets:
            reap = getattr(target, "reap_stale_instances", None)
            if reap is None:
                continue
            try:
                reaped.extend(reap(self._reap_timeout, self._reap_grace))
            except Exception:
                with self._lock:
                    self._target_failures += 1
                logger.exception("reap_stale_instances of %r raised; the other targets still run", target)
        for instance_id in dict.fromkeys(reaped):
            self._free(instance_id, live.get(instance_id), evict=False)
        return reaped

    def _cycle_loop(self) -> None:
        interval = self._reap_timeout / 4
        while not self._stopping.wait(interval):
            try:
                self.reap_cycle()
            except livereg.Error:
                logger.exception("the reap cycle failed; trying again in %.3fs", interval)

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
        for target in self._targets:
            self._call(target, "touch_instance", instance_id)
        if self._reaper is not None:
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

    def clear(self) -> None:
        """Clears all stored KV cache data from the storage manager
        (``memcheck``, ``clear(force=True)``, ``memcheck``, under a lock), as
        the reference. Registrations are untouched. An engine's clear through
        the table (``livereg_clear``) runs this same method on the reaper."""
        with self._clear_lock:
            storage = self._ctx.storage_manager
            storage.memcheck()
            storage.clear(force=True)
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
        ``ctx.event_bus`` as the reference's ``MP_VLLM_BLOCK_ALLOCATION``
        event."""
        event, event_type = _event_types()
        self._ctx.event_bus.publish(
            event(
                event_type=event_type.MP_VLLM_BLOCK_ALLOCATION,
                metadata={"instance_id": instance_id, "model_name": model_name, "records": records},
            )
        )

    def get_handlers(self) -> List[Any]:
        """The request handlers, as the reference lists them (its own
        ``HandlerSpec``, ``RequestType`` and ``ThreadPoolType`` when its
        package is importable, else stand-ins of the same names)."""
        spec, request, pool = _handler_types()
        return [
            spec(request.CLEAR, self.clear, pool.NORMAL),
            spec(request.GET_CHUNK_SIZE, self.get_chunk_size, pool.SYNC),
            spec(request.PING, self.ping, pool.NORMAL),
            spec(request.NOOP, self.debug, pool.SYNC),
            spec(request.REPORT_BLOCK_ALLOCATION, self.report_block_allocations, pool.NORMAL),
        ]

    def report_status(self) -> Dict[str, Any]:
        """``{"worker_liveness": {...}}`` with the reference's keys
        (``enabled``, ``reap_timeout_seconds``, ``registration_grace_seconds``,
        and ``tracked_instances``, the targets' sum) and livereg's
        (``livereg_tracked_instances``, ``reaper_alive``, ``ended`` by
        reason, ``handler_failures``, ``target_failures``, ``table``). Empty
        without liveness targets, as the reference."""
        if not self._targets:
            return {}
        tracked = sum(
            int(target.tracked_instance_count())
            for target in self._targets
            if callable(getattr(target, "tracked_instance_count", None))
        )
        stats = self._table.stats()
        with self._lock:
            target_failures = self._target_failures
        return {
            "worker_liveness": {
                "enabled": self._reaper is not None,
                "reap_timeout_seconds": self._reap_timeout,
                "registration_grace_seconds": self._reap_grace,
                "tracked_instances": tracked,
                "livereg_tracked_instances": stats["tracked_instances"],
                "reaper_alive": stats["reaper_alive"],
                "ended": stats["ended"],
                "handler_failures": stats["handler_failures"],
                "target_failures": target_failures,
                "table": self._table.name,
            }
        }

    def close(self) -> None:
        """Stops the reaper and its cycle, and ends the registrations held
        on pingers' behalf. The table stays for workers and the next server."""
        self._stopping.set()
        if self._cycle is not None:
            self._cycle.join()
            self._cycle = None
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
    """Keeps worker ``instance_id`` registered in ``table`` (a name, an open
    :class:`livereg.Table`, ``None`` for :func:`default_table`, or the
    address of the server's listener, ``"unix:/PATH"`` or
    ``"tcp://HOST:PORT"`` with ``token=``, or ``"tls://HOST:PORT"`` with
    ``tls_ca=`` (and a token or ``tls_cert``/``tls_key``), from a container
    that cannot map the table): beats
    from a daemon thread at a third of the table's timeout, registers again
    when evicted or when the server's reaper changes (a restart: its boot
    token changes), and deregisters on ``close()``. ``on_register(why)`` is
    called after every registration (``"start"``, ``"evicted"``, ``"server
    restarted"``): the server dropped this worker's state, so send it again
    there.

    An id livereg cannot hold (0, the reference's untracked prober, a
    negative one, one past 64 bits) registers nothing: it is logged once and
    the object does nothing, as a PING of it would.
    """

    def __init__(
        self,
        table: Union[str, livereg.Table, None],
        instance_id: int,
        label: Optional[str] = None,
        on_register: Optional[Callable[[str], object]] = None,
        interval: Optional[float] = None,
        wait: float = 10.0,
        token: Optional[Union[str, bytes]] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
    ) -> None:
        self.instance_id = instance_id
        self._address = table if isinstance(table, str) and table.startswith(_ADDRESS_SCHEMES) else None
        self._session_token = token
        self._tls_ca, self._tls_cert, self._tls_key = tls_ca, tls_cert, tls_key
        self.registrations = 0
        self._label = label
        self._on_register = on_register
        self._stopping = threading.Event()
        self._tracked = _Unaccepted().check(instance_id, "WorkerLiveness")
        if not self._tracked:
            if instance_id == 0:
                logger.warning("WorkerLiveness(0): id 0 is the untracked prober's; nothing registered")
            self._stopping.set()
            self._owns_table = False
            return
        self._table: Optional[livereg.Table] = None
        self._owns_table = not isinstance(table, livereg.Table)
        if self._address is None:
            self._table = table if isinstance(table, livereg.Table) else livereg.open(table or default_table())
        self._token = self._table.probe() if self._table is not None else None
        self._worker = self._register("start", deadline=time.monotonic() + wait)
        timeout = self._worker.reap_timeout or (self._table.registration_grace if self._table else 1.0)
        self.interval = interval if interval is not None else max(0.001, timeout / livereg.BEATS_PER_TIMEOUT)
        self._thread = threading.Thread(target=self._beat, name=f"livereg-beat-{instance_id}", daemon=True)
        self._thread.start()

    @property
    def tracked(self) -> bool:
        """Whether this worker is registered (False for an id livereg cannot
        hold)."""
        return self._tracked

    def _register(self, why: str, deadline: Optional[float] = None) -> livereg.Worker:
        while True:
            try:
                if self._address is not None:
                    # A session: the sender thread reconnects and takes the
                    # registration back after a server restart by itself.
                    worker = livereg.connect(
                        self._address,
                        self.instance_id,
                        label=self._label or "",
                        token=self._session_token,
                        tls_ca=self._tls_ca,
                        tls_cert=self._tls_cert,
                        tls_key=self._tls_key,
                    )
                else:
                    assert self._table is not None
                    worker = self._table.register(self.instance_id, label=self._label)
                break
            except (livereg.ExistsError, livereg.BusyError, livereg.DeadlineExceededError):
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
        if self._table is None:
            return
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
        if not self._tracked:
            return None
        info = self._worker.info()
        if not info:
            return None
        value = json.loads(info).get("chunk_size")
        return None if value is None else int(value)

    def clear(self, timeout: float = 5.0) -> None:
        """Asks the server to clear its stored cache, as the reference's
        CLEAR request: its :meth:`LiveregManagement.clear` runs once;
        registrations are untouched. Through the table, or through the
        server's listener for a session. Waits up to ``timeout`` seconds;
        raises ``DeadlineExceededError``, ``NoReaperError`` (and, for a session, what
        :func:`livereg.connect` raises for the connection)."""
        self.worker.clear(timeout)

    @property
    def worker(self) -> livereg.Worker:
        """The current registration."""
        if not self._tracked:
            raise livereg.NotFoundError(f"instance id {self.instance_id!r} is not tracked: nothing registered")
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
        if self._owns_table and self._table is not None:
            self._table.close()

    def __enter__(self) -> "WorkerLiveness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
