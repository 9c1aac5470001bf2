"""The Python module over liblivereg: the same ground as the C tests."""

import os
import queue
import signal
import subprocess
import sys
import time
import unittest

import livereg

_counter = 0


def unique(tag):
    global _counter
    _counter += 1
    return f"livereg-pytest-{tag}-{os.getpid()}-{_counter}"


class TableCase(unittest.TestCase):
    """Each test gets a fresh table, unlinked afterwards."""

    timeout = 5.0
    grace = 5.0
    capacity = 8

    def setUp(self):
        self.name = unique(self.id().rsplit(".", 1)[-1])
        self.table = livereg.create(self.name, capacity=self.capacity, reap_timeout=self.timeout,
                                    registration_grace=self.grace)
        self.addCleanup(self._remove)

    def _remove(self):
        self.table.close()
        try:
            livereg.unlink(self.name)
        except livereg.NotFoundError:
            pass

    def reaper(self):
        drops = queue.Queue()
        clears = queue.Queue()
        reaper = self.table.start_reaper(on_drop=drops.put, on_clear=lambda: clears.put(True))
        self.addCleanup(reaper.stop)
        return reaper, drops, clears


class Registration(TableCase):
    capacity = 2

    def test_register_ping_deregister(self):
        with self.table.register(1, label="gpu1") as worker:
            worker.ping()
            self.assertEqual(self.table.stats()["tracked_instances"], 1)
        self.assertEqual(self.table.stats()["tracked_instances"], 0)

    def test_label_may_be_none(self):
        self.table.register(2).deregister()

    def test_bad_arguments_raise_invalid_argument_with_code_and_message(self):
        with self.assertRaises(livereg.InvalidArgumentError) as caught:
            self.table.register(0)
        self.assertEqual(caught.exception.code, 5)
        self.assertIn("instance id 0", str(caught.exception))
        with self.assertRaises(livereg.InvalidArgumentError) as caught:
            self.table.register(3, label="x" * 48)
        self.assertIn("at most 47", str(caught.exception))
        self.table.register(3, label="x" * 47).deregister()
        with self.assertRaises(livereg.InvalidArgumentError):
            livereg.create("bad name")

    def test_live_duplicate_is_exists_and_a_full_table_is_full(self):
        first = self.table.register(4)
        with self.assertRaises(livereg.ExistsError):
            self.table.register(4)
        second = self.table.register(5)
        with self.assertRaises(livereg.FullError):
            self.table.register(6)
        first.deregister()
        second.deregister()

    def test_every_error_is_a_livereg_error(self):
        with self.assertRaises(livereg.Error):
            livereg.open(unique("missing"))
        with self.assertRaises(livereg.NotFoundError):
            livereg.open(unique("missing"))
        with self.assertRaises(livereg.ExistsError):
            livereg.create(self.name)

    def test_open_sees_the_same_table(self):
        with livereg.open(self.name) as other, self.table.register(7, label="shared"):
            self.assertEqual(other.stats()["tracked_instances"], 1)


class Info(TableCase):
    def test_info_round_trips_and_is_bounded(self):
        self.assertEqual(self.table.info(), b"")
        self.table.set_info('{"chunk_size": 256}')
        with livereg.open(self.name) as other:
            self.assertEqual(other.info(), b'{"chunk_size": 256}')
        with self.assertRaises(livereg.InvalidArgumentError):
            self.table.set_info(b"x" * 1025)


class Progress(unittest.TestCase):
    def test_a_busy_worker_without_progress_ends_stalled_and_an_idle_one_is_kept(self):
        name = f"livereg-pytest-progress-{os.getpid()}"
        table = livereg.create(name, reap_timeout=0.4, registration_grace=0.8, progress_timeout=0.4)
        self.addCleanup(livereg.unlink, name)
        self.addCleanup(table.close)
        drops = queue.Queue()
        reaper = table.start_reaper(on_drop=drops.put)
        self.addCleanup(reaper.stop)
        stuck, idle = table.register(1), table.register(2)
        with stuck.busy():
            stuck.progress()
            deadline = time.monotonic() + 5
            while drops.empty():
                self.assertLess(time.monotonic(), deadline, "never ended")
                stuck.ping()  # alive, but its loop makes no progress
                idle.ping()
                time.sleep(0.05)
        event = drops.get()
        self.assertEqual((event.instance_id, event.reason), (1, livereg.Reason.STALLED))
        with self.assertRaises(livereg.EvictedError):
            stuck.progress()
        self.assertEqual(table.stats()["ended"]["stalled"], 1)
        idle.deregister()


class Reaping(TableCase):
    timeout = 0.4
    grace = 0.8

    def test_stats_have_the_status_keys(self):
        stats = self.table.stats()
        for key in ("enabled", "reap_timeout_seconds", "registration_grace_seconds", "tracked_instances"):
            self.assertIn(key, stats)
        self.assertTrue(stats["enabled"])
        self.assertEqual(stats["reap_timeout_seconds"], 0.4)
        self.assertEqual(stats["registration_grace_seconds"], 0.8)

    def test_probe_and_clear_without_a_reaper(self):
        self.assertIsNone(self.table.probe())
        with self.assertRaises(livereg.NoReaperError):
            self.table.clear(timeout=0.1)

    def test_reaper_probe_busy_and_clear(self):
        _reaper, drops, clears = self.reaper()
        token = self.table.probe()
        self.assertIsInstance(token, int)
        with livereg.open(self.name) as other, self.assertRaises(livereg.BusyError):
            other.start_reaper()
        worker = self.table.register(10, label="cleared")
        worker.ping()
        self.table.clear(timeout=5)
        self.assertTrue(clears.get(timeout=5))
        event = drops.get(timeout=5)
        self.assertEqual((event.instance_id, event.reason, event.label), (10, livereg.Reason.CLEARED, "cleared"))
        self.assertEqual(event.reason.name, "CLEARED")
        with self.assertRaises(livereg.EvictedError):
            worker.ping()
        self.table.register(10).deregister()

    def test_silent_worker_is_evicted_and_told(self):
        _reaper, drops, _clears = self.reaper()
        worker = self.table.register(11)
        worker.ping()
        event = drops.get(timeout=5)
        self.assertEqual((event.instance_id, event.reason), (11, livereg.Reason.TIMEOUT))
        self.assertGreaterEqual(event.silent_ns, 400_000_000)
        with self.assertRaises(livereg.EvictedError):
            worker.ping()

    def test_a_failing_callback_does_not_stop_the_reaper(self):
        seen = queue.Queue()

        def on_drop(event):
            seen.put(event.instance_id)
            raise RuntimeError("handler bug")

        reaper = self.table.start_reaper(on_drop=on_drop)
        self.addCleanup(reaper.stop)
        self.table.register(12).deregister()
        self.table.register(13).deregister()
        self.assertEqual({seen.get(timeout=5), seen.get(timeout=5)}, {12, 13})

    def test_a_callback_that_stops_its_reaper_is_safe(self):
        seen = queue.Queue()
        holder = {}

        def on_drop(event):
            if "reaper" in holder:
                reaper = holder.pop("reaper")
                reaper.stop()  # cannot wait for this very callback
                del reaper
                import gc
                gc.collect()
            time.sleep(0.05)
            seen.put(event.instance_id)

        holder["reaper"] = self.table.start_reaper(on_drop=on_drop)
        self.table.register(14).deregister()
        self.table.register(15).deregister()
        self.assertEqual({seen.get(timeout=5), seen.get(timeout=5)}, {14, 15})
        deadline = time.monotonic() + 5
        while self.table.probe() is not None:
            self.assertLess(time.monotonic(), deadline, "the reaper never stopped")
            time.sleep(0.01)

    def test_a_reaper_driven_by_select_keeps_its_token_and_wakes_for_a_deregistration(self):
        import select
        dropped = []
        with self.table.acquire_reaper(on_drop=dropped.append) as reaper:
            token = self.table.probe()
            for _ in range(10):
                reaper.scan()
                self.assertLessEqual(reaper.next_scan(), self.timeout / 4)
            self.assertEqual(self.table.probe(), token)
            worker = self.table.register(16)
            reaper.scan()
            worker.deregister()
            readable, _, _ = select.select([reaper], [], [], 5)
            self.assertEqual(readable, [reaper])
            self.assertEqual(reaper.scan(), 1)
            self.assertEqual((dropped[0].instance_id, dropped[0].reason), (16, livereg.Reason.DEREGISTERED))
        self.assertIsNone(self.table.probe())

    def test_subprocess_worker_killed_with_sigkill_is_dropped(self):
        _reaper, drops, _clears = self.reaper()
        script = (
            "import sys, time, livereg\n"
            "table = livereg.open(sys.argv[1])\n"
            "worker = table.register(42, label='python child')\n"
            "print('registered', flush=True)\n"
            "while True:\n"
            "    worker.ping()\n"
            "    time.sleep(0.05)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", script, self.name], stdout=subprocess.PIPE,
                                 env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        self.addCleanup(child.stdout.close)
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        self.assertEqual(child.stdout.readline().strip(), b"registered")
        child.send_signal(signal.SIGKILL)
        event = drops.get(timeout=5)
        self.assertEqual((event.instance_id, event.reason, event.pid), (42, livereg.Reason.PROCESS_EXITED, child.pid))

    def test_deregistration_is_seen_promptly_by_an_idle_reaper(self):
        _reaper, drops, _clears = self.reaper()
        started = time.monotonic()
        self.table.register(14).deregister()
        event = drops.get(timeout=5)
        self.assertEqual(event.reason, livereg.Reason.DEREGISTERED)
        self.assertLess(time.monotonic() - started, 2.0)


if __name__ == "__main__":
    unittest.main()
