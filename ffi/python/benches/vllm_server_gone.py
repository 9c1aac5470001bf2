"""SIGKILL of LMCache's real 0.5.6 server (the one running livereg's server
module, so the table's reaper) under a real vLLM engine (PyPI's CPU build,
a tiny Llama, LMCache's connector), a server restarted on the same port
2 s after the kill: the stock engine (vLLM without livereg's plugin,
``VLLM_PLUGINS=not-livereg``) beside the engine with livereg's plugin, in
the same run, on the same setup.

Each run starts one server (livereg's module, timeout 1 s, on a table of
its own) and one engine on it, generates until LMCache gives the prompt
back (``generate fresh``: vLLM's own prefix cache emptied first), times a
few more such generations (the server-up baseline), then SIGKILLs every
process of the server and, from that instant:

1. **the engine knows**: livereg's ``... is gone: ...`` log line (the first
   one, either process), stock LMCache's ``entering degraded mode`` line;
   watched every 5 ms on the engine's log (its pipe included), up to a bound;
2. **the next generation** (asked right after the kill): its time beside
   the server-up median (ratio), whether its tokens are the baseline's;
   waited for up to a bound (a stock LOOKUP can wait 300 s);
3. **a server restarted 2 s after the kill** (while 2. may still wait):
   from the new server said ready to it holding a KV cache registration
   (its ``report_status()`` read every 10 ms), up to a bound; livereg's
   ``a new LMCache server ... serves`` line beside it.

Everything the bound cut is printed as ``> N s`` / ``not within N s``.

Usage (in the environment ``ffi/python/vllm-env`` makes, with this
package's wheel installed): ``python benches/vllm_server_gone.py [--runs N]
[--quick]``; default 3 runs of each engine, bounds 60 s; ``--quick``: one
run of each, bounds 30 s (a few minutes in all); ``--no-restart``: no
server started again (3. not measured; what 1. and 2. are when nothing
answers on the port). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests_lmcache"))
from conftest import Server, free_port, unique  # noqa: E402
from vllm_engines import Engine, make_model  # noqa: E402

import livereg  # noqa: E402

LIVEREG_TIMEOUT = 1.0
#: Over one 256-token chunk: what LMCache gives a prompt it holds.
CHUNK = 256
RESTART_AFTER = 2.0
GONE = {True: "is gone: ", False: "entering degraded mode"}
BACK = {True: "a new LMCache server", False: "Finished re-registering KV caches"}


class FirstSaid:
    """When (monotonic) the engine's log first held ``words``, watched
    every 5 ms from a thread for up to ``bound`` seconds."""

    def __init__(self, engine: Engine, words: str, bound: float) -> None:
        self.at: Optional[float] = None
        self._bound = bound
        self._thread = threading.Thread(target=self._watch, args=(engine, words), daemon=True)
        self._thread.start()

    def _watch(self, engine: Engine, words: str) -> None:
        deadline = time.monotonic() + self._bound
        while time.monotonic() < deadline:
            if engine.lines(words):
                self.at = time.monotonic()
                return
            time.sleep(0.005)

    def after(self, start: float) -> Optional[float]:
        self._thread.join(self._bound + 1)
        return None if self.at is None else self.at - start


def fresh(engine: Engine, timeout: float = 240.0) -> Optional[Dict[str, Any]]:
    """One generation with vLLM's prefix cache emptied; None past ``timeout``."""
    try:
        return engine.ask("generate fresh", "tokens", timeout=timeout)
    except AssertionError:
        return None


def held(server: Server) -> List[int]:
    with server.changed:
        return list(server.changes[-1]["ids"]) if server.changes else []


def first_held_at(server: Server) -> float:
    with server.changed:
        return float(next(c["t"] for c in server.changes if c["ids"]))


def one_run(model: Path, with_livereg: bool, bound: float, baseline_runs: int, restart_server: bool = True
            ) -> Dict[str, Any]:
    table = unique("gone")
    port = free_port()
    config = {"table": table, "reap_timeout_seconds": LIVEREG_TIMEOUT}
    servers = [Server(port, table, module=config)]
    engine: Optional[Engine] = None
    try:
        env = {} if with_livereg else {"VLLM_PLUGINS": "not-livereg"}
        engine = Engine(model, port, table, env=env, with_livereg=with_livereg)
        first = fresh(engine)
        assert first is not None, "no first generation"
        tokens = first["tokens"]
        deadline = time.monotonic() + 120
        while True:  # LMCache's store of the first lands asynchronously
            answer = fresh(engine)
            assert answer is not None and answer["tokens"] == tokens, answer
            if answer["cached"] >= CHUNK:
                break
            assert time.monotonic() < deadline, f"LMCache never gave the prompt back: {answer}"
            time.sleep(0.5)
        up = [answer["seconds"]]
        for _ in range(baseline_runs - 1):
            again = fresh(engine)
            assert again is not None and again["tokens"] == tokens, again
            up.append(again["seconds"])

        gone_said = FirstSaid(engine, GONE[with_livereg], bound)
        restarted: Dict[str, Any] = {}

        def restart() -> None:
            if not restart_server:
                return
            time.sleep(max(0.0, killed_at + RESTART_AFTER - time.monotonic()))
            restarted["back_said"] = FirstSaid(engine, BACK[with_livereg], bound + 5)
            restarted["started"] = time.monotonic()
            second = Server(port, table, module=config)
            restarted["ready"] = time.monotonic()
            servers.append(second)
            try:
                second.wait_for(lambda: bool(held(second)), bound, "a KV cache registration")
                restarted["held"] = first_held_at(second)
            except AssertionError:
                pass

        killed_at = time.monotonic()
        servers[0].kill()  # SIGKILL of the server's tree: nothing said, nothing unregistered
        restarter = threading.Thread(target=restart)
        restarter.start()
        after = fresh(engine, timeout=bound)
        after_done = time.monotonic() - killed_at
        restarter.join()
        result: Dict[str, Any] = {
            "up": statistics.median(up),
            "knows": gone_said.after(killed_at),
            "after": None if after is None else after["seconds"],
            "after_from_kill": None if after is None else after_done,
            "same": None if after is None else after["tokens"] == tokens,
            "after_cached": None if after is None else after["cached"],
        }
        if restart_server:
            result["ready"] = restarted["ready"] - restarted["started"]
            result["registered"] = restarted["held"] - restarted["ready"] if "held" in restarted else None
            result["back_said"] = restarted["back_said"].after(restarted["ready"])
        if with_livereg:
            result["lines"] = engine.lines(GONE[True]) + engine.lines(BACK[True])
        else:
            result["lines"] = engine.lines(GONE[False]) + engine.lines(BACK[False])
        return result
    finally:
        if engine is not None:
            if all(each._ended for each in servers):
                engine.with_livereg = False  # no reaper left: removed here
            engine.close()
        for each in servers:
            each.kill()
        try:
            livereg.unlink(table)
        except livereg.NotFoundError:
            pass


def seconds(values: List[Optional[float]], bound: float, unit: str = "s") -> str:
    """Median, min–max of what was measured; what the bound cut, said."""
    got = [v for v in values if v is not None]
    cut = len(values) - len(got)
    if not got:
        return f"not within {bound:g} s ({cut}/{len(values)})"
    scale = 1000.0 if unit == "ms" else 1.0
    fmt = (lambda v: f"{v * scale:,.0f}") if unit == "ms" else (lambda v: f"{v:.2f}")
    text = f"{fmt(statistics.median(got))} {unit}"
    if len(got) > 1:
        text += f" ({fmt(min(got))}–{fmt(max(got))})"
    if cut:
        text += f"; {cut}/{len(values)} not within {bound:g} s"
    return text


def report(results: Dict[bool, List[Dict[str, Any]]], bound: float) -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}")
    runs = {k: len(v) for k, v in results.items()}
    print(f"runs: stock {runs.get(False, 0)}, livereg {runs.get(True, 0)}; bounds {bound:g} s\n")
    print("| SIGKILL of LMCache's server → | stock (no livereg plugin) | with livereg's plugin |")
    print("|---|---|---|")

    def both(what: str, render: Any) -> None:
        print(f"| {what} | {render(results.get(False, []))} | {render(results.get(True, []))} |")

    both("generation, server up (median of each run's median)",
         lambda rs: seconds([r["up"] for r in rs], bound) if rs else "-")
    both("the engine knows (its log line)", lambda rs: seconds([r["knows"] for r in rs], bound, "ms"))
    both("next generation: its time", lambda rs: seconds([r["after"] for r in rs], bound))
    both("next generation: done after the kill", lambda rs: seconds([r["after_from_kill"] for r in rs], bound))

    def ratio(rs: List[Dict[str, Any]]) -> str:
        got = [r["after"] / r["up"] for r in rs if r["after"] is not None]
        if not got:
            return f"> {bound / statistics.median(r['up'] for r in rs):,.0f}x (cut at {bound:g} s)"
        text = ", ".join(f"{x:.1f}x" for x in got)
        cut = len(rs) - len(got)
        return text + (f"; {cut} cut at {bound:g} s" if cut else "")

    both("next generation / server up", ratio)
    both("next generation: same tokens",
         lambda rs: ", ".join("cut" if r["same"] is None else ("yes" if r["same"] else "NO") for r in rs))
    if not all("ready" in r for rs in results.values() for r in rs):
        print("\n(no server restarted: --no-restart)")
        report_runs(results)
        return
    both("restarted 2 s after: new server ready after its start", lambda rs: seconds([r["ready"] for r in rs], bound))
    both("… KV caches registered with it after it said ready",
         lambda rs: seconds([r["registered"] for r in rs], bound))
    both("… the engine's log says so after it said ready", lambda rs: seconds([r["back_said"] for r in rs], bound + 5))
    report_runs(results)


def report_runs(results: Dict[bool, List[Dict[str, Any]]]) -> None:
    for with_livereg, rs in sorted(results.items()):
        for i, r in enumerate(rs):
            print(f"\n{'livereg' if with_livereg else 'stock'} run {i + 1}: " + repr(
                {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "lines"}))
            for line in r["lines"]:
                print("   ", line.strip()[-200:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-restart", action="store_true", help="no server restarted after the kill")
    options = parser.parse_args()
    runs, bound, baseline_runs = (1, 30.0, 3) if options.quick else (options.runs, 60.0, 5)
    results: Dict[bool, List[Dict[str, Any]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="livereg-bench-model-") as folder:
        model = make_model(Path(folder))
        for _ in range(runs):
            for with_livereg in (False, True):
                results[with_livereg].append(one_run(model, with_livereg, bound, baseline_runs,
                                                        restart_server=not options.no_restart))
                print(f"{'livereg' if with_livereg else 'stock'} run done", file=sys.stderr, flush=True)
    report(results, bound)


if __name__ == "__main__":
    main()
