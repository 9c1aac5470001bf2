"""Runs a function on a module once the process itself imports it:
:func:`when_imported`.

The engine plugin is loaded in every process of an engine, most of which
never touch LMCache; importing LMCache there (torch, numba and the rest)
would cost seconds and change what those processes hold. Instead a finder
placed first on ``sys.meta_path`` waits for the module's name, lets the
finder that really has the module load it, and hands the finished module to
the function.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


logger = logging.getLogger("livereg.lmcache")
_lock = threading.Lock()
#: The functions waiting for each module name.
_waiting: Dict[str, List[Callable[[ModuleType], None]]] = {}


def when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """Calls ``then(module)`` once module ``name`` is imported: at once if
    it already is, else right after the process's own import of it finishes
    (in the importing thread, before the import statement returns). An
    exception from ``then`` is logged, never raised into the import."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            first = not _waiting
            _waiting.setdefault(name, []).append(then)
            if first:
                sys.meta_path.insert(0, _Finder())
            return
    _call(then, module)


def _new_lock_after_fork() -> None:
    """In a forked child: another thread of the parent may have held the
    lock at the fork, and no thread of the child will ever release it."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def _call(then: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        then(module)
    except Exception:
        logger.exception("livereg: handling the import of %s failed", module.__name__)


def _imported(module: ModuleType) -> None:
    with _lock:
        waiting = _waiting.pop(module.__name__, [])
        if not _waiting:
            sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Finder)]
    for then in waiting:
        _call(then, module)


class _Finder:
    """A meta path finder (the protocol, without importing
    ``importlib.abc``) that finds nothing itself: for a waited-for name it
    asks the other finders and wraps the loader they found."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[ModuleSpec]:
        with _lock:
            if fullname not in _waiting:
                return None
        for finder in sys.meta_path:
            if isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: Optional[ModuleSpec] = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                # A loader by protocol, not by inheritance (importlib.abc stays unimported).
                spec.loader = _ThenLoader(spec.loader)  # type: ignore[assignment]
            return spec
        return None


class _ThenLoader:
    """The real loader, then :func:`_imported`; the module keeps the real
    loader as its own."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> Optional[ModuleType]:
        module: Optional[ModuleType] = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        _imported(module)
