// Kernel-by-kernel GPU times of a call (--breakdown), through CUPTI's activity API. libcupti is loaded at run time
// (cupti_profiler.cpp, CUDA builds only), so the bench needs it only when --breakdown is asked for.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "case_result.h"

namespace moekit_bench {

class KernelProfiler {
 public:
  virtual ~KernelProfiler() = default;
  // Runs `call` `calls` times and returns each kernel's (or memset's / memcpy's) launches and GPU time per call.
  virtual std::vector<KernelTime> profile(const std::function<void()>& call, int calls) = 0;
};

#ifdef MOEKIT_BENCH_WITH_CUDA
// nullptr, with `why_not` filled, when CUPTI cannot be loaded.
std::unique_ptr<KernelProfiler> make_cupti_profiler(std::string& why_not);
#endif

}  // namespace moekit_bench
