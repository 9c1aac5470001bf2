"""Tests of the torture harness's bookkeeping (`Ledger` in torture.py).

Run: python3 .ci/torture_test.py. The long-run failure they pin: with pids
keyed to workers, a pid reused by a later worker charged the drops of an old
registration to the new worker ("killed pid N dropped 681s after its kill",
"instance I evicted for timeout but never stopped").
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torture import Drop, Ledger, Life  # noqa: E402


def life(pid, registrations, killed=None, stops=()):
    record = Life(pid)
    record.registrations = list(registrations)
    record.killed = killed
    record.stops = [list(stop) for stop in stops]
    return record


class Sessions(unittest.TestCase):
    def test_a_session_ends_disconnected_only_if_killed_stopped_or_its_reaper_was_down(self):
        ledger = Ledger(timeout=0.5, slack=1.0)
        killed = life(100, [(1, 1)], killed=10.0)
        alive = life(101, [(2, 1)], killed=30.0)
        behind_a_restart = life(102, [(3, 1)], killed=30.0)
        for record in (killed, alive, behind_a_restart):
            record.session = True
        ledger.lives = [killed, alive, behind_a_restart]
        ledger.reaper_downtime = [(19.0, 19.8)]
        drops = [
            Drop(1, "disconnected", 100, 1, 1, 10.002),
            Drop(2, "disconnected", 101, 2, 1, 12.0),
            Drop(3, "disconnected", 102, 3, 1, 20.3),
        ]
        violations, summary = ledger.judge(drops)
        self.assertEqual(len(violations), 1, violations)
        self.assertIn("session instance 2", violations[0])
        self.assertEqual(summary["sessions"], 3)


class PidReuse(unittest.TestCase):
    def test_a_reused_pid_does_not_charge_an_old_drop_to_a_new_worker(self):
        ledger = Ledger(timeout=0.5, slack=1.0)
        # Worker A (pid 100) is stopped, evicted for timeout, killed; much
        # later worker B gets pid 100 again, never stopped, is killed, and its
        # registration ends at once.
        old = life(100, [(3, 7)], killed=20.0, stops=[(10.0, None)])
        new = life(100, [(5, 2)], killed=700.0)
        ledger.lives = [old, new]
        drops = [
            Drop(1, "timeout", 100, 3, 7, 10.6),
            Drop(2, "process_exited", 100, 5, 2, 700.01),
        ]
        violations, summary = ledger.judge(drops)
        self.assertEqual(violations, [])
        self.assertEqual(summary["pid_reuses"], 1)

    def test_a_late_drop_is_still_a_violation(self):
        ledger = Ledger(timeout=0.5, slack=1.0)
        ledger.lives = [life(100, [(3, 7)], killed=10.0), life(100, [(5, 2)], killed=700.0)]
        drops = [
            Drop(1, "process_exited", 100, 3, 7, 15.0),
            Drop(2, "process_exited", 100, 5, 2, 700.01),
        ]
        violations, _ = ledger.judge(drops)
        self.assertEqual(len(violations), 1)
        self.assertIn("dropped 5.00s after its kill", violations[0])

    def test_silence_eviction_of_a_never_stopped_worker_sharing_a_stopped_ones_pid(self):
        ledger = Ledger(timeout=0.5, slack=1.0)
        stopped = life(100, [(3, 7)], killed=20.0, stops=[(10.0, 19.0)])
        beating = life(100, [(4, 1)], killed=50.0)
        ledger.lives = [stopped, beating]
        drops = [
            Drop(1, "timeout", 100, 3, 7, 10.6),
            Drop(2, "timeout", 100, 4, 1, 49.0),
        ]
        violations, _ = ledger.judge(drops)
        self.assertEqual(len(violations), 1)
        self.assertIn("(registration (4, 1), pid 100) evicted for timeout but never stopped", violations[0])

    def test_an_eviction_before_the_timeout_is_a_violation(self):
        ledger = Ledger(timeout=0.5, slack=1.0, beat_interval=0.05)
        ledger.lives = [life(100, [(3, 7)], stops=[(10.0, None)])]
        violations, _ = ledger.judge([Drop(1, "timeout", 100, 3, 7, 10.2)])
        self.assertEqual(len(violations), 1)
        self.assertIn("before its timeout", violations[0])

    def test_a_registration_that_never_ended_and_a_leak_are_reported(self):
        ledger = Ledger()
        ledger.lives = [life(100, [(3, 7), (3, 9)], killed=10.0)]
        violations, _ = ledger.judge([Drop(1, "evicted", 100, 3, 7, 5.0)], slots_held_at_end=1)
        self.assertIn("registration slot/generation (3, 9) never ended", violations)
        self.assertIn("slots still held at the end: 1", violations)

    def test_only_an_engine_that_hangs_on_purpose_may_end_stalled(self):
        ledger = Ledger()
        hangs = Life(100, may_stall=True)
        hangs.registrations = [(1, 1)]
        steps = Life(101)
        steps.registrations = [(2, 1)]
        ledger.lives = [hangs, steps]
        drops = [Drop(1, "stalled", 100, 1, 1, 5.0), Drop(2, "stalled", 101, 2, 1, 5.0)]
        violations, _ = ledger.judge(drops)
        self.assertEqual(len(violations), 1)
        self.assertIn("(registration (2, 1)) ended stalled but its engine never hung", violations[0])

    def test_the_reapers_decision_is_judged_and_a_late_hook_only_reported(self):
        ledger = Ledger(timeout=0.5, slack=1.0)
        ledger.lives = [life(100, [(1, 1)], stops=[(10.0, None)])]
        # Decided after 0.55 s of silence (in bound), hook started 2.5 s after
        # the stop (a busy pool): reported, not a violation.
        violations, summary = ledger.judge([Drop(1, "timeout", 100, 1, 1, 12.5, 0.55)])
        self.assertEqual(violations, [])
        self.assertEqual(summary["worst"]["timeout hook start after stop"][0], 2.5)
        # Decided after 1.8 s of silence: past [0.5, 0.5 + 0.125 + 1.0].
        violations, _ = ledger.judge([Drop(1, "timeout", 100, 1, 1, 11.9, 1.8)])
        self.assertEqual(len(violations), 1)
        self.assertIn("ended timeout after 1.800s of silence, outside [0.5, 1.625]s", violations[0])

    def test_a_registration_ends_cleared_only_after_a_reset(self):
        ledger = Ledger()
        ledger.lives = [life(100, [(3, 7)])]
        drops = [Drop(1, "cleared", 100, 3, 7, 5.0)]
        violations, _ = ledger.judge(drops)
        self.assertEqual(violations, ["registration (3, 7) ended cleared with no reset requested"])
        ledger.resets = [4.9]
        violations, _ = ledger.judge(drops)
        self.assertEqual(violations, [])

    def test_repeated_drops_are_allowed_only_across_reaper_kills(self):
        ledger = Ledger()
        ledger.lives = [life(100, [(3, 7)]), life(101, [(4, 2)])]
        ledger.resets = [4.9]
        drops = [Drop(1, "cleared", 100, 3, 7, 5.0), Drop(1, "cleared", 100, 3, 7, 5.5),
                 Drop(2, "cleared", 101, 4, 2, 5.0), Drop(2, "cleared", 101, 4, 2, 5.6)]
        violations, summary = ledger.judge(drops)
        self.assertEqual(len(violations), 2)
        self.assertIn("dropped again at 5.50 with no reaper kill since 5.00", violations[0])
        # One kill interrupted both drops (their hooks ran at once): both repeat.
        ledger.reaper_downtime = [(5.1, 5.4)]
        violations, summary = ledger.judge(drops)
        self.assertEqual(violations, [])
        self.assertEqual(summary["repeats"], 2)
        # A kill before the first drop does not excuse a repeat.
        ledger.reaper_downtime = [(4.0, 4.5)]
        violations, _ = ledger.judge(drops)
        self.assertEqual(len(violations), 2)


if __name__ == "__main__":
    unittest.main()
