// Tensor views over the sections of the layer's workspace and saved buffer, and the exchange's row layouts.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "src/ep/ep_plan.h"

namespace moekit {
inline namespace v0 {
namespace ep {

inline char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }
inline const char* at(const void* base, size_t offset) { return static_cast<const char*>(base) + offset; }

inline moekit_tensor_t view(const void* data, int32_t dtype, std::initializer_list<int64_t> shape,
                            moekit_device_t device) {
  std::vector<int64_t> dims(shape);
  return moekit_tensor_make(const_cast<void*>(data), static_cast<moekit_dtype_t>(dtype),
                            static_cast<int32_t>(dims.size()), dims.data(), device);
}

// A 2-D weight [N, K] (any row stride) as the single group [1, N, K] of a grouped GEMM.
inline moekit_tensor_t as_one_group(const moekit_tensor_t& t) {
  moekit_tensor_t g = t;
  g.rank = 3;
  g.shape[2] = t.shape[1];
  g.shape[1] = t.shape[0];
  g.shape[0] = 1;
  g.stride[2] = t.stride[1];
  g.stride[1] = t.stride[0];
  g.stride[0] = t.shape[0] * t.stride[0];
  return g;
}

// Host-side row counts of one all-to-allv: where each rank's rows start and how many there are, for what this rank
// sends (send_*) and receives (recv_*). Capacity mode: fixed slots; exact mode: from the exchanged counts.
struct RowLayout {
  std::vector<int64_t> send_base, send_rows, recv_base, recv_rows;
};
RowLayout row_layout(const moekit_ep_plan& plan, const int32_t* send_counts, const int32_t* recv_counts, void* stream);

}  // namespace ep
}  // namespace v0
}  // namespace moekit
