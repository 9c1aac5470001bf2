"""A real vLLM engine (PyPI's CPU build, a tiny Llama) whose LMCache server
(with livereg's server module: the server runs the table's reaper) is
SIGKILLed while the engine serves: the engine's next generation runs
without waiting on it (LMCache's adapters degraded at once: stock LMCache
waits for a LOOKUP's answer up to ``mq_timeout``, 300 s), and a server
restarted 2 s later gets the engine's KV caches again and serves its cache.

The six-minute test (the engine alive past vLLM's 300 s executor timeout,
with a generation in flight at the kill) runs only with
``LIVEREG_LONG_TESTS=1``: it is the budget of a whole CI job by itself.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from conftest import Server, free_port
from vllm_engine import PROMPT
from vllm_engines import Engine, Serve, make_model

import livereg

T = 1.0  # livereg's reap timeout here
#: Over one 256-token chunk: what LMCache gives a prompt it holds.
CHUNK = 256
#: Generous bounds for a loaded 2-core machine (the figures are printed).
NO_WAIT = 60.0


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-llama"))


def fresh(engine: Engine) -> Dict[str, Any]:
    """A generation with vLLM's own prefix cache emptied first: its
    ``cached`` tokens are LMCache's."""
    return engine.ask("generate fresh", "tokens", timeout=240)


def cached_after_store(engine: Engine, tokens: List[int], timeout: float = 120.0) -> Dict[str, Any]:
    """Generations until LMCache gives the prompt (its store of the first
    lands asynchronously), each with ``tokens``."""
    deadline = time.monotonic() + timeout
    while True:
        answer = fresh(engine)
        assert answer["tokens"] == tokens, "a generation gave other tokens"
        if answer["cached"] >= CHUNK:
            return answer
        assert time.monotonic() < deadline, f"LMCache never gave the prompt back within {timeout}s: {answer}"
        time.sleep(0.5)


def instance_of(table: str, pid: int) -> int:
    with livereg.open(table) as opened:
        found = [r.instance_id for r in opened.status().registrations if r.pid == pid and r.state == "live"]
    assert len(found) == 1, f"process {pid} holds {len(found)} live registrations in '{table}'"
    return found[0]


def said(engine: Engine, words: str) -> List[str]:
    return engine.lines(words)


class FirstSaid:
    """When (monotonic) the engine's log first held ``words``, watched from
    a thread (an upper bound: the log's pipe and this poll add to it)."""

    def __init__(self, engine: Engine, words: str) -> None:
        self.at: Optional[float] = None
        self._thread = threading.Thread(target=self._watch, args=(engine, words), daemon=True)
        self._thread.start()

    def _watch(self, engine: Engine, words: str) -> None:
        deadline = time.monotonic() + NO_WAIT
        while time.monotonic() < deadline:
            if engine.lines(words):
                self.at = time.monotonic()
                return
            time.sleep(0.005)

    def after(self, start: float) -> float:
        self._thread.join(NO_WAIT + 1)
        assert self.at is not None, "the engine never said it"
        return self.at - start


@pytest.fixture
def started(model: Path, table_name: str) -> Iterator[Dict[str, Any]]:
    """A server (livereg's module) and an engine on it; all ended after."""
    port = free_port()
    config = {"table": table_name, "reap_timeout_seconds": T}
    made: Dict[str, Any] = {"port": port, "config": config, "servers": []}
    server = Server(port, table_name, module=config)
    made["servers"].append(server)
    try:
        made["engine"] = Engine(model, port, table_name)
        yield made
    finally:
        if "engine" in made:
            close(made["engine"], made["servers"])
        for each in made["servers"]:
            each.kill()


def close(engine: Any, servers: List[Server]) -> None:
    """Ends ``engine`` while the last server's reaper runs; with every
    server killed, what the engine made is removed here (no reaper will)."""
    if all(each._ended for each in servers):
        engine.with_livereg = False
    engine.close()


def test_a_killed_server_costs_the_next_generation_nothing_and_one_restarted_2s_later_gets_the_engine_again(
    started: Dict[str, Any], table_name: str,
) -> None:
    engine: Engine = started["engine"]
    [server] = started["servers"]
    first = fresh(engine)
    tokens = first["tokens"]
    before = cached_after_store(engine, tokens)
    instance_id = instance_of(table_name, engine.worker)

    gone_said = FirstSaid(engine, "is gone: ")
    killed_at = time.monotonic()
    server.kill()  # SIGKILL: nothing unregistered, nothing said
    after = fresh(engine)
    after_kill = time.monotonic() - killed_at
    assert after["tokens"] == tokens, "the generation after the server's SIGKILL gave other tokens"
    assert after["cached"] == 0, f"LMCache gave {after['cached']} tokens with its server dead"
    assert after_kill < NO_WAIT, f"the first generation after the SIGKILL ended {after_kill:.1f}s after it"
    gone = said(engine, "is gone: ")
    assert len(gone) >= 1 and all("in degraded mode" in line for line in gone), gone
    assert len([line for line in gone if "(scheduler)" in line]) == 1, gone
    assert len([line for line in gone if "(worker)" in line]) == 1, gone

    time.sleep(max(0.0, killed_at + 2.0 - time.monotonic()))
    back_said = FirstSaid(engine, "a new LMCache server")
    restarted_at = time.monotonic()
    second = Server(started["port"], table_name, module=started["config"])
    started["servers"].append(second)
    served_after = time.monotonic() - restarted_at
    held_after = second.wait_held(instance_id, 60) - restarted_at
    back = said(engine, "a new LMCache server")
    deadline = time.monotonic() + 60
    while len(back) < 2:
        assert time.monotonic() < deadline, f"the engine never said the server is back: {back}"
        time.sleep(0.2)
        back = said(engine, "a new LMCache server")
    assert len([line for line in back if "(scheduler)" in line]) == 1, back
    assert len([line for line in back if "(worker)" in line]) == 1, back

    again = fresh(engine)
    assert again["tokens"] == tokens, "the first generation on the new server gave other tokens"
    reused = cached_after_store(engine, tokens)
    print(
        f"\nkill -> the engine said the server is gone {gone_said.after(killed_at) * 1000:.0f} ms after "
        f"(log pipe included); next generation done {after_kill:.2f}s after the kill (it took "
        f"{after['seconds']:.2f}s; {before['seconds']:.2f}s with the cache before, {first['seconds']:.2f}s the "
        f"first); restarted 2 s after the kill: the new server said ready {served_after:.1f}s after its start, "
        f"held the engine's KV caches {held_after:.1f}s after it, the engine said it healthy again "
        f"{back_said.after(restarted_at):.1f}s after it; cache used again: {reused['cached']} tokens"
    )
    print("\n".join(gone + back))
    assert said(engine, "is gone: ") == gone, "the engine said the server is gone again"


def test_livereg_health_says_the_cache_server_absent_since_its_kill_and_still_200_while_the_engine_completes(
    model: Path, table_name: str,
) -> None:
    port = free_port()
    servers = [Server(port, table_name, module={"table": table_name, "reap_timeout_seconds": T})]
    serve: Optional[Serve] = None
    try:
        serve = Serve(model, port, table_name, free_port(), env={"VLLM_PLUGINS": "livereg_lmcache,livereg_health"})
        text = serve.complete(PROMPT)["choices"][0]["text"]
        status, body = serve.get("/livereg/health")
        assert status == 200 and body.get("kv_server") == "serving", body
        killed_wall = time.time()
        servers[0].kill()
        deadline = time.monotonic() + NO_WAIT
        while body.get("kv_server") != "absent":
            assert time.monotonic() < deadline, f"/livereg/health still says {status} {body}"
            time.sleep(0.05)
            status, body = serve.get("/livereg/health")
        assert status == 200, f"a gone cache server made /livereg/health answer {status}: {body}"
        assert killed_wall - 1.0 <= body["kv_server_since"] <= killed_wall + 5.0, (killed_wall, body)
        started = time.monotonic()
        assert serve.complete(PROMPT)["choices"][0]["text"] == text, "a completion after the kill gave another text"
        print(f"\n/livereg/health: absent since {body['kv_server_since'] - killed_wall:+.3f}s from the kill; a "
              f"completion after it took {time.monotonic() - started:.2f}s")
    finally:
        if serve is not None:
            close(serve, servers)
        for each in servers:
            each.kill()


@pytest.mark.skipif(os.environ.get("LIVEREG_LONG_TESTS") != "1",
                    reason="six minutes: runs with LIVEREG_LONG_TESTS=1")
def test_the_engine_serves_six_minutes_after_its_servers_sigkill_with_a_generation_in_flight_at_the_kill(
    started: Dict[str, Any],
) -> None:
    engine: Engine = started["engine"]
    [server] = started["servers"]
    tokens = fresh(engine)["tokens"]
    cached_after_store(engine, tokens)
    assert engine.process.stdin is not None
    # 400 tokens (the prompt is 560, the model's length 1024): over a
    # second of decoding here, the kill 0.3 s after it began.
    engine.process.stdin.write("generate long 400\n")
    engine.process.stdin.flush()
    engine.record(120, "started")
    time.sleep(0.3)
    killed_at = time.monotonic()
    server.kill()
    in_flight = engine.record(NO_WAIT * 4, "tokens")
    assert len(in_flight["tokens"]) == 400, in_flight
    assert in_flight["ended"] > killed_at, "the generation ended before the kill: it was not in flight"
    in_flight_after = time.monotonic() - killed_at
    # Past vLLM's 300 s executor timeout (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS),
    # generating now and then all along.
    while time.monotonic() - killed_at < 6 * 60:
        answer = fresh(engine)
        assert answer["tokens"] == tokens and answer["cached"] == 0, answer
        assert answer["seconds"] < NO_WAIT, answer
        time.sleep(20)
    assert engine.process.poll() is None, "the engine exited"
    print(f"\nin-flight generation done {in_flight_after:.1f}s after the kill; serving "
          f"{time.monotonic() - killed_at:.0f}s after it")
