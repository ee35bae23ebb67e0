#!/usr/bin/env python3
"""The handshake reports of tools/bench_controlplane.py's emulated HAMi v2.5 device plugin
(`handshakes`): the value HAMi v2.5.2's plugin writes ("Reported " + Go's time.Now().String(),
pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go), the patch, and the schedule.
Vectors: a value written by a v2.5.2 plugin (also src/tessera/device/annotations_test.cc) and
Go 1.26's time.Time.String() of the instants below, printed by Go."""
import calendar
import importlib.util
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "bench_controlplane", os.path.join(HERE, "..", "..", "tools", "bench_controlplane.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

T0 = calendar.timegm((2024, 1, 23, 4, 30, 4)) * 10**9  # 2024-01-23 04:30:04 UTC, in ns


class ReportedValue(unittest.TestCase):
    def test_value_written_by_a_v252_plugin(self):
        self.assertEqual(bench.reported(T0 + 434037031, 1104711777756895),
                         "Reported 2024-01-23 04:30:04.434037031 +0000 UTC m=+1104711.777756895")

    def test_fraction_as_go_prints_it(self):
        # Go drops the fraction's trailing zeros, and the fraction when it is zero; the
        # monotonic reading always has 9 digits and no leading zero seconds.
        self.assertEqual(bench.go_time_string(T0 + 500000000, 11238),
                         "2024-01-23 04:30:04.5 +0000 UTC m=+0.000011238")
        self.assertEqual(bench.go_time_string(T0, 0), "2024-01-23 04:30:04 +0000 UTC m=+0.000000000")
        self.assertEqual(bench.go_time_string(T0 + 434037030, 8 * 10**9),
                         "2024-01-23 04:30:04.43403703 +0000 UTC m=+8.000000000")

    def test_hami_v252_reads_it_as_a_report(self):
        # Its scheduler's CheckHealth: "Requesting" in the value = waiting for the plugin,
        # "Deleted" = dropped; anything else is a report, which it stamps and registers.
        v = bench.reported()
        self.assertTrue(v.startswith("Reported 20"))
        self.assertNotIn("Requesting", v)
        self.assertNotIn("Deleted", v)
        self.assertNotIn("_", v)

    def test_patch_writes_registration_and_handshake(self):
        self.assertEqual(bench.report_patch("GPU-a,10,8192,100,NVIDIA-T4,0,true:", "Reported x"),
                         {"metadata": {"annotations": {
                             "hami.io/node-nvidia-register": "GPU-a,10,8192,100,NVIDIA-T4,0,true:",
                             "hami.io/node-handshake": "Reported x"}}})


class Schedule(unittest.TestCase):
    def test_every_node_once_per_period_spread_evenly(self):
        names = [f"n{i}" for i in range(4)]
        gen = bench.report_schedule(names, 100.0, 30.0)
        first = [next(gen) for _ in range(4)]
        second = [next(gen) for _ in range(4)]
        self.assertEqual(first, [(100.0, "n0"), (107.5, "n1"), (115.0, "n2"), (122.5, "n3")])
        self.assertEqual(second, [(t + 30.0, n) for t, n in first])


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False, verbosity=1).result.wasSuccessful() else 1)
