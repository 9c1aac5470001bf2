"""What the server and engine sides of ``livereg.lmcache`` agree on: the
table's name, which instance ids can be held, and what the server publishes
in the table's info area."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import threading
from typing import Any, Dict, Optional, Set

import livereg

logger = logging.getLogger("livereg.lmcache")

#: The table a server creates and its engines open, unless told otherwise.
DEFAULT_TABLE = "lmcache-workers"
#: The environment variable that names another table (or a listener's
#: address), on both sides.
TABLE_ENV = "LIVEREG_LMCACHE_TABLE"
#: The label (then a space and the engine key) of a vLLM EngineCore's own
#: registration: it holds no state in the server, whose targets never see it.
CORE_LABEL = "vllm-core"
#: The file holding a listener's token, for a ``tcp://``/``tls://`` address.
TOKEN_FILE_ENV = "LIVEREG_LMCACHE_TOKEN_FILE"
#: The CA that signed a ``tls://`` listener's certificate.
TLS_CA_ENV = "LIVEREG_LMCACHE_TLS_CA"
#: Instance ids a registration can have; 0 is the untracked prober's.
_ID_RANGE = range(1, 1 << 64)
#: Distinct untrackable ids logged; past this many, no more are.
_LOGGED_MAX = 1024


def default_table() -> str:
    """The table name both sides use: ``$LIVEREG_LMCACHE_TABLE``, else
    :data:`DEFAULT_TABLE`."""
    return os.environ.get(TABLE_ENV) or DEFAULT_TABLE


class Unaccepted:
    """Instance ids livereg cannot track, each logged once (the first
    :data:`_LOGGED_MAX` distinct ones)."""

    def __init__(self) -> None:
        self._logged: Set[object] = set()
        self._lock = threading.Lock()

    def check(self, instance_id: object, where: str) -> bool:
        """Whether ``instance_id`` can be tracked; if not, logs why once."""
        if isinstance(instance_id, int) and not isinstance(instance_id, bool) and instance_id in _ID_RANGE:
            return True
        if instance_id == 0:
            return False  # the untracked prober, as LMCache's sentinel
        with self._lock:
            # Bounded: a peer sending endless new bad ids cannot grow it.
            first = instance_id not in self._logged and len(self._logged) < _LOGGED_MAX
            if first:
                self._logged.add(instance_id)
        if first:
            logger.warning(
                "%s: instance id %r is not tracked (expected an int in 1..2**64-1); answered, nothing registered",
                where,
                instance_id,
            )
        return False


def server_info(ctx: Any) -> str:
    """The JSON a server publishes in its table's info area: a ``server``
    id new at every start (engines that see it change know the server's
    state for them is gone) and ``chunk_size`` when ``ctx`` has an int one
    (a context filled later, or a test double, publishes without it)."""
    info: Dict[str, Any] = {"server": secrets.token_hex(8)}
    chunk_size = getattr(ctx, "chunk_size", None)
    if isinstance(chunk_size, int) and not isinstance(chunk_size, bool):
        info["chunk_size"] = chunk_size
    return json.dumps(info)


def read_info(raw: bytes) -> Dict[str, Any]:
    """The server's info, ``{}`` when there is none or it is not ours."""
    if not raw:
        return {}
    try:
        info = json.loads(raw)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def create_or_reuse(
    name: str, capacity: int, timeout: float, grace: float, progress_timeout: float = 0.0
) -> livereg.Table:
    """Creates table ``name`` with these settings, or takes an existing one.

    An existing table with the same settings is opened. One with other
    settings (an operator changed the reap timeout) is replaced when nothing
    is registered in it and no reaper holds it, else reused with its own
    settings; the log says which.

    Raises :class:`livereg.BusyError` when a live reaper holds a table with
    other settings (another server runs on it)."""
    grace = max(grace, timeout)  # livereg needs grace >= timeout
    wanted = {
        "capacity": capacity, "reap_timeout": timeout, "registration_grace": grace,
        "progress_timeout": progress_timeout,
    }
    for _ in range(3):
        try:
            return livereg.create(
                name, capacity=capacity, reap_timeout=timeout, registration_grace=grace,
                progress_timeout=progress_timeout,
            )
        except livereg.ExistsError:
            pass
        try:
            table = livereg.open(name)
        except livereg.NotFoundError:
            continue  # removed in between: create it
        found = {
            "capacity": table.capacity,
            "reap_timeout": table.reap_timeout,
            "registration_grace": table.registration_grace,
            "progress_timeout": table.progress_timeout,
        }
        if all(abs(found[key] - wanted[key]) <= 1e-3 for key in wanted):
            return table
        stats = table.stats()
        if stats["reaper_alive"]:
            table.close()
            raise livereg.BusyError(
                f"table '{name}' has {found}, this server asks for {wanted}, and a live reaper holds it "
                f"(another server?): stop that one, or name another table"
            )
        live = sum(1 for r in table.status().registrations if r.state == "live")
        if live:
            logger.warning(
                "table '%s' has %s, this server asks for %s; %d engine(s) are registered in it, so it is "
                "reused with its own settings (remove it with `livereg rm %s` once they are gone to change them)",
                name, found, wanted, live, name,
            )
            return table
        table.close()
        try:
            livereg.unlink(name)
        except livereg.NotFoundError:
            pass
        logger.warning("table '%s' had %s and nothing registered: replaced with %s", name, found, wanted)
    raise livereg.BusyError(f"table '{name}' kept changing while this server opened it; try again")


def read_token_file(path: Optional[str]) -> Optional[bytes]:
    """The token in ``path``, or None without a path: read as every livereg
    client reads a token file (:func:`livereg.read_token_file`: its first
    line, trimmed; ``PermissionDeniedError`` if others can read it)."""
    return livereg.read_token_file(path) if path else None


def label_instance(label: str) -> int:
    """The instance id a registration known by its ``label`` takes (the
    EngineCore's): the same in every process of the engine, so that one that
    cannot read the table asks the listener about exactly that id. The
    first 63 bits of the label's SHA-256, never 0."""
    digest = hashlib.sha256(label.encode("utf-8")).digest()
    return (int.from_bytes(digest[:8], "big") >> 1) or 1
