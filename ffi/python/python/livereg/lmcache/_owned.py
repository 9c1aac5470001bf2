"""What an engine's processes make in ``/dev/shm``, owned in the table so
the reaper removes it once its maker has ended (``Table.own_file``):

- ``multiprocessing.shared_memory`` segments made with ``create=True``
  (vLLM's message queues, its object and tensor stores), disowned when
  their maker unlinks them;
- ``multiprocessing`` semaphores that keep a name (``/dev/shm/sem.mp-*``,
  made by the ``spawn`` and ``forkserver`` contexts), disowned when
  ``multiprocessing`` removes them;
- vLLM's CPU offload region (``/dev/shm/vllm_offload_{engine_id}.mmap``)
  in the process that made it, while it keeps the name.

Each is wrapped when the process itself imports its module (at once if it
has): loading the plugin imports nothing. The table (``$LIVEREG_LMCACHE_TABLE``,
else ``lmcache-workers``) is opened at the first declaration; over a
listener's address nothing is owned (the reaper cannot see this process's
``/dev/shm``). A declaration that fails is logged once per kind and never
raised into the engine."""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType
from typing import Any, Callable, Optional, Set

from livereg.lmcache._on_import import when_imported

logger = logging.getLogger("livereg.lmcache")

SHARED_MEMORY = "multiprocessing.shared_memory"
SYNCHRONIZE = "multiprocessing.synchronize"
OFFLOAD_REGION = "vllm.v1.kv_offload.cpu.shared_offload_region"
#: The variable naming the table (as ``_common.TABLE_ENV``, read here
#: without importing livereg's native module).
TABLE_ENV = "LIVEREG_LMCACHE_TABLE"
DEFAULT_TABLE = "lmcache-workers"
SHM = "/dev/shm/"


def install() -> None:
    """Wraps what makes files in ``/dev/shm`` once its module is imported."""
    when_imported(SHARED_MEMORY, _wrap_shared_memory)
    when_imported(SYNCHRONIZE, _wrap_semaphores)
    when_imported(OFFLOAD_REGION, _wrap_offload_region)


class _Owner:
    """This process's declarations, through one table handle opened at the
    first (again in a forked child, whose declarations are its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: Any = None
        self._pid = 0
        self._said: Set[str] = set()
        #: What this process declared (a disown of anything else is no
        #: business of this table's, and opens nothing).
        self._owned: Set[str] = set()

    def _handle(self) -> Any:
        name = os.environ.get(TABLE_ENV) or DEFAULT_TABLE
        import livereg

        if livereg.is_address(name):
            return None
        if self._table is None or self._pid != os.getpid():
            self._table, self._pid = livereg.open(name), os.getpid()
        return self._table

    def own(self, path: str) -> None:
        def own(table: Any) -> None:
            table.own_file(path)
            self._owned.add(path)

        self._call("own", path, own)

    def disown(self, path: str) -> None:
        if path in self._owned:
            self._owned.discard(path)
            self._call("disown", path, lambda table: table.disown_file(path))

    def _call(self, what: str, path: str, call: Callable[[Any], object]) -> None:
        try:
            with self._lock:
                if self._pid != os.getpid():
                    self._owned.clear()  # a forked child owns nothing
                table = self._handle()
                if table is not None:
                    call(table)
        except Exception as error:
            kind = f"{what} {type(error).__name__}"
            if kind in self._said:
                return
            self._said.add(kind)
            # No table: no livereg server runs beside this engine.
            quiet = type(error).__name__ == "NotFoundError" and what == "own" and self._table is None
            logger.log(
                logging.DEBUG if quiet else logging.WARNING,
                "livereg: cannot %s %s (the reaper will not remove it): %s",
                what,
                path,
                error,
            )


_owner = _Owner()


def _after_fork_in_child() -> None:
    _owner._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _segment_path(segment: Any) -> Optional[str]:
    name = getattr(segment, "_name", None)
    return SHM + name.lstrip("/") if isinstance(name, str) else None


def _wrap_shared_memory(module: ModuleType) -> None:
    shared_memory = module.SharedMemory
    if getattr(shared_memory, "_livereg_owned", False):
        return
    made, unlink = shared_memory.__init__, shared_memory.unlink

    def __init__(self: Any, name: Optional[str] = None, create: bool = False, *args: Any, **kwargs: Any) -> None:
        made(self, name, create, *args, **kwargs)
        path = _segment_path(self)
        if create and path is not None:
            _owner.own(path)

    def unlink_and_disown(self: Any) -> None:
        unlink(self)
        path = _segment_path(self)
        if path is not None:
            _owner.disown(path)

    shared_memory.__init__ = __init__
    shared_memory.unlink = unlink_and_disown
    shared_memory._livereg_owned = True


def _semaphore_path(name: object) -> Optional[str]:
    return SHM + "sem." + name.lstrip("/") if isinstance(name, str) else None


def _wrap_semaphores(module: ModuleType) -> None:
    semaphore = module.SemLock
    if getattr(semaphore, "_livereg_owned", False):
        return
    made, cleanup = semaphore.__init__, semaphore._cleanup

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        # A name kept (not unlinked at once): a file in /dev/shm.
        path = _semaphore_path(getattr(getattr(self, "_semlock", None), "name", None))
        if path is not None:
            _owner.own(path)

    def _cleanup(name: str) -> None:
        cleanup(name)
        path = _semaphore_path(name)
        if path is not None:
            _owner.disown(path)

    semaphore.__init__ = __init__
    semaphore._cleanup = staticmethod(_cleanup)
    semaphore._livereg_owned = True


def _wrap_offload_region(module: ModuleType) -> None:
    region = module.SharedOffloadRegion
    if getattr(region, "_livereg_owned", False):
        return
    made, cleanup = region.__init__, region.cleanup

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        # Its maker keeps the name until cleanup (without a barrier).
        if getattr(self, "_creator", False) and os.path.exists(self.mmap_path):
            _owner.own(self.mmap_path)

    def cleanup_and_disown(self: Any) -> None:
        path = getattr(self, "mmap_path", None)
        cleanup(self)
        if isinstance(path, str):
            _owner.disown(path)

    region.__init__ = __init__
    region.cleanup = cleanup_and_disown
    region._livereg_owned = True
