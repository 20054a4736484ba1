#include "capi/call.h"

#include <cstdint>
#include <string>

#include "cuda/common/alignment.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace capi {

namespace {

bool is_cuda(const moekit_handle& handle) { return handle.desc.backend == MOEKIT_BACKEND_CUDA; }

size_t buffer_alignment(const moekit_plan& plan) { return is_cuda(*plan.handle) ? kSectionAlignment : 16; }

void check_buffer_alignment(const char* name, const void* p, size_t alignment) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    throw_invalid(std::string(name) + ": pointer is not aligned to " + std::to_string(alignment) + " bytes");
}

void check_size(const char* name, size_t given, size_t needed, const char* query) {
  if (given < needed)
    throw Error(MOEKIT_STATUS_INSUFFICIENT_WORKSPACE, std::string(name) + ": " + std::to_string(given) +
                                                          " bytes given, the plan needs " + std::to_string(needed) +
                                                          " (" + query + ")");
}

}  // namespace

void check_struct(const char* name, const void* p, size_t struct_size, size_t expected, const char* init_function) {
  if (p == nullptr) throw_invalid(std::string(name) + ": is NULL");
  if (struct_size < expected)
    throw_invalid(std::string(name) + ": struct_size is " + std::to_string(struct_size) + ", expected at least " +
                  std::to_string(expected) + "; fill the struct with " + init_function + "() first");
}

const moekit_plan& checked_plan(moekit_plan_t plan, OpKind kind) {
  if (plan == nullptr) throw_invalid("plan: is NULL");
  if (plan->kind != kind)
    throw_invalid(std::string("plan: created for the ") + op_kind_name(plan->kind) + ", not for the " +
                  op_kind_name(kind));
  return *plan;
}

Backend& backend_of(const moekit_plan& plan) { return *plan.handle->backend; }

TensorRules tensor_rules(const moekit_handle& handle) { return TensorRules{handle.backend->device(), is_cuda(handle)}; }

TensorRules tensor_rules(const moekit_plan& plan) { return tensor_rules(*plan.handle); }

Workspace checked_workspace(const moekit_plan& plan, void* workspace, size_t workspace_bytes, size_t needed) {
  check_size("workspace_bytes", workspace_bytes, needed,
             is_layer(plan.kind) ? "moekit_plan_layer_workspace_sizes" : "moekit_plan_workspace_size");
  if (needed > 0) {
    if (workspace == nullptr) throw_invalid("workspace: is NULL, the plan needs " + std::to_string(needed) + " bytes");
    check_buffer_alignment("workspace", workspace, buffer_alignment(plan));
  }
  return Workspace{workspace, workspace_bytes};
}

size_t layer_workspace_bytes(const moekit_plan& plan, SavedUse use) {
  return use == SavedUse::forward ? plan.forward_workspace_bytes : plan.backward_workspace_bytes;
}

void check_saved(const moekit_plan& plan, SavedUse use, const void* saved, size_t saved_bytes) {
  const bool inference =
      plan.kind == OpKind::sparse_ffn_layer ? plan.sparse_ffn.inference != 0 : plan.moe.inference != 0;
  if (inference) {
    if (use == SavedUse::backward)
      throw_invalid("plan: created with inference = 1, so it has no backward (create it with inference = 0)");
    return;
  }
  if (saved == nullptr)
    throw_invalid(
        "saved: is NULL; a training plan's forward fills it and its backward reads it "
        "(moekit_plan_saved_size bytes)");
  check_size("saved_bytes", saved_bytes, plan.saved_bytes, "moekit_plan_saved_size");
  check_buffer_alignment("saved", saved, buffer_alignment(plan));
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
