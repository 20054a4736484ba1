// The checks of tensor VALUES that a handle made with MOEKIT_HANDLE_VALIDATE runs around every operation: what
// each rule accepts, and the failure code both backends produce, so the reference (host) and the CUDA (device)
// evaluation report the same first failure with the same message. capi/ lists the checks of each call; a backend
// only evaluates them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/value_check_code.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

enum class ValueRule : int32_t {
  finite = kRuleFinite,                    // float: no NaN, no +-inf
  finite_or_masked = kRuleFiniteOrMasked,  // float: no NaN, no +inf (-inf masks, as in logits)
  index_range = kRuleIndexRange,           // int: lo + r*shift <= v < hi + r*shift, r the index along dim 0
  offsets = kRuleOffsets,                  // int, rank 1: v[0] == 0, non-decreasing, v[last] <= hi
};

// One check of one tensor. `tensor` is a checked view of the call (rank 1..4, any strides but a contiguous last
// dimension). `rows` bounds dim 0: when `rows.data` is present, only the rows below clamp(rows[rows_entry], 0,
// shape[0]) are checked (the valid grouped rows, offsets[E]). With `via` present (rank 1 int), the rows checked are
// instead tensor rows via[i] for i below the row bound, skipping entries outside [0, shape[0]).
struct ValueCheck {
  std::string name;
  moekit_tensor_t tensor;
  ValueRule rule;
  int64_t lo = 0, hi = 0, shift = 0;
  moekit_tensor_t rows{};
  int64_t rows_entry = 0;
  moekit_tensor_t via{};
};

// The checks of one call: inputs before the operation, outputs after it.
struct CallChecks {
  std::vector<ValueCheck> inputs;
  std::vector<ValueCheck> outputs;
};

}  // namespace v0
}  // namespace moekit
