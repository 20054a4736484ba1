// Workspace and saved-buffer sizes of the reference backend. The reference needs no workspace (it allocates host
// memory as it goes); a training layer's saved buffer is laid out by reference/layer_io.h, the same functions
// its forward and backward use, at the plan's token bound.
#include "src/reference/layer_io.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::plan_sizes(moekit_plan& plan) const {
  plan.workspace_bytes = plan.forward_workspace_bytes = plan.backward_workspace_bytes = 0;
  plan.saved_bytes = 0;
  switch (plan.kind) {
    case OpKind::moe_layer:
      if (!plan.moe.inference) plan.saved_bytes = moe_saved_layout(plan.moe, plan.moe.max_tokens).total;
      break;
    case OpKind::experts:
      if (!plan.moe.inference) plan.saved_bytes = experts_saved_layout(plan.moe, plan.moe.max_tokens).total;
      break;
    case OpKind::token_experts:
      if (!plan.moe.inference)
        plan.saved_bytes = experts_saved_layout(plan.moe, plan.moe.max_tokens * plan.moe.top_k).total;
      break;
    case OpKind::sparse_ffn_layer:
      if (!plan.sparse_ffn.inference)
        plan.saved_bytes = sparse_ffn_saved_layout(plan.sparse_ffn, plan.sparse_ffn.max_tokens).total;
      break;
    default: break;
  }
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
