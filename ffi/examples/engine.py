"""A minimal Python "engine": registers, beats from a thread, and registers
again when told it was evicted or when the reaper's boot token changes (the
server restarted). Usage: engine.py TABLE INSTANCE_ID SECONDS"""

import sys
import threading
import time

import livereg


def register(table, instance_id, why):
    while True:
        try:
            worker = table.register(instance_id, label="py-engine")
            print(f"registered ({why})", flush=True)
            return worker
        except (livereg.ExistsError, livereg.TimeoutError):
            time.sleep(0.05)


def main():
    name, instance_id, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    stop = threading.Event()
    with livereg.open(name) as table:
        worker = register(table, instance_id, "start")

        def beat():
            nonlocal worker
            known = table.probe()
            while not stop.is_set():
                try:
                    worker.ping()
                except livereg.EvictedError:
                    worker = register(table, instance_id, "after eviction")
                token = table.probe()
                if token is not None and token != known:
                    if known is not None:
                        worker.deregister()
                        worker = register(table, instance_id, "reaper restarted")
                    known = token
                time.sleep(0.05)

        thread = threading.Thread(target=beat)
        thread.start()
        time.sleep(seconds)
        stop.set()
        thread.join()
        worker.deregister()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
