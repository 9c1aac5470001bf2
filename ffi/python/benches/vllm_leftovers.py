"""What a real vLLM engine (PyPI's CPU build, with LMCache's connector)
leaves in /dev/shm when it is SIGKILLed whole or exits cleanly: with
livereg's engine plugin owning what its processes make and LMCache's server
module's reaper removing it, beside stock in the same run.

Each run snapshots the engine-made names in /dev/shm (``psm_*``,
``sem.mp-*``, ``vllm_offload_*``: their count, apparent and resident
bytes), starts one engine (``tests_lmcache/vllm_engine.py``, vLLM's
three-process layout), generates once, then SIGKILLs every process of its
tree (a supervisor's kill of the group) or asks it to exit, and waits for
the last of its processes to end. With livereg, it records how long after
that end /dev/shm is back to the snapshot; stock (the engine pointed at a
table that does not exist: the plugin owns nothing), what is left 2 s
after, per run and summed over the crash-restart cycles.

Usage (in the environment ``ffi/python/vllm-env`` makes, with this
package's wheel installed): ``python benches/vllm_leftovers.py [--runs N]
[--livereg-runs N] [--exits N] [--quick]``; ``--quick``: one livereg
kill, no stock. Prints Markdown.
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
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests_lmcache"))
from conftest import module_server, unique  # noqa: E402
from vllm_engines import Engine, make_model  # noqa: E402

ENGINE_MADE = ("psm_", "sem.mp-", "vllm_offload_")
#: name -> (apparent bytes, resident bytes)
Snapshot = Dict[str, Tuple[int, int]]


def snapshot() -> Snapshot:
    found: Snapshot = {}
    for name in os.listdir("/dev/shm"):
        if name.startswith(ENGINE_MADE):
            try:
                stat = os.stat(f"/dev/shm/{name}", follow_symlinks=False)
            except FileNotFoundError:
                continue
            found[name] = (stat.st_size, stat.st_blocks * 512)
    return found


def ended(pids: List[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # A zombie has ended too.
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return False
        except FileNotFoundError:
            continue
    return True


def run_once(model: Path, port: int, table: str, clean: bool, stock: bool) -> Dict[str, float]:
    """One engine's life and end; what /dev/shm held after."""
    before = snapshot()
    engine = Engine(model, port, table, with_livereg=not stock)
    try:
        assert engine.generate()
        made = set(snapshot()) - set(before)
        pids = engine.tree()
        if clean:
            engine.ask("exit", "exited")
        else:
            engine.kill_all()
        while not ended(pids):
            time.sleep(0.001)
        last_end = time.monotonic()
        back: Optional[float] = None
        while time.monotonic() - last_end < (2.0 if stock else 5.0):
            if back is None and set(snapshot()) - set(before) == set():
                back = time.monotonic() - last_end
                if not stock:
                    break
            time.sleep(0.001)
        left = {name: size for name, size in snapshot().items() if name not in before}
        return {
            "made": float(len(made)),
            "back_s": float("nan") if back is None else back,
            "left_files": float(len(left)),
            "left_bytes": float(sum(apparent for apparent, _ in left.values())),
            "left_resident": float(sum(resident for _, resident in left.values())),
        }
    finally:
        engine.close()


def cleanup(before: Snapshot) -> None:
    """Removes what stock runs left (nothing else would)."""
    for name in set(snapshot()) - set(before):
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass


def mib(n: float) -> str:
    return f"{n / 1048576:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="kills of each engine (stock: crash-restart cycles)")
    parser.add_argument("--livereg-runs", type=int, default=3)
    parser.add_argument("--exits", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    start = snapshot()
    with tempfile.TemporaryDirectory() as folder, module_server("leftovers", {"reap_timeout_seconds": 1.0}) as server:
        model = make_model(Path(folder))
        plan = [("livereg", False, 1)] if args.quick else [
            ("livereg", False, args.livereg_runs), ("livereg", True, args.exits),
            ("stock", False, args.runs), ("stock", True, args.exits),
        ]
        results: Dict[Tuple[str, bool], List[Dict[str, float]]] = {}
        try:
            for mode, clean, runs in plan:
                table = server.table if mode == "livereg" else unique("no-such-table")
                for _ in range(runs):
                    result = run_once(model, server.port, table, clean, stock=mode == "stock")
                    results.setdefault((mode, clean), []).append(result)
                    print(mode, "exit" if clean else "kill", result, file=sys.stderr, flush=True)
        finally:
            cleanup(start)
    print(f"{platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}\n")
    print("| engine, end | runs | files made | back to the snapshot after the last process's end (median, max) "
          "| left per run (files, apparent, resident) | left after all runs |")
    print("|---|---|---|---|---|---|")
    for (mode, clean), rows in results.items():
        backs = [r["back_s"] for r in rows if r["back_s"] == r["back_s"]]
        back = (f"{statistics.median(backs) * 1000:.0f} ms, {max(backs) * 1000:.0f} ms ({len(backs)}/{len(rows)})"
                if backs else f"never (0/{len(rows)})")
        per = rows[0]
        total_files = sum(r["left_files"] for r in rows)
        print(f"| {mode}, {'exit' if clean else 'SIGKILL of the tree'} | {len(rows)} "
              f"| {statistics.median(r['made'] for r in rows):.0f} | {back} "
              f"| {per['left_files']:.0f}, {mib(per['left_bytes'])}, {mib(per['left_resident'])} "
              f"| {total_files:.0f} files, {mib(sum(r['left_bytes'] for r in rows))}, "
              f"{mib(sum(r['left_resident'] for r in rows))} |")


if __name__ == "__main__":
    main()
