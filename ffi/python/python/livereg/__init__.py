"""livereg: a lock-free shared-memory liveness registry.

Workers prove they are alive by writing a timestamp into their own slot of a
table in ``/dev/shm``; a reaper ends the registrations that went silent or
whose process died and calls your drop callback, so a server frees what it
held for them. A worker::

    import livereg

    table = livereg.open("workers")
    worker = table.register(3, label="gpu3")
    worker.ping()            # raises livereg.EvictedError once evicted
    worker.deregister()

A server::

    table = livereg.create("workers", reap_timeout=10.0)
    reaper = table.start_reaper(on_drop=lambda event: free(event.instance_id))

A worker in a container that cannot map the table (no shared ``/dev/shm``)
registers through a reaper's listener instead, and pings the same way::

    worker = livereg.connect("unix:/run/livereg/workers.sock", 3, label="gpu3")

or, on an asyncio loop::

    with table.acquire_reaper() as reaper:
        async for event in reaper.events():
            free(event.instance_id)

Every failure raises a subclass of :class:`livereg.Error` carrying ``code``
(the C ABI's result) and the library's message. Calls that can wait release
the GIL; callbacks take it only while they run. The library's log records go
to ``logging.getLogger("livereg")``.
"""

from typing import TYPE_CHECKING

# `open` is left out of `import *` (it would shadow the builtin): call
# `livereg.open`.
__all__ = [
    "BEATS_PER_TIMEOUT",
    "DEFAULT_REGISTRATION_GRACE",
    "INFO_MAX",
    "LABEL_MAX",
    "BeatThread",
    "BusyError",
    "BusyScope",
    "CorruptError",
    "DeadlineExceededError",
    "DrivenReaper",
    "DropEvent",
    "Error",
    "EvictedError",
    "ExistsError",
    "FullError",
    "IncompatibleError",
    "InvalidArgumentError",
    "NoReaperError",
    "NotFoundError",
    "PanicError",
    "PermissionDeniedError",
    "Reaper",
    "Reason",
    "RegistrationState",
    "RegistrationStatus",
    "Stats",
    "Status",
    "SystemCallError",
    "Table",
    "Worker",
    "connect",
    "create",
    "is_address",
    "read_token_file",
    "unlink",
]

if TYPE_CHECKING:
    from livereg._native import (
        BEATS_PER_TIMEOUT,
        DEFAULT_REGISTRATION_GRACE,
        INFO_MAX,
        LABEL_MAX,
        BeatThread,
        BusyError,
        BusyScope,
        CorruptError,
        DeadlineExceededError,
        DrivenReaper,
        DropEvent,
        Error,
        EvictedError,
        ExistsError,
        FullError,
        IncompatibleError,
        InvalidArgumentError,
        NoReaperError,
        NotFoundError,
        PanicError,
        PermissionDeniedError,
        Reaper,
        SystemCallError,
        Table,
        Worker,
        connect,
        create,
        is_address,
        read_token_file,
        unlink,
    )
    from livereg._native import open as open
    from livereg._reason import Reason
    from livereg._status import RegistrationState, RegistrationStatus, Stats, Status
else:
    # Each name is loaded with its module on first use (``import livereg``
    # itself loads nothing): the engine plugin is imported into every
    # process of an engine, most of which never register.
    _ELSEWHERE = {
        "Reason": "livereg._reason",
        **dict.fromkeys(["RegistrationState", "RegistrationStatus", "Stats", "Status"], "livereg._status"),
    }
    # Every other public name (and `open`) is the native module's.
    _HOMES = {
        **{name: "livereg._native" for name in [*__all__, "open"] if name not in _ELSEWHERE},
        **_ELSEWHERE,
    }

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'livereg' has no attribute '{name}'")
        import importlib

        module = importlib.import_module(home)
        for each, where in _HOMES.items():
            if where == home:
                globals()[each] = getattr(module, each)
        return globals()[name]

    def __dir__() -> list:
        return sorted({*globals(), *_HOMES})
