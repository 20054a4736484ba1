// Checks of descriptor fields at plan creation. Each throws INVALID_VALUE (NOT_SUPPORTED for a valid request the
// handle's backend cannot serve) with a message that starts with the field's name.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "cuda/common/activation_kind.h"
#include "moekit/moekit.h"
#include "src/plan.h"

namespace moekit {
inline namespace v0 {
namespace capi {

void require_positive(const char* name, int64_t value);
void require_non_negative(const char* name, int64_t value);
// lo <= value <= hi; `rule` says where the bound comes from ("1 <= top_k <= min(experts, 32)").
void require_in_range(const char* name, int64_t value, int64_t lo, int64_t hi, const char* rule);
void require_flag(const char* name, int32_t value);  // 0 or 1
void require_finite(const char* name, double value);
// An enumeration value; `names` lists the accepted ones for the message.
void require_one_of(const char* name, int32_t value, std::initializer_list<int32_t> accepted, const char* names);

// Rows of a tensor indexed by int32 ids (tokens, pairs, neurons) must stay within the int32 range.
void require_int32_count(const char* name, int64_t count, const char* what);

// One dimension of a tensor at the plan's bounds: `times` * the descriptor field `field` = `extent` (2I for a gated
// h: {"intermediate", I, 2}).
struct TensorDim {
  const char* field;
  int64_t extent;
  int64_t times = 1;
};
// The most elements one tensor of a plan may have at the plan's bounds: more than any memory holds, few enough that
// every size derived from it (float64 copies, the sections of a saved buffer and their sum, E + 1 offsets) stays
// within 64 bits.
constexpr int64_t kMaxTensorElements = int64_t{1} << 56;
// The tensor `tensor` [dims] (the fields positive): at most kMaxTensorElements elements, else INVALID_VALUE naming the
// field of its largest dimension.
void require_tensor_size(const char* tensor, std::initializer_list<TensorDim> dims);

// top_k of a router or an MoE layer: 1 <= K <= min(experts, 32).
void require_top_k(const char* name, int64_t top_k, int64_t experts);

// The storage dtype of an operation: bf16, fp16, fp32, or fp64 on the reference backend only (NOT_SUPPORTED on CUDA).
void require_float_dtype(const moekit_handle& handle, const char* name, int32_t dtype);
// A gradient / output dtype: MOEKIT_DTYPE_INVALID (the *_init default) means "the storage dtype"; otherwise it must
// be the storage dtype or fp32. Returns the resolved dtype.
int32_t resolve_out_dtype(const char* name, int32_t requested, int32_t dtype);

// lo <= value <= hi for a real-valued field (finite).
void require_real_in(const char* name, double value, double lo, double hi, const char* rule);

// The pair bound P of an operation taking fixed (top_k >= 1: P = max_tokens * top_k, returned) or general routing
// (top_k = 0: max_pairs >= 1, returned as is); every pair and token must be an int32 index.
int64_t resolve_max_pairs(int64_t max_tokens, int64_t top_k, int64_t max_pairs);

void require_router_kind(const char* name, int32_t kind);

// activation, glu_layout and glu_limit (> 0) of a layer or a GATED / DGATED grouped GEMM.
void require_activation_options(int32_t activation, int32_t glu_layout, double glu_limit);

}  // namespace capi
}  // namespace v0
}  // namespace moekit
