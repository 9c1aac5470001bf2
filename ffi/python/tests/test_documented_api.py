"""The package keeps its documented names: a program written against them
runs unchanged, every warning an error; spellings used only by builds
between releases still work for one release, and warn; the package says its
release and the library's."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from typing import Callable, Iterator

import pytest
from conftest import unique

import livereg

MakeTable = Callable[..., livereg.Table]

# Written against the documented API only (`timeout=` for every bounded
# wait, `drop_wait=` on register), as a user's program is.
DOCUMENTED_PROGRAM = """
import sys
import livereg

name, address = sys.argv[1], sys.argv[2]
cleared, dropped = [], []
table = livereg.create(name, capacity=8, reap_timeout=30.0)
try:
    with table.start_reaper(on_drop=lambda event: dropped.append(event.reason),
                            on_clear=lambda: cleared.append(1), listen=[address]):
        local = table.register(3, label="local", drop_wait=1.0)
        local.ping()
        table.clear(timeout=5)
        assert cleared == [1], cleared
        remote = livereg.connect(address, 7, timeout=2.0)
        remote.ping()
        remote.clear(timeout=5)
        assert cleared == [1, 1], cleared
        table.reset(timeout=5)
        assert sorted(dropped) == [livereg.Reason.CLEARED] * 2, dropped
        try:
            local.ping()
        except livereg.EvictedError:
            print("ran", flush=True)
finally:
    table.close()
    livereg.unlink(name)
"""


@pytest.fixture
def socket_address(request: pytest.FixtureRequest) -> Iterator[str]:
    path = f"/tmp/livereg-pytest-{os.getpid()}-{request.node.name[:30]}.sock"
    yield f"unix:{path}"
    if os.path.exists(path):
        os.unlink(path)


def test_a_program_written_against_the_documented_api_runs_unchanged(socket_address: str) -> None:
    name = unique("documented")
    try:
        run = subprocess.run(
            [sys.executable, "-W", "error", "-c", DOCUMENTED_PROGRAM, name, socket_address],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        try:
            livereg.unlink(name)
        except livereg.NotFoundError:
            pass
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ran\n"


def test_the_documented_keywords_are_in_the_signatures() -> None:
    import inspect

    assert "timeout" in inspect.signature(livereg.Table.clear).parameters
    assert "timeout" in inspect.signature(livereg.Table.reset).parameters
    assert "timeout" in inspect.signature(livereg.Worker.clear).parameters
    assert "timeout" in inspect.signature(livereg.Worker.reset).parameters
    assert "drop_wait" in inspect.signature(livereg.Table.register).parameters
    connect = inspect.signature(livereg.connect)
    assert list(connect.parameters)[:5] == ["address", "instance_id", "label", "token", "timeout"]
    assert connect.parameters["timeout"].default == 2.0


def test_the_spellings_of_builds_between_releases_still_work_and_warn(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=30.0)
    cleared = []
    with table.start_reaper(on_clear=lambda: cleared.append(1)):
        with pytest.warns(DeprecationWarning, match="use timeout="):
            table.clear(wait=5)
        assert cleared == [1]
        with pytest.warns(DeprecationWarning, match="use drop_wait="):
            worker = table.register(5, wait=1.0)
        with pytest.warns(DeprecationWarning, match="use timeout="):
            worker.clear(wait=5)
        assert cleared == [1, 1]
        with pytest.warns(DeprecationWarning, match="use timeout="):
            table.reset(wait=5)
        with pytest.raises(livereg.EvictedError):
            worker.ping()


def test_a_renamed_connect_timeout_still_bounds_the_connection_and_warns(socket_address: str) -> None:
    # Nothing listens there: refused at once, after the warning.
    with pytest.warns(DeprecationWarning, match="use timeout="):
        with pytest.raises(livereg.Error):
            livereg.connect(socket_address, 1, connect_timeout=0.5)
    with pytest.raises(livereg.InvalidArgumentError, match="timeout"):
        with pytest.warns(DeprecationWarning):
            livereg.connect(socket_address, 1, connect_timeout=float("nan"))


def test_one_value_under_both_names_is_refused(make_table: MakeTable, socket_address: str) -> None:
    table = make_table()
    with pytest.raises(TypeError, match="give timeout= only"):
        table.clear(timeout=1.0, wait=2.0)
    with pytest.raises(TypeError, match="give drop_wait= only"):
        table.register(9, drop_wait=1.0, wait=2.0)
    with pytest.raises(TypeError, match="give timeout= only"):
        livereg.connect(socket_address, 1, timeout=1.0, connect_timeout=2.0)


def test_the_package_says_its_release_and_the_library_s() -> None:
    assert livereg.__version__ == importlib.metadata.version("livereg")
    assert re.fullmatch(r"\d+\.\d+\.\d+(\S*)", livereg.native_version())
    # Released together: a wheel of one release holds the library of the
    # same release.
    assert livereg.native_version() == livereg.__version__
    assert "native_version" in getattr(livereg, "__all__")
