"""livereg as a server module of LMCache 0.5.6's real multiprocess server
(``--server-module``), with engines built from LMCache's own worker code
after ``livereg.lmcache.install()``."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from conftest import Engine, Server, free_port, module_server, unique

import livereg

T = 1.0  # livereg's reap timeout here; LMCache's own is 30 s (its floor), its grace 30 s
LMCACHE_TIMEOUT = 30.0
TOKEN = "lmcache-integration-token"


@pytest.fixture(scope="module")
def listener(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return {"address": f"tcp://127.0.0.1:{free_port()}", "token_file": str(token_file)}


@pytest.fixture(scope="module")
def server(listener: Dict[str, str]) -> Iterator[Server]:
    config = {"reap_timeout_seconds": T, "listen": listener["address"], "token_file": listener["token_file"]}
    with module_server("module", config, timeout=LMCACHE_TIMEOUT) as started:
        yield started


@pytest.fixture(scope="module")
def left_alone(server: Server) -> Iterator[Tuple[Engine, Engine, float]]:
    """Started first, judged last: an engine on livereg that never pings nor
    transfers (idle), and an engine without livereg that only PINGs, killed
    at once (LMCache's own rules must free it, not livereg)."""
    idle = Engine(server, 901, install=True)
    pinger = Engine(server, 902, install=False, ping=1.0)
    killed_at = pinger.signal(signal.SIGKILL)
    yield idle, pinger, killed_at
    idle.kill()
    pinger.kill()


@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
@pytest.mark.parametrize("pings", [False, True])
def test_a_sigkilled_engine_is_freed_from_the_transfer_module_within_half_a_second(
    server: Server, left_alone: Any, engines: List[Engine], mode: str, pings: bool
) -> None:
    instance_id = 100 + 10 * (mode == "lmcache_driven") + pings
    engine = Engine(server, instance_id, mode=mode, ping=1.0 if pings else None)
    engines.append(engine)
    time.sleep(0.2)
    killed_at = engine.signal(signal.SIGKILL)
    freed_after = server.wait_gone(instance_id, 10) - killed_at
    assert freed_after < 0.5, f"freed {freed_after:.3f}s after SIGKILL"


def test_a_stopped_engine_is_freed_past_the_timeout_and_resumed_registers_its_kv_cache_again(
    server: Server, engines: List[Engine]
) -> None:
    engine = Engine(server, 120)
    engines.append(engine)
    stopped_at = engine.signal(signal.SIGSTOP)
    # Its silence began at its last beat, a while before the stop on a busy
    # host: never freed before T of that silence.
    with livereg.open(server.table) as table:
        rows = [r for r in table.status().registrations if r.instance_id == 120]
    silent_before_stop = (rows[0].last_heartbeat_age_seconds or 0.0) if rows else 0.0
    freed_after = server.wait_gone(120, 10 * T) - stopped_at
    silence = freed_after + silent_before_stop
    assert T * 0.95 <= silence and freed_after <= 3 * T + 1, (
        f"a stopped engine freed {freed_after:.3f}s after SIGSTOP, {silence:.3f}s after its last beat"
    )
    time.sleep(0.5)
    assert not server.holds(120), "freed, then registered while still stopped"
    resumed_at = engine.signal(signal.SIGCONT)
    back_after = server.wait_held(120, 10) - resumed_at
    assert back_after <= 3.0, f"registered again {back_after:.3f}s after SIGCONT"


def test_a_clean_unregister_ends_the_livereg_registration_as_deregistered(
    server: Server, engines: List[Engine]
) -> None:
    engine = Engine(server, 130)
    engines.append(engine)
    with livereg.open(server.table) as table:
        before = table.stats()["ended"].get("deregistered", 0)
        engine.unregister()
        server.wait_gone(130, 10)
        deadline = time.monotonic() + 5
        while table.stats()["ended"].get("deregistered", 0) == before:
            assert time.monotonic() < deadline, "no registration ended deregistered"
            time.sleep(0.02)
        assert all(r.instance_id != 130 or r.state != "live" for r in table.status().registrations)


def test_lmcaches_own_requests_still_answer(server: Server) -> None:
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

    client = RequestClientFactory.create(f"tcp://127.0.0.1:{server.port}")
    try:
        assert client.ping(None).result(timeout=20) is True
        assert client.ping(55).result(timeout=20) is True
        assert client.noop().result(timeout=20) == "OK"
        assert client.get_chunk_size().result(timeout=20) == 256
        assert isinstance(client.get_experimental().result(timeout=20), list)
        assert client.clear(False).result(timeout=20) is None
        assert client.clear(True).result(timeout=20) is None
    finally:
        client.close()
    assert server.ask("clear 1") == {"cleared": True}  # MPCacheServer.clear(force=True), /cache/clear's path
    assert server.ask("clear 0") == {"cleared": False}


def test_an_isolated_engine_registers_through_the_listener_and_is_freed_at_once_when_killed(
    server: Server, listener: Dict[str, str], engines: List[Engine]
) -> None:
    # Its own mount (a private /dev/shm: the table cannot be mapped), PID and
    # IPC namespaces; the loopback network is shared, as a pod's is.
    prefix = ["unshare", "--mount", "--pid", "--ipc", "--fork", "--kill-child", "sh", "-c",
              'mount -t tmpfs contained /dev/shm && exec "$0" "$@"']
    engine = Engine(server, 140, env={"LIVEREG_LMCACHE_TABLE": listener["address"],
                                             "LIVEREG_LMCACHE_TOKEN_FILE": listener["token_file"]}, prefix=prefix)
    engines.append(engine)
    with livereg.open(server.table) as table:
        [registration] = [r for r in table.status().registrations if r.instance_id == 140]
        assert registration.remote
    killed_at = engine.signal(signal.SIGKILL)  # unshare, and with it the engine (--kill-child)
    freed_after = server.wait_gone(140, 10) - killed_at
    assert freed_after < 0.5, f"freed {freed_after:.3f}s after SIGKILL"


def test_left_alone_an_idle_engine_outlives_lmcaches_timeout_and_a_ping_only_one_keeps_lmcaches_rules(
    server: Server, left_alone: Tuple[Engine, Engine, float]
) -> None:
    idle, pinger, killed_at = left_alone
    # Past LMCache's timeout and grace (30 s each here) and one scan of its reaper.
    wait = killed_at + LMCACHE_TIMEOUT + LMCACHE_TIMEOUT / 4 + 3 - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    assert server.holds(idle.instance_id), "an idle engine on livereg was freed while alive"
    assert not server.holds(pinger.instance_id), "a killed PING-only engine outlived LMCache's own timeout"
    freed_after = server.wait_gone(pinger.instance_id, 1) - killed_at
    assert LMCACHE_TIMEOUT - 1.5 <= freed_after, f"a PING-only engine was freed {freed_after:.1f}s after it died"


def test_an_engine_whose_table_does_not_answer_runs_as_without_livereg(
    server: Server, engines: List[Engine]
) -> None:
    engine = Engine(server, 150, env={"LIVEREG_LMCACHE_TABLE": unique("nowhere")}, stderr=True,
                    with_livereg=False)
    engines.append(engine)
    with livereg.open(server.table) as table:
        assert all(r.instance_id != 150 for r in table.status().registrations)
    engine.kill()
    warned = engine.stderr_lines("runs without livereg")
    assert len(warned) == 1, warned
