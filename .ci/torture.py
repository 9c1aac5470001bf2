"""The multi-process torture run behind .ci/torture SECONDS.

Sixteen worker processes (`livereg worker --reregister`, a quarter of them in
their own time namespace, behind or ahead of the reaper's clock, and a quarter
in their own PID namespace) beat, get SIGKILLed and replaced, SIGSTOPped and
resumed; the reaper (`livereg reap --on-drop`, whose hook is every drop and is
slow for one instance in ten; every other start, the first included, in its
own PID namespace, so that it and those workers are siblings and no pidfd can
reach them) is itself killed and restarted; clears and resets are requested. Some workers are busy
engines making progress at every beat, some hang their engine loop while
beating on (they must end `stalled`, and only they), some fork a child that
outlives them holding copies of their descriptors. A fifth of the workers
are isolated sessions: each in a container of its own (`unshare`: a mount
namespace with a private /dev/shm, its own PID and IPC namespaces), it
registers through the reaper's listener (`reap --listen unix:…`, `worker
unix:…`); the reaper's kills cut their connections, and they must reclaim
their registrations when it comes back within the timeout.
At the end it checks:

- no worker that kept beating is ever evicted for silence (timeout/grace),
  and a stopped one never before `timeout` after it stopped; the reaper's
  decision (the silence its drop event reports) falls within
  [timeout, timeout + timeout/4 + slack] (grace likewise); when the hook
  started after the stop is reported separately, not judged;
- every killed worker is dropped within its bound (timeout + timeout/4 plus
  slack, counted from the kill or from the reaper's restart if it was down);
- a session ends `disconnected` only if its process was killed or stopped,
  or its reaper was down around the end;
- every registration ends exactly once, or again only across a reaper kill
  (a drop whose hook had started when its reaper died runs again);
- no slot leaks: after everything stops, every slot is free;
- the table still validates.

Everything is keyed by worker object and by registration (slot, generation),
never by pid: over a long run the kernel reuses the pids of killed workers
(`pid_max` is often 32,768), and a drop must be charged to the registration it
names, not to whichever process holds that pid now. The bookkeeping is the
`Ledger` class, tested on its own by `.ci/torture_test.py`.

It prints one final line of counts and exits 0 only with 0 violations. A run
with violations keeps its drops, the reaper's log (every ending, with its
reason and silence) and the workers' stderr in the temporary directory, and
prints where (`LIVEREG_TORTURE_KEEP=1` keeps them from any run); a silence
violation names the worker's kind (session, time offset, PID namespace, shape).
"""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIVEREG = os.path.join(ROOT, "target", "release", "livereg")
TIMEOUT = 0.5
BOUND = TIMEOUT + TIMEOUT / 4
SLACK = 1.0
BEAT_INTERVAL = 0.05
GRACE = 1.0
CLEAR_WAIT = 5.0
PROGRESS_TIMEOUT = 1.0
WORKERS = 16

# One line of the --on-drop hook's log: what ended, why, when the hook started
# (wall clock), and how long the registration had been silent when the reaper
# ended it (its own measure; None where not logged).
Drop = namedtuple("Drop", "instance reason pid slot generation at silent", defaults=(None,))


class Life:
    """What the harness did to one worker process and what it registered.

    Times are wall-clock seconds (`time.time()`), the clock the drop hook
    stamps with.
    """

    def __init__(self, pid, may_stall=False, session=False, kind="local"):
        self.pid = pid
        self.may_stall = may_stall  # its engine loop hangs on purpose
        self.session = session  # registers over the reaper's socket
        self.kind = kind  # how it runs (session, time offset, PID namespace, shape), for violations
        self.registrations = []  # (slot, generation), in order
        self.stops = []  # [stopped, resumed or None]
        self.killed = None

    @property
    def stopped(self):
        return bool(self.stops) and self.stops[-1][1] is None

    def last_stop_before(self, at):
        starts = [start for start, _ in self.stops if start <= at]
        return max(starts) if starts else None


class Ledger:
    """Everything the run did, and the judgement of the drops against it."""

    def __init__(self, timeout=TIMEOUT, slack=SLACK, beat_interval=BEAT_INTERVAL, grace=GRACE):
        self.timeout = timeout
        self.grace = grace
        self.bound = timeout + timeout / 4
        self.slack = slack
        self.beat_interval = beat_interval
        self.lives = []
        self.resets = []  # wall-clock time each reset was requested (answered or not)
        self.resets_done = []  # the same, for resets that completed within their wait
        self.clears = 0  # plain clears that completed: they must end nothing
        self.reaper_downtime = []  # (down, up)

    def judge(self, drops, slots_held_at_end=0):
        """Returns (violations, summary) for the drops the hook logged."""
        violations = []
        owner = {}
        for life in self.lives:
            for registration in life.registrations:
                if registration in owner:
                    violations.append(
                        f"registration slot/generation {registration} handed to pid {owner[registration].pid} "
                        f"and pid {life.pid}")
                owner[registration] = life
        first_drop = {}
        counts = {}
        for drop in drops:
            key = (drop.slot, drop.generation)
            first_drop.setdefault(key, drop)
            counts[key] = counts.get(key, 0) + 1
        worst = {}

        def latency(reason, seconds, bound):
            if seconds > worst.get(reason, (-1.0, bound))[0]:
                worst[reason] = (seconds, bound)

        # 1. Beating workers are never evicted for silence; stopped ones never early.
        for key, drop in first_drop.items():
            life = owner.get(key)
            if life is None or drop.reason not in ("timeout", "grace"):
                continue
            stopped = life.last_stop_before(drop.at)
            if stopped is None:
                violations.append(
                    f"instance {drop.instance} (registration {key}, pid {life.pid}) evicted for "
                    f"{drop.reason} but never stopped")
                continue
            # Sessions too: their listener allows for the last pings a
            # stopped client never forwarded.
            earliest = stopped + self.timeout - 2 * self.beat_interval
            if drop.reason == "timeout" and drop.at < earliest:
                violations.append(
                    f"instance {drop.instance} (registration {key}) evicted {drop.at - stopped:.3f}s after "
                    f"its SIGSTOP, before its timeout of {self.timeout}s")
            # The decision, as the reaper measured it: within its bound.
            if drop.silent is not None:
                budget = self.timeout if drop.reason == "timeout" else self.grace
                late = budget + self.timeout / 4 + self.slack
                latency(f"{drop.reason} decision (silence)", drop.silent, late)
                if not budget <= drop.silent <= late:
                    violations.append(
                        f"instance {drop.instance} (registration {key}) ended {drop.reason} after "
                        f"{drop.silent:.3f}s of silence, outside [{budget}, {late}]s; a {life.kind} worker, "
                        f"stopped {drop.at - stopped:.3f}s before its hook started")
            # When its hook started: reported, not judged (the pool may be busy).
            latency(f"{drop.reason} hook start after stop", drop.at - stopped,
                    self.bound + self.beat_interval + self.slack)
        # 1b. Only an engine that hangs on purpose is ended for making no
        # progress (busy workers that step, idle ones, stopped ones never).
        for key, drop in first_drop.items():
            life = owner.get(key)
            if life is not None and drop.reason == "stalled" and not life.may_stall:
                violations.append(
                    f"instance {drop.instance} (registration {key}) ended stalled but its engine never hung")
        # 1c. A session ends `disconnected` only when its process was killed
        # or stopped, or its reaper was down around the end (the client was
        # gone from the reaper for the timeout).
        for key, drop in first_drop.items():
            life = owner.get(key)
            if life is None or drop.reason != "disconnected":
                continue
            window = self.timeout + self.timeout / 4 + self.slack
            killed = life.killed is not None and life.killed <= drop.at + 0.05
            stopped = life.last_stop_before(drop.at) is not None
            reaper_down = any(down <= drop.at and up >= drop.at - window for down, up in self.reaper_downtime)
            if not (killed or stopped or reaper_down):
                violations.append(
                    f"session instance {drop.instance} (registration {key}) ended disconnected while its process "
                    f"lived and its reaper was up")
        # 2. Killed workers are dropped within their bound: the registration
        # they held when killed (their last) ends within timeout + timeout/4
        # plus slack, counted from the reaper's return if it was down.
        for life in self.lives:
            if life.killed is None or not life.registrations:
                continue
            drop = first_drop.get(life.registrations[-1])
            if drop is None:
                continue  # reported below as never ended
            start = life.killed
            for down, up in self.reaper_downtime:
                if down <= life.killed + self.bound and up >= life.killed:
                    start = max(start, up)
            waited = max(0.0, drop.at - start)
            if drop.at > life.killed:
                latency(f"{drop.reason} after kill", waited, self.bound + self.slack)
            if waited > self.bound + self.slack and drop.at > life.killed:
                violations.append(
                    f"killed pid {life.pid} (registration {life.registrations[-1]}) dropped {waited:.2f}s "
                    f"after its kill (bound {self.bound}s)")
        # Resets: every registration a reset ends, ends within the
        # requester's deadline (the reset itself succeeded within it); a
        # plain clear ends nothing, so a registration ends `cleared` only
        # after a reset was requested.
        for drop in first_drop.values():
            if drop.reason != "cleared":
                continue
            if not any(at <= drop.at for at in self.resets):
                violations.append(f"registration ({drop.slot}, {drop.generation}) ended cleared with no reset requested")
            done = [at for at in self.resets_done if at <= drop.at]
            if done:
                latency("cleared", drop.at - max(done), CLEAR_WAIT)
        # 3. Every registration ends exactly once (repeats only across reaper kills).
        for key in owner:
            if key not in counts:
                violations.append(f"registration slot/generation {key} never ended")
        # A drop runs again only when the reaper running it was killed: at
        # least once across reaper crashes, exactly once otherwise.
        repeats = sum(n - 1 for n in counts.values() if n > 1)
        times = {}
        for drop in drops:
            times.setdefault((drop.slot, drop.generation), []).append(drop.at)
        for key, at in times.items():
            for first, again in zip(at, at[1:]):
                if not any(down >= first - 0.05 and up <= again + 0.05 for down, up in self.reaper_downtime):
                    violations.append(f"registration {key} dropped again at {again:.2f} with no reaper kill since {first:.2f}")
        # 4. No slot leaks.
        if slots_held_at_end:
            violations.append(f"slots still held at the end: {slots_held_at_end}")
        for what, (seconds, bound) in worst.items():
            if what == "cleared" and seconds > bound:
                violations.append(f"a cleared registration was dropped {seconds:.2f}s after the request")
        pids = {}
        for life in self.lives:
            pids[life.pid] = pids.get(life.pid, 0) + 1
        by_reason = {}
        for drop in drops:
            by_reason[drop.reason] = by_reason.get(drop.reason, 0) + 1
        summary = {
            "registrations": len(owner),
            "ended": len(drops),
            "by_reason": by_reason,
            "kills": sum(1 for life in self.lives if life.killed is not None),
            "stops": sum(len(life.stops) for life in self.lives),
            "clears": self.clears,
            "resets": len(self.resets_done),
            "reaper_restarts": len(self.reaper_downtime),
            "sessions": sum(1 for life in self.lives if life.session),
            "repeats": repeats,
            "pid_reuses": sum(n - 1 for n in pids.values()),
            "worst": worst,
        }
        return violations, summary


def describe(seconds, violations, summary):
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(summary["by_reason"].items()))
    worst = "; ".join(
        f"{what} {seconds * 1000:.0f}ms (bound {bound * 1000:.0f}ms)"
        for what, (seconds, bound) in sorted(summary["worst"].items()))
    return (
        f"torture {seconds:.0f}s: registrations {summary['registrations']}, ended {summary['ended']} "
        f"({reasons}), kills {summary['kills']}, stops {summary['stops']}, clears {summary['clears']}, resets {summary['resets']}, "
        f"reaper restarts {summary['reaper_restarts']}, sessions {summary.get('sessions', 0)}, "
        f"repeated drops {summary['repeats']}, "
        f"pid reuses {summary['pid_reuses']}, workers in other time namespaces {summary.get('time_namespaces', 0)}, "
        f"workers in their own PID namespace {summary.get('pid_namespaces', 0)} "
        f"(reaper starts in its own {summary.get('reaper_pid_namespaces', 0)})"
        f"{''.join(f', {what} {n}' for what, n in summary.get('shapes', {}).items())}; "
        f"worst latency: {worst}; violations: {len(violations)}"
    )


def run(*args, check=True):
    result = subprocess.run([LIVEREG, *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise SystemExit(f"livereg {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def pid_namespaces():
    """Whether workers and the reaper can run in PID namespaces of their own
    (`unshare --pid` needs root or user namespaces)."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "true"], capture_output=True)
    if probe.returncode != 0:
        print(f"note: no PID namespaces here ({probe.stderr.decode().strip()}): every process shares the harness's")
    return probe.returncode == 0


def spawn(command, offset=None, own_pids=False, isolated=False, **popen):
    """`command`, in new time and PID namespaces as asked, or `isolated` in a
    container of its own (mount namespace with a private /dev/shm, PID and
    IPC namespaces): then `unshare` is the process returned, its one child
    the program (killed if `unshare` dies)."""
    flags = (["--time", f"--monotonic={offset}"] if offset is not None else []) + (["--pid"] if own_pids else [])
    if isolated:
        flags = ["--mount", "--pid", "--ipc"]
        command = ["sh", "-c", 'mount -t tmpfs session /dev/shm && exec "$0" "$@"', *command]
    if flags:
        command = ["unshare", *flags, "--fork", "--kill-child", *command]
    return subprocess.Popen(command, **popen)


def program_pid(process, wrapped):
    """The pid, in the harness's namespace, of the program `spawn` started:
    the process itself, or the child `unshare` forked."""
    if not wrapped:
        return process.pid
    for _ in range(100):
        try:
            with open(f"/proc/{process.pid}/task/{process.pid}/children") as children:
                pids = children.read().split()
            if pids:
                return int(pids[0])
        except OSError:
            break
        time.sleep(0.01)
    return process.pid


class Reaper:
    """`livereg reap` with the drop hook; with `own_pids`, as pid 1 of a new
    PID namespace."""

    def __init__(self, table, hook, own_pids, listen, log):
        self.own_pids = own_pids
        log.write(f"--- reaper started at {time.time():.6f}{' in its own PID namespace' if own_pids else ''}\n")
        log.flush()
        self.process = spawn([LIVEREG, "reap", table, "--on-drop", hook, "--listen", listen], own_pids=own_pids,
                             stderr=log)

    def kill(self):
        try:
            os.kill(program_pid(self.process, self.own_pids), signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.kill()
        self.process.wait()

    def stop(self):
        """SIGTERM to the reaper itself (`unshare` would not pass it on)."""
        try:
            os.kill(program_pid(self.process, self.own_pids), signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)


def time_namespaces():
    """Monotonic offsets (seconds) workers in their own time namespace get:
    one behind (as after a checkpoint/restore), one ahead; none if the kernel
    or `unshare` refuses time namespaces."""
    probe = subprocess.run(["unshare", "--time", "--monotonic=1", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        print(f"note: no time namespaces here ({probe.stderr.decode().strip()}): every worker shares the reaper's clock")
        return []
    lag = min(300, int(time.monotonic()) - 2)
    return [offset for offset in (-lag, 300) if offset != 0]


class Worker:
    """One worker process; its `life` is what the ledger judges. With an
    `offset`, it runs in a new time namespace whose monotonic clock is that
    many seconds off the reaper's; with `own_pids`, in a new PID namespace
    (`unshare` is then its parent, and kills it if it dies)."""

    def __init__(self, table, instance, offset=None, shape=(), own_pids=False, session=None, log=None):
        command = [LIVEREG, "worker", session or table, "--instance", str(instance), "--interval",
                   f"{int(BEAT_INTERVAL * 1000)}ms", "--reregister", *shape]
        self.offset = offset
        self.own_pids = own_pids or session is not None
        self.session = session
        self.process = spawn(command, offset, own_pids, isolated=session is not None, stdout=subprocess.PIPE,
                             stderr=log or subprocess.DEVNULL, text=True)
        self.shape = shape
        self.forked = []  # pids of children it forked, killed at the end
        kind = ("session" if session is not None else
                f"time offset {offset:+d}s" if offset is not None else "local")
        kind += "".join(f" {part}" for part in shape) + (" own PID namespace" if own_pids and session is None else "")
        self.life = Life(self.process.pid, may_stall="--stall-after" in shape, session=session is not None,
                         kind=f"{kind} (instance {instance})")
        self.lines = threading.Thread(target=self._read, daemon=True)
        self.lines.start()

    def _read(self):
        for line in self.process.stdout:
            parts = line.split()
            if parts and parts[0] == "registered":
                self.life.registrations.append((int(parts[1]), int(parts[2])))
            elif parts and parts[0] == "forked" and not self.own_pids:
                # (In its own PID namespace the pid is that namespace's, and
                # the child dies with the namespace's first process anyway.)
                self.forked.append(int(parts[1]))

    def target(self):
        """The worker itself: the process, or the child `unshare` forked."""
        return program_pid(self.process, self.offset is not None or self.own_pids or self.session is not None)

    def signal(self, number):
        try:
            os.kill(self.target(), number)
        except ProcessLookupError:
            pass

    def kill(self):
        self.signal(signal.SIGKILL)
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.life.killed = time.time()

    def stop(self):
        self.signal(signal.SIGSTOP)
        self.life.stops.append([time.time(), None])

    def resume(self):
        self.signal(signal.SIGCONT)
        self.life.stops[-1][1] = time.time()


def read_drops(path):
    drops = []
    with open(path) as log:
        for line in log:
            instance, reason, pid, slot, generation, at, silent = line.split()
            drops.append(Drop(int(instance), reason, int(pid), int(slot), int(generation), float(at),
                              float(silent)))
    return drops


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
    rng = random.Random(int(os.environ.get("LIVEREG_TORTURE_SEED", time.time_ns())))
    name = f"livereg-torture-{os.getpid()}"
    drops_path = os.path.join(tempfile.gettempdir(), f"{name}.drops")
    open(drops_path, "w").close()
    # The reaper's log (info: every ending, its reason and silence) and the
    # workers' (stderr), kept with the drops when the run finds a violation.
    reaper_log_path = os.path.join(tempfile.gettempdir(), f"{name}.reaper.log")
    workers_log_path = os.path.join(tempfile.gettempdir(), f"{name}.workers.log")
    reaper_log = open(reaper_log_path, "w")
    workers_log = open(workers_log_path, "w")
    keep_logs = os.environ.get("LIVEREG_TORTURE_KEEP") == "1"  # else kept only on a violation
    # The hook is the drop; one in ten is slow (instances ending in 7), and
    # must delay nobody else's.
    # A session's pid is its client's claim: LIVEREG_CLAIMED_PID.
    hook = (f'echo "$LIVEREG_INSTANCE_ID $LIVEREG_REASON ${{LIVEREG_PID:-$LIVEREG_CLAIMED_PID}} $LIVEREG_SLOT $LIVEREG_GENERATION $(date +%s.%N)'
            f' $LIVEREG_SILENT_SECONDS"'
            f' >> {drops_path}; case $LIVEREG_INSTANCE_ID in *7) sleep 1;; esac')
    offsets = time_namespaces()
    own_pids = pid_namespaces()
    listen = f"unix:{tempfile.gettempdir()}/{name}.sock"
    reaper_starts = 0

    def new_reaper():
        nonlocal reaper_starts
        reaper_starts += 1
        return Reaper(name, hook, own_pids and reaper_starts % 2 == 1, listen, reaper_log)

    def new_worker(instance):
        if own_pids and rng.random() < 0.2:
            # An isolated session: the same shapes, over the socket.
            shape = ("--busy",) if rng.random() < 0.2 else ()
            return Worker(name, instance, shape=shape, session=listen, log=workers_log)
        offset = rng.choice(offsets) if offsets and rng.random() < 0.25 else None
        in_own_pids = own_pids and rng.random() < 0.25
        # Shapes: an engine that makes progress at every beat, one whose loop
        # hangs while it beats on (ends stalled), one that forks a child
        # holding copies of its descriptors (its death must still be seen).
        pick = rng.random()
        if pick < 0.10:
            shape = ("--busy",)
        elif pick < 0.20:
            shape = ("--busy", "--stall-after", f"{int(rng.uniform(200, 2000))}ms")
        elif pick < 0.25:
            shape = ("--fork-child",)
        else:
            shape = ()
        return Worker(name, instance, offset, shape, in_own_pids, log=workers_log)

    run("create", name, "--capacity", "64", "--timeout", f"{int(TIMEOUT * 1000)}ms", "--grace", "1s",
        "--progress-timeout", f"{int(PROGRESS_TIMEOUT * 1000)}ms")
    ledger = Ledger()
    workers = []
    reaper = None
    try:
        reaper = new_reaper()
        time.sleep(0.3)
        workers = [new_worker(i + 1) for i in range(WORKERS)]
        ledger.lives.extend(w.life for w in workers)
        retired = []
        next_instance = WORKERS + 1
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.2))
            action = rng.random()
            victim = rng.randrange(len(workers))
            worker = workers[victim]
            if action < 0.25 and not worker.life.stopped:
                worker.kill()
                retired.append(worker)
                workers[victim] = new_worker(next_instance)
                ledger.lives.append(workers[victim].life)
                next_instance += 1
            elif action < 0.45 and not worker.life.stopped:
                worker.stop()
            elif action < 0.65 and worker.life.stopped:
                worker.resume()
            elif action < 0.68:
                requested = time.time()
                ledger.resets.append(requested)
                if run("clear", name, "--reset", "--wait", f"{int(CLEAR_WAIT)}s", check=False).returncode == 0:
                    ledger.resets_done.append(requested)
            elif action < 0.70:
                if run("clear", name, "--wait", f"{int(CLEAR_WAIT)}s", check=False).returncode == 0:
                    ledger.clears += 1
            elif action < 0.73:
                reaper.kill()
                down = time.time()
                time.sleep(rng.uniform(0.05, 0.5))
                reaper = new_reaper()
                ledger.reaper_downtime.append((down, time.time()))
        # Wind down: resume and kill every worker, let the reaper drain.
        for worker in workers:
            if worker.life.stopped:
                worker.resume()
            worker.kill()
        time.sleep(BOUND + SLACK)
        for worker in retired + workers:
            worker.lines.join(timeout=5)
        status = json.loads(run("status", name, "--json").stdout)
        reaper.stop()
        time.sleep(0.2)

        violations, summary = ledger.judge(read_drops(drops_path), status["registrations"])
        everyone = retired + workers
        summary["time_namespaces"] = sum(1 for w in everyone if w.offset is not None)
        summary["pid_namespaces"] = sum(1 for w in everyone if w.own_pids and w.session is None)
        summary["reaper_pid_namespaces"] = (reaper_starts + 1) // 2 if own_pids else 0
        summary["shapes"] = {
            "busy": sum(1 for w in everyone if w.shape == ("--busy",)),
            "stalling": sum(1 for w in everyone if w.life.may_stall),
            "forking": sum(1 for w in everyone if "--fork-child" in w.shape),
        }
        for message in violations:
            print("VIOLATION:", message)
        print(describe(seconds, violations, summary))
        keep_logs = keep_logs or bool(violations)
        if keep_logs:
            print(f"kept: the drops {drops_path}, the reaper's log {reaper_log_path}, "
                  f"the workers' log {workers_log_path}")
        return 1 if violations else 0
    finally:
        for worker in workers:
            worker.signal(signal.SIGCONT)
            worker.signal(signal.SIGKILL)
            try:
                worker.process.kill()
            except ProcessLookupError:
                pass
        for worker in locals().get("retired", []) + workers:
            for pid in worker.forked:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if reaper is not None:
            reaper.kill()
        run("rm", name, check=False)
        reaper_log.close()
        workers_log.close()
        if not keep_logs:
            for path in (drops_path, reaper_log_path, workers_log_path):
                os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
