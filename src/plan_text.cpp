// The problem part of moekit_plan_describe's text: the operation and the descriptor's dimensions, shared by both
// backends (each appends what it runs).
#include <string>

#include "src/plan.h"

namespace moekit {
inline namespace v0 {

namespace {

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> named) {
  std::string text;
  for (const auto& [name, value] : named) text += std::string(text.empty() ? "" : ", ") + name + " " + std::to_string(value);
  return text;
}

}  // namespace

std::string plan_summary(const moekit_plan& plan) {
  std::string text = std::string(op_kind_name(plan.kind)) + " (";
  switch (plan.kind) {
    case OpKind::router:
      text += dims({{"max tokens", plan.router.max_tokens}, {"experts", plan.router.experts}, {"top k", plan.router.top_k}});
      break;
    case OpKind::dispatch:
      text += dims({{"max tokens", plan.dispatch.max_tokens}, {"top k", plan.dispatch.top_k},
                    {"experts", plan.dispatch.experts}});
      break;
    case OpKind::gemm:
      text += std::string(plan.gemm.mode == MOEKIT_GEMM_VARLEN_K ? "varlen K, " : "varlen M, ") +
              dims({{"groups", plan.gemm.groups}, {"max rows", plan.gemm.max_rows}, {"n", plan.gemm.n}, {"k", plan.gemm.k}});
      break;
    case OpKind::combine:
      text += dims({{"max tokens", plan.combine.max_tokens}, {"top k", plan.combine.top_k}, {"hidden", plan.combine.hidden}});
      break;
    case OpKind::bias_grad:
      text += dims({{"experts", plan.bias_grad.experts}, {"max rows", plan.bias_grad.max_rows},
                    {"width", plan.bias_grad.width}});
      break;
    case OpKind::moe_layer:
    case OpKind::experts:
    case OpKind::token_experts:
      text += dims({{"max tokens", plan.moe.max_tokens}, {"hidden", plan.moe.hidden},
                    {"intermediate", plan.moe.intermediate}, {"experts", plan.moe.experts}, {"top k", plan.moe.top_k}});
      break;
    case OpKind::group_select:
    case OpKind::sparse_ffn_layer:
      text += dims({{"max tokens", plan.sparse_ffn.max_tokens}, {"d_model", plan.sparse_ffn.d_model},
                    {"d_ff", plan.sparse_ffn.d_ff}, {"group size", plan.sparse_ffn.group_size},
                    {"top groups", plan.sparse_ffn.top_groups}});
      break;
  }
  text += "; workspace " + std::to_string(plan.workspace_bytes) + " B";
  if (is_layer(plan.kind))
    text += " (forward " + std::to_string(plan.forward_workspace_bytes) + " B, backward " +
            std::to_string(plan.backward_workspace_bytes) + " B)";
  return text + ", saved " + std::to_string(plan.saved_bytes) + " B)";
}

}  // namespace v0
}  // namespace moekit
