// Timing one case (docs/benchmark.md, "How a case is measured"): plan, tensors rotated past the cache, a first call
// that finds out whether the backend serves the case, warm-up, `repeats` rounds of timed calls, the derived
// backward time, the kernel breakdown, then the baseline of equal work.
#pragma once

#include <string>
#include <vector>

#include "baselines.h"
#include "case_config.h"
#include "case_result.h"
#include "kernel_profiler.h"
#include "platform.h"

namespace moekit_bench {

struct MeasureContext {
  Platform& platform;
  moekit_handle_t handle;
  Baselines* baselines = nullptr;      // CUDA backend only
  bool breakdown = false;              // --breakdown
  KernelProfiler* profiler = nullptr;  // with --breakdown, when CUPTI could be loaded
  std::string profiler_missing;        // why there is no profiler
  bool validate = false;               // --validate: calls synchronise, so no graph replay
};

// Never throws: a case the backend cannot serve comes back as not_supported, any other failure as failed.
CaseResult measure_case(const CaseConfig& config, MeasureContext& context);

// Shared with the baselines, which are measured the same way:
// the input sets to rotate through: enough that one round of calls touches more than the platform's rotation bytes
// (2x L2), at most 64; one when a single set is already that large, or on the host.
int rotation_sets(const Platform& platform, double set_bytes);

// `repeats` rounds of platform.time_calls: each round's median, the statistics of every call pooled, and every
// call's time in the order they ran.
struct Rounds {
  std::vector<double> medians;
  TimeStats pooled;
  std::vector<double> samples;
};
Rounds time_rounds(Platform& platform, const Call& call, int sets, const CallCounts& counts);

}  // namespace moekit_bench
