// What one case produced: its timing, rates, baseline, verification and the command that reproduces it. Filled by
// measure_case() and check_case(), written by report.cpp as a table row and a JSON record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace moekit_bench {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();  // a figure that does not apply (JSON null)

struct TimeStats {
  double median_us = kNone;
  double min_us = kNone;
  double max_us = kNone;
};

// Median, min and max of per-call times.
TimeStats summarize(std::vector<double> us);

enum class CaseStatus { ok, not_supported, failed };
const char* status_name(CaseStatus status);  // "ok", "not_supported", "failed"

// --check of one output tensor against the reference backend.
struct OutputCheck {
  std::string name;
  std::string kind;           // "values", "exact", "selection"
  double rel_error = kNone;   // values: ||out - ref|| / ||ref|| over the compared rows
  int64_t mismatches = 0;     // exact: elements that differ; selection: rows that differ
  int64_t rows_skipped = 0;   // values keyed on a selection: rows whose selection differs
  double tolerance = kNone;   // values: docs/math.md section 9's whole-tensor bound for the case's dtype
  bool ok = false;
};

struct CheckResult {
  bool ran = false;
  CaseStatus status = CaseStatus::ok;
  std::string message;
  std::string shape;    // the shape checked, e.g. "tokens=256 experts=8 top_k=2"
  std::string against;  // "reference backend" or "reference backend, 1 thread"
  std::vector<OutputCheck> outputs;
  bool ok() const;
};

struct KernelTime {
  std::string name;
  double calls = 0;  // launches per timed call
  double us = 0;     // GPU time per timed call (the mean over the profiled calls)
  double min_us = 0;  // the least and most GPU time of one call
  double max_us = 0;
};

// The routing a case ran on (operations with real routing, routing.h): how it was drawn and its pairs per expert.
struct RoutingSummary {
  bool present = false;
  std::string kind;                                 // "uniform" or "lognormal"
  double sigma = kNone, empty_fraction = kNone;     // lognormal only
  int64_t forced_empty = 0;                         // lognormal: experts nobody may route to
  int64_t count_min = 0, count_max = 0, empty = 0;  // pairs per expert: fewest, most, experts with none
  double count_mean = kNone;                        // P / E
};

struct CaseResult {
  std::string name, op, backend, dtype, shape;
  std::string config_json;
  CaseStatus status = CaseStatus::ok;
  std::string message;

  TimeStats time;
  double spread_pct = kNone;  // (max - min) / median of the repeats' medians
  int warmup = 0, iterations = 0, repeats = 0, sets = 0;
  bool graph = false;
  std::string timing_method;
  // The library's kernel choices for the case's plan (MOEKIT_LOG_CONFIG lines; none on the reference backend).
  std::vector<std::string> kernel_choices;
  std::string derivation;  // "", or how the time was derived ("t(forward + backward) - t(forward)")
  // Every timed call's time in µs, in the order they ran (repeats rounds of iterations): the timed call's (derived:
  // the full call's) and, for a derived time, the subtracted call's. A bimodal spread shows here, not in a median.
  std::vector<double> samples_us, subtracted_samples_us;
  RoutingSummary routing;

  double flops = 0, bytes = 0;
  double tflops = kNone, gbps = kNone;
  std::string flop_convention;
  std::string ceiling;  // which measured ceiling the case is compared with
  double ceiling_pct = kNone;
  size_t workspace_bytes = 0, saved_bytes = 0;

  std::string baseline_description;  // "no baseline on the reference backend" when there is none
  TimeStats baseline;
  double baseline_tflops = kNone, baseline_gbps = kNone;
  double ratio = kNone;  // baseline time / moekit time: moekit's throughput relative to the baseline

  bool breakdown_requested = false;
  std::vector<KernelTime> breakdown;
  std::string breakdown_note;

  CheckResult check;
  std::string command;
};

}  // namespace moekit_bench
