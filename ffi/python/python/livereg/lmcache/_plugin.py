"""The engine plugin's entry point, :func:`install`: what vLLM (and SGLang)
call in every process of an engine. It imports nothing of LMCache, nor
livereg's native module: it waits for the process's own import of LMCache's
transfer contexts and only then loads the engine side."""

from __future__ import annotations

import logging
import os
import secrets
import threading
from types import ModuleType

from livereg.lmcache._on_import import when_imported
from livereg.lmcache._owned import install as own_files

#: The package that holds LMCache's transfer contexts; its import brings in
#: every transfer-context class.
TRANSFER_CONTEXTS = "lmcache.v1.multiprocess.transfer_context"
#: vLLM's modules whose step functions publish progress (``_steps``).
VLLM_ENGINE_CORE = "vllm.v1.engine.core"
VLLM_WORKERS = "vllm.v1.worker.worker_base"
#: LMCache's multiprocess adapters (``_adapters``): degraded while the
#: server is gone, healthy again once a new one holds the KV caches.
LMCACHE_ADAPTERS = "lmcache.integration.vllm.vllm_multi_process_adapter"
#: The variable holding the engine key (``_stacks.ENGINE_ENV``).
ENGINE_ENV = "LIVEREG_VLLM_ENGINE"

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

    Inside vLLM, the engine's steps publish progress too (see
    ``livereg.lmcache._steps``): an engine that hangs is let go. What the
    engine's processes make in ``/dev/shm`` (shared-memory segments, named
    semaphores, the CPU offload region) is owned in the table, so the
    reaper removes it once its maker has ended (``livereg.lmcache._owned``).
    LMCache's vLLM adapters are put in their degraded mode the moment the
    server is gone and made healthy once a new one holds the KV caches
    (``livereg.lmcache._adapters``). Marks the
    process tree with an engine key (``$LIVEREG_VLLM_ENGINE``) if it has
    none.

    Imports nothing of LMCache or vLLM: the transfer contexts (and vLLM's
    step functions) are wrapped when the process itself imports them (at once if it already has), so a process
    that never uses LMCache pays microseconds and logs nothing. Idempotent;
    never raises."""
    global _installed
    try:
        with _lock:
            if _installed:
                return
            _installed = True
        # The engine's key, made by its first process and inherited by those
        # it starts (its EngineCore, its workers): their registrations and
        # stall reports are found by it.
        if not os.environ.get(ENGINE_ENV):
            os.environ[ENGINE_ENV] = secrets.token_hex(6)
        # What the engine's processes make in /dev/shm, removed once they end.
        own_files()
        when_imported(TRANSFER_CONTEXTS, _wrap)
        when_imported(VLLM_ENGINE_CORE, _wrap_engine_core)
        when_imported(VLLM_WORKERS, _wrap_workers)
        when_imported(LMCACHE_ADAPTERS, _wrap_adapters)
    except Exception:
        logging.getLogger("livereg.lmcache").exception("livereg: install() failed; engines run without livereg")


def _wrap_engine_core(module: ModuleType) -> None:
    from livereg.lmcache._steps import wrap_engine_core

    wrap_engine_core(module)


def _wrap_workers(module: ModuleType) -> None:
    from livereg.lmcache._steps import wrap_workers

    wrap_workers(module)


def _wrap_adapters(module: ModuleType) -> None:
    from livereg.lmcache._adapters import wrap_adapters

    wrap_adapters(module)


def _wrap(package: ModuleType) -> None:
    from livereg.lmcache._engine import wrap_transfer_contexts

    wrap_transfer_contexts(package)
