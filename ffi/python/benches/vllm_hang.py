"""A real vLLM engine (PyPI's CPU build, ``vllm serve`` with LMCache's
connector) whose step hangs → LMCache's real server lets go of it, with
livereg's server module judging progress; and what stock vLLM says through
the same hang.

One ``vllm serve`` with livereg's plugins (``VLLM_PLUGINS``) and the
test-only hang hook (``tests_lmcache/hang_hook``); for each run the worker's
forward (or, with ``--core``, the EngineCore's scheduling with a request
waiting) hangs, and the bench records the seconds from the hang's first
instant (the hook's own monotonic time) to the server no longer holding the
engine (its transfer module's ``report_status()``, read every 10 ms), while
polling vLLM's own ``/health`` and livereg's ``/livereg/health``; then the
hang is released and the engine must serve again before the next run.

Stock vLLM in the same run: its ``/health`` through the hang, and the time
its executor gives up on a step (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``,
300 s by default): stated as the ratio, not waited for.

Usage (in the environment ``ffi/python/vllm-env`` makes, with this
package's wheel installed): ``python benches/vllm_hang.py [--runs N]
[--core] [--quick]``; ``--quick``: one run of each. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests_lmcache"))
from conftest import module_server  # noqa: E402
from test_vllm_hang import P, T, HungServe  # noqa: E402
from vllm_engines import make_model  # noqa: E402

#: vLLM's own bound on a step (its default ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``).
STOCK_STEP_TIMEOUT = float(os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS") or 300)


def hang_once(hung: HungServe, word: str) -> Dict[str, float]:
    """One hang: seconds to let go, and how /health and /livereg/health
    answered while it lasted."""
    completion = hung.hang(word)
    began = hung.hung_at()
    gone = hung.server.wait_gone(hung.worker_id, 120)
    stock: List[int] = []
    red: Optional[float] = None
    deadline = time.monotonic() + 10
    while red is None and time.monotonic() < deadline:
        stock.append(hung.serve.get("/health")[0])
        if hung.serve.get("/livereg/health")[0] == 503:
            red = time.monotonic()
        else:
            time.sleep(0.02)
    hung.release()
    completion.result()
    hung.server.wait_held(hung.worker_id, 60)
    return {"let_go": gone - began, "stock_ok": float(all(code == 200 for code in stock)),
            "red": (red - began) if red is not None else float("inf")}


def row(what: str, seconds: List[float]) -> str:
    return f"| {what} | {len(seconds)} | {statistics.median(seconds):.2f} | {max(seconds):.2f} | {min(seconds):.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    runs = 1 if options.quick else options.runs
    with tempfile.TemporaryDirectory(prefix="livereg-bench-hang-") as folder:
        model = make_model(Path(folder) / "model")
        with module_server("bench-hang", {"reap_timeout_seconds": T, "progress_timeout_seconds": P}) as server:
            hung = HungServe(model, server, Path(folder))
            try:
                results = {word: [hang_once(hung, word) for _ in range(runs)] for word in ("worker", "core")}
            finally:
                hung.release()
                hung.serve.close()
    bound = P + 1.25 * T + 0.5
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}; "
          f"reap timeout {T:g} s, progress timeout {P:g} s: bound {bound:g} s")
    print("| hang → LMCache's server lets go | runs | median s | max s | min s |")
    print("|---|---:|---:|---:|---:|")
    print(row("a worker's forward (GIL released)", [r["let_go"] for r in results["worker"]]))
    print(row("the EngineCore's scheduling, a request waiting", [r["let_go"] for r in results["core"]]))
    print(row("(worker) `/livereg/health` answers 503", [r["red"] for r in results["worker"]]))
    print(row("(EngineCore) `/livereg/health` answers 503", [r["red"] for r in results["core"]]))
    every = [r for rs in results.values() for r in rs]
    print(f"\nstock vLLM /health through every hang: {'200' if all(r['stock_ok'] for r in every) else 'not always 200'}")
    median = statistics.median(r["let_go"] for r in results["worker"])
    print(f"stock vLLM's executor gives up after {STOCK_STEP_TIMEOUT:g} s: {STOCK_STEP_TIMEOUT / median:,.0f}x "
          f"the livereg median ({median:.2f} s); within the bound: {median <= bound}")
    if any(r["red"] == float("inf") for r in every):
        sys.exit("/livereg/health never answered 503 through a hang")


if __name__ == "__main__":
    main()
