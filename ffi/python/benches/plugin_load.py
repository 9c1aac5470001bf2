"""What loading livereg's engine plugin costs in a vLLM process: in a fresh
interpreter that has imported vLLM (as its processes have when they load
their plugins), the time of ``import livereg.lmcache`` +
``livereg.lmcache.install()``, beside the baseline the plugin used to pay
at load in the same run: importing LMCache's transfer contexts.

Usage (in the environment ``ffi/python/vllm-env`` makes, with this
package's wheel installed): ``python benches/plugin_load.py [--runs N]``.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from typing import List

TIMED = """
import time, vllm, vllm.plugins
started = time.perf_counter()
{body}
print(time.perf_counter() - started)
"""
PLUGIN = "import livereg.lmcache\nlivereg.lmcache.install()\nimport sys\nassert 'lmcache' not in sys.modules"
LMCACHE = "import lmcache.v1.multiprocess.transfer_context"


def timed(body: str, runs: int) -> List[float]:
    return [float(subprocess.run([sys.executable, "-c", TIMED.format(body=body)], check=True,
                                 capture_output=True, text=True).stdout.split()[-1]) for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    plugin, lmcache = timed(PLUGIN, runs), timed(LMCACHE, runs)
    print("| in a process that imported vLLM | runs | median ms | max ms |")
    print("|---|---:|---:|---:|")
    for what, seconds in (("`import livereg.lmcache` + `install()`", plugin),
                          ("baseline: `import lmcache.v1.multiprocess.transfer_context`", lmcache)):
        print(f"| {what} | {runs} | {statistics.median(seconds) * 1e3:,.2f} | {max(seconds) * 1e3:,.2f} |")
    print(f"\nbaseline / plugin (medians): {statistics.median(lmcache) / statistics.median(plugin):,.0f}x")


if __name__ == "__main__":
    main()
