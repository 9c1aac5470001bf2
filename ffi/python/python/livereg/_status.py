"""``Table.status()``: a table's snapshot as typed objects.

``Status`` has every key of ``livereg status --json`` as an attribute, with
``ended`` keyed by :class:`livereg.Reason` and ``registrations`` a list of
:class:`RegistrationStatus`. Absent facts are ``None`` (a reaper that never
ran has no heartbeat age; another time namespace's stamps have no age here).
``Table.stats()`` is a :class:`Stats`: the same snapshot without the
registrations, a ``dict`` (what a health endpoint returns as JSON) whose
keys are also typed attributes. The keys are the Rust ``Status``'s, checked
by the tests against ``livereg status --json``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, List, Mapping, Optional

from livereg._reason import Reason

__all__ = ["ReaperState", "RegistrationState", "RegistrationStatus", "Stats", "Status"]


class RegistrationState(str, enum.Enum):
    """Where an occupied slot's registration stands (equal to its name in
    ``livereg status --json``)."""

    #: Registered and not ended.
    LIVE = "live"
    #: Not ended, but its process has begun to exit (it runs no more of its
    #: code); ``ENDING`` once the reaper has seen it end.
    DYING = "dying"
    #: Ended; its drop is pending.
    ENDING = "ending"


@dataclasses.dataclass(frozen=True)
class ReaperState:
    """A table's reaper, as :attr:`Table.reaper_state` reads it: ``state``
    is ``"serving"`` (a reaper holds the table; its ``boot_token``, new at
    every start, and its ``pid``), ``"dying"`` (its process began to end:
    the kernel marked its life word at the very start of its exit; the
    dying reaper's token and pid) or ``"absent"`` (no reaper; both
    ``None``). Two states with the same token are the same reaper."""

    state: str
    boot_token: Optional[int] = None
    pid: Optional[int] = None

    @property
    def serving(self) -> bool:
        """Whether a reaper serves."""
        return self.state == "serving"


def _known(cls: Any, row: Mapping[str, Any]) -> Dict[str, Any]:
    """The keys of ``row`` that ``cls`` has fields for (newer keys are
    ignored, so an older package reads a newer library's snapshot)."""
    names = {field.name for field in dataclasses.fields(cls)}
    return {key: value for key, value in row.items() if key in names}


def _reason(name: Optional[str]) -> Optional[Reason]:
    return None if name is None else Reason[name.upper()]


@dataclasses.dataclass(frozen=True)
class RegistrationStatus:
    """One occupied slot."""

    slot: int
    generation: int
    instance_id: int
    label: str
    pid: int
    #: Live, or ending while its drop is pending (equal to ``"live"`` and
    #: ``"ending"``).
    state: RegistrationState
    ended_reason: Optional[Reason]
    heartbeats: int
    busy: bool
    progress_steps: int
    last_progress_age_seconds: Optional[float]
    last_heartbeat_age_seconds: Optional[float]
    registered_age_seconds: Optional[float]
    #: ``"pidfd+lock"``, ``"lock"``, ``"connection"`` (a session) or ``"none"``.
    exit_detection: str
    #: Whether its process's death word speaks for it (its death is seen as
    #: it begins: ``DYING``); absent from the JSON, so ``False``, otherwise.
    death_word: bool = False
    #: For a session's registration: ``{"peer": ..., "host": ...,
    #: "connected": ...}``, the connection's peer as the listener saw it, the
    #: host the client reported, and whether the running reaper holds its
    #: connection; ``None`` for a registration in the table.
    remote: Optional[Dict[str, Any]] = None

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> "RegistrationStatus":
        fields = _known(cls, row)
        fields["ended_reason"] = _reason(fields.get("ended_reason"))
        fields["state"] = RegistrationState(fields["state"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class Status:
    """A snapshot of a table: its settings, its reaper, what ended, and every
    registration."""

    table: str
    enabled: bool
    reap_timeout_seconds: float
    registration_grace_seconds: float
    scan_interval_seconds: float
    progress_timeout_seconds: float
    stamp_clock: str
    stamp_resolution_seconds: float
    tracked_instances: int
    capacity: int
    reaper_alive: bool
    reaper_stalled: bool
    reaper_pid: int
    boot_token: int
    reaper_heartbeat_age_seconds: Optional[float]
    scans: int
    last_scan_seconds: float
    ended: Dict[Reason, int]
    ended_total: int
    handler_failures: int
    handlers_overdue: int
    corrupt_slots: int
    clears_requested: int
    clears_completed: int
    registrations: List[RegistrationStatus]
    #: The files processes own (``Table.own_file``), removed once they have
    #: ended: ``{"dirs": [...], "owners": [{"pid", "files", "bytes",
    #: "held_bytes"}], "removed_total", "freed_bytes_total",
    #: "refused_total"}``; ``None`` for a table made by an earlier build.
    owned_files: Optional[Dict[str, Any]] = None

    @classmethod
    def from_dict(cls, snapshot: Mapping[str, Any]) -> "Status":
        fields = _known(cls, snapshot)
        fields["ended"] = {Reason[name.upper()]: count for name, count in snapshot["ended"].items()}
        fields["registrations"] = [RegistrationStatus.from_dict(row) for row in snapshot["registrations"]]
        return cls(**fields)


class Stats(Dict[str, Any]):
    """``Table.stats()``: the table's snapshot without its registrations, as
    the dict it always was (``stats["tracked_instances"]``, JSON as it is)
    with typed attributes (``stats.tracked_instances``; ``stats.ended`` keyed
    by :class:`livereg.Reason`)."""

    @property
    def table(self) -> str:
        return str(self["table"])

    @property
    def enabled(self) -> bool:
        return bool(self["enabled"])

    @property
    def capacity(self) -> int:
        return int(self["capacity"])

    @property
    def tracked_instances(self) -> int:
        return int(self["tracked_instances"])

    @property
    def reap_timeout_seconds(self) -> float:
        return float(self["reap_timeout_seconds"])

    @property
    def registration_grace_seconds(self) -> float:
        return float(self["registration_grace_seconds"])

    @property
    def reaper_alive(self) -> bool:
        return bool(self["reaper_alive"])

    @property
    def reaper_stalled(self) -> bool:
        return bool(self["reaper_stalled"])

    @property
    def reaper_pid(self) -> int:
        return int(self["reaper_pid"])

    @property
    def boot_token(self) -> int:
        return int(self["boot_token"])

    @property
    def scans(self) -> int:
        return int(self["scans"])

    @property
    def ended(self) -> Dict[Reason, int]:
        return {Reason[name.upper()]: count for name, count in self["ended"].items()}

    @property
    def ended_total(self) -> int:
        return int(self["ended_total"])

    @property
    def handler_failures(self) -> int:
        return int(self["handler_failures"])

    @property
    def handlers_overdue(self) -> int:
        return int(self["handlers_overdue"])

    @property
    def clears_requested(self) -> int:
        return int(self["clears_requested"])

    @property
    def clears_completed(self) -> int:
        return int(self["clears_completed"])
