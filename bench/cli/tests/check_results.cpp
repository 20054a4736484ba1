// Checks a moekit-bench results file against its config: the meta block, one record per case in config order,
// every case run (or reported not supported) with a positive time, its figures present, its check passed, a
// reproduce command that names the case, for the operations with real routing the routing record (lognormal
// routing: its empty experts really empty), a --breakdown's kernel records, and the plan's description.
//   moekit_bench_check_results RESULTS.json CONFIG.json      exit 0 when everything holds, else 1 with the reasons
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

using nlohmann::json;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "check_results: %s\n", what.c_str());
  ++failures;
}

json read(const char* path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error(std::string("cannot open ") + path);
  return json::parse(file);
}

void check_meta(const json& meta) {
  for (const char* key : {"moekit_version", "git_sha", "backend", "device", "timing_method", "date", "config"})
    expect(meta.contains(key), std::string("meta: no field '") + key + "'");
  expect(meta.value("moekit_version", "").find('.') != std::string::npos, "meta: moekit_version is not MAJOR.MINOR.PATCH");
  expect(!meta.value("git_sha", "").empty(), "meta: empty git_sha");
  expect(meta.contains("device") && !meta["device"].value("name", "").empty(), "meta: no device name");
  const std::string backend = meta.value("backend", "");
  expect(backend == "cuda" || backend == "reference", "meta: backend is neither cuda nor reference");
  if (backend == "cuda") {
    for (const char* key : {"sm_count", "sm_clock_mhz", "driver", "cuda_runtime"})
      expect(meta["device"].contains(key), std::string("meta.device: no field '") + key + "' on the CUDA backend");
    expect(meta["ceilings"].is_object(), "meta: no ceilings on the CUDA backend");
  }
}

bool has_real_routing(const std::string& op) {
  for (const char* routed : {"router_backward", "dispatch", "gemm", "combine", "broadcast_backward", "db1", "db2_ds"})
    if (op == routed) return true;
  return false;
}

void check_routing(const json& c, const std::string& where) {
  const json& routing = c["routing"];
  const json& config = c["config"];
  expect(routing.is_object() && routing["counts"].is_object(), where + "no routing record");
  if (!routing.is_object() || !routing["counts"].is_object()) return;
  const std::string kind = config.value("routing", "uniform");
  expect(routing.value("kind", "") == kind, where + "routing kind " + routing.value("kind", "") + ", config " + kind);
  const json& counts = routing["counts"];
  const double mean = static_cast<double>(config.value("tokens", 0) * config.value("top_k", 0)) /
                      static_cast<double>(config.value("experts", 1));
  expect(counts.value("min", -1) <= mean && counts.value("max", -1) >= mean &&
             std::fabs(counts.value("mean", 0.0) - mean) < 1e-9,
         where + "routing counts inconsistent with the shape: " + counts.dump());
  if (kind != "lognormal") return;
  const int64_t experts = config.value("experts", 0), forced = routing.value("forced_empty", int64_t{-1});
  const double fraction = config.value("routing_empty", 1.0 / 16);
  const auto floor_count = static_cast<int64_t>(std::floor(fraction * static_cast<double>(experts)));
  expect(forced == (experts >= 16 && fraction > 0 ? std::max<int64_t>(floor_count, 1) : floor_count),
         where + "forced_empty " + std::to_string(forced) + " is not the configured fraction of the experts");
  expect(counts.value("empty", int64_t{-1}) >= forced, where + "fewer empty experts than forced: " + routing.dump());
  if (forced > 0) expect(counts.value("min", -1) == 0, where + "an expert forced empty got rows: " + routing.dump());
}

// timing.samples_us holds one positive time per timed call (iterations x repeats), whose extremes are time_us's
// min and max for a measured time; a derived time also lists the subtracted call's, as many.
void check_samples(const json& c, const std::string& where) {
  const json& timing = c["timing"];
  const auto calls = static_cast<size_t>(timing.value("iterations", 0) * timing.value("repeats", 0));
  const auto check_list = [&](const char* key) {
    const json& list = timing[key];
    expect(list.is_array() && list.size() == calls,
           where + key + " is not one time per timed call (" + std::to_string(calls) + "): " + list.dump());
    for (const json& t : list) expect(t.is_number() && t.get<double>() > 0, where + key + " holds " + t.dump());
  };
  check_list("samples_us");
  if (timing.value("derived", "").empty()) {
    expect(timing["subtracted_samples_us"].is_null(), where + "subtracted_samples_us without a derived time");
    const std::vector<double> samples = timing["samples_us"].get<std::vector<double>>();
    const auto [lo_it, hi_it] = std::minmax_element(samples.begin(), samples.end());
    const double lo = lo_it == samples.end() ? 0 : *lo_it, hi = hi_it == samples.end() ? 0 : *hi_it;
    // The samples are rounded to 0.01 µs.
    expect(std::fabs(lo - c["time_us"]["min"].get<double>()) <= 0.006 &&
               std::fabs(hi - c["time_us"]["max"].get<double>()) <= 0.006,
           where + "samples_us's extremes are not time_us's min and max");
  } else {
    check_list("subtracted_samples_us");
  }
}

// With --breakdown on the CUDA backend, every kernel's record: launches per call > 0 and the least and most GPU time
// of one call on either side of the mean (all three from the same per-call sums).
void check_breakdown(const json& c, const std::string& where) {
  const json& breakdown = c["breakdown"];
  expect(breakdown.is_object() && breakdown["kernels"].is_array(), where + "breakdown without a kernel list");
  if (!breakdown.is_object() || !breakdown["kernels"].is_array()) return;
  for (const json& k : breakdown["kernels"]) {
    const std::string kernel = where + "breakdown of " + k.value("kernel", "?") + ": ";
    expect(k.value("calls", 0.0) > 0, kernel + "no launches");
    const double us = k.value("us", -1.0), lo = k.value("min_us", -1.0), hi = k.value("max_us", -1.0);
    expect(lo >= 0 && lo <= us * (1 + 1e-12) && us <= hi * (1 + 1e-12),
           kernel + "min_us <= us <= max_us does not hold: " + k.dump());
  }
}

// kernel_config: the plan's moekit_plan_describe text, one line per entry, naming the backend on its first line.
void check_kernel_config(const json& c, const std::string& where, const std::string& backend) {
  const json& lines = c["kernel_config"];
  expect(lines.is_array() && !lines.empty() && lines[0].is_string(), where + "no kernel_config lines");
  if (!lines.is_array() || lines.empty() || !lines[0].is_string()) return;
  const std::string first = lines[0].get<std::string>();
  const char* names = backend == "reference" ? "reference backend" : "CUDA device";
  expect(first.find(names) != std::string::npos, where + "kernel_config does not name the backend: " + first);
}

void check_case(const json& c, const std::string& expected_name, const std::string& backend) {
  const std::string where = "case '" + expected_name + "': ";
  expect(c.value("name", "") == expected_name, where + "found '" + c.value("name", "") + "' in its place");
  for (const char* key : {"op", "backend", "status", "shape", "config", "time_us", "spread_pct", "timing", "flops",
                          "tflops", "bytes", "gbps", "pct_of_ceiling", "workspace_bytes", "saved_bytes", "baseline",
                          "ratio", "check", "command"})
    expect(c.contains(key), where + "no field '" + key + "'");
  const std::string status = c.value("status", "");
  expect(status == "ok" || status == "not_supported", where + "status " + status + ": " + c.value("message", ""));
  if (status == "ok") {
    const json& t = c["time_us"];
    expect(t["median"].is_number() && t["median"].get<double>() > 0, where + "no positive median time");
    expect(t["min"].is_number() && t["max"].is_number() && t["min"].get<double>() <= t["max"].get<double>(),
           where + "min/max time missing or out of order");
    check_samples(c, where);
    expect(c["gbps"].is_number() && c["gbps"].get<double>() > 0, where + "no positive GB/s");
    if (c["flops"].get<double>() > 0) expect(c["tflops"].is_number(), where + "FLOPs but no TFLOP/s");
    expect(c["bytes"].get<double>() > 0, where + "no bytes counted");
    if (has_real_routing(c.value("op", ""))) check_routing(c, where);
    if (c.contains("breakdown")) check_breakdown(c, where);
    check_kernel_config(c, where, backend);
    if (backend == "reference")
      expect(c["baseline"].value("description", "").find("no baseline") != std::string::npos,
             where + "the reference backend must state that there is no baseline");
    else
      expect(c["ratio"].is_number(), where + "no baseline ratio on the CUDA backend");
  }
  if (!c["check"].is_null()) {
    expect(c["check"].value("ok", false), where + "check failed: " + c["check"].dump());
    expect(!c["check"]["outputs"].empty() || c["check"].value("status", "") != "ok", where + "check compared nothing");
  }
  const std::string command = c.value("command", "");
  expect(command.find("--filter") != std::string::npos && command.find(expected_name) != std::string::npos,
         where + "the command does not select the case: " + command);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s RESULTS.json CONFIG.json\n", argv[0]);
    return 2;
  }
  try {
    const json results = read(argv[1]);
    const json config = read(argv[2]);
    expect(results.contains("meta") && results.contains("cases"), "no meta block or no cases");
    check_meta(results["meta"]);
    const json& cases = results["cases"];
    expect(cases.size() == config["cases"].size(), "the results hold " + std::to_string(cases.size()) +
                                                        " cases, the config " + std::to_string(config["cases"].size()));
    const std::string backend = results["meta"].value("backend", "");
    for (size_t i = 0; i < cases.size() && i < config["cases"].size(); ++i) {
      const json& given = config["cases"][i];
      check_case(cases[i], given.value("name", ""), backend);
      if (given.contains("beta"))
        expect(cases[i]["config"].value("beta", 0.0) == given["beta"].get<double>(),
               "case '" + given.value("name", "") + "': the record's config does not show its beta");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "check_results: %s\n", e.what());
    return 1;
  }
  if (failures == 0) std::printf("check_results: %s holds every case of %s\n", argv[1], argv[2]);
  return failures == 0 ? 0 : 1;
}
