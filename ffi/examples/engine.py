"""A minimal Python "engine": registers, beats from a daemon thread, and
registers again when told it was evicted or when the reaper's boot token
changes (the server restarted). Usage: engine.py TABLE INSTANCE_ID SECONDS"""

from __future__ import annotations

import sys
import threading
import time
from typing import Optional

import livereg


class Liveness:
    """Keeps one registration alive from a daemon thread."""

    def __init__(self, table: livereg.Table, instance_id: int, interval: float) -> None:
        self.table, self.instance_id, self.interval = table, instance_id, interval
        self.worker = self.register("start")
        self.token: Optional[int] = table.probe()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.beat, daemon=True)
        self.thread.start()

    def register(self, why: str) -> livereg.Worker:
        while True:
            try:
                worker = self.table.register(self.instance_id, label="py-engine")
                print(f"registered ({why})", flush=True)
                return worker
            except (livereg.ExistsError, livereg.DeadlineExceededError):
                time.sleep(0.05)  # the old registration's drop is still running

    def beat(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.worker.ping()
            except livereg.EvictedError:
                self.worker = self.register("after eviction")
            token = self.table.probe()
            if token is not None and token != self.token:
                if self.token is not None:
                    # A new reaper: the server restarted and forgot us.
                    self.worker.deregister()
                    self.worker = self.register("reaper restarted")
                self.token = token

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.worker.deregister()


def main() -> None:
    name, instance_id, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    with livereg.open(name) as table:
        liveness = Liveness(table, instance_id, interval=0.05)
        time.sleep(seconds)  # the engine's real work would run here
        liveness.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
