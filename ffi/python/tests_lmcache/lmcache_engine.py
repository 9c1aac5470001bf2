"""An engine worker built from LMCache's own worker code, on CPU:
``create_transfer_context(kv_caches, instance_id=..., req_client=...,
mode=...)`` and the context's ``register(...)``, as every adapter does.

Usage: ``lmcache_engine.py PORT INSTANCE_ID MODE [--install] [--ping SECONDS]``.
``--install`` calls ``livereg.lmcache.install()`` first (what vLLM's plugin
loading does); ``--ping`` PINGs the server every SECONDS as LMCache's
heartbeat thread does (else it never pings, as an idle vLLM engine).
Prints ``registered`` once the server acknowledged, then waits; on a line
``unregister`` on stdin, unregisters and closes the context and prints
``unregistered``.
"""

from __future__ import annotations

import argparse
import sys
import threading


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port")
    parser.add_argument("instance_id", type=int)
    parser.add_argument("mode", choices=["engine_driven", "lmcache_driven"])
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--ping", type=float)
    options = parser.parse_args()
    if options.install:
        import livereg.lmcache

        livereg.lmcache.install()
    import torch
    from lmcache.utils import EngineType
    from lmcache.v1.multiprocess.group_view import EngineGroupInfo
    from lmcache.v1.multiprocess.transfer_context import create_transfer_context
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

    client = RequestClientFactory.create(f"tcp://127.0.0.1:{options.port}")
    # vLLM's paged layout: per layer [2, blocks, block size, heads, head size].
    kv_caches = {f"model.layers.{i}.self_attn": torch.zeros(2, 16, 16, 2, 8) for i in range(2)}
    context = create_transfer_context(
        kv_caches, instance_id=options.instance_id, req_client=client, mode=options.mode
    )
    context.register(
        kv_caches, "livereg-test-model", 1, 16, 20.0,
        layout_hints={"kv_layout": "NHD"},
        engine_group_infos=[EngineGroupInfo(engine_group_id=0, layer_indices=(0, 1), tokens_per_block=16)],
        engine_type=EngineType.VLLM,
    )
    print("registered", flush=True)
    if options.ping:
        stop = threading.Event()

        def ping() -> None:
            while not stop.wait(options.ping):
                try:
                    client.ping(options.instance_id).result(timeout=10)
                except Exception as error:  # the server restarting: the next ping tries again
                    print(f"ping failed: {error}", file=sys.stderr, flush=True)

        threading.Thread(target=ping, daemon=True).start()
    for line in sys.stdin:
        if line.strip() == "unregister":
            future = context.unregister()
            if future is not None:
                future.result(timeout=20)
            context.close()
            print("unregistered", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
