"""The engine plugin's own promises, in this process: the token file read as
every livereg client reads it, a replay never answered after the engine's
end, a context never bound to an engine ended meanwhile, a fork while a
lock of the plugin is held."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

import livereg
from livereg.lmcache import _engine

from conftest import loopback_address, unique


class Context:
    """A transfer context as the plugin sees one: an ``_instance_id`` and the
    three methods it wraps. Its calls go into ``calls``; a register after
    the first waits for ``gate``."""

    def __init__(self, instance_id: int, calls: List[str], gate: threading.Event) -> None:
        self._instance_id = instance_id
        self._calls, self._gate = calls, gate
        self._registers = 0

    def register(self) -> None:
        self._registers += 1
        if self._registers > 1:
            self._calls.append("replay sent")
            self._gate.wait(10)
            self._calls.append("replay answered")
        else:
            self._calls.append("register")

    def unregister(self) -> None:
        self._calls.append("unregister")

    def close(self) -> None:
        self._calls.append("close")


for _name, _wrap in (("register", _engine._wrap_register), ("unregister", _engine._wrap_end),
                     ("close", _engine._wrap_end)):
    setattr(Context, _name, _wrap(getattr(Context, _name)))


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[livereg.Table]:
    """A table with a reaper, named in ``LIVEREG_LMCACHE_TABLE``; the
    plugin's engines are forgotten after the test."""
    name = unique("plugin")
    table = livereg.create(name, capacity=8, reap_timeout=30.0)
    monkeypatch.setenv("LIVEREG_LMCACHE_TABLE", name)
    reaper = table.start_reaper()
    try:
        yield table
    finally:
        for engine in list(_engine._engines.values()):
            engine.close()
        _engine._engines.clear()
        reaper.stop()
        table.close()
        livereg.unlink(name)


def live_ids(table: livereg.Table) -> List[int]:
    return sorted(r.instance_id for r in table.status().registrations if r.state == livereg.RegistrationState.LIVE)


def test_a_replay_being_answered_is_waited_for_before_the_end_is_sent(served: livereg.Table) -> None:
    calls: List[str] = []
    gate = threading.Event()
    context = Context(41, calls, gate)
    context.register()
    engine = _engine._engines[41]
    engine._registered("evicted")  # the server lost the engine: a replay starts
    deadline = time.monotonic() + 5
    while "replay sent" not in calls:
        assert time.monotonic() < deadline, calls
        time.sleep(0.01)
    ending = threading.Thread(target=context.unregister)
    ending.start()
    time.sleep(0.3)
    assert "unregister" not in calls, "the end was sent while a replay waited for its answer"
    gate.set()
    ending.join(10)
    assert calls == ["register", "replay sent", "replay answered", "unregister"], calls
    assert 41 not in live_ids(served)


def test_no_replay_is_sent_once_the_end_began(served: livereg.Table) -> None:
    calls: List[str] = []
    context = Context(42, calls, threading.Event())
    context.register()
    engine = _engine._engines[42]
    engine.ending(context)  # as the wrapped unregister does before it asks the server
    engine._registered("evicted")
    time.sleep(0.3)
    assert calls == ["register"], calls


def test_a_context_registering_while_its_engine_ends_gets_a_live_engine(
    served: livereg.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: List[str] = []
    first = Context(43, calls, threading.Event())
    first.register()
    second = Context(43, calls, threading.Event())
    bind: Callable[..., None] = _engine._Engine.bind
    closing: List[threading.Thread] = []

    def bind_while_the_first_closes(engine: Any, context: Any, replay: Callable[[], object]) -> None:
        # The first context's close runs in full (or waits for this bind)
        # at the moment the second binds.
        if context is second and not closing:
            closing.append(threading.Thread(target=first.close))
            closing[0].start()
            closing[0].join(0.3)
        bind(engine, context, replay)

    monkeypatch.setattr(_engine._Engine, "bind", bind_while_the_first_closes)
    second.register()
    closing[0].join(10)
    engine = _engine._engines.get(43)
    assert engine is not None and engine.context is second, "the second context's engine was ended"
    assert 43 in live_ids(served)


def test_the_token_is_the_first_line_of_its_file_as_the_cli_reads_it(
    tmp_path: Path, make_table: Callable[..., livereg.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\nrotated-next: other\n")
    token.chmod(0o600)
    assert livereg.read_token_file(str(token)) == b"s3cret"
    table = make_table(reap_timeout=30.0)
    address = loopback_address("tcp")
    with table.start_reaper(listen=[address], token="s3cret"):
        monkeypatch.setenv("LIVEREG_LMCACHE_TABLE", address)
        monkeypatch.setenv("LIVEREG_LMCACHE_TOKEN_FILE", str(token))
        engine = _engine._start(44, object(), lambda: None)
        try:
            assert engine is not None and 44 in live_ids(table)
        finally:
            if engine is not None:
                engine.close()
            _engine._engines.clear()


def test_a_token_file_others_can_read_is_named_not_reported_as_a_silent_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    monkeypatch.setenv("LIVEREG_LMCACHE_TABLE", loopback_address("tcp"))
    monkeypatch.setenv("LIVEREG_LMCACHE_TOKEN_FILE", str(token))
    with caplog.at_level(logging.WARNING, logger="livereg.lmcache"):
        assert _engine._start(45, object(), lambda: None) is None
    warned = " ".join(record.getMessage() for record in caplog.records)
    assert "readable by everyone (mode 0644)" in warned and "did not answer" not in warned, warned


def test_a_child_forked_while_the_import_hook_is_locked_imports_freely() -> None:
    code = textwrap.dedent("""
        import os, sys, threading
        from livereg.lmcache import _on_import
        held, release = threading.Event(), threading.Event()
        def hold():
            with _on_import._lock:
                held.set()
                release.wait()
        threading.Thread(target=hold, daemon=True).start()
        held.wait()
        child = os.fork()
        if child == 0:
            seen = []
            _on_import.when_imported("colorsys", seen.append)
            import colorsys
            os._exit(0 if seen == [colorsys] else 1)
        release.set()
        _, status = os.waitpid(child, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    assert _run_bounded(code) == 0, "the forked child hung or failed at its first import"


def _run_bounded(code: str) -> int:
    """Runs ``code`` in a fresh interpreter; its exit code, or -1 if it did
    not end within 20 s (killed, with its process group)."""
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        return child.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 9)
        child.wait()
        return -1
