"""livereg in LMCache's multiprocess server and its engines.

Three ways in, each using only what LMCache's released classes have:

- **the server module** (LMCache 0.5.6 and later), through LMCache's own
  plugin point::

      python -m lmcache.v1.multiprocess.server ... \\
          --server-module '{"module_path": "livereg.lmcache", "config": {"reap_timeout_seconds": 5}}'

  :func:`build_server_modules` returns a :class:`LiveregServerModule`: it owns
  the livereg table's reaper (and optionally a listener for isolated
  engines) and frees a crashed engine's state in every liveness target at
  once; LMCache's own ``ManagementModule`` stays.
- **the engine plugin**: :func:`install`, a ``vllm.general_plugins`` entry
  point, registers each engine in livereg from its KV caches' registration
  on, and registers them again when the server lost them.
- **the module swap**, for a server built in code: :class:`LiveregManagement`
  in place of LMCache's ``ManagementModule``; and :class:`WorkerLiveness`
  for a worker that keeps its own registration.

Both sides find the table by name: :data:`DEFAULT_TABLE`, or
``$LIVEREG_LMCACHE_TABLE`` (a name, or a listener's address).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from livereg.lmcache._plugin import install

if TYPE_CHECKING:
    from livereg.lmcache._common import DEFAULT_TABLE, TABLE_ENV, default_table
    from livereg.lmcache._management import PING_LABEL, LiveregManagement
    from livereg.lmcache._server_module import LiveregServerModule, build_server_modules
    from livereg.lmcache._worker import WorkerLiveness
else:
    # Every name but ``install`` is imported with its module when first
    # asked for: the engine plugin loads this package in every process of
    # an engine, where neither LMCache (torch, numba) nor livereg's native
    # module is to be imported before the process uses them.
    _HOMES = {
        "DEFAULT_TABLE": "livereg.lmcache._common",
        "TABLE_ENV": "livereg.lmcache._common",
        "default_table": "livereg.lmcache._common",
        "PING_LABEL": "livereg.lmcache._management",
        "LiveregManagement": "livereg.lmcache._management",
        "LiveregServerModule": "livereg.lmcache._server_module",
        "build_server_modules": "livereg.lmcache._server_module",
        "WorkerLiveness": "livereg.lmcache._worker",
    }

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'livereg.lmcache' has no attribute '{name}'")
        import importlib

        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list:
        return sorted({*globals(), *_HOMES})


__all__ = [
    "DEFAULT_TABLE",
    "PING_LABEL",
    "TABLE_ENV",
    "LiveregManagement",
    "LiveregServerModule",
    "WorkerLiveness",
    "build_server_modules",
    "default_table",
    "install",
]
