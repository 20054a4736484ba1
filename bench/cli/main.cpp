// moekit-bench: runs the cases of a JSON config on the CUDA backend (CUDA events, baselines measured in the same
// run) or the reference backend (wall clock), optionally checks them against the reference backend, and reports a
// table for people (printed last) and JSON for machines. docs/benchmark.md is the manual.
//
// Exit status: 0 when every case ran or was reported not supported and every check passed; 1 when a case failed,
// a check failed or the results could not be written; 2 for a malformed config or command line.
#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>

#include "baselines.h"
#include "command_line.h"
#include "config_parser.h"
#include "kernel_profiler.h"
#include "measure.h"
#include "output_check.h"
#include "report.h"
#include "run_meta.h"

using namespace moekit_bench;

namespace {

// Written to a temporary name and renamed, so a run killed while writing leaves the previous complete file.
bool write_results(const std::string& path, const RunMeta& meta, const std::vector<CaseResult>& results) {
  const std::string temporary = path + ".partial";
  {
    std::ofstream file(temporary);
    file << results_json(meta, results);
    if (!file.flush()) return false;
  }
  return std::rename(temporary.c_str(), path.c_str()) == 0;
}

// A handle of `backend`, destroyed with the owner.
struct Handle {
  moekit_handle_t handle = nullptr;
  moekit_status_t status = MOEKIT_SUCCESS;
  std::string error;
  Handle(moekit_backend_t backend, int threads, bool validate) {
    moekit_handle_desc_t desc;
    moekit_handle_desc_init(&desc);
    desc.backend = backend;
    desc.num_threads = threads;
    desc.flags = validate ? MOEKIT_HANDLE_VALIDATE : 0;
    status = moekit_handle_create(&desc, &handle);
    if (status != MOEKIT_SUCCESS) {
      error.resize(moekit_get_last_error(nullptr, 0));
      moekit_get_last_error(error.data(), error.size() + 1);
    }
  }
  ~Handle() { moekit_handle_destroy(handle); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

std::vector<CaseConfig> select_cases(const BenchConfig& config, const std::string& filter) {
  std::regex pattern;
  try {
    pattern = std::regex(filter, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw UsageError("--filter: not a valid regular expression: " + filter);
  }
  std::vector<CaseConfig> selected;
  for (const CaseConfig& c : config.cases)
    if (filter.empty() || std::regex_search(c.name, pattern)) selected.push_back(c);
  if (selected.empty()) throw UsageError("--filter " + filter + ": no case of " + config.path + " matches");
  return selected;
}

std::string command_line_text(int argc, char** argv) {
  std::string text;
  for (int i = 0; i < argc; ++i) text += (i ? " " : "") + std::string(argv[i]);
  return text;
}

void print_progress(size_t index, size_t total, const CaseResult& r) {
  std::fprintf(stderr, "[%zu/%zu] %s: ", index + 1, total, r.name.c_str());
  if (r.status == CaseStatus::ok) std::fprintf(stderr, "%.2f us", r.time.median_us);
  else std::fprintf(stderr, "%s", status_name(r.status));
  if (r.check.ran) std::fprintf(stderr, ", check %s", r.check.ok() ? "ok" : "FAILED");
  std::fprintf(stderr, "\n");
}

int run(const Options& options, int argc, char** argv) {
  const BenchConfig config = load_config(options.config);
  const std::vector<CaseConfig> cases = select_cases(config, options.filter);

  RunMeta meta;
  meta.moekit_version = moekit_version_text();
  meta.git_sha = configure_time_git_sha();
  meta.date = utc_now();
  meta.config_path = config.path;
  meta.config_description = config.description;
  meta.command_line = command_line_text(argc, argv);

  // The backend under test: CUDA when asked for or (auto) when a CUDA handle can be created, else the reference.
  std::unique_ptr<Handle> handle;
  std::unique_ptr<Platform> platform;
  if (options.backend != BackendChoice::reference) {
#ifdef MOEKIT_BENCH_WITH_CUDA
    handle = std::make_unique<Handle>(MOEKIT_BACKEND_CUDA, 0, options.validate);
    if (handle->status == MOEKIT_SUCCESS) {
      platform = make_cuda_platform();
    } else if (options.backend == BackendChoice::cuda) {
      std::fprintf(stderr, "moekit-bench: cannot use the CUDA backend: %s\n", handle->error.c_str());
      return 1;
    } else {
      meta.backend_note = "automatic choice: no usable CUDA device (" + handle->error + "); reference backend";
    }
#else
    if (options.backend == BackendChoice::cuda) {
      std::fprintf(stderr, "moekit-bench: this build has no CUDA backend (configured without nvcc)\n");
      return 1;
    }
    meta.backend_note = "automatic choice: this build has no CUDA backend; reference backend";
#endif
  }
  if (!platform) {
    handle = std::make_unique<Handle>(MOEKIT_BACKEND_REFERENCE, options.threads, options.validate);
    if (handle->status != MOEKIT_SUCCESS) {
      std::fprintf(stderr, "moekit-bench: cannot create a reference handle: %s\n", handle->error.c_str());
      return 1;
    }
    platform = make_host_platform(options.threads);
  }
  const bool cuda = platform->backend() == MOEKIT_BACKEND_CUDA;
  meta.backend = cuda ? "cuda" : "reference";
  if (meta.backend_note.empty()) meta.backend_note = options.backend == BackendChoice::automatic
                                                         ? "automatic choice: a usable CUDA device"
                                                         : "chosen with --backend";
  meta.device = platform->describe();
  meta.timing_method = platform->timing_method();
  if (!meta.backend_note.empty()) std::fprintf(stderr, "moekit-bench: %s\n", meta.backend_note.c_str());

  MeasureContext context{*platform, handle->handle, nullptr, false, nullptr, ""};
  std::unique_ptr<Baselines> baselines;
  std::unique_ptr<KernelProfiler> profiler;
#ifdef MOEKIT_BENCH_WITH_CUDA
  if (cuda) {
    std::fprintf(stderr, "moekit-bench: measuring the ceilings (dense bf16 GEMM 8192^3, 1 GiB device copy)\n");
    baselines = make_cuda_baselines(*platform);
    meta.gemm_ceiling_tflops = baselines->gemm_ceiling_tflops;
    meta.copy_ceiling_gbps = baselines->copy_ceiling_gbps;
    context.baselines = baselines.get();
    if (options.breakdown) {
      profiler = make_cupti_profiler(context.profiler_missing);
      context.profiler = profiler.get();
    }
  }
#endif
  context.breakdown = options.breakdown;
  context.validate = options.validate;
  if (options.validate) meta.backend_note += "; MOEKIT_HANDLE_VALIDATE (--validate)";
  if (options.breakdown && !cuda) context.profiler_missing = "no kernel breakdown on the reference backend";

  // The oracle of --check: the reference backend; on the reference backend a second handle with one thread.
  std::unique_ptr<Platform> oracle_platform = make_host_platform(cuda ? 0 : 1);
  Handle oracle(MOEKIT_BACKEND_REFERENCE, cuda ? 0 : 1, false);
  const std::string against = cuda ? "reference backend" : "reference backend, 1 thread";

  std::vector<CaseResult> results;
  bool written = true;
  for (size_t i = 0; i < cases.size(); ++i) {
    CaseResult r = measure_case(cases[i], context);
    if (options.check) r.check = check_case(cases[i], *platform, handle->handle, *oracle_platform, oracle.handle, against);
    r.command = reproduce_command(options, meta.backend, cases[i].name);
    print_progress(i, cases.size(), r);
    results.push_back(std::move(r));
    // Rewritten after every case, so a run stopped by a time limit keeps the cases it finished.
    if (!options.out.empty()) written = write_results(options.out, meta, results);
  }

  int status = 0;
  if (!written) {
    std::fprintf(stderr, "moekit-bench: cannot write %s\n", options.out.c_str());
    status = 1;
  }
  print_details(stdout, results);
  print_table(stdout, meta, results);
  for (const CaseResult& r : results)
    if (r.status == CaseStatus::failed || (r.check.ran && !r.check.ok())) status = 1;
  if (!options.out.empty() && status == 0) std::printf("results: %s\n", options.out.c_str());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse_command_line(argc, argv);
    if (options.help) {
      std::fputs(usage_text(), stdout);
      return 0;
    }
    return run(options, argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "moekit-bench: %s\n%s", e.what(), usage_text());
    return 2;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "moekit-bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-bench: %s\n", e.what());
    return 1;
  }
}
