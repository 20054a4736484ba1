#!/usr/bin/env python3
"""CTest bench_perf_tables: perf_tables.py on the hand-written fixtures here (moekit-bench's CUDA and reference
schema, torch_bench.py's with and without --grouped-mm-alone and with and without its step memory, and with --mode
moekit, sonicmoe_bench.py's with --kernel-time), checked line by line and cell by cell: the header, the topics in their order with their
commands, the tables (the real-model layer shapes and the step memory columns among them), and --update of a
document's generated part."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "perf_tables.py")
RUN_ALL = os.path.join(HERE, "..", "run_all.sh")
sys.path.insert(0, os.path.join(HERE, ".."))
import perf_tables  # noqa: E402

FIG14 = ["moekit_fig14.json", "torch_eager_fig14.json", "torch_eager_fig14_rerun.json", "torch_compile_fig14.json"]
# torch_compile_models.json is as an older torch_bench.py wrote it: no peak_extra_bytes.
MODELS = ["moekit_models.json", "sonicmoe_models.json", "torch_eager_models.json", "torch_compile_models.json",
          "torch_moekit_models.json"]


def fixture(name):
    return os.path.join(HERE, name)


def run(*args, check=True):
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"perf_tables.py failed: {done.stderr}")
    return done.stdout if check else done


def section(text, title):
    """The lines of one topic: from its heading to the next."""
    start = text.index(f"### {title}\n")
    end = text.find("\n### ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def parse_table(text):
    lines = text.splitlines()
    columns = [c.strip() for c in next(l for l in lines if l.startswith("| case")).strip("| ").split(" | ")]
    rows = {}
    for line in lines:
        if line.startswith("| ") and not line.startswith("| case"):
            cells = [c.strip() for c in line.strip("| ").split(" | ")]
            rows[cells[0]] = cells
    return columns, rows


class Header(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.text = run(*map(fixture, FIG14), "--steps", fixture("steps.tsv"),
                       "--command", "MOEKIT_BENCH_BUDGET_S=400 bash bench/device/run_all.sh build-r moekit:smoke")

    def test_markers_and_header(self):
        lines = self.text.splitlines()
        self.assertEqual(lines[0], perf_tables.BEGIN)
        self.assertEqual(lines[-1], perf_tables.END)
        self.assertIn("## Current figures", lines)
        self.assertIn("- Date: 2026-11-30 02:09 UTC to 02:20 UTC", lines)
        self.assertIn("- Commit: `0123456789ab`", lines)
        self.assertIn("- Device: NVIDIA H200 (132 SMs, 1980 / 3201 MHz SM / memory clocks), driver 580.159.04 (CUDA "
                      "13.0 driver API), CUDA runtime 13.0; torch 2.11.0+cu130", lines)
        self.assertIn("- Command (on the GPU machine): `MOEKIT_BENCH_BUDGET_S=400 bash bench/device/run_all.sh build-r "
                      "moekit:smoke`", lines)
        self.assertNotIn("more than one commit", self.text)

    def test_topics_in_order_each_with_its_command(self):
        titles = [title for _, title, _, _ in perf_tables.TOPICS]
        positions = [self.text.index(f"### {title}\n") for title in titles]
        self.assertEqual(positions, sorted(positions))
        layer = section(self.text, titles[0])
        self.assertIn("`bash bench/device/run_all.sh DEST moekit:sonicmoe_fig14 torch-moekit:sonicmoe_fig14 "
                      "sonicmoe:sonicmoe_fig14 torch-eager:sonicmoe_fig14 torch-compile:sonicmoe_fig14` (config "
                      "`bench/configs/sonicmoe_fig14.json`). SonicMoE's steps need `bash "
                      "bench/device/stage_sonicmoe.sh DEST` first.", layer)
        self.assertIn("Ceilings measured by moekit-bench in this step: dense bf16 GEMM 796 TFLOP/s, device copy "
                      "4241 GB/s.", layer)
        self.assertIn("- step `torch-compile:sonicmoe_fig14`: exit 124 (time limit) after 240 s (limit 240 s)", layer)
        gemm = section(self.text, "Grouped GEMMs of the 12 layer shapes")
        self.assertIn("- step `torch-eager:gemm`: skipped (no time left)", gemm)
        self.assertIn("Not measured in this run.", gemm)
        for title in ("Sparse FFN against the dense FFN", "Building blocks against their roofline",
                      "Reference backend (CPU)"):
            self.assertIn("Not measured in this run.", section(self.text, title))
        self.assertIn("Not measured in this run (no SonicMoE results).",
                      section(self.text, "MoE layer against SonicMoE on the same GPU: events and GPU time"))
        models = section(self.text, "MoE layer: real-model shapes")
        self.assertIn("- step `torch-compile:models`: skipped (no time left)", models)
        self.assertIn("Not measured in this run.", models)

    def test_every_topic_step_is_a_run_all_step(self):
        with open(RUN_ALL) as f:
            defined = set(re.findall(r'^\s*"([a-z-]+:[a-z0-9_]+)\|', f.read(), re.M))
        for _, _, config, names in perf_tables.TOPICS:
            for name in names:
                self.assertIn(name, defined)
                self.assertEqual(name.split(":", 1)[1], config)

    def test_more_than_one_commit_is_flagged(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(fixture("torch_compile_fig14.json")) as f:
                other = json.load(f)
            other["meta"]["git_sha"] = "fedcba987654"
            path = os.path.join(tmp, "compile.json")
            with open(path, "w") as f:
                json.dump(other, f)
            text = run(fixture("moekit_fig14.json"), path)
        self.assertIn("- Commit: `0123456789ab`, `fedcba987654`", text)
        self.assertIn("**The result files come from more than one commit**", text)
        self.assertIn("- Command: not given (perf_tables.py --command)", text)


class LayerTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The eager re-run comes second: its copy of the forward case (99999 us) must lose to the first file's.
        text = run(*map(fixture, FIG14), "--steps", fixture("steps.tsv"))
        cls.text = section(text, "MoE layer: the 12 SonicMoE shapes")
        cls.columns, cls.rows = parse_table(cls.text)

    def cell(self, case, column):
        return self.rows[case][self.columns.index(column)]

    def test_columns(self):
        self.assertEqual(self.columns, ["case", "moekit ms", "moekit TFLOP/s", "spread %", "cuBLAS ms",
                                        "moekit vs cuBLAS", "eager ms", "eager TFLOP/s", "moekit vs eager",
                                        "compile ms", "compile TFLOP/s", "moekit vs compile", "moekit step GiB",
                                        "moekit step + gradients GiB",
                                        "eager step GiB", "compile step GiB", "SonicMoE paper H100 TFLOP/s",
                                        "moekit / paper H100"])
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
        self.assertIn("eager / compile: the MoE layer as a PyTorch user writes it", self.text)

    def test_failed_case(self):
        failed = "moe_fwd_T40960_H768_I256_E128_K8"
        self.assertEqual(self.cell(failed, "moekit ms"), "failed")
        self.assertEqual(self.cell(failed, "moekit vs cuBLAS"), "-")
        self.assertEqual(self.cell(failed, "eager ms"), "not run")
        self.assertEqual(self.cell(failed, "moekit step GiB"), "-")  # its record has no plan sizes
        self.assertEqual(self.cell(failed, "moekit step + gradients GiB"), "-")

    def test_step_memory(self):
        fwd, bwd = "moe_fwd_T32768_H4096_I1024_E128_K8", "moe_bwd_T32768_H4096_I1024_E128_K8"
        # workspace 1 MiB + saved 2 GiB, the same plan for both directions.
        self.assertEqual(self.cell(fwd, "moekit step GiB"), "2.00")
        self.assertEqual(self.cell(bwd, "moekit step GiB"), "2.00")
        # + grad_bytes 3288334336 (3.0625 GiB) of the eager record; the re-run's bwd record has none.
        self.assertEqual(self.cell(fwd, "moekit step + gradients GiB"), "5.06")
        self.assertEqual(self.cell(bwd, "moekit step + gradients GiB"), "-")
        self.assertEqual(self.cell(fwd, "eager step GiB"), "10.00")  # peak_extra_bytes 10 GiB
        self.assertEqual(self.cell(bwd, "eager step GiB"), "-")  # the re-run's record has no peak_extra_bytes
        self.assertEqual(self.cell(fwd, "compile step GiB"), "-")  # not supported there
        self.assertIn("step GiB: the device memory a forward + backward of the shape needs", self.text)
        self.assertIn("eager / compile: the peak of torch.cuda.max_memory_allocated()", self.text)

    def test_paper_figure_is_a_labelled_secondary_column(self):
        self.assertEqual(self.cell("moe_fwd_T32768_H4096_I1024_E128_K8", "SonicMoE paper H100 TFLOP/s"), "557")
        self.assertEqual(self.cell("moe_bwd_T32768_H4096_I1024_E128_K8", "SonicMoE paper H100 TFLOP/s"), "566")
        self.assertEqual(self.cell("moe_fwd_T40960_H768_I256_E128_K8", "SonicMoE paper H100 TFLOP/s"), "~334")
        self.assertEqual(self.cell("moe_fwd_T32768_H4096_I1024_E128_K8", "moekit / paper H100"), "0.59")  # 331 / 557
        self.assertEqual(self.cell("moe_fwd_T40960_H768_I256_E128_K8", "moekit / paper H100"), "-")  # failed case
        self.assertIn("read off the figure, which prints no numbers", self.text)
        self.assertIn("a secondary reference", self.text)


class SonicMoE(unittest.TestCase):
    """sonicmoe_bench.py's records: the first columns after cuBLAS in the layer table, its versions in the header,
    its check in a note, and the events / GPU time table with moekit's --breakdown."""

    @classmethod
    def setUpClass(cls):
        cls.text = run(fixture("moekit_fig14.json"), fixture("sonicmoe_fig14.json"), fixture("torch_eager_fig14.json"))

    def test_layer_columns_and_cells(self):
        columns, rows = parse_table(section(self.text, "MoE layer: the 12 SonicMoE shapes"))
        self.assertEqual(columns[6:], ["SonicMoE ms", "SonicMoE TFLOP/s", "moekit vs SonicMoE", "eager ms",
                                       "eager TFLOP/s", "moekit vs eager", "moekit step GiB",
                                       "moekit step + gradients GiB", "SonicMoE step GiB",
                                       "eager step GiB", "SonicMoE paper H100 TFLOP/s", "moekit / paper H100"])
        self.assertEqual(rows["moe_fwd_T32768_H4096_I1024_E128_K8"][6:9], ["11.98", "551", "0.60"])  # 11.976 / 19.96
        self.assertIn("- Device: NVIDIA H200 (132 SMs, 1980 / 3201 MHz SM / memory clocks), driver 580.159.04 (CUDA "
                      "13.0 driver API), CUDA runtime 13.0; torch 2.11.0+cu130, sonic-moe 0.1.2.post1, quack-kernels "
                      "0.3.11", self.text)
        self.assertIn("checked against the PyTorch layer on the same inputs: 3 of 32768 rows off by more than 2% "
                      "(passed).", self.text)

    def test_events_and_gpu_time(self):
        gpu = section(self.text, "MoE layer against SonicMoE on the same GPU: events and GPU time")
        self.assertIn("| shape (T, H, I, E, K) | fwd events: moekit us |", gpu)
        # fwd events 19960 against 11976; bwd: SonicMoE has none; fwd GPU time 18000 + 2050 against 11500.
        self.assertIn("| (32768, 4096, 1024, 128, 8) | 19960 | 11976 | 0.60 | 43120 | - | - | 20050 | 11500 | 0.57 "
                      "| - | - | - |", gpu)
        self.assertNotIn("needs moekit-bench --breakdown", gpu)


class ModelsTable(unittest.TestCase):
    """models.json: the layer table's columns without the paper's, the model of each case (its config's note), and
    the step memory of every tool, "-" where a file (an older tool's) has none."""

    @classmethod
    def setUpClass(cls):
        text = run(*map(fixture, MODELS + FIG14), "--steps", fixture("steps.tsv"))
        cls.text = section(text, "MoE layer: real-model shapes")
        cls.fig14 = section(text, "MoE layer: the 12 SonicMoE shapes")
        cls.columns, cls.rows = parse_table(cls.text)

    def cell(self, case, column):
        return self.rows[case][self.columns.index(column)]

    def test_columns_command_and_notes(self):
        self.assertEqual(self.columns, ["case", "model", "moekit ms", "moekit TFLOP/s", "spread %", "cuBLAS ms",
                                        "moekit vs cuBLAS", "moekit from Python ms", "moekit from Python TFLOP/s",
                                        "Python / C", "SonicMoE ms", "SonicMoE TFLOP/s", "moekit vs SonicMoE",
                                        "eager ms", "eager TFLOP/s", "moekit vs eager", "compile ms",
                                        "compile TFLOP/s", "moekit vs compile", "moekit step GiB",
                                        "moekit step + gradients GiB", "moekit from Python step GiB", "SonicMoE step GiB", "eager step GiB",
                                        "compile step GiB"])
        self.assertEqual(list(self.rows), ["moe_fwd_T32768_H2048_I768_E128_K8", "moe_bwd_T32768_H2048_I768_E128_K8",
                                           "moe_fwd_T16384_H2880_I2880_E32_K4"])
        self.assertIn("`bash bench/device/run_all.sh DEST moekit:models torch-moekit:models sonicmoe:models "
                      "torch-eager:models torch-compile:models` (config `bench/configs/models.json`). SonicMoE's steps need `bash "
                      "bench/device/stage_sonicmoe.sh DEST` first.", self.text)
        self.assertIn("- step `torch-compile:models`: skipped (no time left)", self.text)
        self.assertIn("Ceilings measured by moekit-bench in this step: dense bf16 GEMM 807 TFLOP/s", self.text)
        self.assertIn("The gpt-oss-like case adds its biases", self.text)
        self.assertIn("moekit from Python / SonicMoE / eager / compile: the peak of "
                      "torch.cuda.max_memory_allocated()", self.text)
        self.assertIn("moekit from Python: the same layer called as a PyTorch user calls it", self.text)
        self.assertIn("'Python / C' is its time over moekit-bench's", self.text)
        self.assertNotIn("moekit from Python", self.fig14)  # no Python results of that config
        self.assertNotIn("paper", self.text)
        self.assertNotIn("| model |", self.fig14)
        self.assertNotIn("step `torch-compile:models`", self.fig14)

    def test_cells(self):
        qwen, qwen_bwd, oss = ("moe_fwd_T32768_H2048_I768_E128_K8", "moe_bwd_T32768_H2048_I768_E128_K8",
                               "moe_fwd_T16384_H2880_I2880_E32_K4")
        self.assertEqual(self.cell(qwen, "model"), "Qwen3-30B-A3B-like")
        self.assertEqual(self.cell(oss, "model"), "gpt-oss-20b-like (SwiGLU-OAI, biases)")
        self.assertEqual(self.cell(qwen, "moekit ms"), "4.50")
        self.assertEqual(self.cell(qwen, "moekit vs cuBLAS"), "0.80")
        self.assertEqual(self.cell(qwen, "moekit vs SonicMoE"), "1.11")  # 5000 / 4501.49
        self.assertEqual(self.cell(qwen, "moekit vs eager"), "2.60")  # 11690.96 / 4501.49
        self.assertEqual(self.cell(qwen, "moekit vs compile"), "2.24")  # 10080.9 / 4501.49
        self.assertEqual(self.cell(oss, "SonicMoE ms"), "n/s")
        self.assertEqual(self.cell(oss, "compile ms"), "not run")
        self.assertEqual(self.cell(qwen_bwd, "eager ms"), "not run")

    def test_moekit_from_python(self):
        qwen, qwen_bwd, oss = ("moe_fwd_T32768_H2048_I768_E128_K8", "moe_bwd_T32768_H2048_I768_E128_K8",
                               "moe_fwd_T16384_H2880_I2880_E32_K4")
        self.assertEqual(self.cell(qwen, "moekit from Python ms"), "4.68")
        self.assertEqual(self.cell(qwen, "moekit from Python TFLOP/s"), "529")
        self.assertEqual(self.cell(qwen, "Python / C"), "1.04")  # 4680 / 4501.49
        self.assertEqual(self.cell(qwen_bwd, "Python / C"), "1.05")  # 9360 / 8915.34
        self.assertEqual(self.cell(oss, "moekit from Python ms"), "6.70")  # biases and SwiGLU-OAI: supported
        self.assertEqual(self.cell(oss, "Python / C"), "1.06")  # 6700 / 6321.97
        self.assertEqual(self.cell(qwen, "moekit from Python step GiB"), "4.25")  # 4563402752 / 2^30
        self.assertEqual(self.cell(oss, "moekit from Python step GiB"), "3.50")

    def test_step_memory(self):
        qwen, qwen_bwd, oss = ("moe_fwd_T32768_H2048_I768_E128_K8", "moe_bwd_T32768_H2048_I768_E128_K8",
                               "moe_fwd_T16384_H2880_I2880_E32_K4")
        # moekit: (2310022400 + 818938880) / 2^30 = 2.914; (1524582912 + 757334528) / 2^30 = 2.126.
        self.assertEqual(self.cell(qwen, "moekit step GiB"), "2.91")
        self.assertEqual(self.cell(qwen_bwd, "moekit step GiB"), "2.91")
        self.assertEqual(self.cell(oss, "moekit step GiB"), "2.13")
        # + grad_bytes 1342701568 and 1687633920 of the PyTorch-side records: 4.164, 3.698.
        self.assertEqual(self.cell(qwen, "moekit step + gradients GiB"), "4.16")
        self.assertEqual(self.cell(oss, "moekit step + gradients GiB"), "3.70")
        self.assertEqual(self.cell(qwen, "SonicMoE step GiB"), "4.00")
        self.assertEqual(self.cell(oss, "SonicMoE step GiB"), "-")  # not supported
        self.assertEqual(self.cell(qwen, "eager step GiB"), "6.63")  # 7121928704 / 2^30
        self.assertEqual(self.cell(oss, "eager step GiB"), "4.31")  # 4626842112 / 2^30
        self.assertEqual(self.cell(qwen_bwd, "eager step GiB"), "-")  # not run
        self.assertEqual(self.cell(qwen, "compile step GiB"), "-")  # an older torch_bench.py's file


class GroupedGemmTable(unittest.TestCase):
    """gemm_rows_per_expert.json: the routing counts of skewed configs and torch._grouped_mm alone."""

    @classmethod
    def setUpClass(cls):
        cls.text = run(fixture("moekit_smoke_reference.json"), fixture("torch_eager_gemm_rows_per_expert.json"),
                       fixture("moekit_gemm_rows_per_expert.json"), fixture("moekit_fig14.json"))
        cls.grouped = section(cls.text, "Grouped GEMM at ~256 to ~1024 rows per expert")
        cls.columns, cls.rows = parse_table(cls.grouped)

    def cell(self, case, column):
        return self.rows[case][self.columns.index(column)]

    def test_columns_and_command(self):
        self.assertEqual(self.columns, ["case", "moekit ms", "moekit TFLOP/s", "spread %", "cuBLAS ms",
                                        "moekit vs cuBLAS", "rows/expert min / max", "eager ms", "eager TFLOP/s",
                                        "moekit vs eager", "grouped_mm ms", "grouped_mm TFLOP/s",
                                        "moekit vs grouped_mm"])
        self.assertIn("`bash bench/device/run_all.sh DEST moekit:gemm_rows_per_expert "
                      "torch-eager:gemm_rows_per_expert` (config `bench/configs/gemm_rows_per_expert.json`).",
                      self.grouped)
        self.assertIn("grouped_mm: the torch._grouped_mm call of the case alone", self.grouped)
        self.assertIn("rows/expert: the routing's pairs per expert", self.grouped)

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
        layer = section(self.text, "MoE layer: the 12 SonicMoE shapes")
        self.assertNotIn("grouped_mm", layer)
        self.assertNotIn("rows/expert", layer)
        self.assertNotIn("step GiB", self.grouped)


class BlocksReferenceSmoke(unittest.TestCase):
    """Units below a millisecond and rates in GB/s, the roofline column, the reference backend in seconds, and the
    smoke config's --check as one line."""

    def test_blocks(self):
        blocks = section(run(fixture("moekit_blocks.json")), "Building blocks against their roofline")
        columns, rows = parse_table(blocks)
        self.assertEqual(columns, ["case", "moekit us", "moekit rate", "% of ceiling", "spread %", "copy us",
                                   "moekit vs copy"])
        self.assertEqual(rows["dispatch_T32768_E128_K8 (graph)"][1:], ["22.72", "185 GB/s", "4%", "1.50", "3.10",
                                                                       "0.14"])
        self.assertEqual(rows["combine_T32768_H4096_E128_K8"][1:], ["572.6", "4223 GB/s", "99%", "0.30", "569.0",
                                                                    "0.99"])
        self.assertIn("Ceilings measured by moekit-bench in this step: dense bf16 GEMM 790 TFLOP/s, device copy "
                      "4250 GB/s.", blocks)
        self.assertIn("Rows marked (graph) are CUDA graph replays", blocks)

    def test_reference_backend(self):
        reference = section(run(fixture("moekit_reference_layer.json")), "Reference backend (CPU)")
        columns, rows = parse_table(reference)
        self.assertEqual(columns, ["case", "reference s", "reference TFLOP/s", "spread %"])
        self.assertEqual(rows["moe_fwd_T2048_H1024_I512_E32_K4"][1:], ["1.40", "0.0184", "0.80"])
        self.assertIn("CPU: AMD EPYC 9654. Wall clock per call on the CPU (float64 accumulation, 16 worker threads)",
                      reference)

    def test_smoke_check_summary(self):
        with open(fixture("moekit_fig14.json")) as f:
            results = json.load(f)
        results["meta"]["config"] = "bench/configs/smoke.json"
        passed = {"status": "ok", "ok": True, "outputs": [{"name": "out", "kind": "values", "ok": True,
                                                           "rel_error": 0.0021, "tolerance": 0.01}]}
        failed = {"status": "ok", "ok": False, "outputs": [{"name": "out", "kind": "values", "ok": False,
                                                            "rel_error": 0.5, "tolerance": 0.01}]}
        results["cases"][0]["check"], results["cases"][1]["check"] = passed, failed
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "smoke.json")
            with open(path, "w") as f:
                json.dump(results, f)
            smoke = section(run(path), "Every operation at tiny shapes, checked against the reference backend")
        self.assertIn("3 cases, 2 ran (`moe_fwd_T40960_H768_I256_E128_K8` failed); 2 checked against the reference "
                      "backend: FAILED: `moe_bwd_T32768_H4096_I1024_E128_K8` (largest relative error 5.0e-01).", smoke)
        plain = section(run(fixture("moekit_smoke_reference.json")),
                        "Every operation at tiny shapes, checked against the reference backend")
        self.assertIn("2 cases, 2 ran; no --check.", plain)

    def test_other_configs_follow_with_their_commands(self):
        with open(fixture("moekit_blocks.json")) as f:
            results = json.load(f)
        results["meta"]["config"] = "bench/configs/gemm_probe.json"
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "probe.json")
            with open(path, "w") as f:
                json.dump(results, f)
            text = run(path)
        probe = text[text.index("### `bench/configs/gemm_probe.json`"):]
        self.assertLess(text.index("### Every operation at tiny shapes"), text.index("### `bench/configs/gemm_probe"))
        self.assertIn("- moekit: `./moekit-bench bench/configs/blocks.json --backend cuda --out moekit_blocks.json`",
                      probe)
        self.assertIn("| case | moekit us | moekit rate | spread % | cuBLAS us | moekit vs cuBLAS |", probe)


class Update(unittest.TestCase):
    def test_update_replaces_only_the_generated_part(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "performance.md")
            with open(path, "w") as f:
                f.write(f"# Performance\n\nBefore.\n\n{perf_tables.BEGIN}\nold tables\n{perf_tables.END}\n\nAfter.\n")
            run(fixture("moekit_blocks.json"), "--update", path)
            with open(path) as f:
                document = f.read()
            self.assertTrue(document.startswith("# Performance\n\nBefore.\n\n" + perf_tables.BEGIN + "\n"))
            self.assertTrue(document.endswith(perf_tables.END + "\n\nAfter.\n"))
            self.assertNotIn("old tables", document)
            self.assertIn("| dispatch_T32768_E128_K8 (graph) |", document)
            self.assertEqual(document.count(perf_tables.BEGIN), 1)

    def test_update_refuses_a_file_without_markers(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "other.md")
            with open(path, "w") as f:
                f.write("# No generated part\n")
            done = run(fixture("moekit_blocks.json"), "--update", path, check=False)
            self.assertNotEqual(done.returncode, 0)
            self.assertIn("has no generated part", done.stderr)
            with open(path) as f:
                self.assertEqual(f.read(), "# No generated part\n")


if __name__ == "__main__":
    unittest.main()
