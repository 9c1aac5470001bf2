"""The examples in ffi/examples and the README's Python quick start, run
against the installed package and checked with ``mypy --strict``."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import time
from typing import Callable, List

import pytest

import livereg

MakeTable = Callable[..., livereg.Table]
ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_engine_registers_again_after_eviction_and_a_server_restart(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=0.4, registration_grace=0.8)
    reaper = table.start_reaper()
    with subprocess.Popen(
        [sys.executable, str(ROOT / "ffi/examples/engine.py"), table.name, "5", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as engine:
        time.sleep(1.0)
        table.reset(timeout=5)
        time.sleep(1.0)
        reaper.stop()
        restarted = table.start_reaper()
        out, err = engine.communicate(timeout=20)
    restarted.stop()
    assert engine.returncode == 0, err.decode()
    lines = out.decode()
    for expected in ("registered (start)", "registered (after eviction)", "registered (reaper restarted)", "stopped"):
        assert expected in lines, lines


def readme_python_blocks() -> List[str]:
    """The blocks of the README's "Python" section (the quick start); other
    sections show fragments."""
    text = (ROOT / "README.md").read_text()
    text = text[text.index("\n## Python\n") :]
    text = text[: text.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(readme_python_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(readme_python_blocks())))
def test_a_readme_python_example_runs_and_passes_mypy_strict(index: int, tmp_path: pathlib.Path) -> None:
    source = tmp_path / f"readme_example_{index}.py"
    source.write_text(readme_python_blocks()[index])
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    ran = subprocess.run([sys.executable, str(source)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_the_examples_pass_mypy_strict() -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(ROOT / "ffi/examples/engine.py"),
         str(ROOT / "ffi/examples/kv_server.py")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_kv_server_example_frees_every_state_within_its_bound() -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "ffi/examples/kv_server.py"), "--timeout", "0.8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for expected in (
        "worker 1 (killed): freed after",
        "worker 4 (crashed before its first beat): freed after",
        "worker 2 (stopped): freed after",
        "worker 3 (idle but alive) after 1.6s, two timeouts: kept",
        "clear: stored cache emptied, worker 3's state kept",
        "worker 3 registered again by itself (told: server restarted)",
        "all state freed within its bound",
    ):
        assert expected in ran.stdout, ran.stdout
    assert "VIOLATED" not in ran.stdout


def test_the_kv_server_example_with_isolated_engines_frees_every_state_within_its_bound() -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "ffi/examples/kv_server.py"), "--timeout", "0.8", "--isolated"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for expected in (
        "worker 1 (killed): freed after",
        "worker 4 (crashed before its first beat): freed after",
        "worker 2 (stopped): freed after",
        "worker 3 (idle but alive) after 1.6s, two timeouts: kept",
        "worker 3 kept its registration and state through the restart",
        "all state freed within its bound",
    ):
        assert expected in ran.stdout, ran.stdout
    assert "VIOLATED" not in ran.stdout
