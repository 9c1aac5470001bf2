"""Running LMCache's real multiprocess server and engines built from its
own worker code, as subprocesses, for the integration tests."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import pytest
from shm_left import Tree, engine_made, referenced, referenced_by_anyone, remove

import livereg

HERE = Path(__file__).resolve().parent
#: Set by ``ffi/python/test-lmcache`` to the 0.5.2 package, for its swap test.
LMCACHE_052 = os.environ.get("LIVEREG_LMCACHE_052_PATH")
_names = itertools.count()


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# CI ends this suite with SIGTERM when another stage failed beside it: torn
# down as on Ctrl-C (every fixture's end runs: tables unlinked, engine trees
# ended), never cut off with its tables left in /dev/shm.
signal.signal(signal.SIGTERM, _interrupted)


def unique(tag: str) -> str:
    return f"livereg-lmcache-{tag}-{os.getpid()}-{next(_names)}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """LMCache's server (``lmcache_server.py``) on ``port``: the ids its
    transfer modules hold, as reported, with when they changed."""

    def __init__(self, port: int, table: str, module: Optional[Dict[str, Any]] = None, swap: bool = False,
                 timeout: float = 30.0, python_path: Optional[str] = None) -> None:
        self.port, self.table = port, table
        args = [sys.executable, str(HERE / "lmcache_server.py"), *(["--swap"] if swap else []), "--",
                "--port", str(port), "--l1-size-gb", "0.1", "--eviction-policy", "LRU", "--chunk-size", "256",
                "--worker-reap-timeout-seconds", str(timeout), "--disable-observability"]
        if python_path is None:
            args += ["--supported-transfer-mode", "auto", "--worker-registration-grace-seconds", str(timeout)]
        if module is not None:
            args += ["--server-module", json.dumps({"module_path": "livereg.lmcache", "config": module})]
        env = dict(os.environ, LIVEREG_LMCACHE_TABLE=table)
        if python_path:
            env["PYTHONPATH"] = python_path
        before = engine_made()
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._tree = Tree(self.process.pid, before)
        self._ended = False
        self.changes: List[Dict[str, Any]] = []
        self.replies: List[Dict[str, Any]] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for(lambda: any(r.get("ready") for r in self.replies), 120, "the server to start")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = json.loads(line)
            with self.changed:
                (self.changes if "ids" in record else self.replies).append(record)
                self.changed.notify_all()

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not check():
                left = deadline - time.monotonic()
                assert left > 0, f"waited {timeout}s for {what}; server saw {self.changes[-3:]}"
                assert self.process.poll() is None, f"the server exited ({self.process.returncode})"
                self.changed.wait(min(left, 0.1))

    def holds(self, instance_id: int) -> bool:
        with self.changed:
            return bool(self.changes) and instance_id in self.changes[-1]["ids"]

    def wait_held(self, instance_id: int, timeout: float = 60.0) -> float:
        """When the server began holding ``instance_id`` (waiting for it)."""
        self.wait_for(lambda: self.holds(instance_id), timeout, f"instance {instance_id} to be held")
        with self.changed:
            return self._since(instance_id, held=True)

    def wait_gone(self, instance_id: int, timeout: float) -> float:
        """When the server stopped holding ``instance_id`` (waiting for it)."""
        self.wait_for(lambda: not self.holds(instance_id), timeout, f"instance {instance_id} to be freed")
        with self.changed:
            return self._since(instance_id, held=False)

    def _since(self, instance_id: int, held: bool) -> float:
        """The time of the last change into the current state of the id."""
        since = self.changes[-1]["t"]
        for change in reversed(self.changes):
            if (instance_id in change["ids"]) != held:
                break
            since = change["t"]
        return float(since)

    def ask(self, command: str, timeout: float = 30.0) -> Dict[str, Any]:
        with self.changed:
            seen = len(self.replies)
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        self.wait_for(lambda: len(self.replies) > seen, timeout, f"an answer to {command!r}")
        with self.changed:
            return self.replies[seen]

    def kill(self) -> None:
        """SIGKILLs the server's processes and waits for each to end; what
        they held in /dev/shm that nothing else holds is removed (the
        server is no engine: nothing owns what it makes). Once: later
        calls do nothing."""
        if self._ended:
            return
        self._ended = True
        held = referenced(self._tree.pids()) & engine_made()
        self._tree.kill()
        self.process.wait()
        self._tree.wait_ended()
        remove(held - referenced_by_anyone())


class Engine:
    """An engine process (``lmcache_engine.py``) registered with ``server``.
    ``with_livereg`` (default: ``install``): whether livereg's plugin owns
    what it makes in /dev/shm; without, ``kill`` removes what it left."""

    def __init__(self, server: Server, instance_id: int, mode: str = "engine_driven", install: bool = True,
                 ping: Optional[float] = None, env: Optional[Dict[str, str]] = None,
                 prefix: Sequence[str] = (), stderr: bool = False, with_livereg: Optional[bool] = None) -> None:
        self.instance_id = instance_id
        self.with_livereg = install if with_livereg is None else with_livereg
        before = engine_made()
        # A file, not a pipe: LMCache logs freely, and a full pipe would stop the engine.
        self._stderr = tempfile.TemporaryFile("w+") if stderr else None
        args = [*prefix, sys.executable, str(HERE / "lmcache_engine.py"), str(server.port), str(instance_id), mode]
        args += ["--install"] if install else []
        args += ["--ping", str(ping)] if ping else []
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=self._stderr,
            env={**os.environ, "LIVEREG_LMCACHE_TABLE": server.table, **(env or {})},
        )
        self._tree = Tree(self.process.pid, before)
        self._ended = False
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.strip() == "registered", f"engine {instance_id} printed {line!r} (exit {self.process.poll()})"
        server.wait_held(instance_id, 30)

    def signal(self, number: int) -> float:
        """Sends ``number``; returns when (monotonic)."""
        now = time.monotonic()
        self.process.send_signal(number)
        return now

    def stderr_lines(self, containing: str) -> List[str]:
        """Lines of the engine's stderr with ``containing`` (once it ended;
        started with ``stderr=True``)."""
        assert self._stderr is not None and self.process.poll() is not None
        self._stderr.seek(0)
        return [line for line in self._stderr.read().splitlines() if containing in line]

    def unregister(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("unregister\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "unregistered"

    def kill(self) -> None:
        """SIGKILLs the engine's processes, waits for each to end (while
        the server's reaper still runs), then for what it made in /dev/shm
        to be gone (removed by the reaper, or here without livereg). Once:
        later calls do nothing."""
        if self._ended:
            return
        self._ended = True
        self._tree.kill()
        self.process.wait()
        self._tree.wait_ended()
        self._tree.settle(owned=self.with_livereg)


@contextlib.contextmanager
def module_server(tag: str, config: Dict[str, Any], timeout: float = 30.0) -> Iterator[Server]:
    """LMCache's server with livereg's server module on a table of its own
    (``config`` without ``table``), killed and its table removed after."""
    table = unique(tag)
    started = Server(free_port(), table, module={"table": table, **config}, timeout=timeout)
    try:
        yield started
    finally:
        started.kill()
        try:
            livereg.unlink(table)
        except livereg.NotFoundError:
            pass


@pytest.fixture
def table_name() -> Iterator[str]:
    name = unique("table")
    yield name
    try:
        livereg.unlink(name)
    except livereg.NotFoundError:
        pass


@pytest.fixture
def engines() -> Iterator[List[Engine]]:
    """Engines a test starts; each killed after it."""
    started: List[Engine] = []
    yield started
    for engine in started:
        engine.kill()
