"""A worker registered through a listener follows its engine's EngineCore
as one that maps the table does: it asks the listener (``remote_status``)
about the core's instance id, derived from its label, at most once a
second, and lets go once the core was seen live and is gone; an ask that
fails is unknown, never gone."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest
from conftest import loopback_address

import livereg
from livereg.lmcache import _worker
from livereg.lmcache._common import label_instance
from livereg.lmcache._worker import WorkerLiveness

MakeTable = Callable[..., livereg.Table]

CORE = "vllm-core k"
#: The reaper's progress timeout: a busy core making no progress ends
#: `stalled` after it.
PROGRESS = 1.5


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    return str(tmp_path / "follow.sock")


#: What a session is given besides the address: the token and TLS files.
Credentials = Dict[str, Optional[str]]


@pytest.fixture(params=["unix", "tcp", "tls"])
def served(
    request: pytest.FixtureRequest, make_table: MakeTable, socket_path: str, tmp_path: Path,
    tls_files: Dict[str, str],
) -> Iterator[Tuple[livereg.Table, str, Credentials, "queue.Queue[livereg.DropEvent]"]]:
    """A table judging progress, served by a reaper listening on one
    address of each kind (`tcp://` and `tls://` with a token read from a
    token file); its drops."""
    table = make_table(reap_timeout=2.0, registration_grace=4.0, progress_timeout=PROGRESS)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    credentials: Credentials = {}
    serving: Dict[str, object] = {}
    if request.param == "unix":
        address = f"unix:{socket_path}"
    else:
        token_file = tmp_path / "token"
        token_file.write_text("s3cret-follow\n")
        token_file.chmod(0o600)
        credentials["token"] = livereg.read_token_file(token_file).decode()
        address = loopback_address(request.param)
        serving["token"] = "s3cret-follow"
    if request.param == "tls":
        credentials["tls_ca"] = tls_files["ca.pem"]
        serving.update(tls_cert=tls_files["server.pem"], tls_key=tls_files["server.key"])
    reaper = table.start_reaper(on_drop=drops.put, listen=[address], **serving)  # type: ignore[arg-type]
    try:
        yield table, address, credentials, drops
    finally:
        reaper.stop()


class StalledCore:
    """The EngineCore's registration over another session, beaten from a
    native thread; `stall()` makes it busy with no progress."""

    def __init__(self, address: str, credentials: Credentials) -> None:
        self.worker = livereg.connect(address, label_instance(CORE), label=CORE, **credentials)  # type: ignore[arg-type]
        self.beats = self.worker.beat_in_background(0.05)

    def stall(self) -> None:
        self.worker.set_busy(True)

    def close(self) -> None:
        self.beats.stop()
        try:
            self.worker.deregister()
        except livereg.EvictedError:
            pass


def follower(address: str, instance_id: int, credentials: Credentials) -> WorkerLiveness:
    return WorkerLiveness(address, instance_id, label="engine", interval=0.05, steps=True, follows=CORE,
                          **credentials)  # type: ignore[arg-type]


def until(what: str, done: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def live(table: livereg.Table, instance_id: int) -> bool:
    return any(r.instance_id == instance_id and r.state == "live" for r in table.status().registrations)


def test_a_follower_over_a_session_lets_go_once_its_core_ends_stalled_and_registers_again_when_it_moves(
    served: Tuple[livereg.Table, str, Credentials, "queue.Queue[livereg.DropEvent]"]
) -> None:
    table, address, credentials, drops = served
    core = StalledCore(address, credentials)
    follows = follower(address, 52, credentials)
    try:
        until("the follower never saw its core live", lambda: follows._followed_seen)
        assert live(table, 52)
        core.stall()
        ended: List[livereg.DropEvent] = []
        deadline = time.monotonic() + 20
        while not any(event.instance_id == 52 for event in ended):
            assert time.monotonic() < deadline, f"the follower was not let go; ended so far: {ended}"
            try:
                ended.append(drops.get(timeout=0.1))
            except queue.Empty:
                pass
        reasons = {event.instance_id: event.reason for event in ended}
        assert reasons[label_instance(CORE)] == livereg.Reason.STALLED, ended
        assert reasons[52] == livereg.Reason.DEREGISTERED, ended
        assert [event.instance_id for event in ended].index(label_instance(CORE)) < \
            [event.instance_id for event in ended].index(52), "let go before its core ended"
        assert not live(table, 52)
        until("the follower never took itself for let go", lambda: follows._let_go)
        follows.step_started()  # it moves again: registered again first
        assert live(table, 52)
        follows.step_done()
    finally:
        follows.close()
        core.close()


def test_a_follower_whose_asks_fail_never_lets_go_for_its_core(
    make_table: MakeTable, socket_path: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listener's socket is removed once the follower saw its core live:
    the sessions hold, every ask fails; the core ends stalled and the
    follower stays registered, saying once that its asks fail."""
    table = make_table(reap_timeout=2.0, registration_grace=4.0, progress_timeout=PROGRESS)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    address = f"unix:{socket_path}"
    asks: List[float] = []
    ask = livereg.remote_status

    def counted(*args: object, **kwargs: object) -> livereg.Status:
        asks.append(time.monotonic())
        return ask(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(livereg, "remote_status", counted)
    with table.start_reaper(on_drop=drops.put, listen=[address]):
        core = StalledCore(address, {})
        follows = follower(address, 53, {})
        try:
            until("the follower never saw its core live", lambda: follows._followed_seen)
            os.unlink(socket_path)
            with caplog.at_level(logging.WARNING, logger="livereg.lmcache"):
                core.stall()
                event = drops.get(timeout=20)
                assert (event.instance_id, event.reason) == (label_instance(CORE), livereg.Reason.STALLED)
                ended_at = time.monotonic()
                time.sleep(4 * _worker._ASK_EVERY)  # four asks, each failing
            assert drops.empty(), f"ended: {drops.get()}"
            assert live(table, 53), "the follower was let go on failed asks"
            failed = [r for r in caplog.records if "unknown, not gone" in r.getMessage()]
            assert len(failed) == 1, [r.getMessage() for r in caplog.records]
            after = [at for at in asks if at > ended_at]
            assert len(after) >= 2, f"asked {len(after)} times in {4 * _worker._ASK_EVERY} s"
            gaps = [b - a for a, b in zip(asks, asks[1:])]
            assert min(gaps) >= _worker._ASK_EVERY * 0.9, f"asked more than once a second: {gaps}"
        finally:
            follows.close()
            core.close()


def test_asks_are_at_most_once_a_second_and_never_while_following_a_table(
    make_table: MakeTable, socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower beating every 50 ms asks about once a second over a
    session; one that maps the table never asks."""
    table = make_table(reap_timeout=2.0, registration_grace=4.0, progress_timeout=PROGRESS)
    address = f"unix:{socket_path}"
    asks: List[float] = []
    lock = threading.Lock()
    ask = livereg.remote_status

    def counted(*args: object, **kwargs: object) -> livereg.Status:
        with lock:
            asks.append(time.monotonic())
        return ask(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(livereg, "remote_status", counted)
    with table.start_reaper(listen=[address]):
        core = StalledCore(address, {})
        local = WorkerLiveness(table, 54, label="engine", interval=0.05, steps=True, follows=CORE)
        remote = follower(address, 55, {})
        try:
            started = time.monotonic()
            time.sleep(3.5)
            spent = time.monotonic() - started
            assert local._followed_seen and remote._followed_seen
            with lock:
                taken = list(asks)
            assert 2 <= len(taken) <= spent / _worker._ASK_EVERY + 1, taken
        finally:
            remote.close()
            local.close()
            core.close()


def test_the_engine_core_registers_under_the_id_its_label_gives_through_the_workers_listener_and_token(
    make_table: MakeTable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside vLLM, the EngineCore's own registration: through the address
    its workers use, with their token file, as ``label_instance`` of its
    label (what a follower asks about)."""
    from types import SimpleNamespace

    from livereg.lmcache import _stacks, _steps
    from livereg.lmcache._common import TABLE_ENV, TOKEN_FILE_ENV

    table = make_table(reap_timeout=5.0, registration_grace=5.0)
    address = loopback_address("tcp")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-core\n")
    token_file.chmod(0o600)
    monkeypatch.setenv(TABLE_ENV, address)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file))
    monkeypatch.setenv(_stacks.ENGINE_ENV, "f0110w")
    monkeypatch.setattr(_steps, "stall_report", lambda: None)  # no report of this process made here
    monkeypatch.setattr(_steps, "_core", None)
    monkeypatch.setattr(_steps, "_core_failed", False)
    engine_core = SimpleNamespace(vllm_config=SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="LMCacheConnectorV1")))
    with table.start_reaper(listen=[address], token="s3cret-core"):
        _steps._register_core(engine_core)
        core = _steps._core
        assert core is not None, "the EngineCore did not register"
        try:
            [row] = table.status().registrations
            assert (row.instance_id, row.label) == (label_instance("vllm-core f0110w"), "vllm-core f0110w")
            assert row.instance_id == _steps.core_instance() and row.remote is not None
        finally:
            core.close()


def test_a_second_engine_core_of_the_engine_finding_its_id_held_registers_under_another_with_the_label(
    make_table: MakeTable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from livereg.lmcache import _stacks, _steps
    from livereg.lmcache._common import TABLE_ENV

    table = make_table(reap_timeout=5.0, registration_grace=5.0)
    monkeypatch.setenv(TABLE_ENV, table.name)
    monkeypatch.setenv(_stacks.ENGINE_ENV, "da7a9a")
    monkeypatch.setattr(_steps, "stall_report", lambda: None)  # no report of this process made here
    monkeypatch.setattr(_steps, "_core", None)
    monkeypatch.setattr(_steps, "_core_failed", False)
    first = table.register(_steps.core_instance(), label="vllm-core da7a9a")
    engine_core = SimpleNamespace(vllm_config=SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="LMCacheConnectorV1")))
    _steps._register_core(engine_core)
    core = _steps._core
    assert core is not None, "the second EngineCore did not register"
    try:
        rows = sorted((r.instance_id == _steps.core_instance(), r.label) for r in table.status().registrations)
        assert rows == [(False, "vllm-core da7a9a"), (True, "vllm-core da7a9a")]
    finally:
        core.close()
        first.deregister()


def test_a_labels_instance_id_is_the_same_everywhere_nonzero_and_below_two_to_the_63() -> None:
    ids = [label_instance(f"vllm-core {n:012x}") for n in range(2000)]
    assert all(0 < i < 1 << 63 for i in ids) and len(set(ids)) == len(ids)
    # Fixed by the label alone, in every process and release: the first 63
    # bits of its SHA-256.
    assert label_instance("vllm-core k") == 0x1AEE14E4582B95AC
