// What a handle and a plan are inside the library. capi/ creates them after validating the descriptor;
// backends read them. A plan keeps a copy of its descriptor (with the defaults filled in) and the sizes the
// backend computed from it, so sizes and layouts cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

class Backend;

enum class OpKind {
  router,
  dispatch,
  gemm,
  combine,
  bias_grad,
  group_select,
  moe_layer,
  experts,
  sparse_ffn_layer,
};

const char* op_kind_name(OpKind kind);  // "router", "grouped GEMM", ... for messages
uint64_t next_plan_id();                // unique in the process, never 0; thread-safe

}  // namespace v0
}  // namespace moekit

struct moekit_handle {
  moekit_handle_desc_t desc;
  std::unique_ptr<moekit::Backend> backend;
};

struct moekit_plan {
  moekit::OpKind kind;
  moekit_handle* handle;
  uint64_t id;  // unique in the process; stamped into saved buffers so another plan's buffer is rejected
  // The descriptor of `kind`; the others are zero. experts uses `moe`; group_select uses `sparse_ffn`.
  moekit_router_desc_t router;
  moekit_dispatch_desc_t dispatch;
  moekit_gemm_desc_t gemm;
  moekit_combine_desc_t combine;
  moekit_bias_grad_desc_t bias_grad;
  moekit_moe_desc_t moe;
  moekit_sparse_ffn_desc_t sparse_ffn;
  size_t workspace_bytes;
  size_t saved_bytes;
  int32_t kernel_config;  // the backend's kernel choice made by plan_sizes (CUDA grouped GEMM: a GemmTile)
};
