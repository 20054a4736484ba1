// Valid descriptors of every plan kind at small shapes, for the C ABI tests (test_capi_contract.cpp builds its
// fixtures on them and breaks one field at a time; test_plan_describe.cpp describes a plan of each).
#pragma once

#include <cstdint>

#include "moekit/moekit.h"

namespace plan_descs {

// The MoE shapes: max tokens, hidden, intermediate, local experts, top-k, and the router's experts (moe_desc's
// local experts are 1 to 4 of those 6).
constexpr int64_t kMaxTokens = 8, kH = 32, kI = 8, kE = 4, kK = 2, kRouterExperts = 6;
// The sparse FFN shapes: d_model, d_ff, group size, groups, top groups, subsampled rows a group.
constexpr int64_t kD = 32, kF = 128, kG = 32, kGroups = kF / kG, kTopGroups = 2, kSubsample = 8;

inline moekit_router_desc_t router_desc() {
  moekit_router_desc_t d;
  moekit_router_desc_init(&d);
  d.max_tokens = kMaxTokens;
  d.experts = kE;
  d.top_k = kK;
  d.kind = MOEKIT_ROUTER_SIGMOID;
  return d;
}

inline moekit_dispatch_desc_t dispatch_desc() {
  moekit_dispatch_desc_t d;
  moekit_dispatch_desc_init(&d);
  d.max_tokens = kMaxTokens;
  d.top_k = kK;
  d.experts = kE;
  return d;
}

// Without n and k: each caller sets the two for its product.
inline moekit_gemm_desc_t gemm_desc(int32_t mode, int32_t gather, int32_t epilogue) {
  moekit_gemm_desc_t d;
  moekit_gemm_desc_init(&d);
  d.mode = mode;
  d.gather = gather;
  d.epilogue = epilogue;
  d.groups = kE;
  d.max_rows = 12;
  d.gather_rows = kMaxTokens;
  return d;
}

// The MoE forward's up-projection: A gathered, n = 2I from k = H, the gated epilogue.
inline moekit_gemm_desc_t gated_gemm_desc() {
  moekit_gemm_desc_t d = gemm_desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_GATHER_A, MOEKIT_EPILOGUE_GATED);
  d.n = 2 * kI;
  d.k = kH;
  return d;
}

// The MoE backward's dW1: varlen K, B gathered, n = H from k = 2I, fp32 out.
inline moekit_gemm_desc_t varlen_k_gemm_desc() {
  moekit_gemm_desc_t d = gemm_desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_GEMM_GATHER_B, MOEKIT_EPILOGUE_STORE);
  d.n = kH;
  d.k = 2 * kI;
  d.out_dtype = MOEKIT_DTYPE_FP32;
  return d;
}

inline moekit_combine_desc_t combine_desc() {
  moekit_combine_desc_t d;
  moekit_combine_desc_init(&d);
  d.max_tokens = kMaxTokens;
  d.top_k = kK;
  d.hidden = kH;
  return d;
}

inline moekit_bias_grad_desc_t bias_grad_desc() {
  moekit_bias_grad_desc_t d;
  moekit_bias_grad_desc_init(&d);
  d.experts = kE;
  d.max_rows = 12;
  d.width = kH;
  return d;
}

inline moekit_sparse_ffn_desc_t sparse_ffn_desc() {
  moekit_sparse_ffn_desc_t d;
  moekit_sparse_ffn_desc_init(&d);
  d.max_tokens = kMaxTokens;
  d.d_model = kD;
  d.d_ff = kF;
  d.group_size = kG;
  d.top_groups = kTopGroups;
  d.subsample = kSubsample;
  return d;
}

inline moekit_moe_desc_t moe_desc() {
  moekit_moe_desc_t d;
  moekit_moe_desc_init(&d);
  d.max_tokens = kMaxTokens;
  d.hidden = kH;
  d.intermediate = kI;
  d.router_experts = kRouterExperts;
  d.experts = kE;
  d.expert_begin = 1;
  d.top_k = kK;
  d.router = MOEKIT_ROUTER_SIGMOID;
  d.has_b1 = 1;
  d.has_b2 = 1;
  return d;
}

// The experts on token-major rows: the MoE shapes, with local ids (expert_begin 0).
inline moekit_moe_desc_t token_experts_desc() {
  moekit_moe_desc_t d = moe_desc();
  d.expert_begin = 0;
  return d;
}

}  // namespace plan_descs
