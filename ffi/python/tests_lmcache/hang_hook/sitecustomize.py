"""Test-only: makes a real vLLM's step hang on demand (never shipped; put on
``PYTHONPATH`` by the hang tests, in every process of the engine).

``$LIVEREG_TEST_HANG_FILE`` names a file the test writes one word into:

- ``worker`` hangs the next ``VLLM::Worker`` forward in a sleep that
  releases the GIL, until the file changes;
- ``worker-gil:N`` hangs it once in one C call that holds the GIL for N
  seconds (the file is emptied first);
- ``core`` hangs the EngineCore's next scheduling with a request waiting,
  until the file changes.

Each hang writes ``hung <monotonic time>`` to ``$LIVEREG_TEST_HANG_FILE.at``
as it begins.
"""

import os

_FILE = os.environ.get("LIVEREG_TEST_HANG_FILE")


def _word() -> str:
    try:
        with open(_FILE) as file:  # type: ignore[arg-type]
            return file.read().strip()
    except OSError:
        return ""


def _mark() -> None:
    import time

    with open(f"{_FILE}.at", "w") as file:
        file.write(f"hung {time.monotonic()}\n")


def hang_here(where: str) -> None:
    """Hangs as the file says for ``where`` (``worker`` or ``core``)."""
    word = _word()
    if word == where:
        import time

        _mark()
        while _word() == word:
            time.sleep(0.05)
    elif where == "worker" and word.startswith("worker-gil:"):
        import ctypes

        with open(_FILE, "w"):  # type: ignore[arg-type]
            pass
        _mark()
        ctypes.PyDLL(None).sleep(int(word.split(":")[1]))  # libc's sleep, the GIL held throughout


def _wrap(cls: type, name: str, where: str) -> None:
    original = cls.__dict__[name]

    def hanging(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        hang_here(where)
        return original(self, *args, **kwargs)

    setattr(cls, name, hanging)


if _FILE:
    from livereg.lmcache._on_import import when_imported

    when_imported("vllm.v1.worker.gpu_worker", lambda module: _wrap(module.Worker, "execute_model", "worker"))
    when_imported("vllm.v1.core.sched.scheduler", lambda module: _wrap(module.Scheduler, "schedule", "core"))
