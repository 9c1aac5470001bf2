"""A small "KV-cache server" on livereg.lmcache, and a run that shows when each
worker's state is freed, against what a PING-and-reap management module with
the reference's defaults (120 s timeout, 3,600 s grace, a scan every 30 s)
would have done.

    python3 ffi/examples/kv_server.py [--timeout SECONDS] [--isolated]

The server holds two kinds of per-worker state behind two liveness targets: a
pinned staging buffer and a prefix index. Engine workers are separate
processes using `WorkerLiveness` (no RPC). The run: one worker is killed, one
stopped (a hang), one stays idle but alive, one crashes before its first
heartbeat; then a clear (the stored cache is emptied, the workers keep their
state), then a server restart. Exits 1 if any state was freed outside its
bound.

With --isolated (as root), every engine runs in a container of its own made
with `unshare` (its own mount namespace with a private /dev/shm, its own PID
and IPC namespaces: LMCache's isolated-IPC deployment, where the table cannot
be mapped) and registers through the server's listening socket instead;
deaths are seen when the connection closes, and a server restart is ridden
out by the engines' connections coming back.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

import livereg
from livereg.lmcache import LiveregManagement, WorkerLiveness


class PinnedBuffers:
    """Per-worker staging buffers (a CUDA IPC mapping, in a real server)."""

    def __init__(self) -> None:
        self.buffers: Dict[int, bytearray] = {}
        self.lock = threading.Lock()

    def attach(self, instance_id: int) -> None:
        with self.lock:
            self.buffers[instance_id] = bytearray(1 << 20)

    def drop_instance_state(self, instance_id: int) -> None:
        with self.lock:
            self.buffers.pop(instance_id, None)


class PrefixIndex:
    """Per-worker cached prefixes; records when each worker's went."""

    def __init__(self) -> None:
        self.prefixes: Dict[int, List[str]] = {}
        self.freed: Dict[int, List[float]] = {}
        self.lock = threading.Condition()

    def attach(self, instance_id: int) -> None:
        with self.lock:
            self.prefixes[instance_id] = [f"prefix-{instance_id}"]

    def drop_instance_state(self, instance_id: int) -> None:
        with self.lock:
            if self.prefixes.pop(instance_id, None) is not None:
                self.freed.setdefault(instance_id, []).append(time.monotonic())
                self.lock.notify_all()

    def wait_freed(self, instance_id: int, count: int, timeout: float) -> Optional[float]:
        with self.lock:
            if self.lock.wait_for(lambda: len(self.freed.get(instance_id, [])) >= count, timeout):
                return self.freed[instance_id][count - 1]
            return None


class StoredCache:
    """The server's stored KV cache (the storage manager the clear empties)."""

    def __init__(self) -> None:
        self.chunks: Dict[str, bytes] = {"chunk-0": b"kv"}
        self.clears = 0

    def memcheck(self) -> None:
        pass

    def clear(self, force: bool = False) -> None:
        self.chunks.clear()
        self.clears += 1


class EventBus:
    def publish(self, event: object) -> None:
        pass


class ServerContext:
    """What the management module reads of the server: as the reference's."""

    def __init__(self) -> None:
        self.storage_manager = StoredCache()
        self.chunk_size = 256
        self.event_bus = EventBus()


def engine(table: str, instance_id: int, shape: str) -> None:
    """A worker process: `beating` keeps a registration alive from a daemon
    thread; `no-beat` registers and crashes before its first heartbeat.
    `table` may be the server's listening address (isolated engines)."""
    if shape == "no-beat":
        if table.startswith("unix:"):
            worker = livereg.connect(table, instance_id, label="no-beat")
        else:
            worker = livereg.open(table).register(instance_id, label="no-beat")
        print("registered (start)", flush=True)
        time.sleep(3600)  # killed before it ever beats
        worker.deregister()
    WorkerLiveness(table, instance_id, label=f"engine-{instance_id}",
                   on_register=lambda why: print(f"registered ({why})", flush=True))
    while True:
        time.sleep(3600)  # idle: no requests, and never reaped for it


def engine_pid(child: "subprocess.Popen[str]") -> int:
    """The engine's pid: the child itself, or the process `unshare` forked."""
    if os.path.basename(str(child.args[0])) != "unshare":  # type: ignore[index]
        return child.pid
    with open(f"/proc/{child.pid}/task/{child.pid}/children") as children:
        return int(children.read().split()[0])


class Run:
    def __init__(self, timeout: float, isolated: bool) -> None:
        self.timeout = timeout
        self.isolated = isolated
        self.table = f"kv-server-example-{os.getpid()}"
        self.socket = f"/tmp/{self.table}.sock"
        self.address = f"unix:{self.socket}"
        self.buffers, self.index = PinnedBuffers(), PrefixIndex()
        self.ctx = ServerContext()
        self.server = self.start_server()
        self.started = time.monotonic()
        self.engines: Dict[int, subprocess.Popen[str]] = {}
        self.failures = 0

    def start_server(self) -> LiveregManagement:
        # Built as the reference's module is built, plus the table's name
        # (and, for isolated engines, where it listens).
        listen = [self.address] if self.isolated else []
        return LiveregManagement(self.ctx, [self.buffers, self.index], self.timeout, 3600.0, table=self.table,
                                 listen=listen)

    def say(self, text: str) -> None:
        print(f"{time.monotonic() - self.started:6.2f}s  {text}", flush=True)

    def spawn(self, instance_id: int, shape: str = "beating") -> None:
        command = [sys.executable, __file__, "--engine", self.table, str(instance_id), shape]
        if self.isolated:
            # A container of its own: the table in /dev/shm is out of reach.
            command = ["unshare", "--mount", "--pid", "--ipc", "--fork", "--kill-child", "sh", "-c",
                       'mount -t tmpfs engine /dev/shm && exec "$0" "$@"',
                       sys.executable, __file__, "--engine", self.address, str(instance_id), shape]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line == "registered (start)", line
        self.buffers.attach(instance_id)  # the worker handed its buffers over
        self.index.attach(instance_id)
        self.engines[instance_id] = child

    def expect(self, instance_id: int, what: str, since: float, low: float, high: float, reference: str,
               count: int = 1) -> None:
        freed = self.index.wait_freed(instance_id, count, high + 5)
        if freed is None:
            self.failures += 1
            self.say(f"worker {instance_id} ({what}): NOT freed within {high + 5:.1f}s   reference: {reference}")
            return
        after = freed - since
        ok = low <= after <= high + max(0.25, self.timeout / 4)
        self.failures += not ok
        self.say(f"worker {instance_id} ({what}): freed after {after * 1000:8.1f} ms "
                 f"[bound {low:.2f}..{high:.2f}s: {'ok' if ok else 'VIOLATED'}]   reference: {reference}")

    def main(self) -> int:
        t = self.timeout
        self.say(f"server up: table '{self.table}', reap timeout {t:g}s (reference default: 120 s)")
        for instance_id in (1, 2, 3):
            self.spawn(instance_id)
        self.say("workers 1, 2, 3 registered and beating; server holds a buffer and an index for each")
        time.sleep(0.5)
        now = time.monotonic()
        os.kill(engine_pid(self.engines[1]), signal.SIGKILL)
        os.kill(engine_pid(self.engines[2]), signal.SIGSTOP)
        self.say("SIGKILL worker 1 (crash); SIGSTOP worker 2 (hang); worker 3 stays idle")
        self.expect(1, "killed", now, 0.0, 0.05, "freed after 120-150 s")
        self.spawn(4, "no-beat")
        killed = time.monotonic()
        os.kill(engine_pid(self.engines[4]), signal.SIGKILL)
        self.expect(4, "crashed before its first beat", killed, 0.0, 0.05,
                    "freed after 3,600-3,630 s (the grace)")
        # Silent for the timeout after its last beat; it beat every t/3
        # (an isolated engine's last beats may not have left it: t/8 more).
        self.expect(2, "stopped", now, t - t / 3 - t / 8, t + t / 4, "freed after 120-150 s")
        time.sleep(max(0.0, now + 2 * t - time.monotonic()))
        alive = self.index.freed.get(3) is None and 3 in self.buffers.buffers
        self.failures += not alive
        self.say(f"worker 3 (idle but alive) after {2 * t:g}s, two timeouts: "
                 f"{'kept' if alive else 'FREED'}   reference: reaped after 120-150 s idle, never told")
        self.server.clear()
        time.sleep(self.timeout / 2)
        kept = not self.ctx.storage_manager.chunks and 3 in self.buffers.buffers and not self.index.freed.get(3)
        self.failures += not kept
        self.say(f"clear: stored cache emptied, worker 3's state {'kept' if kept else 'FREED'}   "
                 "reference: the same")
        self.server.close()
        self.server = self.start_server()
        self.say("server restarted (same table): a new reaper, a new boot token")
        if self.isolated:
            # Its connection comes back and takes the registration back:
            # nothing was dropped, nothing needs sending again.
            time.sleep(2 * t)
            kept = not self.index.freed.get(3) and 3 in self.buffers.buffers
            self.failures += not kept
            self.say(f"worker 3 {'kept its registration and state through the restart' if kept else 'was DROPPED'} "
                     "(its connection came back)   reference: never told; its server-side state is silently gone")
        else:
            self.wait_line(3, "registered (server restarted)")
            self.say("worker 3 registered again by itself (told: server restarted)   "
                     "reference: never told; its server-side state is silently gone")
        return 1 if self.failures else 0

    def wait_line(self, instance_id: int, want: str) -> None:
        stdout = self.engines[instance_id].stdout
        assert stdout is not None
        while True:
            line = stdout.readline().strip()
            if not line:
                raise SystemExit(f"worker {instance_id} ended before printing '{want}'")
            if line == want:
                return

    def close(self) -> None:
        for child in self.engines.values():
            child.send_signal(signal.SIGKILL)
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        self.server.close()
        livereg.unlink(self.table)
        if os.path.exists(self.socket):
            os.unlink(self.socket)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--engine":
        engine(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=2.0, help="the server's reap timeout, in seconds")
    parser.add_argument("--isolated", action="store_true",
                        help="engines in containers of their own (unshare, as root), over the server's socket")
    args = parser.parse_args()
    run = Run(args.timeout, args.isolated)
    try:
        code = run.main()
    finally:
        run.close()
    print("all state freed within its bound" if code == 0 else "a bound was VIOLATED")
    sys.exit(code)


if __name__ == "__main__":
    main()
