"""A real vLLM engine (the CPU build) with LMCache's connector, driven from
stdin, for the integration tests.

Usage: ``vllm_engine.py MODEL_FOLDER PORT [--no-connector]``. The engine runs
in vLLM's three-process layout (this process, ``VLLM::EngineCore``,
``VLLM::Worker``), loads its general plugins by itself, and with the
connector reaches LMCache's server at ``tcp://127.0.0.1:PORT``. Prints one
JSON object per line after ``vllm-engine: `` (vLLM logs to stdout too): ``{"ready": true}`` once it can generate, then for each
line ``generate`` on stdin ``{"tokens": [...], "cached": N, "seconds": S}``
(``cached``: the prompt's tokens not computed; ``ended``: when, on the
machine's monotonic clock; or ``{"error": ...}``);
``generate fresh`` the same after emptying vLLM's own prefix cache (so
``cached`` counts what LMCache gave); ``generate long N`` prints
``{"started": true}`` then generates N tokens whatever the end token;
``modules`` prints the modules of ``lmcache`` and ``livereg`` loaded in this
process and in each worker (``{"main": [...], "workers": [[...]]}``; needs
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``); ``exit`` shuts the engine down
cleanly and prints ``{"exited": true}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

#: Over one 256-token chunk, so that the connector stores and retrieves one.
PROMPT = "The reaper scans the table and ends the registrations that went silent. " * 40


#: What starts this script's own lines on stdout (vLLM logs there too).
MARK = "vllm-engine: "


def say(record: object) -> None:
    print(MARK + json.dumps(record), flush=True)


def loaded(_worker: object = None) -> list:
    """The modules of LMCache and livereg this process has imported."""
    return sorted(name for name in sys.modules if name.split(".")[0] in ("lmcache", "livereg"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("port", type=int)
    parser.add_argument("--no-connector", action="store_true")
    options = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kv_transfer_config = None
    if not options.no_connector:
        kv_transfer_config = KVTransferConfig(
            kv_connector="LMCacheMPConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": options.port},
        )
    llm = LLM(
        model=options.model, dtype="bfloat16", max_model_len=1024, max_num_seqs=4, enforce_eager=True,
        distributed_executor_backend="mp", kv_transfer_config=kv_transfer_config, seed=0,
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    say({"ready": True})
    for line in sys.stdin:
        command = line.strip()
        if command.startswith("generate"):
            words = command.split()
            params = greedy
            if words[1:2] == ["fresh"]:
                llm.reset_prefix_cache()
            elif words[1:2] == ["long"]:
                params = SamplingParams(temperature=0.0, max_tokens=int(words[2]), ignore_eos=True)
                say({"started": True})
            try:
                started = time.monotonic()
                [output] = llm.generate([PROMPT], params, use_tqdm=False)
                ended = time.monotonic()  # CLOCK_MONOTONIC: the test's clock too
                say({"tokens": list(output.outputs[0].token_ids), "cached": output.num_cached_tokens or 0,
                     "seconds": ended - started, "ended": ended})
            except Exception as error:  # the worker was stopped or killed: said, not raised
                say({"error": repr(error)})
        elif command == "modules":
            say({"main": loaded(), "workers": llm.collective_rpc(loaded)})
        elif command == "exit":
            llm.llm_engine.engine_core.shutdown()
            say({"exited": True})
            return


if __name__ == "__main__":
    main()
