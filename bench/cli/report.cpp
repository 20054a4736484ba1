#include "report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace moekit_bench {
namespace {

using nlohmann::ordered_json;

ordered_json number(double v) { return std::isfinite(v) ? ordered_json(v) : ordered_json(nullptr); }

// Times in µs to 0.01 µs (the events' resolution is ~0.5 µs): a few characters each in the file.
ordered_json samples(const std::vector<double>& us) {
  ordered_json list = ordered_json::array();
  for (double t : us) list.push_back(number(std::round(t * 100.0) / 100.0));
  return list;
}

ordered_json stats(const TimeStats& t) {
  return {{"median", number(t.median_us)}, {"min", number(t.min_us)}, {"max", number(t.max_us)}};
}

ordered_json meta_json(const RunMeta& m) {
  ordered_json device = {{"name", m.device.name}};
  if (m.backend == "cuda") {
    device["sm_count"] = m.device.sm_count;
    device["sm_clock_mhz"] = m.device.sm_clock_mhz;
    device["memory_clock_mhz"] = m.device.memory_clock_mhz;
    device["l2_bytes"] = m.device.l2_bytes;
    device["memory_bytes"] = m.device.memory_bytes;
    device["driver"] = m.device.driver;
    device["cuda_runtime"] = m.device.cuda_runtime;
  } else {
    device["threads"] = m.device.threads;
  }
  ordered_json ceilings = nullptr;
  if (m.gemm_ceiling_tflops > 0)
    ceilings = {{"dense_bf16_gemm_tflops", m.gemm_ceiling_tflops}, {"device_copy_gbps", m.copy_ceiling_gbps}};
  return {{"moekit_version", m.moekit_version},
          {"git_sha", m.git_sha},
          {"backend", m.backend},
          {"backend_note", m.backend_note},
          {"device", device},
          {"ceilings", ceilings},
          {"timing_method", m.timing_method},
          {"date", m.date},
          {"config", m.config_path},
          {"config_description", m.config_description},
          {"command_line", m.command_line}};
}

ordered_json check_json(const CheckResult& c) {
  if (!c.ran) return nullptr;
  ordered_json outputs = ordered_json::array();
  for (const OutputCheck& o : c.outputs) {
    ordered_json j = {{"name", o.name}, {"kind", o.kind}, {"ok", o.ok}};
    if (o.kind == "values") {
      j["rel_error"] = number(o.rel_error);
      j["tolerance"] = o.tolerance;
      j["rows_skipped"] = o.rows_skipped;
    } else {
      j["mismatches"] = o.mismatches;
    }
    outputs.push_back(j);
  }
  return {{"status", status_name(c.status)}, {"ok", c.ok()},      {"message", c.message},
          {"shape", c.shape},                {"against", c.against}, {"outputs", outputs}};
}

ordered_json routing_json(const RoutingSummary& s) {
  if (!s.present) return nullptr;
  ordered_json j = {{"kind", s.kind}};
  if (s.kind == "lognormal") {
    j["sigma"] = s.sigma;
    j["empty_fraction"] = s.empty_fraction;
    j["forced_empty"] = s.forced_empty;
  }
  j["counts"] = {{"min", s.count_min}, {"max", s.count_max}, {"mean", number(s.count_mean)}, {"empty", s.empty}};
  return j;
}

ordered_json case_json(const CaseResult& r) {
  ordered_json j = {{"name", r.name},
                    {"op", r.op},
                    {"backend", r.backend},
                    {"status", status_name(r.status)},
                    {"message", r.message},
                    {"shape", r.shape},
                    {"config", ordered_json::parse(r.config_json)},
                    {"routing", routing_json(r.routing)},
                    {"time_us", stats(r.time)},
                    {"spread_pct", number(r.spread_pct)},
                    {"timing",
                     {{"method", r.timing_method},
                      {"warmup", r.warmup},
                      {"iterations", r.iterations},
                      {"repeats", r.repeats},
                      {"input_sets", r.sets},
                      {"graph", r.graph},
                      {"derived", r.derivation},
                      {"samples_us", samples(r.samples_us)},
                      {"subtracted_samples_us",
                       r.derivation.empty() ? ordered_json(nullptr) : samples(r.subtracted_samples_us)}}},
                    {"flops", r.flops},
                    {"flop_convention", r.flop_convention},
                    {"tflops", number(r.tflops)},
                    {"bytes", r.bytes},
                    {"gbps", number(r.gbps)},
                    {"ceiling", r.ceiling.empty() ? ordered_json(nullptr) : ordered_json(r.ceiling)},
                    {"pct_of_ceiling", number(r.ceiling_pct)},
                    {"workspace_bytes", r.workspace_bytes},
                    {"saved_bytes", r.saved_bytes},
                    {"baseline",
                     {{"description", r.baseline_description},
                      {"time_us", stats(r.baseline)},
                      {"tflops", number(r.baseline_tflops)},
                      {"gbps", number(r.baseline_gbps)}}},
                    {"ratio", number(r.ratio)},
                    {"kernel_config", r.kernel_choices},
                    {"check", check_json(r.check)}};
  if (r.breakdown_requested) {
    ordered_json kernels = ordered_json::array();
    for (const KernelTime& k : r.breakdown)
      kernels.push_back(
          {{"kernel", k.name}, {"calls", k.calls}, {"us", k.us}, {"min_us", k.min_us}, {"max_us", k.max_us}});
    j["breakdown"] = {{"note", r.breakdown_note}, {"kernels", kernels}};
  }
  j["command"] = r.command;
  return j;
}

std::string fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "-";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, v);
  return text;
}

std::string time_text(double us) { return fixed(us, std::isfinite(us) && std::fabs(us) < 100 ? 2 : 1); }

// TFLOP/s and GB/s: whole numbers when large, three significant digits when small (the reference backend's).
std::string rate_text(double v) {
  if (!std::isfinite(v)) return "-";
  if (v >= 100) return fixed(v, 0);
  if (v >= 1) return fixed(v, 1);
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", v);
  return text;
}

// The worst figure of a check, for the table: "ok 2.1e-03", "FAIL 3e-02", "n/s" (not supported), "-".
std::string check_cell(const CheckResult& c) {
  if (!c.ran) return "-";
  if (c.status == CaseStatus::not_supported) return "n/s";
  if (c.status == CaseStatus::failed) return "FAIL";
  double worst = 0;
  int64_t mismatches = 0;
  for (const OutputCheck& o : c.outputs) {
    if (o.kind == "values") worst = std::max(worst, std::isfinite(o.rel_error) ? o.rel_error : INFINITY);
    if (o.kind != "values") mismatches += o.mismatches;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%s %.1e%s", c.ok() ? "ok" : "FAIL", worst,
                mismatches > 0 ? (" (" + std::to_string(mismatches) + " differ)").c_str() : "");
  return text;
}

}  // namespace

std::string results_json(const RunMeta& meta, const std::vector<CaseResult>& results) {
  ordered_json cases = ordered_json::array();
  for (const CaseResult& r : results) cases.push_back(case_json(r));
  return ordered_json{{"meta", meta_json(meta)}, {"cases", cases}}.dump(2) + "\n";
}

void print_details(std::FILE* out, const std::vector<CaseResult>& results) {
  for (const CaseResult& r : results) {
    if (r.status != CaseStatus::ok) std::fprintf(out, "%s: %s: %s\n", r.name.c_str(), status_name(r.status), r.message.c_str());
    if (r.check.ran) {
      std::fprintf(out, "%s: check at %s against the %s: %s%s\n", r.name.c_str(), r.check.shape.c_str(),
                   r.check.against.c_str(), r.check.ok() ? "ok" : "FAILED",
                   r.check.message.empty() ? "" : (" (" + r.check.message + ")").c_str());
      for (const OutputCheck& o : r.check.outputs) {
        if (o.kind == "values")
          std::fprintf(out, "    %-12s relative error %.3e (bound %.0e)%s%s\n", o.name.c_str(), o.rel_error,
                       o.tolerance, o.rows_skipped > 0 ? (", " + std::to_string(o.rows_skipped) + " rows skipped (their selection differs)").c_str() : "",
                       o.ok ? "" : "  FAIL");
        else
          std::fprintf(out, "    %-12s %s: %lld %s differ%s\n", o.name.c_str(), o.kind.c_str(),
                       static_cast<long long>(o.mismatches), o.kind == "exact" ? "elements" : "rows", o.ok ? "" : "  FAIL");
      }
    }
    if (r.breakdown_requested) {
      std::fprintf(out, "%s: kernel breakdown: %s\n", r.name.c_str(), r.breakdown_note.c_str());
      for (const KernelTime& k : r.breakdown)
        std::fprintf(out, "    %10.2f us  (%9.2f .. %9.2f)  %5.1f x  %s\n", k.us, k.min_us, k.max_us, k.calls,
                     k.name.c_str());
    }
  }
}

void print_table(std::FILE* out, const RunMeta& meta, const std::vector<CaseResult>& results) {
  size_t name_width = 4;
  for (const CaseResult& r : results) name_width = std::max(name_width, r.name.size());
  const int w = static_cast<int>(name_width);
  std::fprintf(out, "\nmoekit %s (%s), %s backend on %s\n", meta.moekit_version.c_str(), meta.git_sha.c_str(),
               meta.backend.c_str(), meta.device.name.c_str());
  if (meta.gemm_ceiling_tflops > 0)
    std::fprintf(out, "ceilings measured in this run: dense bf16 GEMM %.0f TFLOP/s, device copy %.0f GB/s\n",
                 meta.gemm_ceiling_tflops, meta.copy_ceiling_gbps);
  std::fprintf(out, "times in microseconds (%s)\n", meta.timing_method.c_str());
  std::fprintf(out, "%-*s  %-13s %11s %23s %7s %8s %8s %6s %11s %6s  %s\n", w, "case", "status", "median", "min .. max",
               "spread%", "TFLOP/s", "GB/s", "%ceil", "baseline", "ratio", "check");
  for (const CaseResult& r : results) {
    const std::string range = time_text(r.time.min_us) + " .. " + time_text(r.time.max_us);
    std::fprintf(out, "%-*s  %-13s %11s %23s %7s %8s %8s %6s %11s %6s  %s\n", w, r.name.c_str(), status_name(r.status),
                 time_text(r.time.median_us).c_str(), r.status == CaseStatus::ok ? range.c_str() : "-",
                 fixed(r.spread_pct, 2).c_str(), rate_text(r.tflops).c_str(), rate_text(r.gbps).c_str(),
                 fixed(r.ceiling_pct, 1).c_str(), time_text(r.baseline.median_us).c_str(), fixed(r.ratio, 2).c_str(),
                 check_cell(r.check).c_str());
  }
  if (meta.gemm_ceiling_tflops <= 0) std::fprintf(out, "baseline: none on the reference backend\n");
  else std::fprintf(out, "ratio = baseline time / moekit time (> 1: moekit is faster than its baseline)\n");
}

}  // namespace moekit_bench
