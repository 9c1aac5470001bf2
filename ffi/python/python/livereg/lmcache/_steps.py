"""Progress from inside vLLM: the engine's own loop says when it has work
in flight and when a step completes, so an engine that hangs with its beat
thread running is seen (``STALLED``).

Two places of vLLM's V1 engine run its steps, each wrapped when the process
imports it (found in vLLM 0.32's ``vllm/v1``, the release the tests run; a
release without one of these names logs that its steps are not followed,
and a worker whose ``execute_model`` answers the step's output itself, with
no ``sample_tokens`` after it, has its step counted there):

- ``vllm.v1.engine.core.EngineCore.step`` and ``step_with_batch_queue``
  (the scheduler loop of ``VLLM::EngineCore``, called only while requests
  are unfinished): busy from the call on, one step when it returns, idle
  once the scheduler holds no request. This process has no KV caches of its
  own: it holds a registration of its own (label ``vllm-core KEY``) from
  its first step, under an id derived from that label
  (:func:`core_instance`), and its engine's workers let go with it: read
  from the table, or asked of the listener they registered through.
- ``vllm.v1.worker.worker_base.WorkerWrapperBase.execute_model`` (every
  ``VLLM::Worker``, whatever its device) and the worker class's
  ``sample_tokens``: busy from ``execute_model`` on, one step when the
  model's output is made (``execute_model``'s own answer, or
  ``sample_tokens``'), then idle.

Each publishes to its own: the EngineCore's steps to its registration, a
worker's steps to the engines' registrations of its process (one process
holds both when vLLM runs its worker in the EngineCore).

An idle engine never stalls; a slow step that completes never does. Each
hook costs a few attribute reads and two or three calls into livereg's
native module (a store each: no clock, no system call).
"""

from __future__ import annotations

import os
import secrets
import threading
from types import ModuleType
from typing import Any, Callable, List, Optional

import livereg
from livereg.lmcache._common import (
    CORE_LABEL, TLS_CA_ENV, TOKEN_FILE_ENV, default_table, label_instance, logger, read_token_file,
)
from livereg.lmcache._stacks import engine_key, stall_report
from livereg.lmcache._worker import WorkerLiveness

#: Marks a method this module wrapped.
_WRAPPED = "__livereg_steps__"

_lock = threading.Lock()
#: This process's engines (their workers' registrations): the worker's
#: steps are published to them.
_registrations: List[WorkerLiveness] = []
#: The EngineCore's own registration: its steps are published to it.
_core: Optional[WorkerLiveness] = None
_core_failed = False
#: Whether this process's steps are followed (a step function was wrapped).
_followed = False


def steps_followed() -> bool:
    """Whether vLLM's step functions of this process are wrapped: its
    registrations get progress."""
    return _followed


def core_label() -> str:
    """The label of this engine's EngineCore registration."""
    return f"{CORE_LABEL} {engine_key()}"


def core_instance() -> int:
    """The instance id of this engine's EngineCore registration, derived
    from its label: a worker that cannot read the table (registered through
    a listener) asks the listener about it."""
    return label_instance(core_label())


def _core_liveness(instance_id: int) -> WorkerLiveness:
    """The EngineCore's registration as ``instance_id``, in the table or
    through the listener its workers use (with their token and CA)."""
    return WorkerLiveness(
        default_table(), instance_id, label=core_label(), wait=2.0, steps=True, stacks=stall_report(),
        token=read_token_file(os.environ.get(TOKEN_FILE_ENV)), tls_ca=os.environ.get(TLS_CA_ENV) or None,
    )


def publish_to(liveness: WorkerLiveness) -> None:
    """The worker steps of this process are published to ``liveness`` from
    now on."""
    with _lock:
        _registrations.append(liveness)


def stop_publishing(liveness: WorkerLiveness) -> None:
    with _lock:
        if liveness in _registrations:
            _registrations.remove(liveness)


def _started(registrations: List[WorkerLiveness]) -> None:
    for liveness in registrations:
        try:
            liveness.step_started()
        except Exception:  # never into the engine's step
            logger.exception("livereg: publishing a step's start failed")


def _done(registrations: List[WorkerLiveness], busy: bool = False) -> None:
    for liveness in registrations:
        try:
            liveness.step_done(busy)
        except Exception:  # never into the engine's step
            logger.exception("livereg: publishing a step failed")


def _cores() -> List[WorkerLiveness]:
    return [] if _core is None else [_core]


def _wrapped(method: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
    setattr(wrapper, _WRAPPED, method)
    wrapper.__name__ = getattr(method, "__name__", "step")
    wrapper.__doc__ = getattr(method, "__doc__", None)
    return wrapper


def wrap_engine_core(module: ModuleType) -> None:
    """Wraps the EngineCore's step functions (each once)."""
    core = getattr(module, "EngineCore", None)
    if not isinstance(core, type):
        logger.warning("livereg: %s has no EngineCore class; its steps are not followed", module.__name__)
        return
    for name in ("step", "step_with_batch_queue"):
        method = core.__dict__.get(name)
        if callable(method) and not hasattr(method, _WRAPPED):
            setattr(core, name, _wrapped(method, _core_step(method)))
    _now_followed()


def _core_step(method: Callable[..., Any]) -> Callable[..., Any]:
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _core is None and not _core_failed:
            _register_core(self)
        cores = _cores()
        _started(cores)
        try:
            return method(self, *args, **kwargs)
        finally:  # a step that raised has ended too: it is not hung
            scheduler = getattr(self, "scheduler", None)
            _done(cores, bool(scheduler is not None and scheduler.has_requests()))

    return step


def _register_core(engine_core: Any) -> None:
    """The EngineCore's own registration, from its first step, when the
    engine uses an LMCache connector."""
    global _core, _core_failed
    with _lock:
        if _core is not None or _core_failed:
            return
        _core_failed = True  # one attempt per process
    config = getattr(getattr(engine_core, "vllm_config", None), "kv_transfer_config", None)
    connector = str(getattr(config, "kv_connector", "") or "")
    if "lmcache" not in connector.lower():
        return
    try:
        liveness = _core_liveness(core_instance())
    except (livereg.ExistsError, livereg.BusyError, livereg.DeadlineExceededError) as error:
        # Another EngineCore of this engine holds the id (data parallel):
        # registered under another, followed by its label from the table
        # only.
        logger.warning("livereg: the EngineCore's id %d is held (%s); registered under another, which workers "
                       "registered through a listener do not follow", core_instance(), error)
        try:
            liveness = _core_liveness(secrets.randbits(63) or 1)
        except (livereg.Error, OSError, ValueError) as again:
            logger.warning("livereg: the EngineCore runs without a registration of its own: %s", again)
            return
    except (livereg.Error, OSError, ValueError) as error:
        logger.warning("livereg: the EngineCore runs without a registration of its own: %s", error)
        return
    with _lock:
        _core = liveness
        _core_failed = False


def wrap_workers(module: ModuleType) -> None:
    """Wraps the worker wrapper's ``execute_model`` (once)."""
    wrapper = getattr(module, "WorkerWrapperBase", None)
    method = getattr(wrapper, "execute_model", None) if isinstance(wrapper, type) else None
    if not callable(method):
        logger.warning("livereg: %s has no WorkerWrapperBase.execute_model; worker steps are not followed",
                       module.__name__)
        return
    if not hasattr(method, _WRAPPED):
        setattr(wrapper, "execute_model", _wrapped(method, _worker_execute(method)))
    _now_followed()


def _now_followed() -> None:
    global _followed
    _followed = True


def _worker_execute(method: Callable[..., Any]) -> Callable[..., Any]:
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        _started(_registrations)
        try:
            output = method(self, *args, **kwargs)
        except BaseException:
            _done(_registrations)  # a step that raised has ended too: it is not hung
            raise
        if output is not None:
            _done(_registrations)
        else:
            _wrap_sampling(type(getattr(self, "worker", None)))
        return output

    return execute_model


def _wrap_sampling(worker_class: type) -> None:
    """The output of a step that samples separately comes from the worker
    class's ``sample_tokens``: wrapped on first use (each class once)."""
    for cls in worker_class.__mro__:
        method = cls.__dict__.get("sample_tokens")
        if method is None:
            continue
        if not hasattr(method, _WRAPPED):
            setattr(cls, "sample_tokens", _wrapped(method, _sampled(method)))
        return


def _sampled(method: Callable[..., Any]) -> Callable[..., Any]:
    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            _done(_registrations)

    return sample_tokens
