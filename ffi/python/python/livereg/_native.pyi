"""Types of the native extension module (re-exported by ``livereg``)."""

import os
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple, TypedDict, Union, final, type_check_only

from typing_extensions import Unpack

from livereg._reason import Reason
from livereg._status import ReaperState, Stats, Status

__version__: str
INFO_MAX: int
_REASONS: List[Tuple[str, int]]
LABEL_MAX: int
BEATS_PER_TIMEOUT: int
DEFAULT_REGISTRATION_GRACE: float

@type_check_only
class ServeOptions(TypedDict, total=False):
    """What a reaper's listeners are given (``start_reaper``,
    ``acquire_reaper``): addresses, the token they require, TLS files."""

    listen: Sequence[str]
    token: Optional[Union[str, bytes]]
    tls_cert: Optional[str]
    tls_key: Optional[str]
    tls_client_ca: Optional[str]

class Error(Exception):
    code: int

class EvictedError(Error):
    reason: Optional[Reason]

class FullError(Error):
    capacity: Optional[int]

class ExistsError(Error, FileExistsError):
    registered: Optional[tuple[int, int]]

class NotFoundError(Error, FileNotFoundError): ...
class InvalidArgumentError(Error, ValueError): ...
class IncompatibleError(Error): ...
class CorruptError(Error): ...
class PermissionDeniedError(Error, PermissionError): ...
class DeadlineExceededError(Error, TimeoutError): ...
class NoReaperError(Error): ...
class BusyError(Error):
    pending_drop: Optional[int]

class SystemCallError(Error, OSError): ...
class PanicError(Error): ...

@final
class DropEvent:
    @property
    def instance_id(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def registered_ns(self) -> int: ...
    @property
    def last_heartbeat_ns(self) -> Optional[int]: ...
    @property
    def silent_ns(self) -> int: ...
    @property
    def remote(self) -> bool: ...
    @property
    def dying(self) -> bool: ...
    @property
    def reason(self) -> Reason: ...

@final
class BeatThread:
    def stop(self) -> None: ...

@final
class BusyScope:
    def __enter__(self) -> "Worker": ...
    def __exit__(self, *exc: object) -> None: ...

@final
class Worker:
    @property
    def instance_id(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def remote(self) -> bool: ...
    @property
    def reap_timeout(self) -> float: ...
    @property
    def reaper_state(self) -> ReaperState: ...
    def wait_reaper_state(self, known: ReaperState, timeout: float) -> ReaperState: ...
    def info(self) -> bytes: ...
    def ping(self) -> None: ...
    def progress(self) -> None: ...
    def set_busy(self, busy: bool) -> None: ...
    def busy(self) -> BusyScope: ...
    def beat_in_background(
        self,
        interval: float,
        stall_signal: Optional[int] = None,
        stall_report: Optional[str] = None,
        step_thread: Optional[int] = None,
    ) -> BeatThread: ...
    def clear(self, timeout: float = 5.0, *, wait: Optional[float] = None) -> None:
        """``wait=`` is deprecated (the name of builds between releases): use ``timeout=``."""
    def reset(self, timeout: float = 5.0, *, wait: Optional[float] = None) -> None:
        """``wait=`` is deprecated (the name of builds between releases): use ``timeout=``."""
    def deregister(self) -> None: ...
    def __enter__(self) -> "Worker": ...
    def __exit__(self, *exc: object) -> None: ...

@final
class Reaper:
    def stop(self) -> None: ...
    def check(self) -> bool: ...
    def __enter__(self) -> "Reaper": ...
    def __exit__(self, *exc: object) -> None: ...

@final
class DrivenReaper:
    def fileno(self) -> int: ...
    def next_scan_in(self) -> float: ...
    def scan(self) -> List[DropEvent]: ...
    def scan_all(self) -> List[DropEvent]: ...
    def stop(self) -> None: ...
    @property
    def stopped(self) -> bool: ...
    def events(self) -> AsyncIterator[DropEvent]: ...
    def __enter__(self) -> "DrivenReaper": ...
    def __exit__(self, *exc: object) -> None: ...

@final
class Table:
    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def reap_timeout(self) -> float: ...
    @property
    def registration_grace(self) -> float: ...
    @property
    def progress_timeout(self) -> float: ...
    def register(
        self,
        instance_id: int,
        label: Optional[str] = None,
        replace: bool = False,
        drop_wait: Optional[float] = None,
        *,
        wait: Optional[float] = None,
    ) -> Worker:
        """``wait=`` is deprecated (the name of builds between releases): use ``drop_wait=``."""
    def clear(self, timeout: float = 5.0, *, wait: Optional[float] = None) -> None:
        """``wait=`` is deprecated (the name of builds between releases): use ``timeout=``."""
    def reset(self, timeout: float = 5.0, *, wait: Optional[float] = None) -> None:
        """``wait=`` is deprecated (the name of builds between releases): use ``timeout=``."""
    def probe(self) -> Optional[int]: ...
    @property
    def reaper_state(self) -> ReaperState: ...
    def wait_reaper_state(self, known: ReaperState, timeout: float) -> ReaperState: ...
    def own_file(self, path: Union[str, "os.PathLike[str]"]) -> None: ...
    def disown_file(self, path: Union[str, "os.PathLike[str]"]) -> bool: ...
    def status(self) -> Status: ...
    def stats(self) -> Stats: ...
    def metrics_text(self) -> str: ...
    def set_info(self, value: Union[bytes, str]) -> None: ...
    def info(self) -> bytes: ...
    def start_reaper(
        self,
        on_drop: Optional[Callable[[DropEvent], object]] = None,
        on_clear: Optional[Callable[[], object]] = None,
        on_dying: Optional[Callable[[DropEvent], object]] = None,
        **serving: Unpack[ServeOptions],
    ) -> Reaper: ...
    def acquire_reaper(
        self,
        on_drop: Optional[Callable[[DropEvent], object]] = None,
        on_clear: Optional[Callable[[], object]] = None,
        on_dying: Optional[Callable[[DropEvent], object]] = None,
        **serving: Unpack[ServeOptions],
    ) -> DrivenReaper: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Table": ...
    def __exit__(self, *exc: object) -> None: ...

def create(
    name: str,
    capacity: int = 256,
    reap_timeout: float = 10.0,
    registration_grace: Optional[float] = None,
    mode: int = 0o600,
    progress_timeout: float = 0.0,
    clock: str = "auto",
    owned_dirs: Optional[Sequence[Union[str, "os.PathLike[str]"]]] = None,
) -> Table: ...
def open(name: str) -> Table: ...
def unlink(name: str) -> None: ...
def connect(
    address: str,
    instance_id: int,
    label: str = "",
    token: Optional[Union[str, bytes]] = None,
    timeout: float = 2.0,
    tls_ca: Optional[str] = None,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    *,
    connect_timeout: Optional[float] = None,
) -> Worker:
    """``connect_timeout=`` is deprecated (the name of builds between releases): use ``timeout=``."""


def native_version() -> str:
    """The release of the livereg library compiled into this package
    (``"0.1.0"``): what the C library of that release reports."""

def remote_status(
    address: str,
    instance_id: Optional[int] = None,
    token: Optional[Union[str, bytes]] = None,
    timeout: float = 2.0,
    tls_ca: Optional[str] = None,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
) -> Status:
    """The status of the table behind the listener at ``address``, as
    :meth:`Table.status` returns it, with only the registrations of
    ``instance_id`` (none for ``None`` or 0): asked over a connection of its
    own that registers nothing, bounded by ``timeout`` seconds; ``token``
    and the TLS files as :func:`connect` takes them. Raises as
    :func:`connect` for the connection (``InvalidArgumentError``: a bad
    address or timeout; ``PermissionDeniedError``: a refused token or TLS
    handshake; ``DeadlineExceededError``: no answer in time;
    ``SystemCallError``: a failed connection) and ``IncompatibleError`` for
    an answer that is not a status."""

def is_address(name: str) -> bool:
    """Whether ``name`` is a session address (``unix:``, ``tcp://``,
    ``tls://``) rather than a table's name."""

def read_token_file(path: Union[str, "os.PathLike[str]"]) -> bytes:
    """The token in the file at ``path``: its first line, with the
    whitespace around it removed, as every livereg client reads a token
    file. Raises ``PermissionDeniedError`` if others can read the file,
    ``InvalidArgumentError`` for an empty first line or a token over 256
    bytes, ``NotFoundError`` for a missing file."""

def _stop_reapers_at_exit() -> None:
    """Stops every reaper of this process (registered with ``atexit``)."""
