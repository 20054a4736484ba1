#include "measure.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "workload.h"

namespace moekit_bench {
namespace {

// The library's moekit_plan_describe text of `plan`, one entry per line (a layer's building blocks each on one).
std::vector<std::string> plan_description_lines(moekit_plan_t plan) {
  std::string text(moekit_plan_describe(plan, nullptr, 0), '\0');
  moekit_plan_describe(plan, text.data(), text.size() + 1);
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

double spread_percent(const std::vector<double>& medians) {
  if (medians.size() < 2) return kNone;
  const auto [lo, hi] = std::minmax_element(medians.begin(), medians.end());
  return 100.0 * (*hi - *lo) / summarize(medians).median_us;
}

// The library calls of `steps`, in order, on one set; a failed call throws CaseFailure.
Call steps_call(Workload& workload, std::vector<int> steps, void* stream) {
  return [&workload, steps, stream](int set) {
    for (int step : steps) check_call(workload.run_step(step, set, stream), workload.step_name(step).c_str());
  };
}

void fill_rates(CaseResult& r, const WorkModel& model, const MeasureContext& context) {
  const double seconds = r.time.median_us * 1e-6;
  if (!(seconds > 0)) return;
  if (r.flops > 0) r.tflops = r.flops / seconds / 1e12;
  r.gbps = r.bytes / seconds / 1e9;
  if (context.baselines == nullptr) return;
  if (!model.dense.empty()) {
    r.ceiling = "dense bf16 GEMM 8192^3 (cuBLASLt), TFLOP/s";
    r.ceiling_pct = 100.0 * r.tflops / context.baselines->gemm_ceiling_tflops;
  } else {
    r.ceiling = "device-to-device copy, GB/s (read + write)";
    r.ceiling_pct = 100.0 * r.gbps / context.baselines->copy_ceiling_gbps;
  }
}

void measure_baseline(CaseResult& r, const WorkModel& model, const CallCounts& counts, MeasureContext& context) {
  if (context.baselines == nullptr) {
    r.baseline_description = "no baseline on the reference backend";
    return;
  }
  r.baseline_description = model.baseline_description;
  r.baseline = model.dense.empty()
                   ? context.baselines->device_copy(r.bytes, counts.warmup, counts.iterations, counts.repeats)
                   : context.baselines->dense_gemms(model.dense, counts.warmup, counts.iterations, counts.repeats);
  const double seconds = r.baseline.median_us * 1e-6;
  if (!model.dense.empty()) {
    double flops = 0;
    for (const DenseGemm& g : model.dense) flops += g.flops();
    r.baseline_tflops = flops / seconds / 1e12;
  } else {
    r.baseline_gbps = r.bytes / seconds / 1e9;
  }
  r.ratio = r.baseline.median_us / r.time.median_us;
}

// One round of platform.time_calls added to `rounds`: its median, and its calls' times in the order they ran (the
// caller pools them once every round is in).
void add_round(Platform& platform, const Call& call, int sets, const CallCounts& counts, Rounds& rounds) {
  const std::vector<double> us = platform.time_calls(call, sets, counts.warmup, counts.iterations);
  rounds.medians.push_back(summarize(us).median_us);
  rounds.samples.insert(rounds.samples.end(), us.begin(), us.end());
}

// A derived time is the difference of two measurements, so both must see the same machine: their rounds alternate
// (full, part, full, part, ...), and a burst of load from another process slows a round of each rather than all
// rounds of one. Measured back to back, a busy host (CI runs the tests two at a time on two cores) made a
// backward's difference negative.
std::pair<Rounds, Rounds> time_alternating_rounds(Platform& platform, const Call& full, const Call& part, int sets,
                                                  const CallCounts& counts) {
  Rounds full_rounds, part_rounds;
  for (int round = 0; round < counts.repeats; ++round) {
    add_round(platform, full, sets, counts, full_rounds);
    add_round(platform, part, sets, counts, part_rounds);
  }
  full_rounds.pooled = summarize(full_rounds.samples);
  part_rounds.pooled = summarize(part_rounds.samples);
  return {full_rounds, part_rounds};
}

void measure(const CaseConfig& config, MeasureContext& context, CaseResult& r, WorkModel& model, CallCounts& counts) {
  Platform& platform = context.platform;
  std::unique_ptr<Workload> workload = make_workload(config, config.shape);
  check_call(workload->create_plan(context.handle), "plan creation");
  r.kernel_choices = plan_description_lines(workload->plan());
  r.workspace_bytes = workload->workspace_bytes();
  r.saved_bytes = workload->saved_bytes();
  model = workload->model();
  r.flops = model.flops;
  r.flop_convention = model.flop_convention;
  r.bytes = workload->bytes();
  if (const Routing* routing = workload->routing_used()) r.routing = summarize(*routing);

  double set_bytes = 0;
  for (const TensorSpec& s : workload->tensors()) set_bytes += static_cast<double>(s.bytes());
  r.sets = rotation_sets(platform, set_bytes);
  std::vector<std::unique_ptr<TensorSet>> sets;
  std::vector<const TensorSet*> views;
  for (int s = 0; s < r.sets; ++s) {
    sets.push_back(std::make_unique<TensorSet>(platform, workload->tensors(), config.seed + static_cast<uint64_t>(s)));
    views.push_back(sets.back().get());
  }
  Buffer workspace(platform, r.workspace_bytes);
  workload->bind(views, workspace.data(), workspace.bytes());

  const Call timed = steps_call(*workload, workload->timed_steps(), platform.stream());
  const std::vector<int> subtracted_steps = workload->subtracted_steps();
  const Call subtracted = subtracted_steps.empty() ? nullptr : steps_call(*workload, subtracted_steps, platform.stream());
  if (!subtracted_steps.empty()) {
    r.derivation = "t(" + workload->step_name(0) + " + " + workload->step_name(1) + ") - t(" +
                   workload->step_name(0) + "), medians of each round";
  }

  // One call before anything else: a backend that cannot serve the case says so here.
  timed(0);
  platform.synchronize();

  Call timed_run = timed, subtracted_run = subtracted;
  r.timing_method = platform.timing_method();
  if (config.graph && context.validate) {
    r.timing_method += "; graph replay asked for, but a validating call cannot be captured (--validate)";
  } else if (config.graph) {
    Call replay = platform.capture(timed, r.sets);
    if (replay) {
      r.graph = true;
      timed_run = replay;
      if (subtracted) subtracted_run = platform.capture(subtracted, r.sets);
      r.timing_method += "; each call replays a captured CUDA graph";
    } else {
      r.timing_method += "; graph replay asked for but not available on this backend";
    }
  }

  counts = platform.backend() == MOEKIT_BACKEND_CUDA ? config.cuda_counts : config.reference_counts;
  r.warmup = counts.warmup;
  r.iterations = counts.iterations;
  r.repeats = counts.repeats;
  if (!subtracted) {
    const Rounds full = time_rounds(platform, timed_run, r.sets, counts);
    r.time = full.pooled;
    r.spread_pct = spread_percent(full.medians);
    r.samples_us = full.samples;
  } else {
    const auto [full, part] = time_alternating_rounds(platform, timed_run, subtracted_run, r.sets, counts);
    std::vector<double> differences;
    for (size_t i = 0; i < full.medians.size(); ++i) differences.push_back(full.medians[i] - part.medians[i]);
    r.time.median_us = full.pooled.median_us - part.pooled.median_us;
    r.time.min_us = full.pooled.min_us - part.pooled.median_us;
    r.time.max_us = full.pooled.max_us - part.pooled.median_us;
    r.spread_pct = spread_percent(differences);
    r.samples_us = full.samples;
    r.subtracted_samples_us = part.samples;
  }

  if (context.breakdown) {
    r.breakdown_requested = true;
    if (context.profiler == nullptr) {
      r.breakdown_note = context.profiler_missing;
    } else {
      const int calls = std::max(1, std::min(counts.iterations, 10));
      int set = 0;
      r.breakdown = context.profiler->profile([&] { timed(set++ % r.sets); }, calls);
      r.breakdown_note = "GPU time per timed call (CUPTI activity records), plain stream calls, one at a time: "
                         "mean (least .. most) of " +
                         std::to_string(calls) + " calls";
    }
  }
}

}  // namespace

int rotation_sets(const Platform& platform, double set_bytes) {
  const double needed = static_cast<double>(platform.rotation_bytes());
  if (needed <= 0 || set_bytes >= needed) return 1;
  return static_cast<int>(std::min(64.0, std::floor(needed / std::max(set_bytes, 1.0)) + 1));
}

Rounds time_rounds(Platform& platform, const Call& call, int sets, const CallCounts& counts) {
  Rounds r;
  for (int round = 0; round < counts.repeats; ++round) add_round(platform, call, sets, counts, r);
  r.pooled = summarize(r.samples);
  return r;
}

CaseResult measure_case(const CaseConfig& config, MeasureContext& context) {
  CaseResult r;
  r.name = config.name;
  r.op = config.op_name;
  r.backend = context.platform.backend() == MOEKIT_BACKEND_CUDA ? "cuda" : "reference";
  r.shape = shape_text(config.shape);
  r.config_json = config.json;
  WorkModel model;
  CallCounts counts;
  try {
    measure(config, context, r, model, counts);  // releases the case's buffers before the baseline takes its own
  } catch (const CaseFailure& e) {
    r.status = e.status == MOEKIT_STATUS_NOT_SUPPORTED ? CaseStatus::not_supported : CaseStatus::failed;
    r.message = r.status == CaseStatus::not_supported ? std::string("not supported by this backend yet: ") + e.what()
                                                      : e.what();
    return r;
  } catch (const std::exception& e) {
    r.status = CaseStatus::failed;
    r.message = e.what();
    return r;
  }
  fill_rates(r, model, context);
  try {
    measure_baseline(r, model, counts, context);
  } catch (const std::exception& e) {
    r.baseline_description = "baseline failed: " + std::string(e.what());
  }
  return r;
}

}  // namespace moekit_bench
