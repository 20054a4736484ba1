// Honest kernel timing on the GPU: CUDA events around each call, warm-up apart from timing, the median of many
// runs, and `sets` copies of the inputs rotated so no call finds the previous call's data in L2.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit_bench {

// A timing program has nothing to recover: these print what failed (the library's last error, or the CUDA error
// text) and exit the process with status 1 unless the call succeeded.
void check(moekit_status_t status, const char* what);
void check(cudaError_t status, const char* what);

// A CUDA-backend handle on device 0 (exits on failure).
moekit_handle_t cuda_handle();

// A contiguous view of device memory on CUDA device 0.
moekit_tensor_t device_tensor(void* data, moekit_dtype_t dtype, std::vector<int64_t> shape);

struct Timing {
  double median_us;
  double min_us;
  double max_us;
  int runs;
};

// Calls run(i % sets) `warmup` times untimed, then `runs` times each between two events; returns the
// statistics of the per-call times. run() only enqueues work on `stream`.
Timing time_calls(const std::function<void(int set)>& run, int sets, void* stream, int warmup = 10, int runs = 100);

// How many copies of a working set of `bytes` are needed so that cycling through them exceeds 2x the L2 size.
int rotation_sets(size_t bytes);

// A device-to-device copy of `bytes` (read + write counted), the memory ceiling measured in the same run:
// returns TB/s counting 2 * bytes per copy.
double measured_copy_tbps(size_t bytes, void* stream);

// One line of the final table: name, median/min/max, and the derived rate.
std::string format_row(const std::string& name, const Timing& t, const std::string& rate);

// Fills device memory with uniform random bf16 values in [-scale, scale] (a fixed seed).
void fill_random_bf16(void* device, size_t count, float scale, unsigned long long seed);

// As fill_random_bf16 for large buffers: 4 Mi values drawn on the host, repeated over the buffer on the device
// (timings need no fresh values, only no zeros).
void fill_random_bf16_repeated(void* device, size_t count, float scale, unsigned long long seed);

// Random routing of `tokens` tokens to `top_k` distinct experts each (every pair valid), laid out as dispatch lays
// it out (docs/math.md section 2: stable by expert): offsets [E+1], gather_idx and pair_idx [P], grouped_pos [P].
struct Routing {
  std::vector<int32_t> offsets, gather_idx, pair_idx, grouped_pos;
};
Routing random_routing(int64_t tokens, int64_t experts, int64_t top_k, unsigned long long seed);

}  // namespace moekit_bench
