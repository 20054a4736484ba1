#include "capi/desc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "capi/validate.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace capi {

void require_positive(const char* name, int64_t value) {
  if (value < 1) throw_invalid(std::string(name) + ": must be >= 1, got " + std::to_string(value));
}

void require_non_negative(const char* name, int64_t value) {
  if (value < 0) throw_invalid(std::string(name) + ": must be >= 0, got " + std::to_string(value));
}

void require_in_range(const char* name, int64_t value, int64_t lo, int64_t hi, const char* rule) {
  if (value < lo || value > hi)
    throw_invalid(std::string(name) + ": " + std::to_string(value) + " is outside [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "] (" + rule + ")");
}

void require_flag(const char* name, int32_t value) {
  if (value != 0 && value != 1) throw_invalid(std::string(name) + ": must be 0 or 1, got " + std::to_string(value));
}

void require_finite(const char* name, double value) {
  if (!std::isfinite(value)) throw_invalid(std::string(name) + ": must be finite, got " + std::to_string(value));
}

void require_one_of(const char* name, int32_t value, std::initializer_list<int32_t> accepted, const char* names) {
  for (int32_t v : accepted)
    if (v == value) return;
  throw_invalid(std::string(name) + ": " + std::to_string(value) + " is not one of " + names);
}

void require_int32_count(const char* name, int64_t count, const char* what) {
  if (count > std::numeric_limits<int32_t>::max())
    throw_invalid(std::string(name) + ": " + what + " = " + std::to_string(count) +
                  " exceeds the int32 range of the index tensors");
}

void require_tensor_size(const char* tensor, std::initializer_list<TensorDim> dims) {
  // NOTE: 128-bit products, so that no pair of fields can wrap around the check.
  __int128 elements = 1;
  const TensorDim* largest = dims.begin();
  std::string shape;
  for (const TensorDim& d : dims) {
    const __int128 extent = static_cast<__int128>(d.extent) * d.times;
    if (extent > static_cast<__int128>(largest->extent) * largest->times) largest = &d;
    elements = std::min<__int128>(elements * extent, static_cast<__int128>(kMaxTensorElements) + 1);
    if (!shape.empty()) shape += ", ";
    shape += (d.times == 1 ? "" : std::to_string(d.times) + " * ") + std::to_string(d.extent);
  }
  if (elements > kMaxTensorElements)
    throw_invalid(std::string(largest->field) + ": " + tensor + " [" + shape +
                  "] would have more than 2^56 elements, the most one tensor may have");
}

void require_top_k(const char* name, int64_t top_k, int64_t experts) {
  int64_t bound = experts < 32 ? experts : 32;
  require_in_range(name, top_k, 1, bound, "1 <= top_k <= min(experts, 32)");
}

void require_float_dtype(const moekit_handle& handle, const char* name, int32_t dtype) {
  if (!is_float_dtype(dtype))
    throw_invalid(std::string(name) + ": expected bf16, fp16, fp32 or fp64, got " + dtype_name(dtype) + " (" +
                  std::to_string(dtype) + ")");
  if (dtype == MOEKIT_DTYPE_FP64 && handle.desc.backend == MOEKIT_BACKEND_CUDA)
    throw_not_supported(std::string(name) + ": fp64 runs on the reference backend only, not on a CUDA handle");
}

int32_t resolve_out_dtype(const char* name, int32_t requested, int32_t dtype) {
  if (requested == MOEKIT_DTYPE_INVALID) return dtype;
  if (requested != dtype && requested != MOEKIT_DTYPE_FP32)
    throw_invalid(std::string(name) + ": expected " + dtype_name(dtype) + " (the storage dtype) or fp32, got " +
                  dtype_name(requested) + " (" + std::to_string(requested) + ")");
  return requested;
}

void require_real_in(const char* name, double value, double lo, double hi, const char* rule) {
  require_finite(name, value);
  if (value < lo || value > hi)
    throw_invalid(std::string(name) + ": " + std::to_string(value) + " is outside [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "] (" + rule + ")");
}

int64_t resolve_max_pairs(int64_t max_tokens, int64_t top_k, int64_t max_pairs) {
  require_positive("max_tokens", max_tokens);
  require_int32_count("max_tokens", max_tokens, "max_tokens");
  require_in_range("top_k", top_k, 0, std::numeric_limits<int32_t>::max(), "0 selects general routing");
  if (top_k == 0) {
    require_positive("max_pairs", max_pairs);
    require_int32_count("max_pairs", max_pairs, "max_pairs");
    return max_pairs;
  }
  require_int32_count("top_k", max_tokens * top_k, "max_tokens * top_k pairs");
  return max_tokens * top_k;
}

void require_router_kind(const char* name, int32_t kind) {
  require_one_of(name, kind,
                 {MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_ROUTER_TOPK, MOEKIT_ROUTER_SIGMOID},
                 "SOFTMAX_TOPK (0), TOPK_SOFTMAX (1), TOPK (2), SIGMOID (3)");
}

void require_activation_options(int32_t activation, int32_t glu_layout, double glu_limit) {
  require_one_of("activation", activation,
                 {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI, MOEKIT_ACT_GELU,
                  MOEKIT_ACT_RELU, MOEKIT_ACT_SILU, MOEKIT_ACT_RELU2},
                 "SWIGLU (0), GEGLU (1), REGLU (2), SWIGLU_OAI (3), GELU (16), RELU (17), SILU (18), RELU2 (19)");
  // NOTE: a non-gated activation ignores the layout, but a value outside the enum is still a mistake.
  require_one_of("glu_layout", glu_layout, {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED}, "CONCAT (0), INTERLEAVED (1)");
  require_finite("glu_limit", glu_limit);
  if (!(glu_limit > 0)) throw_invalid("glu_limit: must be > 0, got " + std::to_string(glu_limit));
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
