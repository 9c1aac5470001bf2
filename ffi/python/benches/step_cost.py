"""What the engine plugin's progress adds to one step of a vLLM engine,
against the same step without it, in the same run.

The steps are the plugin's real wrappers (``livereg.lmcache._steps``)
around stand-ins of vLLM's step functions that do nothing (the worst case:
a real step takes milliseconds), publishing to one registration in a real
table, as in a ``VLLM::Worker`` and in ``VLLM::EngineCore``:

- the worker: ``WorkerWrapperBase.execute_model`` answering its output
  (busy, one step, idle);
- the EngineCore: ``EngineCore.step`` with a request left (busy, one step,
  still busy: the scheduler's ``has_requests()`` asked once more).

The heartbeat path is untouched (``benches/ping.py`` measures it).

Usage: python benches/step_cost.py [--quick]. Prints a Markdown table.
"""

from __future__ import annotations

import os
import platform
import sys
import timeit
from types import ModuleType
from typing import Any, Callable

import livereg
from livereg.lmcache import _steps
from livereg.lmcache._worker import WorkerLiveness


def per_call_ns(call: Callable[[], object], number: int, repeat: int) -> float:
    """The best of ``repeat`` runs of ``number`` calls, per call."""
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e9


class Scheduler:
    def has_requests(self) -> bool:
        return True


def stand_ins() -> "tuple[type, type]":
    class WorkerWrapperBase:
        def execute_model(self, scheduler_output: Any) -> Any:
            return scheduler_output

    class EngineCore:
        scheduler = Scheduler()

        def step(self) -> Any:
            return None

    return WorkerWrapperBase, EngineCore


def main() -> None:
    quick = "--quick" in sys.argv
    number, repeat = (20_000, 3) if quick else (500_000, 7)
    name = f"livereg-bench-steps-{os.getpid()}"
    table = livereg.create(name, capacity=8, reap_timeout=10.0, progress_timeout=60.0)
    try:
        liveness = WorkerLiveness(table, 1, label="bench", steps=True)
        _steps._registrations[:] = [liveness]  # a worker's
        _steps._core, _steps._core_failed = liveness, True  # the EngineCore's (registered here)
        bare_worker, bare_core = stand_ins()
        worker_class, core_class = stand_ins()
        module = ModuleType("stand_ins")
        module.WorkerWrapperBase = worker_class  # type: ignore[attr-defined]
        module.EngineCore = core_class  # type: ignore[attr-defined]
        _steps.wrap_workers(module)
        _steps.wrap_engine_core(module)
        bare_w, wrapped_w = bare_worker(), worker_class()
        bare_c, wrapped_c = bare_core(), core_class()
        rows = [
            ("worker `execute_model`", per_call_ns(lambda: bare_w.execute_model(1), number, repeat),
             per_call_ns(lambda: wrapped_w.execute_model(1), number, repeat)),
            ("EngineCore `step`", per_call_ns(bare_c.step, number, repeat),
             per_call_ns(wrapped_c.step, number, repeat)),
        ]
        liveness.close()
    finally:
        table.close()
        livereg.unlink(name)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}")
    print("| step (a stand-in doing nothing) | without the plugin ns | with it ns | added ns |")
    print("|---|---:|---:|---:|")
    for what, bare, wrapped in rows:
        print(f"| {what} | {bare:,.0f} | {wrapped:,.0f} | {wrapped - bare:,.0f} |")
    worst = max(wrapped - bare for _, bare, wrapped in rows)
    print(f"\nmost added per step: {worst:,.0f} ns ({'within' if worst <= 1000 else 'over'} 1 µs)")


if __name__ == "__main__":
    main()
