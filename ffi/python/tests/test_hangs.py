"""A hung engine, in this package alone: beats from a native thread so that
a hang holding the GIL is judged by progress, the stacks of the moment in
stderr and a stall report the health route reads, and the engine plugin's
registration let go while it hangs and registered again when it moves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import livereg
from livereg.lmcache import _stacks, _steps
from livereg.lmcache._health import engine_health
from livereg.lmcache._worker import WorkerLiveness

from conftest import unique

#: A process that registers, beats natively, goes busy and hangs in
#: ``hang_here`` (a C call holding the GIL, or a sleep releasing it), then
#: says how its registration ended.
HANGING = textwrap.dedent(
    """
    import ctypes, json, sys, time, livereg
    from livereg.lmcache._stacks import stall_report
    table = livereg.open(sys.argv[1])
    worker = table.register(9, label="engine")
    report = stall_report()
    beats = worker.beat_in_background(0.05, stall_signal=report.signal, stall_report=report.path,
                                      step_thread=report.step_thread)
    print("hanging", flush=True)
    worker.set_busy(True)
    def hang_here():
        if sys.argv[2] == "gil":
            ctypes.PyDLL(None).sleep(int(sys.argv[3]))  # one C call, the GIL held
        else:
            time.sleep(int(sys.argv[3]))
    hang_here()
    try:
        worker.progress()
        print(json.dumps({"ended": None}), flush=True)
    except livereg.EvictedError as error:
        print(json.dumps({"ended": error.reason.name if error.reason else None}), flush=True)
    """
)


#: A table judging progress, and the drops of its reaper.
Judged = Tuple[livereg.Table, List[livereg.DropEvent]]


@pytest.fixture
def judged(make_table: Callable[..., livereg.Table]) -> Iterator[Judged]:
    """A table judging progress (0.6 s) with a reaper collecting drops."""
    table = make_table(reap_timeout=0.4, progress_timeout=0.6)
    drops: List[livereg.DropEvent] = []
    reaper = table.start_reaper(drops.append)
    yield table, drops
    reaper.stop()


@pytest.mark.parametrize("gil", ["gil", "nogil"])
def test_a_hang_with_or_without_the_gil_ends_stalled_with_the_hung_frame_in_stderr_and_the_report(
    judged: Judged, tmp_path: Path, gil: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, drops = judged
    monkeypatch.setenv(_stacks.RUN_DIR_ENV, str(tmp_path))
    env = {**os.environ, _stacks.RUN_DIR_ENV: str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", HANGING, table.name, gil, "4"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "hanging"
        deadline = time.monotonic() + 30
        while not drops:
            assert time.monotonic() < deadline, "the hung worker was never dropped"
            time.sleep(0.02)
        assert drops[0].reason == livereg.Reason.STALLED, drops[0]  # beating on: judged by progress
        status, body = _wait_health(503)
        assert body["stalled"][0]["pid"] == child.pid and "hang_here" in body["stalled"][0]["frame"], body
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert json.loads(out.splitlines()[-1]) == {"ended": "STALLED"}
    header = [line for line in err.splitlines() if line.startswith("livereg: instance 9")]
    assert len(header) == 1 and "its step hangs in" in header[0] and "hang_here" in header[0], err
    assert 'in hang_here' in err.split(header[0], 1)[1], "the stacks did not follow the header"
    assert engine_health()[0] == 200 and not list(tmp_path.iterdir()), "the child left its report"


def _wait_health(status: int, timeout: float = 10.0) -> Tuple[int, Dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        answer = engine_health()
        if answer[0] == status:
            return answer
        assert time.monotonic() < deadline, f"health stayed {answer}"
        time.sleep(0.05)


def test_the_hung_frame_is_the_step_threads_innermost() -> None:
    dump = ("Thread 0x00007f0000000002 (most recent call first):\n  File \"/a.py\", line 3 in wait\n\n"
            "Current thread 0x00007f0000000001 (most recent call first):\n  File \"/engine.py\", line 9 in forward\n"
            "  File \"/engine.py\", line 20 in step\n\n")
    assert _stacks.hung_frame(dump, 0x7F0000000001) == 'File "/engine.py", line 9 in forward'
    assert _stacks.hung_frame(dump, 0x7F0000000002) == 'File "/a.py", line 3 in wait'
    assert _stacks.hung_frame(dump, 0x7F0000000003) is None


def test_the_route_ignores_empty_reports_and_those_of_dead_processes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_stacks.RUN_DIR_ENV, str(tmp_path))
    (tmp_path / f"stall-{os.getpid()}-1.txt").write_text("")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f"stall-{int(dead.stdout)}-1.txt").write_text("Thread 0x0000000000000001 (most recent call first):\n")
    assert engine_health() == (200, {"status": "ok", "engine": _stacks.engine_key()})
    (tmp_path / f"stall-{os.getpid()}-1.txt").write_text(
        "Thread 0x0000000000000001 (most recent call first):\n  File \"/x.py\", line 1 in stuck\n\n")
    status, body = engine_health()
    assert status == 503 and body["stalled"][0]["frame"] == 'File "/x.py", line 1 in stuck', body
    assert "stalled, hung in" in body["reason"]


class Steps:
    """A WorkerLiveness judged by progress, stepped by hand."""

    def __init__(self, table: livereg.Table) -> None:
        self.told: List[str] = []
        self.liveness = WorkerLiveness(table, 31, label="engine", on_register=self.told.append,
                                       interval=0.05, steps=True)

    def registered(self, table: livereg.Table) -> bool:
        return any(r.instance_id == 31 and r.state == "live" for r in table.status().registrations)


def test_a_stalled_engine_stays_let_go_while_it_hangs_and_registers_again_before_its_next_step(
    judged: Judged
) -> None:
    table, drops = judged
    steps = Steps(table)
    try:
        steps.liveness.step_started()
        deadline = time.monotonic() + 30
        while not drops:
            assert time.monotonic() < deadline, "the busy engine without steps was never dropped"
            time.sleep(0.02)
        assert drops[0].reason == livereg.Reason.STALLED
        time.sleep(1.0)  # many beats of its Python thread: still let go
        assert not steps.registered(table) and steps.told == ["start"]
        steps.liveness.step_done()  # the hung step completes
        steps.liveness.step_started()  # the next one: registered again first
        assert steps.registered(table), "the next step went on without a registration"
        assert steps.told == ["start", "moved again"]
        steps.liveness.step_done()
    finally:
        steps.liveness.close()


def test_a_live_idle_engine_follows_its_scheduler_out_and_a_busy_one_is_judged_by_itself(
    judged: Judged
) -> None:
    table, drops = judged
    core = table.register(77, label="vllm-core k")
    follower = WorkerLiveness(table, 32, label="engine", interval=0.05, steps=True, follows="vllm-core k")
    busy = WorkerLiveness(table, 33, label="engine", interval=0.05, steps=True, follows="vllm-core k")
    try:
        busy.step_started()
        time.sleep(0.3)  # both saw the core live
        core.deregister()
        deadline = time.monotonic() + 10
        while not any(d.instance_id == 32 for d in drops):
            assert time.monotonic() < deadline, "the idle follower was not let go"
            time.sleep(0.02)
        assert [d.reason for d in drops if d.instance_id == 32] == [livereg.Reason.DEREGISTERED]
        assert any(r.instance_id == 33 and r.state == "live" for r in table.status().registrations)
        busy.step_done()
        follower.step_started()  # it moves again
        assert any(r.instance_id == 32 and r.state == "live" for r in table.status().registrations)
        follower.step_done()
    finally:
        follower.close()
        busy.close()


class FakeScheduler:
    def __init__(self) -> None:
        self.requests = 1

    def has_requests(self) -> bool:
        return self.requests > 0


def test_the_engine_cores_steps_mark_it_busy_count_steps_and_go_idle_with_no_request(
    judged: Judged, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, _ = judged
    liveness = WorkerLiveness(table, 34, label="engine", interval=0.05, steps=True)
    monkeypatch.setattr(_steps, "_core", liveness)
    monkeypatch.setattr(_steps, "_registrations", [])  # a worker's registration in this process gets none
    seen: List[Any] = []

    class EngineCore:
        def __init__(self) -> None:
            self.scheduler = FakeScheduler()

        def step(self) -> str:
            [row] = [r for r in table.status().registrations if r.instance_id == 34]
            seen.append(row.busy)
            self.scheduler.requests -= 1
            return "outputs"

    module = type(sys)("fake_core")
    module.EngineCore = EngineCore  # type: ignore[attr-defined]
    monkeypatch.setattr(_steps, "_core_failed", True)  # registered above
    _steps.wrap_engine_core(module)
    _steps.wrap_engine_core(module)  # wrapped once
    engine = EngineCore()
    engine.scheduler.requests = 2
    assert engine.step() == "outputs"
    [row] = [r for r in table.status().registrations if r.instance_id == 34]
    assert row.busy and row.progress_steps == 1, "a request remains: still busy"
    engine.step()
    [row] = [r for r in table.status().registrations if r.instance_id == 34]
    assert not row.busy and row.progress_steps == 2 and seen == [True, True]
    liveness.close()


def test_a_workers_step_is_its_execute_model_or_the_sampling_after_it(
    judged: Judged, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, _ = judged
    liveness = WorkerLiveness(table, 35, label="engine", interval=0.05, steps=True)
    monkeypatch.setattr(_steps, "_registrations", [liveness])

    class Worker:
        def sample_tokens(self, grammar: Any) -> str:
            return "sampled"

    class WorkerWrapperBase:
        def __init__(self, answer: Any) -> None:
            self.worker, self.answer = Worker(), answer

        def execute_model(self, scheduler_output: Any) -> Any:
            return self.answer

    module = type(sys)("fake_workers")
    module.WorkerWrapperBase = WorkerWrapperBase  # type: ignore[attr-defined]
    _steps.wrap_workers(module)

    def row() -> livereg.RegistrationStatus:
        found: livereg.RegistrationStatus = [r for r in table.status().registrations if r.instance_id == 35][0]
        return found

    assert WorkerWrapperBase("output").execute_model(None) == "output"
    assert not row().busy and row().progress_steps == 1
    sampling = WorkerWrapperBase(None)
    assert sampling.execute_model(None) is None
    assert row().busy and row().progress_steps == 1, "busy until its sampling"
    assert sampling.worker.sample_tokens(None) == "sampled"
    assert not row().busy and row().progress_steps == 2
    liveness.close()


def test_a_plain_worker_liveness_beats_only_from_python(make_table: Callable[..., livereg.Table]) -> None:
    # Without steps, nothing judges progress: a hang holding the GIL must
    # still end in silence (TIMEOUT), so no native beats.
    table = make_table(reap_timeout=0.4)
    liveness = WorkerLiveness(table, 36, interval=0.05)
    try:
        assert liveness._native is None
    finally:
        liveness.close()


def test_the_server_modules_progress_timeout_is_the_tables_and_is_checked(table_name: str) -> None:
    from livereg.lmcache._server_module import LiveregServerModule

    module = LiveregServerModule(None, [], {"table": table_name, "reap_timeout_seconds": 1,
                                            "progress_timeout_seconds": 3})
    try:
        assert module.table.progress_timeout == 3.0
        assert module.report_status()["livereg"]["progress_timeout_seconds"] == 3.0
    finally:
        module.close()
    with pytest.raises(ValueError, match="progress_timeout_seconds must be 0"):
        LiveregServerModule(None, [], {"table": unique("x"), "reap_timeout_seconds": 4,
                                       "progress_timeout_seconds": 0.5})


@pytest.fixture
def table_name() -> Iterator[str]:
    name = unique("hang")
    yield name
    try:
        livereg.unlink(name)
    except livereg.NotFoundError:
        pass


def test_engine_core_registrations_hold_nothing_in_the_servers_targets(make_table: Callable[..., livereg.Table]
                                                                        ) -> None:
    from livereg.lmcache._targets import live_registrations

    table = make_table()
    core = table.register(40, label="vllm-core abc")
    engine = table.register(41, label="lmcache-engine abc")
    assert set(live_registrations(table)) == {41}
    core.deregister()
    engine.deregister()




def test_reports_of_processes_that_are_gone_are_swept_by_the_next_one(tmp_path: Path) -> None:
    engines = tmp_path / "livereg-0"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    old = engines / "oldkey"
    old.mkdir(parents=True)
    (old / f"stall-{int(gone.stdout)}-1.txt").write_text("dump")
    live = engines / "livekey"
    live.mkdir()
    (live / f"stall-{os.getpid()}-1.txt").write_text("")
    _stacks._sweep(engines)
    assert not old.exists(), "a killed process's report (and its empty folder) stayed"
    assert (live / f"stall-{os.getpid()}-1.txt").exists(), "a live process's report was removed"


def test_steps_never_raise_into_the_engine_even_for_an_untracked_id(
    make_table: Callable[..., livereg.Table]
) -> None:
    table = make_table()
    untracked = WorkerLiveness(table, 0, steps=True)

    class Broken:
        def step_started(self) -> None:
            raise RuntimeError("broken")

        def step_done(self, busy: bool = False) -> None:
            raise RuntimeError("broken")

    registrations: List[Any] = [untracked, Broken()]
    _steps._started(registrations)
    _steps._done(registrations)


HAMMER = textwrap.dedent(
    """
    import sys, threading, time, livereg
    table = livereg.open(sys.argv[1])
    worker = table.register(50, label="engine")
    worker.set_busy(True)
    while True:  # stalled: the reaper ends it
        try:
            worker.ping()
        except livereg.EvictedError:
            break
        time.sleep(0.01)
    sys.setswitchinterval(1e-6)
    def hammer(call):
        for _ in range(3000):
            try:
                call()
            except livereg.EvictedError as error:
                assert error.reason == livereg.Reason.STALLED
    threads = [threading.Thread(target=hammer, args=(call,))
               for call in (worker.ping, worker.progress, worker.ping, worker.progress)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("done")
    """
)


def test_threads_hearing_a_stall_at_once_never_deadlock(judged: Judged) -> None:
    # Raising EvictedError with its reason runs Python code (the Reason
    # enum), where the interpreter may hand the GIL to another thread; the
    # handle's lock must not be held then, or a thread pinging the same
    # handle waits on the lock while holding the GIL, forever. (In a child:
    # a deadlock there fails this test instead of hanging it.)
    table, _ = judged
    try:
        done = subprocess.run([sys.executable, "-c", HAMMER, table.name], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("threads hearing the stall at once deadlocked on one handle")
    assert done.stdout.strip() == "done", done.stderr
