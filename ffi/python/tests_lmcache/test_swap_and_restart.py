"""The server restarted under a live engine, and the module swap
(``LiveregManagement`` in place of LMCache's ``ManagementModule``) in the
real 0.5.6 server and in 0.5.2's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import List

from conftest import LMCACHE_052, Engine, Server, free_port

T = 1.0


def test_a_restarted_server_gets_the_live_engines_kv_cache_again(table_name: str, engines: List[Engine]) -> None:
    port = free_port()
    config = {"table": table_name, "reap_timeout_seconds": T}
    first = Server(port, table_name, module=config)
    try:
        engine = Engine(first, 300, mode="lmcache_driven")
        engines.append(engine)
    finally:
        first.kill()  # a crash: nothing unregistered
    second = Server(port, table_name, module=config)
    try:
        ready = time.monotonic()
        back_after = second.wait_held(300, 15) - ready
        assert back_after < 10, f"registered again {back_after:.1f}s after the new server served"
        killed_at = engine.signal(signal.SIGKILL)
        assert second.wait_gone(300, 10) - killed_at < 0.5
    finally:
        for started in engines:
            started.kill()  # ended while the reaper runs
        second.kill()


def test_the_swap_in_0_5_6_serves_lmcaches_requests_and_frees_a_killed_engine_at_once(
    table_name: str, engines: List[Engine]
) -> None:
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

    server = Server(free_port(), table_name, swap=True, timeout=30.0)
    try:
        client = RequestClientFactory.create(f"tcp://127.0.0.1:{server.port}")
        try:
            assert client.ping(None).result(timeout=20) is True
            assert client.noop().result(timeout=20) == "OK"
            assert client.get_chunk_size().result(timeout=20) == 256
            assert client.get_experimental().result(timeout=20) == []
            assert client.clear(False).result(timeout=20) is None
        finally:
            client.close()
        assert server.ask("clear 1") == {"cleared": True}
        status = server.ask("status")["status"]
        assert status["worker_liveness"]["table"] == table_name
        engine = Engine(server, 310, mode="engine_driven")
        engines.append(engine)
        killed_at = engine.signal(signal.SIGKILL)
        assert server.wait_gone(310, 10) - killed_at < 0.5
    finally:
        for started in engines:
            started.kill()  # ended while the reaper runs
        server.kill()


def test_the_swap_in_0_5_2_starts_and_answers_its_requests(table_name: str) -> None:
    assert LMCACHE_052, "LIVEREG_LMCACHE_052_PATH must name an unpacked lmcache 0.5.2 (ffi/python/test-lmcache sets it)"
    server = Server(free_port(), table_name, swap=True, timeout=30.0, python_path=LMCACHE_052)
    try:
        # 0.5.2's own message-queue client, in a process that imports 0.5.2.
        script = f"""
import zmq
from lmcache.v1.multiprocess.mq import MessageQueueClient
from lmcache.v1.multiprocess.protocols.base import RequestType
from lmcache.v1.multiprocess.protocol import get_response_class
client = MessageQueueClient("tcp://127.0.0.1:{server.port}", zmq.Context())
def ask(kind, *payloads):
    return client.submit_request(kind, list(payloads), get_response_class(kind)).result(timeout=20)
print(ask(RequestType.PING, 7), ask(RequestType.NOOP), ask(RequestType.GET_CHUNK_SIZE), ask(RequestType.CLEAR))
client.close()
"""
        answered = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": LMCACHE_052},
                                  capture_output=True, text=True, timeout=120)
        assert answered.stdout.split() == ["True", "OK", "256", "None"], answered.stderr[-2000:]
        assert server.ask("clear 1") == {"cleared": True}
    finally:
        server.kill()
