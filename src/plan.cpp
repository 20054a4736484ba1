// Names of the plan kinds (for messages) and the process-wide plan id counter.
#include "src/plan.h"

#include <atomic>

namespace moekit {
inline namespace v0 {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::router: return "router";
    case OpKind::dispatch: return "dispatch";
    case OpKind::gemm: return "grouped GEMM";
    case OpKind::combine: return "combine";
    case OpKind::bias_grad: return "bias gradient";
    case OpKind::group_select: return "group selection";
    case OpKind::moe_layer: return "MoE layer";
    case OpKind::experts: return "experts layer";
    case OpKind::token_experts: return "token-major experts layer";
    case OpKind::sparse_ffn_layer: return "sparse FFN layer";
  }
  return "unknown operation";
}

bool is_layer(OpKind kind) {
  return kind == OpKind::moe_layer || kind == OpKind::experts || kind == OpKind::token_experts ||
         kind == OpKind::sparse_ffn_layer;
}

uint64_t next_plan_id() {
  // NOTE: starts at 1, so a zeroed saved buffer never names a live plan.
  static std::atomic<uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace v0
}  // namespace moekit
