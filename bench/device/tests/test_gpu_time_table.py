#!/usr/bin/env python3
"""CTest bench_gpu_time_table: gpu_time_table.py on hand-written results (moekit-bench --breakdown and
sonicmoe_bench.py --kernel-time, a second SonicMoE file replacing a case of the first), checked cell by cell."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu_time_table.py")


def moekit_case(name, median, kernel_us):
    return {"name": name, "backend": "cuda", "status": "ok", "time_us": {"median": median},
            "breakdown": {"kernels": [{"kernel": f"k{i}", "calls": 1.0, "us": us} for i, us in enumerate(kernel_us)]}}


def sonicmoe_case(name, median, per_call_us, status="ok"):
    return {"name": name, "backend": "sonicmoe", "status": status, "time_us": {"median": median},
            "kernel_time_us": {"per_call_us": per_call_us, "calls": 10}}


class GpuTimeTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        files = {
            "moekit.json": [moekit_case("moe_fwd_T10_H20_I30_E4_K2", 100.0, [40.0, 60.0]),
                            moekit_case("moe_bwd_T10_H20_I30_E4_K2", 200.0, [150.0, 150.0]),
                            moekit_case("moe_fwd_T11_H20_I30_E4_K2", 50.0, [25.0])],
            "sonicmoe.json": [sonicmoe_case("moe_fwd_T10_H20_I30_E4_K2", 999.0, 999.0),
                              sonicmoe_case("moe_bwd_T10_H20_I30_E4_K2", 300.0, 240.0, status="failed")],
            "sonicmoe_rerun.json": [sonicmoe_case("moe_fwd_T10_H20_I30_E4_K2", 150.0, 80.0)],
        }
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for name, cases in files.items():
                paths.append(os.path.join(tmp, name))
                with open(paths[-1], "w") as f:
                    json.dump({"meta": {}, "cases": cases}, f)
            text = subprocess.run([sys.executable, SCRIPT, *paths], check=True, capture_output=True, text=True).stdout
        cls.rows = {l.split(" | ")[0][2:]: [c.strip() for c in l.strip("| ").split(" | ")]
                    for l in text.splitlines() if l.startswith("| (")}

    def test_shapes_in_order(self):
        self.assertEqual(list(self.rows), ["(10, 20, 30, 4, 2)", "(11, 20, 30, 4, 2)"])

    def test_events_and_gpu_time_with_ratios(self):
        # fwd events 100 vs 150 (the rerun's), bwd events: SonicMoE's case failed, so neither of its times counts;
        # fwd GPU time 100 vs 80; fwd + bwd GPU time 300 vs none.
        self.assertEqual(self.rows["(10, 20, 30, 4, 2)"][1:],
                         ["100", "150", "1.50", "200", "-", "-", "100", "80", "0.80", "300", "-", "-"])

    def test_missing_side_shows_dashes(self):
        self.assertEqual(self.rows["(11, 20, 30, 4, 2)"][1:],
                         ["50", "-", "-", "-", "-", "-", "25", "-", "-", "-", "-", "-"])


if __name__ == "__main__":
    unittest.main()
