"""A stalled engine that moves again is healthy at once, whether or not it
can register again: the stall report follows its steps, and a registration
refused by a full table is tried again with backoff, logged once."""

from __future__ import annotations

import faulthandler
import os
import threading
import time
from pathlib import Path
from typing import Callable, List

import pytest

import livereg
from livereg.lmcache import _stacks
from livereg.lmcache._health import engine_health
from livereg.lmcache._worker import WorkerLiveness


def _registered(table: livereg.Table, instance_id: int) -> bool:
    return any(r.instance_id == instance_id and r.state == "live" for r in table.status().registrations)


def _take_last_slot(table: livereg.Table) -> livereg.Worker:
    deadline = time.monotonic() + 30
    while True:
        try:
            return table.register(99, label="filler")
        except (livereg.FullError, livereg.BusyError):
            assert time.monotonic() < deadline, "the stalled engine's slot was never freed"
            time.sleep(0.05)


def test_an_engine_moving_again_is_healthy_while_a_full_table_refuses_it_and_registers_once_room_is_made(
    make_table: Callable[..., livereg.Table], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(_stacks.RUN_DIR_ENV, str(tmp_path))
    table = make_table(capacity=1, reap_timeout=0.4, progress_timeout=0.6)
    drops: List[livereg.DropEvent] = []
    reaper = table.start_reaper(drops.append)
    thread = threading.get_ident()
    path = tmp_path / f"stall-{os.getpid()}-{thread:x}.txt"
    file = open(path, "w+")
    faulthandler.register(_stacks.STACK_SIGNAL, file=file, all_threads=True, chain=False)
    told: List[str] = []
    liveness = WorkerLiveness(table, 37, label="engine", on_register=told.append, interval=0.05, steps=True,
                              stacks=_stacks.StallReport(_stacks.STACK_SIGNAL, str(path), thread, file))
    try:
        liveness.step_started()
        deadline = time.monotonic() + 30
        while not drops:
            assert time.monotonic() < deadline, "the busy engine without steps was never dropped"
            time.sleep(0.02)
        assert drops[0].reason == livereg.Reason.STALLED
        deadline = time.monotonic() + 10
        while engine_health()[0] != 503:  # the native beat thread's dump
            assert time.monotonic() < deadline, f"never reported stalled: {engine_health()}"
            time.sleep(0.02)
        filler = _take_last_slot(table)
        for _ in range(3):  # the engine moves: steps complete and begin, the table is full
            liveness.step_done()
            assert engine_health() == (200, {"status": "ok", "engine": _stacks.engine_key()}), \
                "a moving engine stayed reported stalled"
            liveness.step_started()
        assert not _registered(table, 37) and told == ["start"]
        refused = [r for r in caplog.records if "cannot register again" in r.getMessage()]
        assert len(refused) == 1 and "full" in refused[0].getMessage().lower(), [r.getMessage() for r in refused]
        filler.deregister()
        deadline = time.monotonic() + 30
        while not _registered(table, 37):  # tried again from the beat thread, no step needed
            assert time.monotonic() < deadline, "never registered again once the table had room"
            time.sleep(0.05)
        assert told == ["start", "moved again"]
        assert len([r for r in caplog.records if "cannot register again" in r.getMessage()]) == 1
        liveness.step_done()
        assert engine_health()[0] == 200
    finally:
        liveness.close()
        reaper.stop()
        faulthandler.unregister(_stacks.STACK_SIGNAL)
        file.close()
