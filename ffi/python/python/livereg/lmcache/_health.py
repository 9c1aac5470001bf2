"""``GET /livereg/health`` on vLLM's OpenAI server: a ``vllm.endpoint_plugins``
entry point (named ``livereg_health``; vLLM loads an endpoint plugin only
when ``$VLLM_PLUGINS`` names it).

It answers 200 while no process of this engine is stalled, and 503 once
one is, with a JSON body naming each stalled process (pid, title), since
when, and the frame its steps hang in, until it moves again. It reads the
stall reports the engine's processes leave in their run directory
(``livereg.lmcache._stacks``): no request reaches the engine, so it answers
while the engine is hung, which vLLM's own ``/health`` does not notice.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from livereg.lmcache._stacks import engine_key, stalls

#: The route's path.
PATH = "/livereg/health"


def engine_health(key: Optional[str] = None) -> Tuple[int, Dict[str, Any]]:
    """The route's answer for engine ``key`` (default: this process's):
    ``(200, {...})`` or ``(503, {...})``."""
    key = key or engine_key()
    stalled = stalls(key)
    if stalled:
        worst = max(stalled, key=lambda stall: stall["stalled_for_seconds"])
        reason = f"{worst['process'] or 'pid ' + str(worst['pid'])} stalled"
        if worst["frame"]:
            reason += f", hung in {worst['frame']}"
        return 503, {"status": "stalled", "engine": key, "reason": reason, "stalled": stalled}
    return 200, {"status": "ok", "engine": key}


class HealthRoute:
    """The endpoint plugin (vLLM's ``EndpointPlugin`` protocol)."""

    name = "livereg_health"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        import importlib

        # vLLM's server is FastAPI's: imported from it only here.
        JSONResponse = importlib.import_module("fastapi.responses").JSONResponse
        key = engine_key()

        async def livereg_health() -> Any:
            status, body = engine_health(key)
            return JSONResponse(body, status_code=status)

        app.add_api_route(PATH, livereg_health, methods=["GET"], include_in_schema=False)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        """Nothing to keep: the route reads the stall reports."""
