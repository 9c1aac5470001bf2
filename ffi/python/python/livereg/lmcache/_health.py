"""``GET /livereg/health`` on vLLM's OpenAI server: a ``vllm.endpoint_plugins``
entry point (named ``livereg_health``; vLLM loads an endpoint plugin only
when ``$VLLM_PLUGINS`` names it).

It answers 200 while no process of this engine is stalled, and 503 once
one is, with a JSON body naming each stalled process (pid, title), since
when, and the frame its steps hang in, until it moves again. It reads the
stall reports the engine's processes leave in their run directory
(``livereg.lmcache._stacks``): no request reaches the engine, so it answers
while the engine is hung, which vLLM's own ``/health`` does not notice.

Where it cannot know (the run directory is not this user's private one: a
path another user made first; or a live process of the engine could make no
report), it answers 503 too, ``"status": "unknown"`` with the reason: a
liveness probe that cannot see stalls must not pass as healthy, and the
reason (in the body and logged once) says what to fix.

Where LMCache's server module serves the engine's table, the body also
says the cache server's state: ``"kv_server": "serving"`` or ``"absent"``
(a server that is dying counts as gone) and since when
(``"kv_server_since"``, Unix seconds), with the serving server's pid. A
gone server changes no status code: the engine serves without its cache.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, Optional, Set, Tuple

from livereg.lmcache._stacks import engine_key, read_reports, report_failure

#: The route's path.
PATH = "/livereg/health"

_logger = logging.getLogger("livereg.lmcache")
_lock = threading.Lock()
_logged: Set[str] = set()


def engine_health(key: Optional[str] = None, kv_server: bool = False) -> Tuple[int, Dict[str, Any]]:
    """The route's answer for engine ``key`` (default: this process's):
    ``(200, {...})``, or ``(503, {...})`` with ``"status"`` ``"stalled"``
    or ``"unknown"``; with ``kv_server``, the cache server's state too."""
    status, body = _stall_health(key or engine_key())
    if kv_server:
        body.update(kv_server_state())
    return status, body


def kv_server_state() -> Dict[str, Any]:
    """``{"kv_server": ..., "kv_server_since": ...}`` (and the serving
    server's ``"kv_server_pid"``), or ``{}`` where the table is not
    LMCache's server module's."""
    try:
        from livereg.lmcache._server_watch import server_watch

        watch = server_watch()
    except Exception:
        return {}
    if watch is None or not watch.armed:
        return {}
    state, since = watch.state, watch.since
    body: Dict[str, Any] = {"kv_server": "serving" if state.serving else "absent", "kv_server_since": since}
    if state.serving:
        body["kv_server_pid"] = state.pid
    return body


def _stall_health(key: str) -> Tuple[int, Dict[str, Any]]:
    try:
        stalled, unreported = read_reports(key)
    except OSError as error:
        return _unknown(key, f"the stall reports cannot be read: {error}", [])
    if stalled:
        worst = max(stalled, key=lambda stall: stall["stalled_for_seconds"])
        reason = f"{worst['process'] or 'pid ' + str(worst['pid'])} stalled"
        if worst["frame"]:
            reason += f", hung in {worst['frame']}"
        return 503, {"status": "stalled", "engine": key, "reason": reason, "stalled": stalled}
    here = report_failure()
    if unreported or here:
        first = unreported[0]["reason"] if unreported else here
        return _unknown(key, f"a process of the engine has no stall report: {first}", unreported)
    return 200, {"status": "ok", "engine": key}


def _unknown(key: str, why: str, unreported: Any) -> Tuple[int, Dict[str, Any]]:
    reason = f"stall state unknown: {why}"
    with _lock:
        first = reason not in _logged and len(_logged) < 64
        if first:
            _logged.add(reason)
    if first:
        _logger.warning("livereg: %s answers 503 for engine %s: %s", PATH, key, reason)
    body: Dict[str, Any] = {"status": "unknown", "engine": key, "reason": reason}
    if unreported:
        body["unreported"] = unreported
    return 503, body


class HealthRoute:
    """The endpoint plugin (vLLM's ``EndpointPlugin`` protocol)."""

    name = "livereg_health"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        import importlib

        # vLLM's server is FastAPI's: imported from it only here.
        JSONResponse = importlib.import_module("fastapi.responses").JSONResponse
        key = engine_key()
        kv_server_state()  # the cache server watched from now on: its state has a since

        async def livereg_health() -> Any:
            status, body = engine_health(key, kv_server=True)
            return JSONResponse(body, status_code=status)

        app.add_api_route(PATH, livereg_health, methods=["GET"], include_in_schema=False)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        """Nothing to keep: the route reads the stall reports."""
