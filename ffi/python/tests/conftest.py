"""Fixtures: every table has a unique name and is unlinked after its test."""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any, Callable, Iterator, List, Tuple

import pytest

import livereg

_names = itertools.count()

# The package under test must be the installed wheel, never the source tree.
assert "site-packages" in livereg.__file__, f"livereg imported from {livereg.__file__}"


def unique(tag: str) -> str:
    return f"livereg-pytest-{tag}-{os.getpid()}-{next(_names)}"


@pytest.fixture
def make_table(request: pytest.FixtureRequest) -> Iterator[Callable[..., livereg.Table]]:
    made: List[Tuple[str, livereg.Table]] = []

    def make(**options: Any) -> livereg.Table:
        name = unique(request.node.name[:40])
        options.setdefault("capacity", 8)
        table = livereg.create(name, **options)
        made.append((name, table))
        return table

    yield make
    for name, table in made:
        table.close()
        try:
            livereg.unlink(name)
        except livereg.NotFoundError:
            pass


def python_child(script: str, *args: str) -> List[str]:
    """argv for a child interpreter running ``script`` with this venv."""
    return [sys.executable, "-c", script, *args]
