// What a handle and a plan are inside the library. capi/ creates them after validating the descriptor;
// backends read them. A plan keeps a copy of its descriptor (with the defaults filled in) and the sizes the
// backend computed from it, so sizes and layouts cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/gemm/gemm_config.h"
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
  token_experts,
  sparse_ffn_layer,
};

const char* op_kind_name(OpKind kind);  // "router", "grouped GEMM", ... for messages
bool is_layer(OpKind kind);             // a forward and a backward over a saved buffer
uint64_t next_plan_id();                // unique in the process, never 0; thread-safe
// "MoE layer (max tokens 4096, hidden 1024, ...; workspace 123 B, saved 456 B)": the operation and its dimensions,
// the first part of moekit_plan_describe's text.
std::string plan_summary(const moekit_plan& plan);

// A layer's building-block plans, made once by the backend's plan_sizes and only read by its calls. Each backend's
// layer code knows its concrete type; `list` names them for moekit_plan_describe.
class SubPlans {
 public:
  virtual ~SubPlans() = default;
  virtual std::vector<std::pair<const char*, const moekit_plan*>> list() const = 0;
};

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
  // The descriptor of `kind`; the others are zero. experts and token_experts use `moe`; group_select uses `sparse_ffn`.
  moekit_router_desc_t router;
  moekit_dispatch_desc_t dispatch;
  moekit_gemm_desc_t gemm;
  moekit_combine_desc_t combine;
  moekit_bias_grad_desc_t bias_grad;
  moekit_moe_desc_t moe;
  moekit_sparse_ffn_desc_t sparse_ffn;
  size_t workspace_bytes;  // enough for every run of the plan
  // What a layer's forward and its backward each need (workspace_bytes is the larger; 0 for the backward of an
  // inference plan); the building blocks: workspace_bytes both.
  size_t forward_workspace_bytes, backward_workspace_bytes;
  size_t saved_bytes;
  // CUDA grouped GEMM: every kernel choice, made by plan_sizes; a run only reads it.
  moekit::GemmConfig gemm_config;
  // CUDA layers: the building blocks' plans (shared by copies of the plan, never changed after plan_sizes).
  std::shared_ptr<const moekit::SubPlans> sub_plans;
};
