"""Fixtures: every table has a unique name and is unlinked after its test."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

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


def contained_python(script: str, *args: str, own_network: bool = False) -> "subprocess.Popen[str]":
    """A child interpreter running ``script`` in a container of its own
    (``unshare``: mount namespace with a private tmpfs on /dev/shm, PID and
    IPC namespaces, and a network namespace if ``own_network``), its
    stdout piped as text. It dies with ``unshare`` (``--kill-child``)."""
    namespaces = ["--mount", "--pid", "--ipc"] + (["--net"] if own_network else [])
    return subprocess.Popen(
        ["unshare", *namespaces, "--fork", "--kill-child", "sh", "-c",
         'mount -t tmpfs contained /dev/shm && exec "$0" "$@"', *python_child(script, *args)],
        stdout=subprocess.PIPE,
        text=True,
    )


def loopback_address(scheme: str) -> str:
    """``SCHEME://127.0.0.1:PORT`` on a port free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"{scheme}://127.0.0.1:{port}"


@pytest.fixture
def tls_files(tmp_path: Path) -> Dict[str, str]:
    """PEM files made by ``trustme``: ``ca.pem``, a listener's
    ``server.pem``/``server.key`` for 127.0.0.1 and localhost, a client's
    ``client.pem``/``client.key`` of the same CA, and ``other.pem``, a CA
    that signed none of them."""
    import trustme

    ca, other = trustme.CA(), trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("engine-7")
    files = {name: str(tmp_path / name) for name in
             ("ca.pem", "other.pem", "server.pem", "server.key", "client.pem", "client.key")}
    ca.cert_pem.write_to_path(files["ca.pem"])
    other.cert_pem.write_to_path(files["other.pem"])
    server.cert_chain_pems[0].write_to_path(files["server.pem"])
    server.private_key_pem.write_to_path(files["server.key"])
    client.cert_chain_pems[0].write_to_path(files["client.pem"])
    client.private_key_pem.write_to_path(files["client.key"])
    return files
