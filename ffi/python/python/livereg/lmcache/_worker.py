"""An engine's registration kept alive from a daemon thread, with no RPC;
for an engine that publishes its progress, beaten from a native thread and
let go while it hangs."""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional, Union

import livereg
from livereg.lmcache._common import Unaccepted, default_table, label_instance, logger, read_info
from livereg.lmcache._stacks import StallReport


#: The longest one connection attempt to a listener may take.
_CONNECT_TIMEOUT = 2.0
#: How long registering again after a stall may wait for the ended
#: registration's drop (a step waits for it).
_MOVED_WAIT = 5.0
#: After a failed registration again (a full table), the first pause before
#: the next attempt, in seconds; each failure doubles it, up to the last.
_RETRY_FIRST = 0.5
_RETRY_MAX = 30.0
#: How often the server watch looks whether it is closed (a change wakes it
#: at once).
_SERVER_LOOK = 0.5
#: Over a session, the least time between two asks of the listener about
#: the followed registration (each is a connection, a TLS handshake over
#: ``tls://``).
_ASK_EVERY = 1.0


class WorkerLiveness:
    """Keeps worker ``instance_id`` registered in ``table`` (a name, an open
    :class:`livereg.Table`, ``None`` for :func:`default_table`, or the
    address of the server's listener, ``"unix:/PATH"`` or
    ``"tcp://HOST:PORT"`` with ``token=``, or ``"tls://HOST:PORT"`` with
    ``tls_ca=`` (and a token or ``tls_cert``/``tls_key``), from a container
    that cannot map the table): beats
    from a daemon thread at a third of the table's timeout, registers again
    when evicted, and deregisters on ``close()``. ``on_register(why)`` is
    called after every registration (``"start"``, ``"evicted"``) and when the
    server restarted (``"server restarted"``: the registration holds, a new
    reaper takes the table over as it finds it): the server dropped this
    worker's state, so send it again there. A server restart is seen by the
    reaper's boot token changing (a table) or by the server id in its info
    area changing (a session). An ``on_register`` that raises is logged and
    called again at each beat until it returns.

    An id livereg cannot hold (0, the reference's untracked prober, a
    negative one, one past 64 bits) registers nothing: it is logged once and
    the object does nothing, as a PING of it would.

    With ``steps=True`` the engine publishes its progress through
    :meth:`step_started` and :meth:`step_done`, and is judged by it: it is
    also beaten from a native thread (a hang that holds the GIL keeps
    beating, so it ends ``STALLED``, not ``TIMEOUT``), its threads' stacks
    go to stderr when it stalls (``stacks``: a
    :class:`livereg.lmcache._stacks.StallReport`), and once stalled it
    registers again (``on_register("moved again")``) only when a step
    completes or starts: a hung engine stays let go. Its stall report is
    emptied as soon as it moves, registered again or not; a registration
    again that fails (a full table) is logged once and tried again from the
    beat thread, and before steps, with a pause doubling from
    :data:`_RETRY_FIRST` to :data:`_RETRY_MAX` seconds. ``follows`` is the
    label of another registration of the same engine (its scheduler's): once
    it was seen live and is gone, this one is let go too (deregistered) until
    it moves again. Read from the table; over a session, asked of the
    listener this worker registered through (same token and TLS files), at
    most once every :data:`_ASK_EVERY` seconds, about the instance id
    :func:`livereg.lmcache._common.label_instance` derives from the label
    (the one the followed registration takes). An ask that fails (the
    listener does not answer, refuses) says nothing: never gone.

    ``on_server(state)`` is called with the server's reaper state (a
    :class:`livereg.ReaperState`) as it starts and at each change: ``dying``
    from the very start of the server process's end (a SIGKILL, the OOM
    killer: the kernel marks the reaper's life word, and this wakes at once,
    without polling), ``absent``, and ``serving`` with a new boot token when
    a new server serves. Called from a daemon thread of its own that sleeps
    in :meth:`livereg.Table.wait_reaper_state`; an ``on_server`` that raises
    is logged. Over a session: ``serving`` while connected (pid ``0``),
    ``absent`` from the connection's close, ``serving`` with a new token
    once a new server takes the registration back; never ``dying``.
    """

    def __init__(
        self,
        table: Union[str, livereg.Table, None],
        instance_id: int,
        label: Optional[str] = None,
        on_register: Optional[Callable[[str], object]] = None,
        interval: Optional[float] = None,
        wait: float = 10.0,
        token: Optional[Union[str, bytes]] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        steps: bool = False,
        stacks: Optional[StallReport] = None,
        follows: Optional[str] = None,
        on_server: Optional[Callable[[livereg.ReaperState], object]] = None,
    ) -> None:
        self.instance_id = instance_id
        self._steps, self._stacks, self._follows = steps, stacks, follows
        self._followed_seen = False
        #: When the listener was last asked about the followed registration,
        #: and whether its last failure was logged.
        self._asked_at: Optional[float] = None
        self._ask_failed = False
        #: Ended by a stall (or its scheduler's) and not registered again yet.
        self._let_go = False
        #: Whether a step is running (between step_started and step_done):
        #: then its own progress judges it, not its scheduler's end.
        self._in_step = False
        #: Set by a step once the engine moves after a stall.
        self._moved = threading.Event()
        #: Held while a let-go registration registers again (by the beat
        #: thread, or by the step that finds it let go).
        self._resuming = threading.Lock()
        #: Failed registrations again since the engine moved, the pause
        #: before the next attempt, and when that attempt is due.
        self._retries = 0
        self._retry_pause = 0.0
        self._retry_at = 0.0
        self._native: Optional[livereg.BeatThread] = None
        self._server_watch: Optional[threading.Thread] = None
        self.interval = interval or 0.0
        self._address = table if isinstance(table, str) and livereg.is_address(table) else None
        self._session_token = token
        self._tls_ca, self._tls_cert, self._tls_key = tls_ca, tls_cert, tls_key
        self.registrations = 0
        self._label = label
        self._on_register = on_register
        self._stopping = threading.Event()
        self._server: Optional[object] = None
        self._unsent: Optional[str] = None  # an on_register that has not returned yet
        self._tracked = Unaccepted().check(instance_id, "WorkerLiveness")
        if not self._tracked:
            if instance_id == 0:
                logger.warning("WorkerLiveness(0): id 0 is the untracked prober's; nothing registered")
            self._stopping.set()
            self._owns_table = False
            return
        self._table: Optional[livereg.Table] = None
        self._owns_table = not isinstance(table, livereg.Table)
        if self._address is None:
            self._table = table if isinstance(table, livereg.Table) else livereg.open(table or default_table())
        self._token = self._table.probe() if self._table is not None else None
        self._worker = self._register("start", deadline=time.monotonic() + wait)
        self._thread = threading.Thread(target=self._beat, name=f"livereg-beat-{instance_id}", daemon=True)
        self._thread.start()
        if on_server is not None:
            self._server_watch = threading.Thread(
                target=self._watch_server, args=(on_server,), name=f"livereg-server-{instance_id}", daemon=True,
            )
            self._server_watch.start()

    @property
    def stopped(self) -> threading.Event:
        """Set once :meth:`close` began."""
        return self._stopping

    @property
    def tracked(self) -> bool:
        """Whether this worker is registered (False for an id livereg cannot
        hold)."""
        return self._tracked

    def _register(self, why: str, deadline: Optional[float] = None) -> livereg.Worker:
        while True:
            try:
                if self._address is not None:
                    # A session: the sender thread reconnects and takes the
                    # registration back after a server restart by itself.
                    left = _CONNECT_TIMEOUT if deadline is None else deadline - time.monotonic()
                    worker = livereg.connect(
                        self._address,
                        self.instance_id,
                        timeout=min(_CONNECT_TIMEOUT, max(0.05, left)),
                        label=self._label or "",
                        token=self._session_token,
                        tls_ca=self._tls_ca,
                        tls_cert=self._tls_cert,
                        tls_key=self._tls_key,
                    )
                else:
                    assert self._table is not None
                    worker = self._table.register(self.instance_id, label=self._label)
                break
            except (livereg.ExistsError, livereg.BusyError, livereg.DeadlineExceededError):
                # A live or ending registration of this id (a previous
                # process of this worker, or one the server holds for it).
                if deadline is not None and time.monotonic() > deadline:
                    raise
                if self._stopping.wait(0.05):
                    raise
        worker.ping()
        if not self.interval:
            timeout = worker.reap_timeout or (self._table.registration_grace if self._table else 1.0)
            self.interval = max(0.001, timeout / livereg.BEATS_PER_TIMEOUT)
        if self._steps:
            self._beat_natively(worker)
        if self._stacks is not None:
            self._stacks.clear()  # registered: whatever stalled moves again
        self.registrations += 1
        logger.info("instance %d registered (%s)", self.instance_id, why)
        self._server = read_info(worker.info()).get("server")
        self._told(why)
        return worker

    def _watch_server(self, on_server: Callable[[livereg.ReaperState], object]) -> None:
        """Calls ``on_server`` with the reaper's state, then at each change,
        until :meth:`close`: read from the table, or (a session) from the
        current registration."""
        state: Optional[livereg.ReaperState] = None
        while not self._stopping.is_set():
            source: Union[livereg.Table, livereg.Worker] = self._table if self._table is not None else self._worker
            try:
                changed = source.reaper_state if state is None else source.wait_reaper_state(state, _SERVER_LOOK)
            except livereg.Error:
                # A registration replaced under the watch (registered
                # again): the next look reads the new one.
                self._stopping.wait(_SERVER_LOOK)
                continue
            if changed == state:
                continue
            state = changed
            try:
                on_server(state)
            except Exception:
                logger.exception("instance %d: on_server(%s) raised", self.instance_id, state.state)

    def _told(self, why: str) -> None:
        """Calls ``on_register(why)``; if it raises, it is called again at
        the next beat."""
        self._unsent = why
        if self._on_register is None:
            self._unsent = None
            return
        try:
            self._on_register(why)
        except Exception:
            logger.exception("instance %d: on_register(%r) raised; called again at the next beat", self.instance_id, why)
            return
        self._unsent = None

    def _beat_natively(self, worker: livereg.Worker) -> None:
        if self._native is not None:
            self._native.stop()
        stacks = self._stacks
        self._native = worker.beat_in_background(
            self.interval,
            stall_signal=stacks.signal if stacks else None,
            stall_report=stacks.path if stacks else None,
            step_thread=stacks.step_thread if stacks else None,
        )

    def _beat(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                if self._let_go:
                    if self._moved.is_set() and self._stacks is not None:
                        # A dump the native thread wrote after the engine
                        # moved (it saw the end a beat late) is no stall.
                        self._stacks.clear()
                    self._register_once_moved()
                    continue
                self._beat_once()
            except livereg.Error:
                if self._stopping.is_set():
                    return  # closed while registering again
                logger.exception("instance %d: heartbeat failed; trying again", self.instance_id)

    def _moved_again(self) -> None:
        """A let-go engine steps: its stall is over, whether or not it can
        register again."""
        self._moved.set()
        if self._stacks is not None:
            self._stacks.clear()

    def _register_once_moved(self) -> None:
        """Registers again (``on_register("moved again")``) if the engine
        was let go, has moved since, and no failed attempt asks to wait."""
        with self._resuming:
            if not (self._let_go and self._moved.is_set()) or self._stopping.is_set():
                return
            if self._retries and time.monotonic() < self._retry_at:
                return
            self._followed_seen = False
            try:
                self._worker = self._register("moved again", deadline=time.monotonic() + _MOVED_WAIT)
            except livereg.Error as error:
                if self._stopping.is_set():
                    return
                self._retries += 1
                self._retry_pause = min(_RETRY_MAX, self._retry_pause * 2 or _RETRY_FIRST)
                self._retry_at = time.monotonic() + self._retry_pause
                if self._retries == 1:
                    logger.warning(
                        "instance %d moves again but cannot register again (%s); it steps unregistered, tried "
                        "again with a pause doubling up to %.0f s (logged once)", self.instance_id, error,
                        _RETRY_MAX,
                    )
                return
            if self._retries:
                logger.warning("instance %d registered again after %d failed attempts", self.instance_id,
                               self._retries)
            self._retries, self._retry_pause = 0, 0.0
            self._moved.clear()
            self._let_go = False

    def _beat_once(self) -> None:
        try:
            self._worker.ping()
        except livereg.EvictedError as error:
            if self._steps and error.reason == livereg.Reason.STALLED:
                logger.warning(
                    "instance %d stalled: busy with no progress for the table's progress timeout; let go until it "
                    "moves again", self.instance_id,
                )
                self._let_go = True
                self._register_once_moved()  # a step may have completed already
                return
            self._worker = self._register("evicted")
        if self._follows is not None and not self._in_step and self._followed_gone():
            logger.warning(
                "instance %d: its engine's %r ended while it lives: let go until it moves again",
                self.instance_id, self._follows,
            )
            with self._resuming:
                try:
                    self._worker.deregister()
                except livereg.EvictedError:
                    pass
                self._moved.clear()
                self._let_go = True
            return
        if self._unsent is not None:
            self._told(self._unsent)
        if self._table is not None:
            token = self._table.probe()
            if token is not None and token != self._token:
                restarted = self._token is not None
                self._token = token
                if restarted:
                    # The registration holds (the new reaper took the table
                    # over as it found it): told, never ended. Ending it
                    # would have the new server free the engine's state,
                    # perhaps after what it registered with it already.
                    self._told("server restarted")
        if self._table is not None:
            return  # a table's restarts are seen by the reaper's boot token
        server = read_info(self._worker.info()).get("server")
        if server is not None and server != self._server:
            restarted = self._server is not None
            self._server = server
            if restarted:
                self._told("server restarted")  # the registration held (a session reclaimed it)

    def _followed_gone(self) -> bool:
        """Whether the followed registration was seen live and is gone."""
        if self._table is not None:
            registrations = self._table.status().registrations
        else:
            asked = self._ask_followed()
            if asked is None:
                return False  # not asked now, or no answer: unknown
            registrations = asked
        live = any(
            r.label == self._follows and r.state == livereg.RegistrationState.LIVE
            for r in registrations
        )
        if live:
            self._followed_seen = True
            return False
        return self._followed_seen

    def _ask_followed(self) -> Optional[List[livereg.RegistrationStatus]]:
        """The followed registration's rows as the listener answers them
        (a session), or None: asked less than :data:`_ASK_EVERY` seconds
        ago, or the ask failed. Bounded by the connect timeout (by the beat
        interval if Python beats alone)."""
        now = time.monotonic()
        if self._address is None or self._follows is None:
            return None
        if self._asked_at is not None and now - self._asked_at < _ASK_EVERY:
            return None
        self._asked_at = now
        timeout = _CONNECT_TIMEOUT if self._native is not None else min(_CONNECT_TIMEOUT, max(0.05, self.interval))
        try:
            status = livereg.remote_status(
                self._address, label_instance(self._follows), token=self._session_token, timeout=timeout,
                tls_ca=self._tls_ca, tls_cert=self._tls_cert, tls_key=self._tls_key,
            )
        except livereg.Error as error:
            if not self._ask_failed:
                logger.warning(
                    "instance %d: asking %s about %r failed (%s): unknown, not gone; asked again each %.0f s "
                    "(logged once until an answer)", self.instance_id, self._address, self._follows, error,
                    _ASK_EVERY,
                )
            self._ask_failed = True
            return None
        self._ask_failed = False
        return status.registrations

    def step_started(self) -> None:
        """The engine has work in flight: it must complete a step within the
        table's progress timeout (see :meth:`step_done`). Let go, the
        engine moves again: it registers again first, ``on_register``
        included (the server holds its state before the step uses it)."""
        if not self._tracked:
            return
        if self._let_go:
            self._moved_again()
            self._register_once_moved()
        self._in_step = True
        try:
            self._worker.set_busy(True)
        except livereg.EvictedError as error:
            self._ended_by(error)

    def step_done(self, busy: bool = False) -> None:
        """One step completed; ``busy``: work is still in flight."""
        if not self._tracked:
            return
        self._in_step = busy
        try:
            worker = self._worker
            worker.progress()
            if not busy:
                worker.set_busy(False)
        except livereg.EvictedError as error:
            self._ended_by(error)

    def _ended_by(self, error: livereg.EvictedError) -> None:
        # A step right after the stall (before the beat thread saw it), or
        # while let go: the engine moves.
        if error.reason == livereg.Reason.STALLED:
            self._let_go = True
        if self._let_go:
            self._moved_again()

    @property
    def chunk_size(self) -> Optional[int]:
        """The server's chunk size, read from the table's info area (no RPC)."""
        if not self._tracked:
            return None
        value = read_info(self._worker.info()).get("chunk_size")
        return None if value is None else int(value)

    def clear(self, timeout: float = 5.0) -> None:
        """Asks the server to clear its stored cache, as the reference's
        CLEAR request: its :meth:`LiveregManagement.clear` runs once;
        registrations are untouched. Through the table, or through the
        server's listener for a session. Waits up to ``timeout`` seconds;
        raises ``DeadlineExceededError``, ``NoReaperError`` (and, for a session, what
        :func:`livereg.connect` raises for the connection)."""
        self.worker.clear(timeout)

    @property
    def worker(self) -> livereg.Worker:
        """The current registration."""
        if not self._tracked:
            raise livereg.NotFoundError(f"instance id {self.instance_id!r} is not tracked: nothing registered")
        return self._worker

    def close(self) -> None:
        """Stops beating and deregisters."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._native is not None:
            self._native.stop()
        if self._thread is not threading.current_thread():
            # The beat thread notices within one connect attempt at most.
            self._thread.join(_CONNECT_TIMEOUT + self.interval + 1.0)
            if self._thread.is_alive():
                logger.warning("instance %d: the beat thread did not stop; deregistering anyway", self.instance_id)
        try:
            self._worker.deregister()
        except livereg.EvictedError:
            pass
        if self._server_watch is not None and self._server_watch is not threading.current_thread():
            self._server_watch.join(_SERVER_LOOK + 1.0)
        if self._owns_table and self._table is not None:
            self._table.close()

    def __enter__(self) -> "WorkerLiveness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
