"""The engine side: what :func:`livereg.lmcache.install` does once the
process imports LMCache's transfer contexts.

Every LMCache adapter (vLLM, SGLang, ATOM) and LMCache's SDK hand their KV
caches to the server through a transfer context: ``create_transfer_context(
kv_caches, instance_id=..., req_client=..., mode=...)``, then the context's
``register(...)``, and at the end its ``unregister()`` / ``close()``.
:func:`wrap_transfer_contexts` wraps those three methods on every transfer-context class, so
that from the moment an engine's KV caches register, the engine holds a
livereg registration for its ``instance_id`` (taken just before the
server is asked, so a crash in between is covered too), beaten from a daemon
thread, until the context unregisters or closes (a clean end:
``deregistered``).

When livereg says the server dropped the engine while it is alive (evicted:
it was stopped past the timeout, or reset), or the server restarted, the
engine's KV caches are registered again by replaying its own ``register``
call, and so is its livereg registration.

Where nothing answers (no table, no listener, LMCache not installed), it logs
once and the engine runs exactly as without it; it never raises into the
engine.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple

import livereg
from livereg.lmcache._common import TLS_CA_ENV, TOKEN_FILE_ENV, default_table, logger, read_token_file
from livereg.lmcache._stacks import engine_key, stall_report
from livereg.lmcache._steps import core_label, publish_to, steps_followed, stop_publishing
from livereg.lmcache._worker import WorkerLiveness

#: The label of an engine's registration.
ENGINE_LABEL = "lmcache-engine"
#: How long a registration may wait for a previous one of the same id (a
#: process of this engine that just died) to end.
_REGISTER_WAIT = 2.0
#: How often, and how far apart in seconds, a replay is tried.
_REPLAY_ATTEMPTS = 30
_REPLAY_PAUSE = 1.0
#: Marks a method this module wrapped (each is wrapped once).
_WRAPPED = "__livereg_wrapped__"

_lock = threading.Lock()
_logged: Set[str] = set()
#: The engines of this process, by instance id.
_engines: Dict[int, "_Engine"] = {}


def _log_once(key: str, message: str, *args: object) -> None:
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.warning(message, *args)


class _Engine:
    """One instance id's livereg registration, and the transfer context whose
    ``register`` call is replayed when the server lost its state."""

    def __init__(self, instance_id: int, token: Optional[bytes]) -> None:
        self.instance_id = instance_id
        self.context: Any = None
        self._replay: Optional[Callable[[], object]] = None
        #: Held by a replay from check to answer, and by the engine's own
        #: end before it asks the server: a replay is either answered before
        #: the server is told the end, or never sent.
        self._replaying = threading.Lock()
        #: The boot token of the server the current context's registration
        #: was last answered by (read before it was asked), if known: a
        #: replay for a server that has it already is not sent again.
        self.registered_token: Optional[int] = None
        # Inside vLLM, the engine's steps are followed (``_steps``): it is
        # judged by its progress, and let go with its EngineCore.
        followed = steps_followed()
        self.liveness = WorkerLiveness(
            _target(), instance_id, label=f"{ENGINE_LABEL} {engine_key()}" if followed else ENGINE_LABEL,
            on_register=self._registered, wait=_REGISTER_WAIT, token=token,
            tls_ca=os.environ.get(TLS_CA_ENV) or None, steps=followed,
            stacks=stall_report() if followed else None, follows=core_label() if followed else None,
        )
        if followed:
            publish_to(self.liveness)

    def bind(self, context: Any, replay: Callable[[], object]) -> None:
        """``context`` registers now; ``replay`` registers it again."""
        self.context, self._replay = context, replay
        self.registered_token = None  # told by ``answered`` once it is

    def ending(self, context: Any) -> None:
        """``context`` is about to tell the server it ends: no replay of it
        is sent from now on, and one being answered is waited for."""
        with self._replaying:
            if self.context is context:
                self._replay = None

    def server_token(self) -> Optional[int]:
        """The serving server's boot token, read now from the table (None
        over a session, or if none serves)."""
        table = self.liveness._table if self.liveness.tracked else None
        if table is None:
            return None
        try:
            state = table.reaper_state
        except livereg.Error:
            return None
        return state.boot_token if state.serving else None

    def answered(self, context: Any, token: Optional[int]) -> None:
        """``context`` registered with the server of ``token``."""
        if self.context is context:
            self.registered_token = token

    def register_with(self, token: int) -> bool:
        """Registers the KV caches with the server of ``token`` unless they
        are already; True once they are, or once there is nothing to
        register (the context ended). Raises what the replay raises."""
        with self._replaying:
            replay = self._replay
            if replay is None:
                return True
            if self.registered_token == token:
                return True
            replay()
            self.registered_token = token
        logger.warning("instance %d: KV caches registered again", self.instance_id)
        return True

    def _registered(self, why: str) -> None:
        """livereg registered the engine (again): after an eviction or a
        server restart, the server's state for it is gone; send it again."""
        replay = self._replay
        if why == "start" or replay is None:
            return
        if why != "server restarted":
            self.registered_token = None  # the same server dropped the state: sent again whatever its token
        logger.warning("instance %d: registering its KV caches again (%s)", self.instance_id, why)
        if why == "moved again" and self._replay_once(replay):
            return  # before the step that found the engine let go goes on
        # Off the beat thread: beats go on while the server answers.
        threading.Thread(target=self._replay_until_done, args=(replay,), name="livereg-lmcache-replay",
                         daemon=True).start()

    def _replay_once(self, replay: Callable[[], object]) -> bool:
        """One replay, here and now; False (logged) if it failed."""
        try:
            with self._replaying:
                if self._replay is replay:
                    self._replay_for_current(replay)
        except Exception as error:
            logger.warning("instance %d: registering the KV caches again failed (%s); trying on", self.instance_id,
                           error)
            return False
        logger.warning("instance %d: KV caches registered again", self.instance_id)
        return True

    def _replay_for_current(self, replay: Callable[[], object]) -> None:
        """``replay()`` unless the serving server has the registration
        already (held: ``_replaying``)."""
        token = self.server_token()
        if token is not None and token == self.registered_token:
            return
        replay()
        self.registered_token = token

    def _replay_until_done(self, replay: Callable[[], object]) -> None:
        # (The context's request client may be used from this thread:
        # LMCache's clients queue each request for one thread of their own
        # that alone touches the socket.)
        for attempt in range(1, _REPLAY_ATTEMPTS + 1):
            try:
                with self._replaying:
                    if self._replay is not replay:
                        return  # a newer context registers, or this one ended
                    self._replay_for_current(replay)
                logger.warning("instance %d: KV caches registered again", self.instance_id)
                return
            except Exception as error:
                logger.warning("instance %d: registering the KV caches again failed (%s), attempt %d of %d",
                               self.instance_id, error, attempt, _REPLAY_ATTEMPTS)
            if self.liveness.stopped.wait(_REPLAY_PAUSE):
                return

    def close(self) -> None:
        """A clean end: deregistered."""
        self._replay = None
        stop_publishing(self.liveness)
        self.liveness.close()


def _target() -> str:
    return default_table()


def _token() -> Optional[bytes]:
    return read_token_file(os.environ.get(TOKEN_FILE_ENV))


def _start(instance_id: int, context: Any, replay: Callable[[], object]) -> Optional[_Engine]:
    """Binds ``context`` (which ``replay`` registers again) to the engine of
    ``instance_id``: this process's, or a new registration; None (logged
    once) when nothing answers or the id cannot be held. The engine is
    looked up and bound under one lock, the one :func:`_stop` takes: a
    context is never bound to an engine that was ended meanwhile."""
    with _lock:
        engine = _engines.get(instance_id)
        if engine is not None:
            engine.bind(context, replay)
            return engine
    try:
        token = _token()
    except livereg.Error as error:
        _log_once(
            f"token:{os.environ.get(TOKEN_FILE_ENV)}",
            "livereg: engine %d runs without livereg: %s (%s names the file holding the listener's token)",
            instance_id, error, TOKEN_FILE_ENV,
        )
        return None
    try:
        engine = _Engine(instance_id, token)
    except livereg.IncompatibleError as error:
        target = _target()
        _log_once(
            f"incompatible:{target}",
            "livereg: engine %d runs without livereg: %s speaks a version this livereg cannot (%s); upgrade the "
            "older of the two",
            instance_id, "listener" if livereg.is_address(target) else f"table '{target}'", error,
        )
        return None
    except (livereg.Error, OSError, ValueError) as error:
        target = _target()
        _log_once(
            f"start:{target}",
            "livereg: engine %d runs without livereg: %s did not answer (%s); set %s to the server's table or "
            "listener",
            instance_id, "listener" if livereg.is_address(target) else f"table '{target}'", error, "LIVEREG_LMCACHE_TABLE",
        )
        return None
    if not engine.liveness.tracked:
        return None
    with _lock:
        started = _engines.setdefault(instance_id, engine)
        started.bind(context, replay)
    if started is not engine:
        engine.close()  # another thread started this id's engine meanwhile
    return started


def _stop(context: Any) -> None:
    """``context`` ended cleanly: so does its engine's registration."""
    instance_id = getattr(context, "_instance_id", None)
    if not isinstance(instance_id, int):
        return
    with _lock:
        engine = _engines.get(instance_id)
        if engine is None or engine.context is not context:
            return
        del _engines[instance_id]
    engine.close()


def _ending(context: Any) -> None:
    """``context`` is about to tell the server it ends: its engine sends no
    replay of it after that."""
    with _lock:
        engine = _engines.get(getattr(context, "_instance_id", None))  # type: ignore[arg-type]
    if engine is not None:
        engine.ending(context)


def engine_of(instance_id: int) -> Optional[_Engine]:
    """This process's engine of ``instance_id``, if livereg holds one."""
    with _lock:
        return _engines.get(instance_id)


def _forget_after_fork() -> None:
    """In a forked child: the parent's engines are not the child's (their
    beat threads did not cross the fork, their registrations hold the
    parent's pid); the child registers its own."""
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _engines.clear()


os.register_at_fork(after_in_child=_forget_after_fork)

_inside = threading.local()


def _wrap_register(original: Callable[..., Any]) -> Callable[..., Any]:
    def register(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0):
            return original(self, *args, **kwargs)  # a subclass calling its base
        engine: Optional[_Engine] = None
        try:
            instance_id = getattr(self, "_instance_id", None)
            if isinstance(instance_id, int) and not isinstance(instance_id, bool):
                engine = _start(instance_id, self, lambda: _call(original, self, args, kwargs))
        except Exception:
            logger.exception("livereg: could not register the engine; it runs without livereg")
        token = engine.server_token() if engine is not None else None
        result = _call(original, self, args, kwargs)
        if engine is not None:
            engine.answered(self, token)
        return result

    setattr(register, _WRAPPED, original)
    return register


def _call(original: Callable[..., Any], self: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        return original(self, *args, **kwargs)
    finally:
        _inside.depth -= 1


def _wrap_end(original: Callable[..., Any]) -> Callable[..., Any]:
    def end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _ending(self)
        except Exception:
            logger.exception("livereg: could not stop the engine's replays")
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                _stop(self)
            except Exception:
                logger.exception("livereg: could not deregister the engine")

    setattr(end, _WRAPPED, original)
    return end


def _subclasses(cls: type) -> Iterator[type]:
    yield cls
    sub: type
    for sub in cls.__subclasses__():
        yield from _subclasses(sub)


def wrap_transfer_contexts(package: ModuleType) -> None:
    """Wraps ``register``, ``unregister`` and ``close`` of every transfer
    context class the package defined (each once)."""
    base = getattr(package, "TransferContext", None)
    if not isinstance(base, type):
        _log_once("import", "livereg: %s has no TransferContext class; nothing installed", package.__name__)
        return
    for cls in _subclasses(base):
        for name, wrap in (("register", _wrap_register), ("unregister", _wrap_end), ("close", _wrap_end)):
            method = cls.__dict__.get(name)
            if callable(method) and not hasattr(method, _WRAPPED) and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, wrap(method))
    logger.debug("livereg: LMCache engines of this process register in '%s'", default_table())
