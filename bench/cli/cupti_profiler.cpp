// --breakdown on the CUDA backend: CUPTI activity records of every kernel, memset and memcpy a call enqueues,
// summed per name. libcupti is opened with dlopen, so moekit-bench runs without it when --breakdown is not asked for.
#include "kernel_profiler.h"

#ifndef MOEKIT_BENCH_NO_CUPTI

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

namespace moekit_bench {
namespace {

// The CUPTI entry points the profiler uses, resolved from the loaded library.
struct Cupti {
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
};

// Activity records arrive on CUPTI's thread through these callbacks: (name, ns) of every completed activity.
std::mutex records_mutex;
std::vector<std::pair<std::string, uint64_t>> records;
Cupti* active = nullptr;

constexpr size_t kBufferBytes = size_t{8} << 20;

std::string demangled(const char* name) {
  if (name == nullptr) return "(unnamed kernel)";
  int status = 0;
  char* text = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && text != nullptr ? text : name;
  std::free(text);
  return result.size() > 160 ? result.substr(0, 157) + "..." : result;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_size) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(records_mutex);
  while (active != nullptr && active->next_record(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      records.emplace_back(demangled(k->name), k->end - k->start);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      records.emplace_back("[memset]", m->end - m->start);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      records.emplace_back("[memcpy]", m->end - m->start);
    }
  }
  std::free(buffer);
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                     CUPTI_ACTIVITY_KIND_MEMCPY};

class CuptiProfiler final : public KernelProfiler {
 public:
  explicit CuptiProfiler(const Cupti& cupti) : cupti_(cupti) { active = &cupti_; }
  ~CuptiProfiler() override {
    std::lock_guard<std::mutex> lock(records_mutex);
    active = nullptr;
  }

  std::vector<KernelTime> profile(const std::function<void()>& call, int calls) override {
    cudaDeviceSynchronize();
    {
      std::lock_guard<std::mutex> lock(records_mutex);
      records.clear();
    }
    for (CUpti_ActivityKind kind : kKinds) cupti_.enable(kind);
    // One call at a time, its records flushed before the next: each kernel's time is known per call, so a call
    // that runs slower than the others shows which kernel took the time (min_us / max_us).
    std::vector<size_t> call_ends;
    for (int i = 0; i < calls; ++i) {
      call();
      cudaDeviceSynchronize();
      cupti_.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
      std::lock_guard<std::mutex> lock(records_mutex);
      call_ends.push_back(records.size());
    }
    for (CUpti_ActivityKind kind : kKinds) cupti_.disable(kind);

    // Per name, in order of first appearance: launches, and GPU time per call (mean, least, most).
    std::vector<KernelTime> kernels;
    std::map<std::string, size_t> position;
    std::vector<std::vector<double>> per_call;  // kernel -> call -> us
    std::lock_guard<std::mutex> lock(records_mutex);
    size_t begin = 0;
    for (int i = 0; i < calls; ++i) {
      for (size_t r = begin; r < call_ends[i]; ++r) {
        const auto& [name, ns] = records[r];
        auto it = position.find(name);
        if (it == position.end()) {
          it = position.emplace(name, kernels.size()).first;
          kernels.push_back(KernelTime{name});
          per_call.emplace_back(calls, 0.0);
        }
        // Totals first, one division at the end: adding 1/calls per launch gave 0.9999999999999999 launches.
        kernels[it->second].calls += 1;
        per_call[it->second][i] += static_cast<double>(ns) * 1e-3;
      }
      begin = call_ends[i];
    }
    for (size_t k = 0; k < kernels.size(); ++k) {
      kernels[k].calls /= calls;
      for (double us : per_call[k]) kernels[k].us += us;
      kernels[k].us /= calls;
      const auto [least, most] = std::minmax_element(per_call[k].begin(), per_call[k].end());
      kernels[k].min_us = *least;
      kernels[k].max_us = *most;
    }
    return kernels;
  }

 private:
  Cupti cupti_;
};

template <class F>
bool resolve(void* library, const char* name, F& function) {
  function = reinterpret_cast<F>(dlsym(library, name));
  return function != nullptr;
}

}  // namespace

std::unique_ptr<KernelProfiler> make_cupti_profiler(std::string& why_not) {
  void* library = nullptr;
  for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12", "/usr/local/cuda/lib64/libcupti.so",
                           "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
  }
  if (library == nullptr) {
    why_not = "no kernel breakdown: libcupti could not be loaded (put the CUDA toolkit's lib64 on LD_LIBRARY_PATH)";
    return nullptr;
  }
  Cupti cupti;
  if (!resolve(library, "cuptiActivityEnable", cupti.enable) ||
      !resolve(library, "cuptiActivityDisable", cupti.disable) ||
      !resolve(library, "cuptiActivityRegisterCallbacks", cupti.register_callbacks) ||
      !resolve(library, "cuptiActivityFlushAll", cupti.flush_all) ||
      !resolve(library, "cuptiActivityGetNextRecord", cupti.next_record)) {
    why_not = "no kernel breakdown: libcupti lacks the activity API";
    return nullptr;
  }
  if (cupti.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    why_not = "no kernel breakdown: cuptiActivityRegisterCallbacks failed";
    return nullptr;
  }
  return std::make_unique<CuptiProfiler>(cupti);
}

}  // namespace moekit_bench

#else  // MOEKIT_BENCH_NO_CUPTI

namespace moekit_bench {

std::unique_ptr<KernelProfiler> make_cupti_profiler(std::string& why_not) {
  why_not = "no kernel breakdown: this build found no CUPTI headers";
  return nullptr;
}

}  // namespace moekit_bench

#endif
