"""Runs LMCache's own multiprocess server (``run_cache_server``, on CPU) for
the integration tests, and reports on stdout, one JSON object a line:

- ``{"ready": true, "pid": ...}`` once it serves;
- ``{"t": MONOTONIC, "ids": [...]}`` each time the set of instance ids its
  transfer modules hold changes (read from the server's own
  ``report_status()`` every 10 ms);
- ``{"cleared": FORCED}`` (until 0.5.2 every clear forced) or ``{"error": "..."}`` for each ``clear 0|1`` line
  read on stdin, ``{"status": {...}}`` for each ``status`` line.

Usage: ``lmcache_server.py [--swap] -- LMCACHE_SERVER_ARGS...``; ``--swap``
builds the server with ``livereg.lmcache.LiveregManagement`` in place of its
``ManagementModule`` (the module swap).
"""

from __future__ import annotations

import inspect
import json
import sys
import threading
import time
from typing import Any, List


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields, default=str) + "\n")
    sys.stdout.flush()


def registered(status: Any) -> List[int]:
    ids = set(status.get("registered_gpu_ids", ())) | set(status.get("registered_non_cuda_instance_ids", ()))
    return sorted(int(i) for i in ids)


def watch(engine: Any) -> None:
    last: Any = None
    while True:
        ids = registered(engine.report_status())
        if ids != last:
            emit(t=time.monotonic(), ids=ids)
            last = ids
        time.sleep(0.01)


def main() -> None:
    argv = sys.argv[1:]
    swap = "--swap" in argv[: argv.index("--")] if "--" in argv else False
    lmcache_args = argv[argv.index("--") + 1:] if "--" in argv else argv
    from lmcache.v1.multiprocess import server

    if swap:
        from livereg.lmcache import LiveregManagement

        server.ManagementModule = LiveregManagement  # type: ignore[misc]
    sys.argv = ["lmcache-server", *lmcache_args]
    args = server.parse_args()
    configs = dict(
        mp_config=server.parse_args_to_mp_server_config(args),
        storage_manager_config=server.parse_args_to_config(args),
        obs_config=server.parse_args_to_observability_config(args),
    )
    if hasattr(server, "parse_args_to_coordinator_config"):
        configs["coordinator_config"] = server.parse_args_to_coordinator_config(args)
    started = server.run_cache_server(**configs, return_engine=True, start_prometheus_http_server=False)
    assert started is not None
    _, engine = started
    threading.Thread(target=watch, args=(engine,), daemon=True).start()
    import os

    emit(ready=True, pid=os.getpid())
    for line in sys.stdin:
        command = line.split()
        try:
            if command[:1] == ["clear"]:
                force = command[1] == "1"
                if "force" in inspect.signature(engine.clear).parameters:
                    engine.clear(force=force)
                else:  # until 0.5.2: every clear forced
                    engine.clear()
                    force = True
                emit(cleared=force)
            elif command[:1] == ["status"]:
                emit(status=engine.report_status())
        except Exception as error:  # reported to the test, which judges it
            emit(error=f"{type(error).__name__}: {error}")
    threading.Event().wait()  # stdin closed: serve until killed


if __name__ == "__main__":
    main()
