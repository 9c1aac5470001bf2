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
to ``logging.getLogger("livereg")``. ``livereg.__version__`` is this
package's release and ``livereg.native_version()`` the library's within it.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Each home's public names, as its stub defines them: listed nowhere
    # else.
    from livereg._native import *  # noqa: F403
    from livereg._native import __version__ as __version__
    from livereg._native import open as open
    from livereg._reason import *  # noqa: F403
    from livereg._status import *  # noqa: F403
else:
    # Nothing is loaded by ``import livereg`` itself: the engine plugin is
    # imported into every process of an engine, most of which never
    # register. The first name asked for loads the homes, and each home's
    # public names (its ``__all__``; pyo3 keeps the native module's) become
    # this module's. ``open`` stays out of ``import *`` (it would shadow the
    # builtin): call ``livereg.open``.
    _HOMES = ("livereg._native", "livereg._reason", "livereg._status")
    _NOT_STARRED = ("open",)

    def _load() -> None:
        import importlib

        names = []
        for home in _HOMES:
            module = importlib.import_module(home)
            for name in module.__all__:
                if not name.startswith("_"):
                    globals()[name] = getattr(module, name)
                    names.append(name)
        globals()["__all__"] = sorted(n for n in names if n not in _NOT_STARRED)

    def __getattr__(name: str) -> object:
        if name == "__version__":
            # The package's release, as its crate's Cargo version says.
            import importlib

            return importlib.import_module("livereg._native").__version__
        if "__all__" not in globals():
            _load()
            if name in globals():
                return globals()[name]
        raise AttributeError(f"module 'livereg' has no attribute '{name}'")

    def __dir__() -> list:
        if "__all__" not in globals():
            _load()
        return sorted(globals())
