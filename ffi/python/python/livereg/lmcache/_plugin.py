"""The engine plugin's entry point, :func:`install`: what vLLM (and SGLang)
call in every process of an engine. It imports nothing of LMCache, nor
livereg's native module: it waits for the process's own import of LMCache's
transfer contexts and only then loads the engine side."""

from __future__ import annotations

import logging
import threading
from types import ModuleType

from livereg.lmcache._on_import import when_imported

#: The package that holds LMCache's transfer contexts; its import brings in
#: every transfer-context class.
TRANSFER_CONTEXTS = "lmcache.v1.multiprocess.transfer_context"

_lock = threading.Lock()
_installed = False


def install() -> None:
    """Holds a livereg registration for every LMCache engine of this process
    from its KV caches' registration to their unregistration. Declared as a
    ``vllm.general_plugins`` and ``sglang.srt.plugins`` entry point (the
    engine calls it in every process); callable directly. The table or
    listener is ``$LIVEREG_LMCACHE_TABLE`` (default ``lmcache-workers``),
    with ``$LIVEREG_LMCACHE_TOKEN_FILE`` and ``$LIVEREG_LMCACHE_TLS_CA`` for
    an address.

    Imports nothing of LMCache: the transfer contexts are wrapped when the
    process itself imports them (at once if it already has), so a process
    that never uses LMCache pays microseconds and logs nothing. Idempotent;
    never raises."""
    global _installed
    try:
        with _lock:
            if _installed:
                return
            _installed = True
        when_imported(TRANSFER_CONTEXTS, _wrap)
    except Exception:
        logging.getLogger("livereg.lmcache").exception("livereg: install() failed; engines run without livereg")


def _wrap(package: ModuleType) -> None:
    from livereg.lmcache._engine import wrap_transfer_contexts

    wrap_transfer_contexts(package)
