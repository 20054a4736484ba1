// The kernels the library chose for a case: plan creation runs with MOEKIT_LOG_CONFIG=1 and stderr captured, and
// the library's "moekit: ..." lines (one per grouped GEMM plan, a layer's building blocks included) become the
// case's `kernel_config` in the results.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace moekit_bench {

// Runs `create` (the plan creation) with MOEKIT_LOG_CONFIG=1 and returns the lines the library printed, without
// their "moekit: " prefix. Any other output on stderr meanwhile is passed on. Restores stderr and the variable
// even when `create` throws.
std::vector<std::string> capture_kernel_choices(const std::function<void()>& create);

}  // namespace moekit_bench
