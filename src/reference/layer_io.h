// Tensor I/O the reference grouped GEMM and layers share on top of reference/dense.h: index tensors checked
// before they are used to address memory, gradient writes with a beta, and the saved-activation buffers
// (header check and the section layout that plan_sizes reports).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace ref {

// An optional tensor is given when it has data.
inline bool present(const moekit_tensor_t& t) { return t.data != nullptr; }

// Grouped-row offsets [groups+1]: offsets[0] = 0, non-decreasing, last <= rows; otherwise INVALID_VALUE
// naming `name`.
std::vector<int64_t> read_offsets(const char* name, const moekit_tensor_t& t, int64_t groups, int64_t rows);
// Every value in [lo, hi); otherwise INVALID_VALUE naming `name`.
void require_in_range(const char* name, const std::vector<int64_t>& values, int64_t lo, int64_t hi);

// A rank-1 view of every element of a contiguous tensor (a [T, K] tensor read as [P]).
moekit_tensor_t flat_view(const moekit_tensor_t& t);

// Writes beta * old + values into rows [row_begin, row_end) of t (row_end < 0: all rows), rounding to t's dtype;
// with beta == 0 the old values are never read. values is dense over the whole tensor and is updated in place.
void write_accumulated(const moekit_tensor_t& t, std::vector<double>& values, double beta, int64_t row_begin = 0,
                       int64_t row_end = -1);

// The dtype the router's fp32 values (scores, ds) are held in: fp32, or fp64 in an fp64 layer (no rounding).
int32_t score_dtype(int32_t dtype);

// Saved-activation buffers: a SavedHeader, then 256-byte aligned sections.
class SavedLayout {
 public:
  // Reserves a section of `bytes` and returns its offset from the buffer start.
  size_t add(size_t bytes);
  size_t total() const { return end_; }

 private:
  size_t end_ = 0;
  bool has_header_ = false;
};

// Writes the header naming the plan and the number of tokens (rows) of the forward.
void write_saved_header(void* saved, uint64_t plan_id, int64_t tokens);
// INVALID_VALUE ("saved: ...") unless the header names this plan and these tokens (and no backward spent it).
void check_saved_header(const void* saved, uint64_t plan_id, int64_t tokens);
// Marks the buffer spent when the plan's backward may overwrite it (backward_overwrites_saved): the CUDA backend's
// backward leaves dh where h was, so the buffer serves one backward. The caller granted the write with the flag.
void spend_saved(const void* saved, const moekit_moe_desc_t& desc);

// Sections of the three layers' saved buffers for a forward of `tokens` tokens (rows); `total` is what the plan
// reports at max_tokens.
struct MoeSavedLayout {
  size_t logits, scores, indices, h, total;  // [T, RE], [T, K] doubles, [T, K] int64, [T*K, h width] doubles
};
MoeSavedLayout moe_saved_layout(const moekit_moe_desc_t& desc, int64_t tokens);
struct ExpertsSavedLayout {
  size_t h, total;  // [P, h width] doubles
};
ExpertsSavedLayout experts_saved_layout(const moekit_moe_desc_t& desc, int64_t rows);
struct SparseFfnSavedLayout {
  size_t groups, total;  // [T, kg] int64
};
SparseFfnSavedLayout sparse_ffn_saved_layout(const moekit_sparse_ffn_desc_t& desc, int64_t tokens);

// Typed access to a saved section.
template <class T>
T* saved_section(void* saved, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(saved) + offset);
}
template <class T>
const T* saved_section(const void* saved, size_t offset) {
  return reinterpret_cast<const T*>(static_cast<const char*>(saved) + offset);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
