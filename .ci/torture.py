"""The multi-process torture run behind .ci/torture SECONDS.

Sixteen or more worker processes (`livereg worker --reregister`) beat, get
SIGKILLed and restarted, SIGSTOPped and resumed, and deregister; the reaper
(`livereg reap --on-drop`, logging every drop) is itself killed and restarted;
clears are requested. Throughout, and at the end, it checks:

- no worker that kept beating is ever evicted for silence (timeout/grace);
- every killed worker is dropped within its bound (timeout + timeout/4 plus
  slack, counted from the kill or from the reaper's restart if it was down);
- every registration ends exactly once, or at least once across a reaper
  kill (and then only the interrupted drop repeats);
- no slot leaks: after everything stops, every slot is free;
- the table still validates.

It prints one final line of counts and exits 0 only with 0 violations.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIVEREG = os.path.join(ROOT, "target", "release", "livereg")
TIMEOUT = 0.5
BOUND = TIMEOUT + TIMEOUT / 4
SLACK = 1.0
WORKERS = 16


def run(*args, check=True):
    result = subprocess.run([LIVEREG, *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise SystemExit(f"livereg {' '.join(args)} failed: {result.stderr.strip()}")
    return result


class Worker:
    """One worker process and what we know about it."""

    def __init__(self, table, instance):
        self.instance = instance
        self.process = subprocess.Popen(
            [LIVEREG, "worker", table, "--instance", str(instance), "--interval", "50ms", "--reregister"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.stopped_since = None  # time of SIGSTOP while stopped
        self.ever_stopped = False
        self.registrations = []  # (slot, generation) in order
        self.lines = threading.Thread(target=self._read, daemon=True)
        self.lines.start()

    def _read(self):
        for line in self.process.stdout:
            parts = line.split()
            if parts and parts[0] == "registered":
                self.registrations.append((int(parts[1]), int(parts[2])))

    @property
    def pid(self):
        return self.process.pid


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
    rng = random.Random(int(os.environ.get("LIVEREG_TORTURE_SEED", time.time_ns())))
    name = f"livereg-torture-{os.getpid()}"
    drops_path = os.path.join(tempfile.gettempdir(), f"{name}.drops")
    open(drops_path, "w").close()
    hook = f'echo "$LIVEREG_INSTANCE_ID $LIVEREG_REASON $LIVEREG_PID $LIVEREG_SLOT $LIVEREG_GENERATION $(date +%s.%N)" >> {drops_path}'
    run("create", name, "--capacity", "64", "--timeout", f"{int(TIMEOUT * 1000)}ms", "--grace", "1s")
    violations = []
    kills = []  # (pid, time)
    reaper_restarts = 0
    reaper_downtime = []  # (down, up)
    clears = 0
    try:
        reaper = subprocess.Popen([LIVEREG, "reap", name, "--on-drop", hook], stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        workers = [Worker(name, i + 1) for i in range(WORKERS)]
        retired = []
        next_instance = WORKERS + 1
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.2))
            action = rng.random()
            victim = rng.randrange(len(workers))
            worker = workers[victim]
            if action < 0.25 and worker.stopped_since is None:
                worker.process.send_signal(signal.SIGKILL)
                worker.process.wait()
                kills.append((worker.pid, time.time()))
                retired.append(worker)
                workers[victim] = Worker(name, next_instance)
                next_instance += 1
            elif action < 0.45 and worker.stopped_since is None:
                worker.process.send_signal(signal.SIGSTOP)
                worker.stopped_since = time.monotonic()
                worker.ever_stopped = True
            elif action < 0.65 and worker.stopped_since is not None:
                worker.process.send_signal(signal.SIGCONT)
                worker.stopped_since = None
            elif action < 0.70:
                if run("clear", name, "--wait", "5s", check=False).returncode == 0:
                    clears += 1
            elif action < 0.73:
                reaper.send_signal(signal.SIGKILL)
                reaper.wait()
                down = time.time()
                time.sleep(rng.uniform(0.05, 0.5))
                reaper = subprocess.Popen([LIVEREG, "reap", name, "--on-drop", hook], stderr=subprocess.DEVNULL)
                reaper_downtime.append((down, time.time()))
                reaper_restarts += 1
        # Wind down: resume and stop every worker cleanly, let the reaper drain.
        for worker in workers:
            if worker.stopped_since is not None:
                worker.process.send_signal(signal.SIGCONT)
            worker.process.send_signal(signal.SIGKILL)
            worker.process.wait()
            kills.append((worker.pid, time.time()))
        time.sleep(BOUND + SLACK)
        for worker in retired + workers:
            worker.lines.join(timeout=5)
        status = json.loads(run("status", name, "--json").stdout)
        reaper.send_signal(signal.SIGTERM)
        reaper.wait(timeout=10)
        time.sleep(0.2)

        drops = []
        with open(drops_path) as log:
            for line in log:
                instance, reason, pid, slot, generation, at = line.split()
                drops.append((int(instance), reason, int(pid), int(slot), int(generation), float(at)))
        everyone = retired + workers
        by_pid = {w.pid: w for w in everyone}
        # 1. Beating workers are never evicted for silence.
        for instance, reason, pid, slot, generation, _ in drops:
            worker = by_pid.get(pid)
            if reason in ("timeout", "grace") and worker is not None and not worker.ever_stopped:
                violations.append(f"instance {instance} (pid {pid}) evicted for {reason} but never stopped")
        # 2. Killed workers are dropped within their bound: the registration
        # they held when killed (their last) ends within timeout + timeout/4
        # plus slack, counted from the reaper's return if it was down.
        ended_at = {}
        for _, _, _, slot, generation, at in drops:
            ended_at.setdefault((slot, generation), at)
        for pid, killed in kills:
            worker = by_pid[pid]
            if not worker.registrations:
                continue
            last = worker.registrations[-1]
            at = ended_at.get(last)
            if at is None:
                continue  # reported below as never ended
            start = killed
            for down, up in reaper_downtime:
                if down <= killed + BOUND and up >= killed:
                    start = max(start, up)
            if at > start + BOUND + SLACK and at > killed:
                violations.append(f"killed pid {pid} dropped {at - start:.2f}s after its kill (bound {BOUND}s)")
        # 3. Every registration ends exactly once (repeats only across reaper kills).
        registered = [(s, g) for w in everyone for (s, g) in w.registrations]
        counts = {}
        for _, _, _, slot, generation, _ in drops:
            counts[(slot, generation)] = counts.get((slot, generation), 0) + 1
        for key in registered:
            if counts.get(key, 0) == 0:
                violations.append(f"registration slot/generation {key} never ended")
        repeats = sum(n - 1 for n in counts.values() if n > 1)
        if repeats > reaper_restarts:
            violations.append(f"{repeats} repeated drops but only {reaper_restarts} reaper kills")
        # 4. No slot leaks; 5. the table validates (status opened it).
        if status["registrations"]:
            violations.append(f"slots still held at the end: {status['registrations']}")
        by_reason = {}
        for _, reason, _, _, _, _ in drops:
            by_reason[reason] = by_reason.get(reason, 0) + 1
        for message in violations:
            print("VIOLATION:", message)
        print(
            f"torture {seconds:.0f}s: registrations {len(registered)}, ended {len(drops)} "
            f"({', '.join(f'{r} {n}' for r, n in sorted(by_reason.items()))}), kills {len(kills)}, "
            f"clears {clears}, reaper restarts {reaper_restarts}, repeated drops {repeats}, "
            f"violations: {len(violations)}"
        )
        return 1 if violations else 0
    finally:
        for process in [w.process for w in locals().get("workers", [])]:
            try:
                process.send_signal(signal.SIGCONT)
                process.kill()
            except ProcessLookupError:
                pass
        if "reaper" in locals():
            reaper.kill()
        run("rm", name, check=False)
        os.unlink(drops_path)


if __name__ == "__main__":
    sys.exit(main())
