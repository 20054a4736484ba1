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

// Where this rank's pairs go and come from: slot [P] (send-buffer row of grouped row i), perm [M] (local-expert row
// of received row r), valid (device count of grouped rows), pairs (this call's T*K), and the exchange's row layout.
struct Route {
  const int32_t* slot;
  const int32_t* perm;
  const int32_t* valid;
  int64_t pairs;
  const RowLayout& rows;
};
// Staging buffers of one row exchange: grouped [P], send [S], recv [M] rows.
struct Staging {
  void* grouped;
  void* send;
  void* recv;
};

// Rows src[pick[i]] of this rank's grouped pairs to the experts' ranks, landing at owner's local-expert rows.
void send_to_experts(const moekit_ep_plan& plan, const Route& route, const Staging& buf, const void* src,
                     const int32_t* pick, void* owner, size_t row_bytes, void* stream);
// The local experts' rows `owner` back to the ranks the pairs came from, into buf.grouped in their grouped order.
void return_to_sources(const moekit_ep_plan& plan, const Route& route, const Staging& buf, const void* owner,
                       size_t row_bytes, void* stream);

}  // namespace ep
}  // namespace v0
}  // namespace moekit
