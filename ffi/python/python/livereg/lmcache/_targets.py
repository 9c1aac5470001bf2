"""Driving an LMCache server's liveness targets from livereg's verdicts.

The targets are the modules the server builds for its reaper: the transfer
modules (LMCache-driven and engine-driven), ``KVEventModule``,
``QStoreModule`` when enabled, Blend's mirror, and any duck-typed module with
``drop_instance_state``. Only methods their released classes have are used:

- **freeing at once**, when livereg ends a registration: the first of
  ``evict_instance`` (the one-method extension livereg proposes),
  ``unregister_kv_cache`` (both transfer modules: the same release as their
  own reap) and ``unregister_q_cache`` (``QStoreModule``) that the target
  has, when it holds the instance; then every target's
  ``drop_instance_state`` (a KV-event subscription closes, Blend drops its
  state), once per ended registration;
- **keeping alive**: ``touch_instance`` for every live registration, so an
  idle but live engine is never reaped by a target's own silence rule.

A registration that ended is never touched again: the touch pass and the
freeing are serialised, and a touch pass skips a registration that ended
after its snapshot.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from livereg.lmcache._common import CORE_LABEL, logger

#: Methods that free an instance's state on a target at once, in the order
#: tried; a target is given the first it has.
FREE_AT_ONCE = ("evict_instance", "unregister_kv_cache", "unregister_q_cache")
#: What LMCache's server requires of a liveness target.
LIVENESS_METHODS = ("touch_instance", "reap_stale_instances", "tracked_instance_count", "drop_instance_state")

#: A registration: (slot, generation).
Registration = Tuple[int, int]


def is_liveness_target(module: object) -> bool:
    """Whether ``module`` has every method of LMCache's liveness targets."""
    return all(callable(getattr(module, name, None)) for name in LIVENESS_METHODS)


def _holds(target: Any, instance_id: int) -> bool:
    """Whether ``target`` holds state for ``instance_id``, as far as its
    public methods tell (True when they cannot tell): asking first keeps a
    target that never saw the instance from logging that it has nothing."""
    snapshot = getattr(target, "context_entries_snapshot", None)
    if callable(snapshot):
        return instance_id in snapshot()
    report = getattr(target, "report_status", None)
    if callable(report):
        ids = report().get("registered_non_cuda_instance_ids")
        if ids is not None:
            return instance_id in ids
    return True


class TargetDriver:
    """Frees and keeps alive instances on ``targets`` as livereg says."""

    def __init__(self, targets: Sequence[Any]) -> None:
        for target in targets:
            if not callable(getattr(target, "drop_instance_state", None)):
                raise TypeError(f"liveness target {target!r} has no drop_instance_state(instance_id)")
        self.targets = tuple(targets)
        # Serialises touch passes and frees, so no touch follows a free.
        self._drive = threading.Lock()
        self._counters = threading.Lock()
        self._failures = 0
        # Per slot, the newest generation that ended: a touch pass skips
        # snapshots older than that (bounded by the table's capacity).
        self._ended: Dict[int, int] = {}

    @property
    def failures(self) -> int:
        """Calls into targets that raised (each logged)."""
        with self._counters:
            return self._failures

    def call(self, target: Any, method: str, *args: Any) -> Any:
        """``target.method(*args)`` if the target has it; a raise is logged
        and counted, never passed on."""
        function = getattr(target, method, None)
        if function is None:
            return None
        try:
            return function(*args)
        except Exception:
            with self._counters:
                self._failures += 1
            logger.exception("%s(%s) of %r raised; the other targets still run",
                             method, ", ".join(map(repr, args)), target)
            return None

    def free(self, instance_id: int, registration: Optional[Registration], targets: Iterable[int] = ()) -> None:
        """livereg ended ``registration`` of ``instance_id``: frees it at
        once on every target that holds it, then calls ``drop_instance_state``
        on each target in ``targets`` (indexes; all when empty)."""
        indexes = list(targets) or list(range(len(self.targets)))
        with self._drive:
            if registration is not None:
                slot, generation = registration
                self._ended[slot] = max(generation, self._ended.get(slot, -1))
            for index in indexes:
                target = self.targets[index]
                method = next((name for name in FREE_AT_ONCE if callable(getattr(target, name, None))), None)
                if method is not None and self._holds(target, instance_id):
                    self.call(target, method, instance_id)
            for index in indexes:
                self.call(self.targets[index], "drop_instance_state", instance_id)

    def _holds(self, target: Any, instance_id: int) -> bool:
        try:
            return _holds(target, instance_id)
        except Exception:
            logger.debug("could not ask %r whether it holds %d; freeing anyway", target, instance_id, exc_info=True)
            return True

    def drop(self, instance_id: int, targets: Iterable[int]) -> None:
        """``drop_instance_state`` on each target in ``targets`` (a target's
        own reap returned the id: it freed it already)."""
        with self._drive:
            for index in targets:
                self.call(self.targets[index], "drop_instance_state", instance_id)

    def touch(self, live: Dict[int, Registration]) -> None:
        """Touches every registration in ``live`` (instance id → slot and
        generation, a snapshot of the table) on every target, but those that
        ended since the snapshot."""
        with self._drive:
            current = [
                instance_id
                for instance_id, (slot, generation) in live.items()
                if self._ended.get(slot, -1) < generation
            ]
            for target in self.targets:
                for instance_id in current:
                    self.call(target, "touch_instance", instance_id)

    def reap(self, timeout: float, grace: float) -> List[int]:
        """Every target's own ``reap_stale_instances(timeout, grace)``; the
        ids they returned, each once, in order."""
        reaped: List[int] = []
        for target in self.targets:
            ids = self.call(target, "reap_stale_instances", timeout, grace)
            reaped.extend(ids or ())
        return list(dict.fromkeys(reaped))

    def tracked(self) -> int:
        """The targets' ``tracked_instance_count`` summed."""
        return sum(int(self.call(target, "tracked_instance_count") or 0) for target in self.targets)


def live_registrations(table: Any) -> Dict[int, Registration]:
    """Live registrations of ``table`` that hold state in the server:
    instance id → (slot, generation)."""
    return {
        r.instance_id: (r.slot, r.generation)
        for r in table.status().registrations
        if r.state == "live" and not r.label.startswith(CORE_LABEL)
    }
