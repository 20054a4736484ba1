// The comparisons measured in the same run on the CUDA backend: cuBLASLt dense bf16 GEMMs of the same FLOPs for
// GEMM-shaped work, a device-to-device copy of the same bytes for memory-bound work, and the two ceilings every
// case's "% of ceiling" refers to. Implemented in cuda_baselines.cpp (CUDA builds only).
#pragma once

#include <memory>
#include <vector>

#include "case_result.h"
#include "platform.h"
#include "workload.h"

namespace moekit_bench {

class Baselines {
 public:
  virtual ~Baselines() = default;

  // The GEMMs one after another as one timed call, on rotated operand sets; pooled over `repeats` rounds.
  virtual TimeStats dense_gemms(const std::vector<DenseGemm>& gemms, int warmup, int iterations, int repeats) = 0;
  // cudaMemcpyAsync of bytes / 2 (bytes counts read + write).
  virtual TimeStats device_copy(double bytes, int warmup, int iterations, int repeats) = 0;

  // Measured once, when the baselines are created: dense bf16 GEMM 8192^3 (TFLOP/s) and a 1 GiB copy (GB/s,
  // read + write).
  double gemm_ceiling_tflops = 0;
  double copy_ceiling_gbps = 0;
};

#ifdef MOEKIT_BENCH_WITH_CUDA
// Measures the ceilings; throws CaseFailure when cuBLASLt cannot run.
std::unique_ptr<Baselines> make_cuda_baselines(Platform& platform);
#endif

}  // namespace moekit_bench
