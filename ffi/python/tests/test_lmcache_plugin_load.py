"""The engine plugin as vLLM loads it in every process: importing
``livereg.lmcache`` and calling ``install()`` imports nothing of LMCache and
logs nothing; the transfer contexts are wrapped (once) when the process
itself imports them. Each case runs in a fresh interpreter, with a stand-in
``lmcache`` package where one is needed."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Dict

import pytest

import livereg

#: A stand-in for LMCache's transfer-context package: a base class and two
#: subclasses, one of them calling its base's ``register``.
TRANSFER_CONTEXT = '''
class TransferContext:
    def __init__(self, instance_id):
        self._instance_id = instance_id
    def register(self, *args):
        return "base"
    def unregister(self):
        return None
    def close(self):
        return None

class EngineDrivenTransferContext(TransferContext):
    def register(self, *args):
        return "engine:" + super().register(*args)

class LMCacheDrivenTransferContext(TransferContext):
    pass
'''

#: Prints what the process holds after the snippet ran, as JSON.
REPORT = '''
import json, logging, sys
def wrapped(cls, name):
    method = cls.__dict__.get(name)
    depth = 0
    while method is not None and hasattr(method, "__livereg_wrapped__"):
        method, depth = method.__livereg_wrapped__, depth + 1
    return depth
report = {"lmcache": sorted(m for m in sys.modules if m.split(".")[0] == "lmcache"),
          "torch": "torch" in sys.modules, "native": "livereg._native" in sys.modules}
tc = sys.modules.get("lmcache.v1.multiprocess.transfer_context")
if tc is not None:
    report["wrapped"] = {cls.__name__: {n: wrapped(cls, n) for n in ("register", "unregister", "close")}
                         for cls in (tc.TransferContext, tc.EngineDrivenTransferContext,
                                     tc.LMCacheDrivenTransferContext)}
print(json.dumps(report))
'''


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    package = tmp_path / "lmcache" / "v1" / "multiprocess" / "transfer_context"
    package.mkdir(parents=True)
    for folder in (tmp_path / "lmcache", tmp_path / "lmcache" / "v1", tmp_path / "lmcache" / "v1" / "multiprocess"):
        (folder / "__init__.py").write_text("")
    (package / "worker_transfer.py").write_text(TRANSFER_CONTEXT)
    (package / "__init__.py").write_text("from .worker_transfer import *  # noqa: F403\n"
                                         "from .worker_transfer import TransferContext, EngineDrivenTransferContext,"
                                         " LMCacheDrivenTransferContext\n")
    return tmp_path


def run(snippet: str, path: str = "") -> Dict[str, Any]:
    """Runs ``snippet`` (with every log record printed to stderr) then
    :data:`REPORT` in a fresh interpreter; its report and its stderr."""
    code = "import logging\nlogging.basicConfig(level=logging.DEBUG)\n" + textwrap.dedent(snippet) + REPORT
    env = {"PYTHONPATH": path, "LIVEREG_LMCACHE_TABLE": "livereg-plugin-load-no-such-table"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    report: Dict[str, Any] = json.loads(done.stdout)
    report["stderr"] = done.stderr
    return report


def test_loading_the_plugin_imports_no_lmcache_nor_torch_nor_the_native_module_and_logs_nothing(stand_in: Path) -> None:
    report = run("""
        import livereg.lmcache
        livereg.lmcache.install()
        livereg.lmcache.install()
    """, str(stand_in))
    assert report["lmcache"] == [] and not report["torch"] and not report["native"]
    assert report["stderr"] == ""


def test_the_transfer_contexts_are_wrapped_once_when_the_process_imports_them(stand_in: Path) -> None:
    report = run("""
        import livereg.lmcache
        livereg.lmcache.install()
        livereg.lmcache.install()
        from lmcache.v1.multiprocess.transfer_context import EngineDrivenTransferContext
        livereg.lmcache.install()
        assert EngineDrivenTransferContext(0).register() == "engine:base"
    """, str(stand_in))
    once = {"register": 1, "unregister": 1, "close": 1}
    assert report["wrapped"] == {
        "TransferContext": once,
        "EngineDrivenTransferContext": {"register": 1, "unregister": 0, "close": 0},
        "LMCacheDrivenTransferContext": {"register": 0, "unregister": 0, "close": 0},
    }


def test_transfer_contexts_imported_before_the_plugin_are_wrapped_at_once(stand_in: Path) -> None:
    report = run("""
        import lmcache.v1.multiprocess.transfer_context
        import livereg.lmcache
        livereg.lmcache.install()
        livereg.lmcache.install()
    """, str(stand_in))
    assert report["wrapped"]["TransferContext"] == {"register": 1, "unregister": 1, "close": 1}
    assert report["wrapped"]["EngineDrivenTransferContext"]["register"] == 1


def test_a_submodule_imported_first_still_wraps_every_context(stand_in: Path) -> None:
    report = run("""
        import livereg.lmcache
        livereg.lmcache.install()
        from lmcache.v1.multiprocess.transfer_context.worker_transfer import TransferContext
    """, str(stand_in))
    assert report["wrapped"]["EngineDrivenTransferContext"]["register"] == 1


def test_the_server_side_names_are_imported_only_when_asked_for() -> None:
    report = run("""
        import livereg.lmcache
        assert "livereg.lmcache._management" not in sys.modules
        assert callable(livereg.lmcache.build_server_modules)
        assert livereg.lmcache.PING_LABEL == "lmcache-ping"
        try:
            livereg.lmcache.no_such_name
        except AttributeError as error:
            assert "no_such_name" in str(error)
        else:
            raise AssertionError("no AttributeError")
    """.replace("import livereg.lmcache", "import sys, livereg.lmcache", 1))
    assert report["lmcache"] == []


def refuse_every_version(listener: socket.socket, stop: threading.Event) -> None:
    """A listener of a protocol nobody here speaks: answers every hello with
    an incompatible-version refusal, as a livereg listener words it."""
    listener.settimeout(0.1)
    while not stop.is_set():
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            continue
        with connection:
            connection.settimeout(5)
            try:
                length = struct.unpack(">I", connection.recv(4, socket.MSG_WAITALL))[0]
                body = connection.recv(length, socket.MSG_WAITALL)
            except (OSError, struct.error):
                continue
            version = struct.unpack(">H", body[1:3])[0]
            message = f"session protocol version {version}, this reaper speaks 9 to 9: upgrade the client".encode()
            refusal = bytes([130, 6]) + struct.pack(">H", len(message)) + message
            connection.sendall(struct.pack(">I", len(refusal)) + refusal)


def test_an_engine_whose_listener_speaks_no_version_of_ours_warns_once_and_runs(
    stand_in: Path, tmp_path: Path
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    serving = threading.Thread(target=refuse_every_version, args=(listener, stop), daemon=True)
    serving.start()
    token = tmp_path / "token"
    token.write_text("secret")
    token.chmod(0o600)
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    try:
        code = f"""
            import os
            os.environ["LIVEREG_LMCACHE_TABLE"] = "{address}"
            os.environ["LIVEREG_LMCACHE_TOKEN_FILE"] = "{token}"
            import livereg.lmcache
            livereg.lmcache.install()
            from lmcache.v1.multiprocess.transfer_context import EngineDrivenTransferContext
            assert EngineDrivenTransferContext(5).register() == "engine:base"
            assert EngineDrivenTransferContext(6).register() == "engine:base"
        """
        report = run(code, str(stand_in))
    finally:
        stop.set()
        serving.join()
        listener.close()
    warned = [line for line in report["stderr"].splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1, report["stderr"]
    assert "speaks a version this livereg cannot" in warned[0] and "upgrade" in warned[0], warned


def test_a_forked_engine_registers_as_itself_not_as_its_parents_engine(stand_in: Path) -> None:
    name = f"livereg-plugin-fork-{os.getpid()}"
    table = livereg.create(name, capacity=8, reap_timeout=5.0)
    try:
        code = f"""
            import os, time
            os.environ["LIVEREG_LMCACHE_TABLE"] = "{name}"
            import livereg, livereg.lmcache
            livereg.lmcache.install()
            from lmcache.v1.multiprocess.transfer_context import EngineDrivenTransferContext
            EngineDrivenTransferContext(5).register()
            child = os.fork()
            if child == 0:
                from livereg.lmcache import _engine
                inherited = dict(_engine._engines)
                EngineDrivenTransferContext(6).register()
                with livereg.open("{name}") as table:
                    mine = [r.instance_id for r in table.status().registrations if r.pid == os.getpid()]
                os._exit(0 if not inherited and mine == [6] else 1)
            _, status = os.waitpid(child, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
        """
        run(code, str(stand_in))
    finally:
        table.close()
        livereg.unlink(name)
