"""Where stall reports live: a directory no other local user can make first
or swap, never a link followed; and where none can be kept, the health
route says the engine's state is unknown (503), never healthy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import livereg
from livereg.lmcache import _run_dir, _stacks
from livereg.lmcache._health import engine_health

from conftest import unique

#: Another local user.
OTHER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

#: An engine's process: registers, makes its stall report (says whether it
#: could), beats natively, goes busy and hangs.
HANGING = textwrap.dedent(
    """
    import sys, time, livereg
    from livereg.lmcache._stacks import stall_report
    table = livereg.open(sys.argv[1])
    worker = table.register(int(sys.argv[2]), label="engine")
    report = stall_report()
    beats = worker.beat_in_background(0.05, stall_signal=report.signal if report else None,
                                      stall_report=report.path if report else None,
                                      step_thread=report.step_thread if report else None)
    print("reported" if report else "unreported", flush=True)
    worker.set_busy(True)
    time.sleep(120)
    """
)


@pytest.fixture
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``<tmp>`` as /tmp is (world-writable, sticky) that every user
    reaches, for this process and its children; no runtime dir, no named run
    dir, an engine key of its own. (After ``tmp_path``: pytest's own
    folders stay where they were.)"""
    folder = Path(tempfile.mkdtemp(prefix="livereg-pytest-tmp-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv(_stacks.RUN_DIR_ENV, raising=False)
    monkeypatch.setenv(_stacks.ENGINE_ENV, unique("key").replace("-", ""))
    yield folder
    shutil.rmtree(folder)  # (removes links, never what they point to)


def as_other(*argv: str) -> None:
    subprocess.run([*OTHER, *argv], check=True)


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def _plant(kind: str, engines: Path, victim: Path) -> None:
    """Another user makes the engines' folder first."""
    if kind == "file":
        as_other("touch", str(engines))
    elif kind == "link":
        as_other("ln", "-s", str(victim), str(engines))
    elif kind == "open dir":
        as_other("mkdir", "-m", "0777", str(engines))
    elif kind == "their dir":
        as_other("mkdir", "-m", "0700", str(engines))


def _wait_health(want: int, key: str, timeout: float = 10.0) -> Tuple[int, Dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        answer = engine_health(key)
        if answer[0] == want:
            return answer
        assert time.monotonic() < deadline, f"health stayed {answer}"
        time.sleep(0.05)


@pytest.mark.parametrize("planted", ["nothing", "file", "link", "open dir", "their dir"])
def test_a_folder_another_user_made_first_makes_the_route_say_unknown_never_healthy_while_stalled(
    make_table: Callable[..., livereg.Table], shared_tmp: Path, tmp_path: Path, planted: str
) -> None:
    table = make_table(reap_timeout=0.4, progress_timeout=0.6)
    drops: List[livereg.DropEvent] = []
    reaper = table.start_reaper(drops.append)
    key = os.environ[_stacks.ENGINE_ENV]
    engines = shared_tmp / f"livereg-{os.getuid()}"
    # The engine's user's own folder the link leads to, holding a gone
    # process's report: nothing in it may be read, removed or written.
    victim = tmp_path / "victim"
    (victim / "oldkey").mkdir(parents=True)
    victim.chmod(0o700)
    swept = victim / "oldkey" / f"stall-{_dead_pid()}-1.txt"
    swept.write_text("a gone process's report")
    _plant(planted, engines, victim)
    child = subprocess.Popen([sys.executable, "-c", HANGING, table.name, "21"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        said = child.stdout.readline().strip()
        deadline = time.monotonic() + 30
        while not drops:
            assert time.monotonic() < deadline, "the hung engine was never dropped"
            time.sleep(0.02)
        assert drops[0].reason == livereg.Reason.STALLED
        if planted == "nothing":  # the control: seen stalled
            assert said == "reported"
            status, body = _wait_health(503, key)
            assert body["status"] == "stalled" and body["stalled"][0]["pid"] == child.pid, body
        else:
            assert said == "unreported", f"the engine kept its report in a folder {planted!r} another user made"
            time.sleep(0.5)  # a report, had one been made, is dumped by now
            status, body = engine_health(key)
            assert status == 503 and body["status"] == "unknown", (status, body)
            assert str(engines) in str(body["reason"]) and "stall state unknown" in str(body["reason"]), body
    finally:
        child.kill()
        child.wait()
        reaper.stop()
    assert swept.read_text() == "a gone process's report", "the sweep went through the planted link"
    assert sorted(p.name for p in victim.iterdir()) == ["oldkey"], "something was written through the link"
    if planted in ("open dir", "their dir"):
        assert list(engines.iterdir()) == [], "the engine wrote into another user's folder"


def test_the_sweep_enters_no_linked_folder_and_removes_only_regular_files(tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    outside = tmp_path / "outside"
    outside.mkdir()
    dead = _dead_pid()
    theirs = outside / f"stall-{dead}-1.txt"
    theirs.write_text("the engine user's own file")
    kept = outside / "kept.txt"
    kept.write_text("the engine user's own file")
    engines.mkdir()
    (engines / "linked").symlink_to(outside)
    gone = engines / "gonekey"
    gone.mkdir()
    (gone / f"stall-{dead}-2.txt").symlink_to(kept)
    (gone / f"stall-{dead}-3.txt").write_text("a gone process's dump")
    _stacks._sweep(engines)
    assert theirs.read_text() == "the engine user's own file", "the sweep removed a file through a linked folder"
    assert kept.read_text() == "the engine user's own file"
    assert not (gone / f"stall-{dead}-3.txt").exists(), "a gone process's report stayed"
    assert (gone / f"stall-{dead}-2.txt").is_symlink(), "a link was taken for a report"


def test_the_route_reads_no_report_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv(_stacks.RUN_DIR_ENV, str(run))
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("Thread 0x0000000000000001 (most recent call first):\n  File \"/secret.py\", line 1 in x\n\n")
    (run / f"stall-{os.getpid()}-1.txt").symlink_to(elsewhere)
    status, body = engine_health()
    assert status == 200 and "secret" not in str(body), (status, body)


def test_a_process_that_cannot_make_its_report_makes_the_route_say_unknown_until_it_exits(
    make_table: Callable[..., livereg.Table], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    monkeypatch.setenv(_stacks.RUN_DIR_ENV, str(run))
    table = make_table()
    # SIGKILL: faulthandler cannot be registered for it.
    env = {**os.environ, "LIVEREG_LMCACHE_STACK_SIGNAL": "9"}
    child = subprocess.Popen([sys.executable, "-c", HANGING, table.name, "22"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "unreported"
        status, body = engine_health()
        assert status == 503 and body["status"] == "unknown", (status, body)
        [unreported] = body["unreported"]
        assert unreported["pid"] == child.pid and f"pid {child.pid}" in unreported["reason"], body
    finally:
        child.terminate()
        _, err = child.communicate(timeout=30)
    assert "no stall report can be made" in err, err
    assert engine_health()[0] == 200, "a killed process's word stayed"


@pytest.mark.parametrize("mode, used", [(0o700, True), (0o755, False)])
def test_the_runtime_dir_holds_the_engines_only_when_it_is_this_users_private_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int, used: bool
) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    runtime.chmod(mode)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    expected = runtime / "livereg" if used else Path(tempfile.gettempdir()) / f"livereg-{os.getuid()}"
    assert _run_dir.engines_dir() == expected


def test_a_named_run_dir_open_to_others_is_refused_with_what_was_found(tmp_path: Path) -> None:
    named = tmp_path / "named"
    named.mkdir()
    named.chmod(0o755)
    with pytest.raises(_run_dir.RunDirError, match=r"a directory of uid \d+, mode 0755: expected a directory"):
        _run_dir.private_dir(named)
