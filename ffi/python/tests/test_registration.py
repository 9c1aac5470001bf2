"""Registration, errors, info, progress: the same ground as the C tests."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import queue
import re
import time
from typing import Any, Callable, Dict

import pytest

import livereg

MakeTable = Callable[..., livereg.Table]


def test_register_ping_deregister(make_table: MakeTable) -> None:
    table = make_table()
    with table.register(1, label="gpu1") as worker:
        worker.ping()
        assert table.stats()["tracked_instances"] == 1
        assert worker.instance_id == 1
    assert table.stats()["tracked_instances"] == 0
    with pytest.raises(livereg.EvictedError) as caught:
        worker.ping()
    assert caught.value.code == 1


def test_label_may_be_none_and_status_lists_registrations(make_table: MakeTable) -> None:
    table = make_table()
    with table.register(2), table.register(3, label="gpu3"):
        status = table.status()
        assert isinstance(status, livereg.Status)
        rows = {row.instance_id: row for row in status.registrations}
        assert isinstance(rows[2], livereg.RegistrationStatus)
        assert rows[2].label == ""
        assert rows[3].label == "gpu3"
        assert rows[3].state == "live"
        assert rows[3].ended_reason is None
        assert status.ended[livereg.Reason.TIMEOUT] == 0
        assert status.reaper_heartbeat_age_seconds is None  # no reaper ever ran


def test_bad_arguments_raise_invalid_argument_with_code_and_message(make_table: MakeTable) -> None:
    table = make_table()
    with pytest.raises(livereg.InvalidArgumentError) as caught:
        table.register(0)
    assert caught.value.code == 5
    assert "instance id 0" in str(caught.value)
    with pytest.raises(livereg.InvalidArgumentError, match="at most 47"):
        table.register(3, label="x" * 48)
    table.register(3, label="x" * 47).deregister()
    with pytest.raises(livereg.InvalidArgumentError):
        livereg.create("bad name")
    with pytest.raises(livereg.InvalidArgumentError, match="reap_timeout"):
        livereg.create("livereg-never-made", reap_timeout=-1.0)


def test_live_duplicate_is_exists_and_a_full_table_is_full(make_table: MakeTable) -> None:
    table = make_table(capacity=2)
    first = table.register(4)
    with pytest.raises(livereg.ExistsError) as exists:
        table.register(4)
    # What a caller acts on is a field, not a phrase of the message.
    assert exists.value.registered == (4, os.getpid())
    second = table.register(5)
    with pytest.raises(livereg.FullError) as caught:
        table.register(6)
    assert caught.value.code == 2 and caught.value.capacity == 2
    first.deregister()
    second.deregister()
    with pytest.raises(livereg.ExistsError) as table_exists:
        livereg.create(table.name)
    assert table_exists.value.registered is None


def test_every_error_is_a_livereg_error_with_its_code(make_table: MakeTable) -> None:
    table = make_table()
    with pytest.raises(livereg.Error):
        livereg.open("livereg-pytest-missing")
    with pytest.raises(livereg.NotFoundError) as caught:
        livereg.open("livereg-pytest-missing")
    assert caught.value.code == 4
    with pytest.raises(livereg.ExistsError):
        livereg.create(table.name)
    codes = {cls.__name__: cls.code for cls in livereg.Error.__subclasses__()}
    assert codes["BusyError"] == 11 and codes["PanicError"] == 13


def test_every_result_code_of_the_c_header_has_its_exception_class() -> None:
    # The header is checked against the one list of codes by the C library's
    # tests; the classes are made from that list: a code added there is here.
    header = (pathlib.Path(__file__).parents[3] / "include" / "livereg.h").read_text()
    listed = {
        name: int(value)
        for name, value in re.findall(r"^\s+LIVEREG_(\w+) = (\d+)", header, re.MULTILINE)
    }
    assert listed["OK"] == 0 and len(listed) > 13
    classes = {cls.code: cls for cls in livereg.Error.__subclasses__()}
    assert set(classes) == set(listed.values()) - {0}


def test_a_closed_table_says_so(make_table: MakeTable) -> None:
    table = make_table()
    worker = table.register(9)
    table.close()
    worker.ping()  # the registration keeps the mapping
    with pytest.raises(livereg.InvalidArgumentError, match="closed"):
        table.register(10)
    worker.deregister()


def test_open_sees_the_same_table(make_table: MakeTable) -> None:
    table = make_table()
    with livereg.open(table.name) as other, table.register(7, label="shared"):
        assert other.stats()["tracked_instances"] == 1
        assert other.capacity == 8


def test_info_round_trips_and_is_bounded(make_table: MakeTable) -> None:
    table = make_table()
    assert table.info() == b""
    table.set_info('{"chunk_size": 256}')
    with livereg.open(table.name) as other:
        assert other.info() == b'{"chunk_size": 256}'
    table.set_info(b"\x00raw")
    assert table.info() == b"\x00raw"
    with pytest.raises(livereg.InvalidArgumentError):
        table.set_info(b"x" * (livereg.INFO_MAX + 1))
    with pytest.raises(livereg.InvalidArgumentError, match="bytes or str"):
        table.set_info(12)  # type: ignore[arg-type]


def test_a_busy_worker_without_progress_ends_stalled_and_an_idle_one_is_kept(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8, progress_timeout=0.4)
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    with table.start_reaper(on_drop=drops.put):
        stuck, idle = table.register(1), table.register(2)
        with stuck.busy():
            stuck.progress()
            deadline = time.monotonic() + 5
            while drops.empty():
                assert time.monotonic() < deadline, "never ended"
                try:
                    stuck.ping()  # alive, but its loop makes no progress
                except livereg.EvictedError:
                    pass  # ended: its drop is on its way
                idle.ping()
                time.sleep(0.05)
        event = drops.get()
        assert (event.instance_id, event.reason) == (1, livereg.Reason.STALLED)
        with pytest.raises(livereg.EvictedError):
            stuck.progress()
        # Counted once its handlers returned and its slot was freed, just
        # after the callback that delivered the event.
        deadline = time.monotonic() + 5
        while table.stats()["ended"]["stalled"] != 1:
            assert time.monotonic() < deadline, table.stats()["ended"]
            time.sleep(0.01)
        idle.deregister()


def test_the_reason_stub_gives_every_reason_its_value() -> None:
    """Reasons are made from the core crate's list at import; ``stubtest``
    (run by ``ffi/python/test``) checks every stub against the module but
    not an enum's values, which this does."""
    here = pathlib.Path(livereg.__file__).parent
    stub = ast.parse((here / "_reason.pyi").read_text())
    reason = next(node for node in stub.body if isinstance(node, ast.ClassDef) and node.name == "Reason")
    stubbed = [
        (statement.targets[0].id, statement.value.value)
        for statement in reason.body
        if isinstance(statement, ast.Assign)
        and isinstance(statement.targets[0], ast.Name)
        and isinstance(statement.value, ast.Constant)
    ]
    assert stubbed == [(r.name, r.value) for r in livereg.Reason]


def test_the_stamp_clock_is_chosen_at_creation_and_shown_in_status(make_table: MakeTable) -> None:
    # A 10 s timeout is hundreds of coarse ticks: "auto" stamps coarsely.
    coarse = make_table(reap_timeout=10.0).status()
    assert coarse.stamp_clock == "coarse"
    assert 0 < coarse.stamp_resolution_seconds <= 10.0 / 200
    precise = make_table(reap_timeout=10.0, clock="precise").status()
    assert precise.stamp_clock == "precise"
    assert precise.stamp_resolution_seconds == 0.0
    # Too short a timeout for the coarse clock's ticks, and a bad name.
    with pytest.raises(livereg.InvalidArgumentError, match="expected a timeout of at least"):
        make_table(reap_timeout=0.01, clock="coarse")
    with pytest.raises(livereg.InvalidArgumentError, match="expected \"auto\""):
        make_table(clock="sundial")


def test_each_error_is_also_the_builtin_it_is() -> None:
    """``except TimeoutError`` (or ``ValueError``, ``FileNotFoundError``…)
    catches the livereg error that is one, which stays a ``livereg.Error``."""
    pairs = [
        (livereg.DeadlineExceededError, TimeoutError),
        (livereg.InvalidArgumentError, ValueError),
        (livereg.PermissionDeniedError, PermissionError),
        (livereg.NotFoundError, FileNotFoundError),
        (livereg.ExistsError, FileExistsError),
        (livereg.SystemCallError, OSError),
    ]
    for error, builtin in pairs:
        assert issubclass(error, livereg.Error) and issubclass(error, builtin), error
        assert error.__module__ == "livereg" and error.__doc__
    with pytest.raises(FileNotFoundError) as missing:
        livereg.open(f"livereg-never-created-{os.getpid()}")
    assert isinstance(missing.value, livereg.NotFoundError)
    assert missing.value.code == livereg.NotFoundError.code
    assert "livereg-never-created" in str(missing.value)
    with pytest.raises(ValueError):
        livereg.create(f"livereg-bad-{os.getpid()}", capacity=0)
    assert not issubclass(livereg.EvictedError, OSError)


def test_star_import_leaves_the_builtin_open_alone_and_stats_are_typed(make_table: Any) -> None:
    namespace: Dict[str, Any] = {}
    exec("from livereg import *", namespace)
    assert "open" not in namespace and "connect" in namespace
    table = make_table()
    with table.register(5, label="typed"):
        stats = table.stats()
        assert stats["tracked_instances"] == 1 == stats.tracked_instances
        assert isinstance(stats, livereg.Stats)
        assert json.loads(json.dumps(stats))["capacity"] == stats.capacity
        assert all(isinstance(reason, livereg.Reason) for reason in stats.ended) and sum(stats.ended.values()) == 0
        (row,) = table.status().registrations
        assert row.state is livereg.RegistrationState.LIVE
        assert json.dumps(row.state) == '"live"'  # a str, as the JSON says it
