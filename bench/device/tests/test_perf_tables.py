#!/usr/bin/env python3
"""CTest bench_perf_tables: perf_tables.py on the hand-written fixtures here (moekit-bench's CUDA schema and
torch_bench.py's, with and without --grouped-mm-alone), checked cell by cell."""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "perf_tables.py")


def fixture(name):
    return os.path.join(HERE, name)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], check=True, capture_output=True, text=True).stdout


class PerfTables(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The eager re-run comes second: its copy of the forward case (99999 us) must lose to the first file's.
        cls.text = run(fixture("moekit_fig14.json"), fixture("torch_eager_fig14.json"),
                       fixture("torch_eager_fig14_rerun.json"), fixture("torch_compile_fig14.json"),
                       "--steps", fixture("steps.tsv"))
        lines = cls.text.splitlines()
        cls.header = next(l for l in lines if l.startswith("| case"))
        cls.rows = {l.split(" | ")[0][2:]: [c.strip() for c in l.strip("| ").split(" | ")]
                    for l in lines if l.startswith("| moe_")}

    def cell(self, case, column):
        columns = [c.strip() for c in self.header.strip("| ").split(" | ")]
        return self.rows[case][columns.index(column)]

    def test_meta_lines(self):
        self.assertIn("### `bench/configs/sonicmoe_fig14.json`", self.text)
        self.assertIn("- moekit-bench (cuda backend): 2026-11-30T02:09:00Z, commit `0123456789ab`, NVIDIA H200 "
                      "(132 SMs, 1980 / 3201 MHz SM / memory clocks)", self.text)
        self.assertIn("dense bf16 GEMM 796 TFLOP/s, device copy 4241 GB/s", self.text)
        self.assertIn("Command: `./moekit-bench bench/configs/sonicmoe_fig14.json --backend cuda --out "
                      "moekit_sonicmoe_fig14.json`", self.text)
        self.assertIn("- PyTorch eager: 2026-11-30T02:14:00Z, commit `0123456789ab`, NVIDIA H200 (132 SMs), "
                      "CUDA runtime 13.0, torch 2.11.0+cu130", self.text)
        self.assertIn("- PyTorch torch.compile: 2026-11-30T02:16:00Z", self.text)
        self.assertIn("- step `torch-compile:sonicmoe_fig14`: exit 124 (time limit) after 240 s", self.text)
        self.assertNotIn("torch-eager:gemm", self.text)  # a step of a config that is not in the files

    def test_columns(self):
        self.assertEqual(self.header, "| case | moekit ms | moekit TFLOP/s | spread % | cuBLAS ms | moekit vs cuBLAS | "
                                      "eager ms | eager TFLOP/s | moekit vs eager | compile ms | compile TFLOP/s | "
                                      "moekit vs compile | SonicMoE H100 TFLOP/s | moekit / H100 |")
        self.assertEqual(list(self.rows), ["moe_fwd_T32768_H4096_I1024_E128_K8", "moe_bwd_T32768_H4096_I1024_E128_K8",
                                           "moe_fwd_T40960_H768_I256_E128_K8"])

    def test_moekit_and_cublas(self):
        fwd = "moe_fwd_T32768_H4096_I1024_E128_K8"
        self.assertEqual(self.cell(fwd, "moekit ms"), "19.96")
        self.assertEqual(self.cell(fwd, "moekit TFLOP/s"), "331")
        self.assertEqual(self.cell(fwd, "spread %"), "0.43")
        self.assertEqual(self.cell(fwd, "cuBLAS ms"), "9.67")
        self.assertEqual(self.cell(fwd, "moekit vs cuBLAS"), "0.48")
        self.assertEqual(self.cell("moe_bwd_T32768_H4096_I1024_E128_K8", "moekit vs cuBLAS"), "0.44")

    def test_pytorch_ratios_and_merge(self):
        fwd, bwd = "moe_fwd_T32768_H4096_I1024_E128_K8", "moe_bwd_T32768_H4096_I1024_E128_K8"
        self.assertEqual(self.cell(fwd, "eager ms"), "24.95")  # the first file's, not the re-run's 99999 us
        self.assertEqual(self.cell(fwd, "moekit vs eager"), "1.25")  # 24.95 / 19.96
        self.assertEqual(self.cell(bwd, "eager ms"), "86.24")  # only in the re-run
        self.assertEqual(self.cell(bwd, "moekit vs eager"), "2.00")
        self.assertEqual(self.cell(fwd, "compile ms"), "n/s")
        self.assertEqual(self.cell(fwd, "moekit vs compile"), "-")
        self.assertEqual(self.cell(bwd, "compile ms"), "not run")

    def test_failed_case(self):
        failed = "moe_fwd_T40960_H768_I256_E128_K8"
        self.assertEqual(self.cell(failed, "moekit ms"), "failed")
        self.assertEqual(self.cell(failed, "moekit vs cuBLAS"), "-")
        self.assertEqual(self.cell(failed, "eager ms"), "not run")

    def test_sonicmoe_reference_column(self):
        self.assertEqual(self.cell("moe_fwd_T32768_H4096_I1024_E128_K8", "SonicMoE H100 TFLOP/s"), "557")
        self.assertEqual(self.cell("moe_bwd_T32768_H4096_I1024_E128_K8", "SonicMoE H100 TFLOP/s"), "566")
        self.assertEqual(self.cell("moe_fwd_T40960_H768_I256_E128_K8", "SonicMoE H100 TFLOP/s"), "~334")
        self.assertEqual(self.cell("moe_fwd_T32768_H4096_I1024_E128_K8", "moekit / H100"), "0.59")  # 331 / 557
        self.assertEqual(self.cell("moe_fwd_T40960_H768_I256_E128_K8", "moekit / H100"), "-")  # failed case
        self.assertIn("read off the figure, which prints no numbers", self.text)

    def test_microseconds_and_rate_units_for_small_cases(self):
        text = run(fixture("moekit_fig14.json"), fixture("moekit_smoke_reference.json"))
        self.assertLess(text.index("sonicmoe_fig14.json`"), text.index("smoke.json`"))  # CONFIG_ORDER
        smoke = text[text.index("smoke.json`"):]
        self.assertIn("| case | moekit us | moekit rate | spread % | cuBLAS us | moekit vs cuBLAS |", smoke)
        self.assertIn("| dispatch | 10.96 | 0.377 GB/s | 0.27 | - | - |", smoke)
        self.assertIn("| moe_forward | 226.0 | 0.000554 TFLOP/s | 10.27 | - | - |", smoke)
        self.assertNotIn("SonicMoE H100", smoke)


class SonicMoEColumns(unittest.TestCase):
    """sonicmoe_bench.py's records: their own columns after PyTorch's, its versions, and its check in a note."""

    def test_columns_and_cells(self):
        text = run(fixture("moekit_fig14.json"), fixture("sonicmoe_fig14.json"))
        lines = text.splitlines()
        columns = [c.strip() for c in next(l for l in lines if l.startswith("| case")).strip("| ").split(" | ")]
        self.assertEqual(columns[6:], ["SonicMoE ms", "SonicMoE TFLOP/s", "moekit vs SonicMoE",
                                       "SonicMoE H100 TFLOP/s", "moekit / H100"])
        row = next(l for l in lines if l.startswith("| moe_fwd_T32768_H4096_I1024_E128_K8"))
        cells = [c.strip() for c in row.strip("| ").split(" | ")]
        self.assertEqual(cells[6:], ["11.98", "551", "0.60", "557", "0.59"])  # 11.976 / 19.96 ms; 331 / 557
        self.assertIn("- SonicMoE: 2026-11-30T02:18:00Z, commit `0123456789ab`, NVIDIA H200 (132 SMs), CUDA runtime "
                      "13.0, torch 2.11.0+cu130, sonic-moe 0.1.2.post1, quack-kernels 0.3.11", text)
        self.assertIn("checked against the PyTorch layer on the same inputs: 3 of 32768 rows off by more than 2% "
                      "(passed).", text)


class GroupedGemmTable(unittest.TestCase):
    """gemm_rows_per_expert.json: after gemm.json's place, the routing counts of skewed configs, torch._grouped_mm alone."""

    @classmethod
    def setUpClass(cls):
        cls.text = run(fixture("moekit_smoke_reference.json"), fixture("torch_eager_gemm_rows_per_expert.json"),
                       fixture("moekit_gemm_rows_per_expert.json"), fixture("moekit_fig14.json"))
        lines = cls.text[cls.text.index("gemm_rows_per_expert.json`"):].splitlines()
        cls.columns = [c.strip() for c in next(l for l in lines if l.startswith("| case")).strip("| ").split(" | ")]
        cls.rows = {l.split(" | ")[0][2:]: [c.strip() for c in l.strip("| ").split(" | ")]
                    for l in lines if l.startswith("| gemm_")}

    def cell(self, case, column):
        return self.rows[case][self.columns.index(column)]

    def test_order_and_columns(self):
        self.assertLess(self.text.index("sonicmoe_fig14.json`"), self.text.index("gemm_rows_per_expert.json`"))
        self.assertLess(self.text.index("gemm_rows_per_expert.json`"), self.text.index("smoke.json`"))
        self.assertEqual(self.columns, ["case", "moekit ms", "moekit TFLOP/s", "spread %", "cuBLAS ms",
                                        "moekit vs cuBLAS", "rows/expert min / max", "eager ms", "eager TFLOP/s",
                                        "moekit vs eager", "grouped_mm ms", "grouped_mm TFLOP/s",
                                        "moekit vs grouped_mm"])
        self.assertIn("grouped_mm: the torch._grouped_mm call of the case alone", self.text)

    def test_cells(self):
        up, skewed = "gemm_up_E128_r1024", "gemm_dw1_E128_r1024_skewed"
        self.assertEqual(self.cell(up, "moekit ms"), "4.40")
        self.assertEqual(self.cell(up, "moekit vs cuBLAS"), "0.68")
        self.assertEqual(self.cell(up, "rows/expert min / max"), "949 / 1110, 0 empty")
        self.assertEqual(self.cell(skewed, "rows/expert min / max"), "0 / 13834, 83 empty")
        self.assertEqual(self.cell(up, "moekit vs eager"), "1.36")  # 6.00 / 4.40
        self.assertEqual(self.cell(up, "grouped_mm ms"), "3.50")
        self.assertEqual(self.cell(up, "grouped_mm TFLOP/s"), "628")
        self.assertEqual(self.cell(up, "moekit vs grouped_mm"), "0.80")  # 3.50 / 4.40
        self.assertEqual(self.cell(skewed, "grouped_mm ms"), "-")  # the eager record has no grouped_mm_alone
        self.assertEqual(self.cell(skewed, "moekit vs grouped_mm"), "-")

    def test_no_extra_columns_elsewhere(self):
        fig14 = self.text[self.text.index("sonicmoe_fig14.json`"):self.text.index("gemm_rows_per_expert.json`")]
        self.assertNotIn("grouped_mm", fig14)
        self.assertNotIn("rows/expert", fig14)


if __name__ == "__main__":
    unittest.main()
