"""livereg for Python: a lock-free shared-memory liveness registry.

A thin ctypes layer over liblivereg (no compiler needed). The library is found
where ``LIVEREG_LIB`` points, else in the repository's ``target/release``
(after ``cargo build --release``), else by the system loader.

    import livereg

    table = livereg.open("workers")
    worker = table.register(3, label="gpu3")
    worker.ping()            # raises livereg.EvictedError once evicted
    worker.deregister()

Every failure raises a subclass of :class:`livereg.Error` carrying ``code``
(the C result) and the library's message.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import pathlib
import threading
from typing import Callable, Iterator, Optional

__all__ = [
    "Error", "EvictedError", "FullError", "ExistsError", "NotFoundError",
    "InvalidArgumentError", "IncompatibleError", "CorruptError",
    "PermissionError", "TimeoutError", "NoReaperError", "BusyError",
    "IOError", "PanicError", "Reason", "DropEvent", "Table", "Worker",
    "Reaper", "DrivenReaper", "create", "open", "unlink",
]


def _find_library() -> str:
    explicit = os.environ.get("LIVEREG_LIB")
    if explicit:
        return explicit
    here = pathlib.Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "target" / "release" / "liblivereg.so"
        if candidate.exists():
            return str(candidate)
    return "liblivereg.so"


_lib = ctypes.CDLL(_find_library())


class Error(Exception):
    """A livereg failure: ``code`` is the C result, the message says why."""

    code = -1

    def __init__(self, message: str, code: Optional[int] = None):
        super().__init__(message)
        if code is not None:
            self.code = code


def _error_class(name: str, code: int) -> type:
    return type(name, (Error,), {"code": code, "__doc__": f"LIVEREG result {code}."})


EvictedError = _error_class("EvictedError", 1)
FullError = _error_class("FullError", 2)
ExistsError = _error_class("ExistsError", 3)
NotFoundError = _error_class("NotFoundError", 4)
InvalidArgumentError = _error_class("InvalidArgumentError", 5)
IncompatibleError = _error_class("IncompatibleError", 6)
CorruptError = _error_class("CorruptError", 7)
PermissionError = _error_class("PermissionError", 8)  # noqa: A001 (livereg.PermissionError)
TimeoutError = _error_class("TimeoutError", 9)  # noqa: A001
NoReaperError = _error_class("NoReaperError", 10)
BusyError = _error_class("BusyError", 11)
IOError = _error_class("IOError", 12)  # noqa: A001
PanicError = _error_class("PanicError", 13)

_ERRORS = {cls.code: cls for cls in (
    EvictedError, FullError, ExistsError, NotFoundError, InvalidArgumentError,
    IncompatibleError, CorruptError, PermissionError, TimeoutError,
    NoReaperError, BusyError, IOError, PanicError)}


class Reason(enum.IntEnum):
    """Why a registration ended (values of ``livereg_reason``)."""

    TIMEOUT = 1
    GRACE = 2
    PROCESS_EXITED = 3
    DEREGISTERED = 4
    CLEARED = 5
    REPLACED = 6
    STALLED = 7


class _Options(ctypes.Structure):
    _fields_ = [("capacity", ctypes.c_uint32), ("mode", ctypes.c_uint32),
                ("reap_timeout_ms", ctypes.c_uint64), ("registration_grace_ms", ctypes.c_uint64),
                ("progress_timeout_ms", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _fields_ = [("capacity", ctypes.c_uint32), ("tracked_instances", ctypes.c_uint32),
                ("reaper_alive", ctypes.c_uint32), ("reaper_pid", ctypes.c_uint32),
                ("boot_token", ctypes.c_uint64), ("reap_timeout_ms", ctypes.c_uint64),
                ("registration_grace_ms", ctypes.c_uint64), ("ended_total", ctypes.c_uint64),
                ("ended_by_reason", ctypes.c_uint64 * (len(Reason) + 1)), ("handler_failures", ctypes.c_uint64),
                ("scans", ctypes.c_uint64)]


class _DropEvent(ctypes.Structure):
    _fields_ = [("instance_id", ctypes.c_uint64), ("slot", ctypes.c_uint32),
                ("generation", ctypes.c_uint32), ("reason", ctypes.c_int),
                ("pid", ctypes.c_uint32), ("registered_ns", ctypes.c_uint64),
                ("last_heartbeat_ns", ctypes.c_uint64), ("silent_ns", ctypes.c_uint64),
                ("label", ctypes.c_char * 48)]


_ON_DROP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_DropEvent))
_ON_CLEAR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Callbacks(ctypes.Structure):
    _fields_ = [("userdata", ctypes.c_void_p), ("on_drop", _ON_DROP), ("on_clear", _ON_CLEAR)]


_P = ctypes.c_void_p
_R = ctypes.c_int
for _name, _args, _ret in [
    ("livereg_options_default", [ctypes.POINTER(_Options)], None),
    ("livereg_create", [ctypes.c_char_p, ctypes.POINTER(_Options), ctypes.POINTER(_P)], _R),
    ("livereg_open", [ctypes.c_char_p, ctypes.POINTER(_P)], _R),
    ("livereg_close", [_P], None),
    ("livereg_unlink", [ctypes.c_char_p], _R),
    ("livereg_register", [_P, ctypes.c_uint64, ctypes.c_char_p, ctypes.POINTER(_P)], _R),
    ("livereg_ping", [_P], _R),
    ("livereg_progress", [_P], _R),
    ("livereg_set_busy", [_P, ctypes.c_int], _R),
    ("livereg_deregister", [_P], _R),
    ("livereg_clear", [_P, ctypes.c_uint64], _R),
    ("livereg_probe", [_P, ctypes.POINTER(ctypes.c_uint64)], _R),
    ("livereg_get_stats", [_P, ctypes.POINTER(_Stats)], _R),
    ("livereg_reaper_start", [_P, ctypes.POINTER(_Callbacks), ctypes.POINTER(_P)], _R),
    ("livereg_reaper_acquire", [_P, ctypes.POINTER(_Callbacks), ctypes.POINTER(_P)], _R),
    ("livereg_reaper_fd", [_P], ctypes.c_int),
    ("livereg_set_info", [_P, ctypes.c_char_p, ctypes.c_size_t], _R),
    ("livereg_get_info", [_P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)], _R),
    ("livereg_reaper_next_scan_ms", [_P], ctypes.c_uint64),
    ("livereg_reaper_scan", [_P, ctypes.POINTER(ctypes.c_uint32)], _R),
    ("livereg_reaper_stop", [_P], None),
    ("livereg_result_str", [ctypes.c_int], ctypes.c_char_p),
    ("livereg_last_error", [], ctypes.c_char_p),
]:
    _function = getattr(_lib, _name)
    _function.argtypes = _args
    _function.restype = _ret


def _check(result: int) -> None:
    if result != 0:
        message = _lib.livereg_last_error().decode("utf-8", "replace")
        raise _ERRORS.get(result, Error)(message, result)


def _seconds_to_ms(seconds: float) -> int:
    return max(0, int(round(seconds * 1000)))


class DropEvent:
    """A registration that ended, as the reaper's ``on_drop`` sees it."""

    __slots__ = ("instance_id", "slot", "generation", "reason", "pid", "label",
                 "registered_ns", "last_heartbeat_ns", "silent_ns")

    def __init__(self, raw: _DropEvent):
        self.instance_id = raw.instance_id
        self.slot = raw.slot
        self.generation = raw.generation
        self.reason = Reason(raw.reason)
        self.pid = raw.pid
        self.label = raw.label.decode("utf-8", "replace")
        self.registered_ns = raw.registered_ns
        self.last_heartbeat_ns = raw.last_heartbeat_ns or None
        self.silent_ns = raw.silent_ns

    def __repr__(self) -> str:
        return (f"DropEvent(instance_id={self.instance_id}, reason={self.reason.name}, "
                f"pid={self.pid}, label={self.label!r}, slot={self.slot})")


class Worker:
    """A registration. Ping it; deregister it (or use it as a context manager)."""

    def __init__(self, handle: int, instance_id: int):
        self._handle = ctypes.c_void_p(handle)
        self.instance_id = instance_id
        self._lock = threading.Lock()

    def ping(self) -> None:
        """Heartbeat. Raises :class:`EvictedError` once the registration ended.
        Safe to call from several threads, and beside ``deregister``."""
        with self._lock:  # the handle is not freed while in use
            if not self._handle:
                raise EvictedError(f"instance {self.instance_id} was deregistered", 1)
            result = _lib.livereg_ping(self._handle)
        _check(result)

    def _call(self, function, *args) -> None:
        with self._lock:  # the handle is not freed while in use
            if not self._handle:
                raise EvictedError(f"instance {self.instance_id} was deregistered", 1)
            result = function(self._handle, *args)
        _check(result)

    def progress(self) -> None:
        """One step of the engine's loop (one atomic add in the library).
        Raises :class:`EvictedError` once the registration ended."""
        self._call(_lib.livereg_progress)

    def set_busy(self, busy: bool) -> None:
        """Says whether the engine has work in flight: while busy it must
        call :meth:`progress` at least every ``progress_timeout``."""
        self._call(_lib.livereg_set_busy, 1 if busy else 0)

    @contextlib.contextmanager
    def busy(self) -> Iterator["Worker"]:
        """Busy for the ``with`` block, idle after it."""
        self.set_busy(True)
        try:
            yield self
        finally:
            try:
                self.set_busy(False)
            except EvictedError:
                pass

    def deregister(self) -> None:
        """Ends the registration cleanly. Raises :class:`EvictedError` if it
        had already ended; the handle is released either way."""
        with self._lock:
            handle, self._handle = self._handle, ctypes.c_void_p()
        if handle:
            _check(_lib.livereg_deregister(handle))

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *_exc) -> None:
        try:
            self.deregister()
        except EvictedError:
            pass

    def __del__(self):
        if getattr(self, "_handle", None):
            try:
                self.deregister()
            except Exception:  # interpreter teardown, already evicted
                pass


class Reaper:
    """A running reaper thread; ``stop()`` it (or use it as a context manager)."""

    def __init__(self, handle: int, callbacks: _Callbacks, keep: tuple):
        self._handle = ctypes.c_void_p(handle)
        self._callbacks = callbacks  # the C side holds pointers into these
        self._keep = keep

    def stop(self) -> None:
        """Stops the reaper once its running callbacks return. Called from
        one of its own callbacks, it cannot wait for them: the callbacks then
        stay alive for as long as the library might still call them."""
        handle, self._handle = self._handle, ctypes.c_void_p()
        if handle:
            _lib.livereg_reaper_stop(handle)
            if getattr(_inside_callback, "active", False):
                _KEPT_FOR_LIBRARY_THREADS.append((self._callbacks, self._keep))

    def __enter__(self) -> "Reaper":
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.stop()


# Whether this thread runs a reaper callback (a stop from there cannot wait).
_inside_callback = threading.local()
# Thunks of reapers stopped from their own callbacks: the library may still be
# running them, so they are never freed.
_KEPT_FOR_LIBRARY_THREADS: list = []


class DrivenReaper(Reaper):
    """The table's reaper, scanning only when told; ``stop()`` gives the role
    back (or use it as a context manager)."""

    def fileno(self) -> int:
        """A descriptor that becomes readable when a scan is due early (a
        watched process exited, a registration ended, a clear was requested)."""
        return _lib.livereg_reaper_fd(self._handle)

    def next_scan(self) -> float:
        """Seconds until the next periodic scan is due."""
        return _lib.livereg_reaper_next_scan_ms(self._handle) / 1000

    def scan(self) -> int:
        """One scan now; runs the callbacks here. Returns how many
        registrations ended."""
        if not self._handle:
            raise InvalidArgumentError("the reaper was stopped", 5)
        ended = ctypes.c_uint32()
        _check(_lib.livereg_reaper_scan(self._handle, ctypes.byref(ended)))
        return ended.value


def _callbacks(on_drop: Optional[Callable[[DropEvent], None]],
               on_clear: Optional[Callable[[], None]]) -> tuple:
    """C callbacks calling the Python ones. ctypes takes the GIL around each
    call; an exception is printed and swallowed, never raised into C. A slow
    callback does not hold up the others: the library runs several at once."""

    def call(function, *args):
        _inside_callback.active = True
        try:
            function(*args)
        except Exception:  # noqa: BLE001 (must not cross into C)
            import traceback
            traceback.print_exc()
        finally:
            _inside_callback.active = False

    def drop(_userdata, event_pointer):
        if on_drop is not None:
            call(lambda: on_drop(DropEvent(event_pointer.contents)))

    def clear(_userdata):
        if on_clear is not None:
            call(on_clear)

    keep = (_ON_DROP(drop), _ON_CLEAR(clear))
    return _Callbacks(None, keep[0], keep[1]), keep


class Table:
    """An open table. ``close()`` it (or use it as a context manager)."""

    def __init__(self, handle: int, name: str):
        self._handle = ctypes.c_void_p(handle)
        self.name = name

    def _live(self) -> ctypes.c_void_p:
        if not self._handle:
            raise InvalidArgumentError(f"table '{self.name}' is closed", 5)
        return self._handle

    def register(self, instance_id: int, label: Optional[str] = None) -> Worker:
        """Registers ``instance_id`` (not 0) with a label of at most 47 bytes."""
        out = ctypes.c_void_p()
        encoded = None if label is None else label.encode("utf-8")
        _check(_lib.livereg_register(self._live(), instance_id, encoded, ctypes.byref(out)))
        return Worker(out.value, instance_id)

    def clear(self, timeout: float = 5.0) -> None:
        """Ends every registration through the reaper; waits up to ``timeout`` s."""
        _check(_lib.livereg_clear(self._live(), _seconds_to_ms(timeout)))

    def probe(self) -> Optional[int]:
        """The live reaper's boot token, or ``None`` if no reaper is alive."""
        token = ctypes.c_uint64()
        result = _lib.livereg_probe(self._live(), ctypes.byref(token))
        if result == NoReaperError.code:
            return None
        _check(result)
        return token.value

    def stats(self) -> dict:
        """The status keys: ``enabled``, ``reap_timeout_seconds``,
        ``registration_grace_seconds``, ``tracked_instances`` and more."""
        raw = _Stats()
        _check(_lib.livereg_get_stats(self._live(), ctypes.byref(raw)))
        return {
            "enabled": raw.reap_timeout_ms > 0,
            "reap_timeout_seconds": raw.reap_timeout_ms / 1000,
            "registration_grace_seconds": raw.registration_grace_ms / 1000,
            "tracked_instances": raw.tracked_instances,
            "capacity": raw.capacity,
            "reaper_alive": bool(raw.reaper_alive),
            "reaper_pid": raw.reaper_pid,
            "boot_token": raw.boot_token,
            "ended_total": raw.ended_total,
            "ended": {reason.name.lower(): raw.ended_by_reason[reason] for reason in Reason},
            "handler_failures": raw.handler_failures,
            "scans": raw.scans,
        }

    def start_reaper(self, on_drop: Optional[Callable[[DropEvent], None]] = None,
                     on_clear: Optional[Callable[[], None]] = None) -> Reaper:
        """Starts this table's reaper thread. Callbacks run on that thread,
        holding the GIL while they run. Raises :class:`BusyError` if another
        reaper holds the table."""
        callbacks, keep = _callbacks(on_drop, on_clear)
        out = ctypes.c_void_p()
        _check(_lib.livereg_reaper_start(self._live(), ctypes.byref(callbacks), ctypes.byref(out)))
        return Reaper(out.value, callbacks, keep)

    def set_info(self, value) -> None:
        """Publishes ``value`` (bytes, or text as UTF-8; at most 1,024 bytes)
        for workers to read with :meth:`info`, without RPC."""
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        _check(_lib.livereg_set_info(self._live(), data, len(data)))

    def info(self) -> bytes:
        """The bytes last published with :meth:`set_info` (a consistent copy)."""
        buffer = ctypes.create_string_buffer(1024)
        length = ctypes.c_size_t()
        _check(_lib.livereg_get_info(self._live(), buffer, 1024, ctypes.byref(length)))
        return buffer.raw[:length.value]

    def acquire_reaper(self, on_drop: Optional[Callable[[DropEvent], None]] = None,
                       on_clear: Optional[Callable[[], None]] = None) -> "DrivenReaper":
        """Takes this table's reaper role for a reaper your own loop drives:
        wait until ``fileno()`` is readable or ``next_scan()`` seconds pass
        (``select``, ``selectors``, asyncio's ``add_reader``), then ``scan()``;
        callbacks run inside ``scan()``. Raises :class:`BusyError` if another
        reaper holds the table."""
        callbacks, keep = _callbacks(on_drop, on_clear)
        out = ctypes.c_void_p()
        _check(_lib.livereg_reaper_acquire(self._live(), ctypes.byref(callbacks), ctypes.byref(out)))
        return DrivenReaper(out.value, callbacks, keep)

    def close(self) -> None:
        handle, self._handle = self._handle, ctypes.c_void_p()
        if handle:
            _lib.livereg_close(handle)

    def __enter__(self) -> "Table":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()


def create(name: str, capacity: int = 256, reap_timeout: float = 10.0,
           registration_grace: Optional[float] = None, mode: int = 0o600,
           progress_timeout: float = 0.0) -> Table:
    """Creates table ``name`` exclusively. ``registration_grace`` defaults to
    the larger of 30 s and ``reap_timeout``; ``progress_timeout`` (0: off) is
    how long a busy worker may make no progress before it ends ``STALLED``."""
    if registration_grace is None:
        registration_grace = max(30.0, reap_timeout)
    options = _Options(capacity, mode, _seconds_to_ms(reap_timeout), _seconds_to_ms(registration_grace),
                       _seconds_to_ms(progress_timeout))
    out = ctypes.c_void_p()
    _check(_lib.livereg_create(name.encode("utf-8"), ctypes.byref(options), ctypes.byref(out)))
    return Table(out.value, name)


def open(name: str) -> Table:  # noqa: A001 (livereg.open)
    """Opens and validates an existing table."""
    out = ctypes.c_void_p()
    _check(_lib.livereg_open(name.encode("utf-8"), ctypes.byref(out)))
    return Table(out.value, name)


def unlink(name: str) -> None:
    """Removes the table's name."""
    _check(_lib.livereg_unlink(name.encode("utf-8")))
