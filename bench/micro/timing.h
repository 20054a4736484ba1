// Honest kernel timing on the GPU: CUDA events around each call, warm-up apart from timing, the median of many
// runs, and `sets` copies of the inputs rotated so no call finds the previous call's data in L2.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace moekit_bench {

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

}  // namespace moekit_bench
