"""livereg as a module of LMCache's multiprocess server, through its plugin
point (0.5.6 and later)::

    python -m lmcache.v1.multiprocess.server ... \\
        --server-module '{"module_path": "livereg.lmcache", "config": {"reap_timeout_seconds": 5}}'

LMCache calls :func:`build_server_modules` with the modules it built; the
module returned owns the livereg table's reaper (and, with ``listen``, a
listener for engines in isolated containers) and drives the built-in liveness
targets from livereg's verdicts. LMCache's own ``ManagementModule`` stays as
it is: engines that only PING keep its rules.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import livereg
from livereg.lmcache._common import CORE_LABEL, default_table, logger, read_token_file
from livereg.lmcache._served_table import ServedTable
from livereg.lmcache._targets import TargetDriver, is_liveness_target, live_registrations

#: livereg's hang budget when the config names none, in seconds. Beats cost
#: nothing, so it need not respect LMCache's 30 s floor for its 10 s pings.
DEFAULT_REAP_TIMEOUT = 10.0
#: How long a busy engine may go without completing a step before it is let
#: go (``STALLED``), when the config names none, in seconds: a real step
#: takes milliseconds to seconds, and the slowest legitimate one (a long
#: prefill chunk, a first compile of a new shape on a cold cache) well under
#: a minute; vLLM itself waits 300 s for a step's answer before it dies.
DEFAULT_PROGRESS_TIMEOUT = 60.0
#: Table slots when the config names none.
DEFAULT_CAPACITY = 256

_CONFIG_KEYS = (
    "table", "reap_timeout_seconds", "progress_timeout_seconds", "capacity", "listen", "token_file", "tls_cert", "tls_key", "tls_client_ca",
)


class LiveregServerModule:
    """An LMCache server module on a livereg table.

    ``ctx`` is the server context (only its ``chunk_size`` is read, and
    published in the table's info area when it is an int); ``targets`` the
    liveness targets to drive. ``config`` takes, each optional:

    - ``table``: the table's name (default ``$LIVEREG_LMCACHE_TABLE``, else
      ``lmcache-workers``);
    - ``reap_timeout_seconds``: livereg's hang budget (default 10): an engine
      whose beats stop that long is freed; a dead one at once;
    - ``progress_timeout_seconds``: how long an engine with work in flight
      may go without completing a step (default 60; 0 turns it off): past
      it, it ends ``STALLED`` and is freed, however it beats (the engine
      plugin publishes vLLM's steps);
    - ``capacity``: table slots (default 256);
    - ``listen``: one address or a list (``unix:/PATH``, ``tcp://HOST:PORT``,
      ``tls://HOST:PORT``) where engines in isolated containers register
      (default none);
    - ``token_file``: the file holding the listener's token (required for
      ``tcp://``);
    - ``tls_cert``, ``tls_key`` (and ``tls_client_ca`` to require client
      certificates): the listener's certificate for ``tls://``.

    An existing table with other settings is reused or replaced (see the
    log); one held by another live reaper raises :class:`livereg.BusyError`.
    """

    def __init__(self, ctx: Any, targets: Sequence[Any] = (), config: Optional[Mapping[str, Any]] = None) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - set(_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"livereg server module: unknown config key(s) {unknown}; expected some of {list(_CONFIG_KEYS)}")
        timeout = float(config.get("reap_timeout_seconds", DEFAULT_REAP_TIMEOUT))
        if timeout <= 0:
            raise ValueError(f"livereg server module: reap_timeout_seconds must be > 0, got {timeout}")
        progress_timeout = float(config.get("progress_timeout_seconds", DEFAULT_PROGRESS_TIMEOUT))
        if progress_timeout < 0 or (0 < progress_timeout < timeout / 4):
            raise ValueError(
                "livereg server module: progress_timeout_seconds must be 0 (off) or at least a scan "
                f"(reap_timeout_seconds / 4 = {timeout / 4:g}), got {progress_timeout:g}"
            )
        listen = config.get("listen") or []
        listen = [listen] if isinstance(listen, str) else list(listen)
        self._ctx = ctx
        self._driver = TargetDriver(targets)
        self._timeout = timeout
        token = read_token_file(config.get("token_file"))
        self._served = ServedTable(
            ctx, str(config.get("table") or default_table()), int(config.get("capacity", DEFAULT_CAPACITY)), timeout,
            timeout, progress_timeout,
        )
        self._table = self._served.table
        #: Engines whose process began to exit, by instance id: when it was
        #: seen (their state is freed once they have ended).
        self._dying: Dict[int, float] = {}
        self._served.start_reaper(
            self._ended,
            on_dying=self._dying_now,
            listen=listen,
            token=token,
            tls_cert=config.get("tls_cert"),
            tls_key=config.get("tls_key"),
            tls_client_ca=config.get("tls_client_ca"),
        )
        self._served.repeat(self._touch_live, self._table.reap_timeout / 4, "touching live engines", "livereg-lmcache-touch")
        logger.info(
            "livereg: table '%s', reap timeout %.3gs, progress timeout %s, %d liveness target(s)%s",
            self._table.name, self._table.reap_timeout,
            f"{self._table.progress_timeout:.3g}s" if self._table.progress_timeout else "off", len(self._driver.targets),
            f", listening on {', '.join(listen)}" if listen else "",
        )

    @property
    def context(self) -> Any:
        """The server context (LMCache's module protocol)."""
        return self._ctx

    @property
    def table(self) -> livereg.Table:
        """The livereg table (for engines' names, status, tests)."""
        return self._table

    def _dying_now(self, event: livereg.DropEvent) -> None:
        """The reaper's dying handler: the engine's process began to exit.
        Nothing is freed yet (see docs/lmcache.md, "Dying, then ended"):
        what LMCache's ``unregister_kv_cache`` frees may still be written by
        the dying engine's device or a system call in flight until the
        process has ended; the engine is said dying at once."""
        self._dying[event.instance_id] = time.monotonic()
        logger.warning(
            "livereg: %s (instance %d, pid %d) dying: its process began to exit; its state is freed once it has ended",
            event.label or "an engine", event.instance_id, event.pid,
        )

    def _ended(self, event: livereg.DropEvent) -> None:
        """The reaper's drop handler: the engine crashed, hung, deregistered
        or was reset; every target frees it now. (A vLLM EngineCore's own
        registration holds nothing here: its workers let go themselves.)"""
        if event.reason == livereg.Reason.STALLED:
            logger.warning(
                "livereg: %s (instance %d, pid %d) stalled: busy with no step for %.1fs; its state is let go",
                event.label or "an engine", event.instance_id, event.pid, event.silent_ns / 1e9,
            )
        self._dying.pop(event.instance_id, None)
        if event.label.startswith(CORE_LABEL):
            return
        self._driver.free(event.instance_id, (event.slot, event.generation))

    def _touch_live(self) -> None:
        self._driver.touch(live_registrations(self._table))

    def report_status(self) -> Dict[str, Any]:
        """``{"livereg": {...}}``: the table, its timeout, live and ended
        registrations, the reaper's health and calls into targets that
        raised."""
        stats = self._table.stats()
        return {
            "livereg": {
                "table": self._table.name,
                "reap_timeout_seconds": self._table.reap_timeout,
                "progress_timeout_seconds": self._table.progress_timeout,
                "tracked_instances": stats["tracked_instances"],
                "dying": sorted(self._dying),
                "reaper_alive": stats["reaper_alive"],
                "ended": stats["ended"],
                "handler_failures": stats["handler_failures"],
                "target_failures": self._driver.failures,
            }
        }

    def close(self) -> None:
        """Stops the reaper (and listener) and the touching; the table stays
        for the engines and the next server."""
        if self._served.stop():
            self._served.close()


def build_server_modules(context: Any) -> List[LiveregServerModule]:
    """LMCache's server-module factory: one :class:`LiveregServerModule`
    driving every liveness target among the modules LMCache built
    (``context.modules``), configured by ``context.config``."""
    targets = [module for module in context.modules if is_liveness_target(module)]
    return [LiveregServerModule(context.server_context, targets, context.config)]
