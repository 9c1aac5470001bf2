"""Sessions from Python: a worker in an isolated container (its own mount
namespace with a private /dev/shm, its own PID, IPC and network namespaces,
made here with unshare) registers through the reaper's listener with
``livereg.connect`` and is reaped like a local one."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest
from conftest import contained_python, loopback_address

import livereg

MakeTable = Callable[..., livereg.Table]

CLIENT = """
import sys, time, livereg
address, instance, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
token = sys.argv[4] if len(sys.argv) > 4 else None
try:
    worker = livereg.connect(address, instance, label="py-engine", token=token)
except livereg.Error as e:
    print("refused", type(e).__name__, e, flush=True)
    sys.exit(0)
print("registered", flush=True)
for n in range(100000):
    try:
        worker.ping()
    except livereg.EvictedError as e:
        print("evicted", e, flush=True)
        sys.exit(0)
    if mode == "exit" and n == 5:
        worker.deregister()
        print("done", flush=True)
        sys.exit(0)
    time.sleep(0.01)
"""


@pytest.fixture
def socket_address(request: pytest.FixtureRequest) -> Iterator[str]:
    path = f"/tmp/livereg-pytest-{os.getpid()}-{request.node.name[:30]}.sock"
    yield f"unix:{path}"
    if os.path.exists(path):
        os.unlink(path)


def isolated(address: str, instance: int, mode: str, token: Optional[str] = None) -> "subprocess.Popen[str]":
    """A Python engine in its own container, running CLIENT."""
    args: List[str] = [address, str(instance), mode] + ([token] if token else [])
    return contained_python(CLIENT, *args, own_network=address.startswith("unix:"))


def until_reset_heard(worker: livereg.Worker) -> None:
    """Pings ``worker`` until it raises ``EvictedError`` saying ``cleared``
    (within 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            worker.ping()
        except livereg.EvictedError as evicted:
            assert "cleared" in str(evicted)
            return
        time.sleep(0.005)
    pytest.fail("the reset never reached the session")


def line(child: "subprocess.Popen[str]") -> str:
    assert child.stdout is not None
    return child.stdout.readline().strip()


def test_an_isolated_python_engine_killed_is_dropped_disconnected_at_once(
    make_table: MakeTable, socket_address: str
) -> None:
    table = make_table(reap_timeout=30.0)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    with table.start_reaper(on_drop=drops.put, listen=[socket_address]):
        child = isolated(socket_address, 21, "ping")
        assert line(child) == "registered"
        [row] = table.status().registrations
        assert row.exit_detection == "connection"
        assert row.remote is not None and row.remote["peer"].startswith("unix pid=")
        killed = time.monotonic()
        child.send_signal(signal.SIGKILL)  # unshare's parent-death signal kills the engine
        child.wait()
        event = drops.get(timeout=10)
        assert (event.instance_id, event.reason) == (21, livereg.Reason.DISCONNECTED)
        assert time.monotonic() - killed < 2.0
        assert event.remote, "a session's end says it was remote"


def test_an_isolated_python_engine_that_deregisters_ends_deregistered(
    make_table: MakeTable, socket_address: str
) -> None:
    table = make_table(reap_timeout=30.0)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    with table.start_reaper(on_drop=drops.put, listen=[socket_address]):
        child = isolated(socket_address, 22, "exit")
        assert line(child) == "registered"
        assert line(child) == "done"
        event = drops.get(timeout=10)
        assert (event.instance_id, event.reason) == (22, livereg.Reason.DEREGISTERED)
        child.wait()


def test_a_wrong_token_is_refused_and_a_live_id_is_exists(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=30.0)
    address = loopback_address("tcp")
    with pytest.raises(livereg.InvalidArgumentError, match="needs a token"):
        table.start_reaper(listen=[address])
    with table.start_reaper(listen=[address], token="s3cret"):
        child = isolated(address, 23, "ping", token="wrong")
        assert line(child).startswith("refused PermissionDeniedError")
        child.wait()
        assert table.status().registrations == []
        with pytest.raises(livereg.PermissionDeniedError):
            livereg.connect(address, 23, token=b"wrong")
        worker = livereg.connect(address, 23, label="first", token=b"s3cret")
        assert worker.remote
        with pytest.raises(livereg.ExistsError):
            livereg.connect(address, 23, token="s3cret")
        worker.ping()
        worker.deregister()


def test_info_and_a_reset_reach_a_session(make_table: MakeTable, socket_address: str) -> None:
    table = make_table(reap_timeout=30.0)
    table.set_info(b'{"chunk_size": 256}')
    with table.start_reaper(listen=[socket_address]):
        worker = livereg.connect(socket_address, 24)
        assert worker.info() == b'{"chunk_size": 256}'
        worker.ping()
        table.reset(timeout=5)
        until_reset_heard(worker)


def test_a_session_over_tls_verifies_the_listener_against_its_ca(
    make_table: MakeTable, tls_files: Dict[str, str]
) -> None:
    """tls://: the right CA registers; another CA, or none, is refused in
    one line; nothing falls back to plaintext."""
    files = tls_files
    address = loopback_address("tls")
    table = make_table(reap_timeout=30.0)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    with table.start_reaper(
        on_drop=drops.put, listen=[address], token="s3cret", tls_cert=files["server.pem"], tls_key=files["server.key"]
    ):
        worker = livereg.connect(address, 31, token="s3cret", tls_ca=files["ca.pem"])
        worker.ping()
        [row] = table.status().registrations
        assert row.remote is not None and row.remote["peer"].startswith("tls 127.0.0.1:")
        worker.deregister()
        assert drops.get(timeout=10).reason == livereg.Reason.DEREGISTERED
        with pytest.raises(livereg.PermissionDeniedError, match="TLS handshake failed") as refused:
            livereg.connect(address, 32, token="s3cret", tls_ca=files["other.pem"])
        assert "\n" not in str(refused.value)
        with pytest.raises(livereg.InvalidArgumentError, match="needs the CA"):
            livereg.connect(address, 33, token="s3cret")
        assert table.status().registrations == []


def test_a_listener_requiring_client_certificates_takes_them_instead_of_a_token(
    make_table: MakeTable, tls_files: Dict[str, str]
) -> None:
    """tls_client_ca: a client presenting a certificate of that CA
    registers with no token; one without is refused in one line."""
    files = tls_files
    address = loopback_address("tls")
    table = make_table(reap_timeout=30.0)
    with table.start_reaper(
        listen=[address], tls_cert=files["server.pem"], tls_key=files["server.key"], tls_client_ca=files["ca.pem"]
    ):
        with pytest.raises(livereg.PermissionDeniedError) as refused:
            livereg.connect(address, 35, tls_ca=files["ca.pem"])
        assert "\n" not in str(refused.value)
        assert table.status().registrations == []
        worker = livereg.connect(address, 36, tls_ca=files["ca.pem"], tls_cert=files["client.pem"], tls_key=files["client.key"])
        worker.ping()
        assert [row.instance_id for row in table.status().registrations] == [36]
        worker.deregister()


def test_an_engine_asks_for_a_clear_and_a_reset_through_its_session(make_table: MakeTable, tmp_path: Path) -> None:
    """Worker.clear() runs the server's clear handlers (registrations
    untouched); Worker.reset() ends every registration, its own too; pings
    go on from another thread while a clear is waited for."""
    socket_path = tmp_path / "clear.sock"
    address = f"unix:{socket_path}"
    table = make_table(reap_timeout=30.0)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    clears: "queue.Queue[float]" = queue.Queue()

    def on_clear() -> None:
        time.sleep(0.3)
        clears.put(time.monotonic())

    with table.start_reaper(on_drop=drops.put, on_clear=on_clear, listen=[address]):
        local = table.register(40, label="local")
        worker = livereg.connect(address, 41)
        pinged: List[float] = []
        stop = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                worker.ping()
                pinged.append(time.monotonic())
                time.sleep(0.01)

        beater = threading.Thread(target=beat)
        beater.start()
        asked = time.monotonic()
        worker.clear(timeout=10.0)
        cleared = clears.get(timeout=1)
        stop.set()
        beater.join()
        assert any(asked < at < cleared for at in pinged), "pings went on during the clear"
        local.ping()
        worker.ping()
        assert drops.empty()
        with pytest.raises(livereg.DeadlineExceededError):
            worker.clear(timeout=0.05)  # the handler takes 0.3 s
        clears.get(timeout=5)
        worker.reset(timeout=10.0)
        ended = sorted((e.instance_id, e.reason) for e in (drops.get(timeout=5), drops.get(timeout=5)))
        assert ended == [(40, livereg.Reason.CLEARED), (41, livereg.Reason.CLEARED)]
        with pytest.raises(livereg.EvictedError):
            local.ping()
        until_reset_heard(worker)


def test_busy_sessions_are_not_ended_stalled_after_their_reaper_was_paused(
    make_table: MakeTable, socket_address: str
) -> None:
    """32 sessions busy, a step every 10 ms; the reaper's daemon stopped for
    less and for more than half its timeout, then resumed: the queued steps
    are applied before any is judged stalled."""
    livereg_bin = os.environ.get("LIVEREG_BIN", "")
    assert os.access(livereg_bin, os.X_OK), f"LIVEREG_BIN={livereg_bin!r} (ffi/python/test builds it)"
    table = make_table(capacity=64, reap_timeout=2.0, registration_grace=4.0, progress_timeout=0.5)
    name = table.status().table
    daemon = subprocess.Popen([livereg_bin, "reap", name, "--listen", socket_address], stderr=subprocess.DEVNULL)
    stop = threading.Event()
    stepper: Optional[threading.Thread] = None
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(socket_address[len("unix:"):]):
            assert time.monotonic() < deadline, "the listener never came up"
            time.sleep(0.02)
        workers = [livereg.connect(socket_address, 100 + i) for i in range(32)]
        for worker in workers:
            worker.set_busy(True)

        def step() -> None:
            while not stop.wait(0.01):
                for worker in workers:
                    worker.ping()
                    worker.progress()

        stepper = threading.Thread(target=step, daemon=True)
        stepper.start()
        time.sleep(1.0)
        for pause in (0.8, 1.5):
            daemon.send_signal(signal.SIGSTOP)
            time.sleep(pause)
            daemon.send_signal(signal.SIGCONT)
            time.sleep(1.5)
        ended = table.stats()["ended"]
        assert ended.get("stalled", 0) == 0 and sum(ended.values()) == 0, ended
    finally:
        stop.set()
        if stepper is not None:
            stepper.join()
        daemon.send_signal(signal.SIGCONT)
        daemon.kill()
        daemon.wait()


def test_a_connect_timeout_no_duration_holds_is_refused_and_a_huge_one_never_panics(socket_address: str) -> None:
    with pytest.raises(livereg.InvalidArgumentError, match="timeout"):
        livereg.connect(socket_address, 1, timeout=1e300)
    with pytest.raises(livereg.InvalidArgumentError, match="timeout"):
        livereg.connect(socket_address, 1, timeout=float("nan"))
    # Nothing listens there: it fails as an error, never a panic.
    with pytest.raises(livereg.Error):
        livereg.connect(socket_address, 1, timeout=1e19)


def test_an_address_is_told_from_a_table_name_as_the_library_tells_it() -> None:
    assert livereg.is_address("unix:/run/livereg/kv.sock")
    assert livereg.is_address("tcp://127.0.0.1:7071") and livereg.is_address("tls://kv:7071")
    assert not livereg.is_address("lmcache-workers") and not livereg.is_address("/dev/shm/x")


def test_the_typed_status_has_exactly_the_keys_of_the_status_json(make_table: MakeTable) -> None:
    # `livereg status --json` is the one schema (the Rust `Status`); the
    # Python types are checked against it, a session's registration included.
    livereg_bin = os.environ.get("LIVEREG_BIN", "")
    assert os.access(livereg_bin, os.X_OK), f"LIVEREG_BIN={livereg_bin!r} (ffi/python/test builds it)"
    address = loopback_address("tcp")
    table = make_table()
    reaper = table.start_reaper(listen=[address], token="s3cret")
    local = table.register(1, label="local")
    remote = livereg.connect(address, 2, token="s3cret", timeout=5.0)
    snapshot = json.loads(subprocess.check_output([livereg_bin, "status", table.name, "--json"]))
    rows = snapshot["registrations"]
    assert {row["instance_id"] for row in rows} == {1, 2}
    assert {field.name for field in dataclasses.fields(livereg.Status)} == set(snapshot)
    # (a row leaves out `remote` for a registration in the table)
    row_fields = {field.name for field in dataclasses.fields(livereg.RegistrationStatus)}
    assert all(set(row) <= row_fields for row in rows)
    assert set().union(*rows) == row_fields
    typed_stats = {name for name, value in vars(livereg.Stats).items() if isinstance(value, property)}
    assert typed_stats <= set(snapshot) - {"registrations"}
    remote.deregister()
    local.deregister()
    reaper.stop()


def test_remote_status_answers_the_tables_status_with_one_instances_rows_and_raises_as_connect(
    make_table: MakeTable, socket_address: str
) -> None:
    address = loopback_address("tcp")
    table = make_table(reap_timeout=30.0)
    with table.start_reaper(listen=[address, socket_address], token="s3cret"):
        local = table.register(61, label="local")
        remote = livereg.connect(address, 62, label="remote", token="s3cret")
        for where, token in ((address, "s3cret"), (socket_address, "s3cret")):
            status = livereg.remote_status(where, 62, token=token, timeout=5.0)
            assert isinstance(status, livereg.Status)
            assert (status.table, status.reap_timeout_seconds) == (table.name, 30.0)
            assert [(r.instance_id, r.label, r.state) for r in status.registrations] == \
                [(62, "remote", livereg.RegistrationState.LIVE)]
            assert status.tracked_instances == table.status().tracked_instances == 2
            assert livereg.remote_status(where, token=token).registrations == []
            assert livereg.remote_status(where, 99, token=token).registrations == []
        with pytest.raises(livereg.PermissionDeniedError):
            livereg.remote_status(address, 62, token=b"wrong")
        with pytest.raises(livereg.InvalidArgumentError, match="timeout"):
            livereg.remote_status(address, 62, token="s3cret", timeout=0.0)
        with pytest.raises(livereg.InvalidArgumentError, match="needs the CA"):
            livereg.remote_status(loopback_address("tls"), 62, token="s3cret")
        remote.deregister()
        local.deregister()
    # Nothing listens there any more.
    with pytest.raises(livereg.SystemCallError):
        livereg.remote_status(socket_address, 62, token="s3cret")
