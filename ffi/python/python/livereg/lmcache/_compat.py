"""Meeting the installed LMCache where it is.

How a server finds a management module's request handlers changed across
0.5.x: 0.5.0–0.5.4 call ``get_handlers()`` and check each handler's
annotations against the request's payload types; 0.5.5 also picks the module
by ``isinstance(module, ManagementModule)``; 0.5.6 finds methods decorated
with ``@request_handler`` and checks their signatures against its RPC specs.
:func:`adopt` gives one of our methods the installed release's view of its
counterpart (decoration, signature, resolved annotations), so each release
finds and accepts it as its own.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from livereg.lmcache._common import logger


def real_management() -> Optional[type]:
    """LMCache's ``ManagementModule`` class, or None when LMCache is not
    importable."""
    try:
        from lmcache.v1.multiprocess.modules.management import ManagementModule  # type: ignore
    except Exception:  # not installed, or an install that does not import
        return None
    return ManagementModule  # type: ignore[no-any-return]


def _request_handler_api() -> Optional[Tuple[Callable[..., Any], Callable[..., Any]]]:
    """``(request_handler, get_request_handler_options)`` from 0.5.6 on."""
    try:
        from lmcache.v1.multiprocess.request_handler import (  # type: ignore
            get_request_handler_options,
            request_handler,
        )
    except Exception:
        return None
    return request_handler, get_request_handler_options


def adopt(ours: Callable[..., Any], real: Optional[Callable[..., Any]]) -> None:
    """Makes function ``ours`` look to the installed LMCache as ``real``
    does: the same signature and annotations (resolved, so they need none of
    LMCache's names here) and, from 0.5.6 on, the same ``@request_handler``
    decoration. Nothing when ``real`` is None."""
    if real is None:
        return
    try:
        ours.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]
        ours.__annotations__ = typing.get_type_hints(real)
    except Exception:
        logger.warning("could not read LMCache's %s; %s keeps its own signature", real, ours.__name__, exc_info=True)
        return
    api = _request_handler_api()
    if api is None:
        return
    request_handler, options_of = api
    options = options_of(real)
    if options is not None:
        request_handler(
            options.handler_type,
            operation=options.operation,
            requires_client_affinity=options.requires_client_affinity,
        )(ours)


def clear_forces_by_default(real: Optional[type]) -> bool:
    """Whether a clear without ``force`` forces: so until 0.5.2 (``clear()``
    took no argument and always forced); from 0.5.3, ``clear(force=False)``."""
    clear = getattr(real, "clear", None)
    if clear is None:
        return True
    parameter = inspect.signature(clear).parameters.get("force")
    return parameter is None or bool(parameter.default)


# Stand-ins for LMCache's types when its package is not importable.
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


def handler_types() -> Tuple[Any, Any, Any]:
    """``(HandlerSpec, RequestType, ThreadPoolType)``: LMCache's own when
    they are importable (0.5.0–0.5.5), else stand-ins with the same names."""
    try:
        from lmcache.v1.multiprocess.engine_module import HandlerSpec, ThreadPoolType  # type: ignore
        from lmcache.v1.multiprocess.protocols.base import RequestType  # type: ignore
    except ImportError:
        return _HandlerSpec, _RequestType, _ThreadPoolType
    return HandlerSpec, RequestType, ThreadPoolType


def event_types() -> Tuple[Any, Any]:
    """``(Event, EventType)``: LMCache's own, else stand-ins."""
    try:
        from lmcache.v1.mp_observability.event import Event, EventType  # type: ignore
    except ImportError:
        return _Event, _EventType
    return Event, EventType
