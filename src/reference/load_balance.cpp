// The aux-loss-free load-balance update of docs/math.md section 7, once per optimizer step, on the reference backend.
#include <algorithm>
#include <vector>

#include "src/reference/dense.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::load_balance_update(const moekit_load_balance_args_t& args, void*) {
  bool integer_counts = args.counts.dtype == MOEKIT_DTYPE_INT32 || args.counts.dtype == MOEKIT_DTYPE_INT64;
  std::vector<double> counts;
  if (integer_counts) {
    std::vector<int64_t> integers = read_indices(args.counts);
    counts.assign(integers.begin(), integers.end());
  } else {
    counts = read_values(args.counts);
  }
  std::vector<double> ema = read_values(args.ema);
  std::vector<double> bias = read_values(args.bias);
  double groups = static_cast<double>(counts.size());
  double target = static_cast<double>(args.top_groups) / groups;
  for (size_t g = 0; g < counts.size(); ++g) {
    double freq = counts[g] / args.tokens;
    // The ema is stored in fp32; the thresholds compare the value that will be stored.
    ema[g] = static_cast<float>(args.momentum * ema[g] + (1 - args.momentum) * freq);
    // Strict on both sides: a group exactly at half or twice the target is left alone.
    if (ema[g] < 0.5 * target) bias[g] += args.gamma;
    else if (ema[g] > 2 * target) bias[g] -= args.gamma;
    bias[g] = std::clamp(bias[g], -args.bias_max, args.bias_max);
  }
  write_values(args.ema, ema);
  write_values(args.bias, bias);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
