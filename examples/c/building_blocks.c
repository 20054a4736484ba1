/*
 * building_blocks.c — an MoE layer forward and backward chained by hand from moekit's building blocks (C99,
 * static link), checked against the layer operations moekit_moe_forward / moekit_moe_backward. Reference (CPU)
 * backend, host memory, bf16 with fp32 weight gradients, no biases.
 *
 * Forward (docs/math.md section 3):
 *   logits = x Wr^T              grouped GEMM, one group (a dense GEMM)
 *   scores, indices = router     softmax over the top-k logits
 *   CSR = dispatch(indices)      expert_offsets, gather_idx, pair_idx, grouped_pos
 *   h, a = x[gather] W1^T        grouped GEMM, varlen M, rows of x gathered, gated (SwiGLU) epilogue
 *   y = a W2^T                   grouped GEMM, varlen M
 *   out = combine(y, scores)     out_t = sum over k of s[t,k] y[grouped_pos[t,k]]
 * Backward (docs/math.md section 4):
 *   dh, a', ds                   grouped GEMM dout[gather] W2, dgated epilogue
 *   dW2, dW1                     grouped GEMMs, varlen K
 *   dx = broadcast(dh W1)        grouped GEMM, then the broadcast backward
 *   dlogits; dx += dlogits Wr; dWr = dlogits^T x     router backward, two one-group GEMMs
 * And the experts alone (moekit_experts_forward, for expert parallelism) on the rows x[gather_idx] give the
 * chain's y.
 *
 * docs/api.md quotes this file. Exit status 0 when the chain matches the layer, 1 otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moekit/moekit.h>

#define EXAMPLE_NAME "building_blocks"
#include "example_util.h"

enum { T = 64, H = 64, I = 32, E = 4, K = 2, P = T * K };

static void fill_bf16(uint16_t* values, size_t count, float scale) {
  size_t i;
  for (i = 0; i < count; ++i) values[i] = float_to_bf16(rng_uniform(scale));
}

static const moekit_device_t cpu = {MOEKIT_DEVICE_CPU, 0};

/* A contiguous host tensor of up to three dimensions (trailing zeros are ignored by rank). */
static moekit_tensor_t tensor(void* data, moekit_dtype_t dtype, int32_t rank, int64_t d0, int64_t d1, int64_t d2) {
  const int64_t shape[3] = {d0, d1, d2};
  return moekit_tensor_make(data, dtype, rank, shape, cpu);
}

/* One workspace serves every call in turn: it holds nothing between calls. */
static unsigned char* workspace = NULL;
static size_t workspace_bytes = 0;

static void reserve_workspace(moekit_plan_t plan) {
  size_t bytes = 0;
  CHECK(moekit_plan_workspace_size(plan, &bytes));
  if (bytes > workspace_bytes) {
    free(workspace);
    workspace = (unsigned char*)malloc(bytes);
    if (workspace == NULL) check(MOEKIT_STATUS_OUT_OF_MEMORY, "malloc(workspace)");
    workspace_bytes = bytes;
  }
}

/* Inputs */
static uint16_t x[T * H], w_router[E * H], w1[E * 2 * I * H], w2[E * H * I];
/* Intermediates (grouped tensors have P rows; rows past the valid count are never touched) */
static uint16_t logits[T * E], h[P * 2 * I], act[P * I], y[P * H];
static float scores[T * K];
static int32_t indices[T * K], expert_offsets[E + 1], gather_idx[P], pair_idx[P], grouped_pos[P];
/* Outputs: by hand and by the layer */
static uint16_t out_chain[T * H], out_layer[T * H];

/* logits [T, E] = x [T, H] Wr^T: a grouped GEMM with a single group spanning all T rows. */
static void router_logits(moekit_handle_t handle) {
  static int32_t one_group[2] = {0, T};
  moekit_gemm_desc_t desc;
  moekit_gemm_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_gemm_desc_init(&desc));
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.b_layout = MOEKIT_GEMM_B_NK; /* Wr is [E, H] = [N, K] */
  desc.epilogue = MOEKIT_EPILOGUE_STORE;
  desc.groups = 1;
  desc.max_rows = T;
  desc.gather_rows = T;
  desc.n = E;
  desc.k = H;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_gemm_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_gemm_args_init(&args));
  args.a = tensor(x, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  args.b = tensor(w_router, MOEKIT_DTYPE_BF16, 3, 1, E, H);
  args.offsets = tensor(one_group, MOEKIT_DTYPE_INT32, 1, 2, 0, 0);
  args.c = tensor(logits, MOEKIT_DTYPE_BF16, 2, T, E, 0);
  CHECK(moekit_gemm(plan, &args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* scores [T, K] fp32 and indices [T, K]: softmax over each token's top-K logits. */
static void route(moekit_handle_t handle) {
  moekit_router_desc_t desc;
  moekit_router_fwd_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_router_desc_init(&desc));
  desc.max_tokens = T;
  desc.experts = E;
  desc.top_k = K;
  desc.kind = MOEKIT_ROUTER_SOFTMAX_TOPK;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_router_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_router_fwd_args_init(&args));
  args.logits = tensor(logits, MOEKIT_DTYPE_BF16, 2, T, E, 0);
  args.scores = tensor(scores, MOEKIT_DTYPE_FP32, 2, T, K, 0);
  args.indices = tensor(indices, MOEKIT_DTYPE_INT32, 2, T, K, 0);
  CHECK(moekit_router_forward(plan, &args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* The deterministic CSR: pairs sorted by expert (stable, so ascending pair number inside an expert). */
static void dispatch(moekit_handle_t handle) {
  moekit_dispatch_desc_t desc;
  moekit_dispatch_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_dispatch_desc_init(&desc));
  desc.max_tokens = T;
  desc.top_k = K;
  desc.experts = E;
  CHECK(moekit_dispatch_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_dispatch_args_init(&args));
  args.indices = tensor(indices, MOEKIT_DTYPE_INT32, 2, T, K, 0);
  args.expert_offsets = tensor(expert_offsets, MOEKIT_DTYPE_INT32, 1, E + 1, 0, 0);
  args.gather_idx = tensor(gather_idx, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  args.pair_idx = tensor(pair_idx, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  args.grouped_pos = tensor(grouped_pos, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  CHECK(moekit_dispatch(plan, &args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* h [P, 2I] = x[gather_idx] W1[e]^T for each expert's rows, and the SwiGLU a [P, I] = silu(gate) * up of the
 * rounded h, in the GEMM's epilogue. */
static void up_projection(moekit_handle_t handle) {
  moekit_gemm_desc_t desc;
  moekit_gemm_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_gemm_desc_init(&desc));
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.b_layout = MOEKIT_GEMM_B_NK; /* W1 [E, 2I, H] */
  desc.gather = MOEKIT_GEMM_GATHER_A;
  desc.epilogue = MOEKIT_EPILOGUE_GATED;
  desc.activation = MOEKIT_ACT_SWIGLU;
  desc.glu_layout = MOEKIT_GLU_CONCAT;
  desc.groups = E;
  desc.max_rows = P;
  desc.gather_rows = T;
  desc.n = 2 * I;
  desc.k = H;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_gemm_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_gemm_args_init(&args));
  args.a = tensor(x, MOEKIT_DTYPE_BF16, 2, T, H, 0); /* gathered: row r is x[gather_idx[r]] */
  args.b = tensor(w1, MOEKIT_DTYPE_BF16, 3, E, 2 * I, H);
  args.offsets = tensor(expert_offsets, MOEKIT_DTYPE_INT32, 1, E + 1, 0, 0);
  args.gather_idx = tensor(gather_idx, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  args.c = tensor(h, MOEKIT_DTYPE_BF16, 2, P, 2 * I, 0);
  args.act = tensor(act, MOEKIT_DTYPE_BF16, 2, P, I, 0);
  CHECK(moekit_gemm(plan, &args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* y [P, H] = a W2[e]^T for each expert's rows. */
static void down_projection(moekit_handle_t handle) {
  moekit_gemm_desc_t desc;
  moekit_gemm_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_gemm_desc_init(&desc));
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.b_layout = MOEKIT_GEMM_B_NK; /* W2 [E, H, I] */
  desc.epilogue = MOEKIT_EPILOGUE_STORE;
  desc.groups = E;
  desc.max_rows = P;
  desc.gather_rows = P;
  desc.n = H;
  desc.k = I;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_gemm_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_gemm_args_init(&args));
  args.a = tensor(act, MOEKIT_DTYPE_BF16, 2, P, I, 0);
  args.b = tensor(w2, MOEKIT_DTYPE_BF16, 3, E, H, I);
  args.offsets = tensor(expert_offsets, MOEKIT_DTYPE_INT32, 1, E + 1, 0, 0);
  args.c = tensor(y, MOEKIT_DTYPE_BF16, 2, P, H, 0);
  CHECK(moekit_gemm(plan, &args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* out_t = sum over k of s[t,k] y[grouped_pos[t*K+k]] (fp32, ascending k, then rounded). */
static void combine(moekit_handle_t handle) {
  moekit_combine_desc_t desc;
  moekit_combine_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_combine_desc_init(&desc));
  desc.max_tokens = T;
  desc.top_k = K;
  desc.hidden = H;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_combine_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_combine_args_init(&args));
  args.grouped = tensor(y, MOEKIT_DTYPE_BF16, 2, P, H, 0);
  args.scores = tensor(scores, MOEKIT_DTYPE_FP32, 2, T, K, 0);
  args.grouped_pos = tensor(grouped_pos, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  args.out = tensor(out_chain, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  CHECK(moekit_combine(plan, &args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* ---------------------------------------------------------------------------------------------- */
/* The backward, docs/math.md section 4 step by step (no biases here, so no db1 and no db2 + ds)  */
/* ---------------------------------------------------------------------------------------------- */

/* Creates a grouped-GEMM plan for `desc`, runs it once on `args` and destroys it. */
static void gemm_once(moekit_handle_t handle, const moekit_gemm_desc_t* desc, const moekit_gemm_args_t* args) {
  moekit_plan_t plan;
  CHECK(moekit_gemm_plan_create(handle, desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_gemm(plan, args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* Backward inputs and intermediates */
static uint16_t dout[T * H], dh[P * 2 * I], act_scaled[P * I], dxe[P * H], dlogits[T * E];
static float dscores[T * K];
/* Gradients: by hand and by the layer (weight gradients in fp32) */
static uint16_t dx_chain[T * H], dx_layer[T * H];
static float dw_router_chain[E * H], dw1_chain[E * 2 * I * H], dw2_chain[E * H * I];
static float dw_router_layer[E * H], dw1_layer[E * 2 * I * H], dw2_layer[E * H * I];

/* Step 1: dA = dout[gather_idx] W2[e] (never stored); the DGATED epilogue recomputes a from h and writes
 * dh = dact(h, s dA), a' = s a and ds[pair] = dA . a. */
static void backward_dgated(moekit_handle_t handle) {
  moekit_gemm_desc_t desc;
  moekit_gemm_args_t args;
  CHECK(moekit_gemm_desc_init(&desc));
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.b_layout = MOEKIT_GEMM_B_KN; /* W2 [E, H, I] read as [E, K, N] */
  desc.gather = MOEKIT_GEMM_GATHER_A;
  desc.epilogue = MOEKIT_EPILOGUE_DGATED;
  desc.activation = MOEKIT_ACT_SWIGLU;
  desc.glu_layout = MOEKIT_GLU_CONCAT;
  desc.groups = E;
  desc.max_rows = P;
  desc.gather_rows = T;
  desc.n = 2 * I; /* h's width */
  desc.k = H;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_gemm_args_init(&args));
  args.a = tensor(dout, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  args.b = tensor(w2, MOEKIT_DTYPE_BF16, 3, E, H, I);
  args.offsets = tensor(expert_offsets, MOEKIT_DTYPE_INT32, 1, E + 1, 0, 0);
  args.gather_idx = tensor(gather_idx, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  args.h = tensor(h, MOEKIT_DTYPE_BF16, 2, P, 2 * I, 0);
  args.row_scale = tensor(scores, MOEKIT_DTYPE_FP32, 1, P, 0, 0);
  args.pair_idx = tensor(pair_idx, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  args.c = tensor(dh, MOEKIT_DTYPE_BF16, 2, P, 2 * I, 0);
  args.act = tensor(act_scaled, MOEKIT_DTYPE_BF16, 2, P, I, 0);
  args.dscores = tensor(dscores, MOEKIT_DTYPE_FP32, 1, P, 0, 0);
  gemm_once(handle, &desc, &args);
}

/* Steps 2 and 6: dW2[e] = dout[gather]^T a' and dW1[e] = dh^T x[gather], grouped GEMMs with varlen K. */
static void backward_weight_grads(moekit_handle_t handle) {
  moekit_gemm_desc_t desc;
  moekit_gemm_args_t args;
  CHECK(moekit_gemm_desc_init(&desc));
  desc.mode = MOEKIT_GEMM_VARLEN_K;
  desc.gather = MOEKIT_GEMM_GATHER_A; /* rows of dout */
  desc.groups = E;
  desc.max_rows = P;
  desc.gather_rows = T;
  desc.n = I;
  desc.k = H;
  desc.dtype = MOEKIT_DTYPE_BF16;
  desc.out_dtype = MOEKIT_DTYPE_FP32;
  CHECK(moekit_gemm_args_init(&args));
  args.a = tensor(dout, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  args.b = tensor(act_scaled, MOEKIT_DTYPE_BF16, 2, P, I, 0);
  args.offsets = tensor(expert_offsets, MOEKIT_DTYPE_INT32, 1, E + 1, 0, 0);
  args.gather_idx = tensor(gather_idx, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  args.c = tensor(dw2_chain, MOEKIT_DTYPE_FP32, 3, E, H, I);
  gemm_once(handle, &desc, &args);

  desc.gather = MOEKIT_GEMM_GATHER_B; /* rows of x */
  desc.n = H;
  desc.k = 2 * I;
  args.a = tensor(dh, MOEKIT_DTYPE_BF16, 2, P, 2 * I, 0);
  args.b = tensor(x, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  args.c = tensor(dw1_chain, MOEKIT_DTYPE_FP32, 3, E, 2 * I, H);
  gemm_once(handle, &desc, &args);
}

/* Steps 4 and 7: dxe = dh W1[e], then dx_t = sum over k of dxe[grouped_pos[t*K+k]]. */
static void backward_input_grad(moekit_handle_t handle) {
  moekit_gemm_desc_t desc;
  moekit_gemm_args_t args;
  moekit_combine_desc_t combine_desc;
  moekit_combine_args_t combine_args;
  moekit_plan_t plan;
  CHECK(moekit_gemm_desc_init(&desc));
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.b_layout = MOEKIT_GEMM_B_KN; /* W1 [E, 2I, H] read as [E, K, N] */
  desc.groups = E;
  desc.max_rows = P;
  desc.gather_rows = P;
  desc.n = H;
  desc.k = 2 * I;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_gemm_args_init(&args));
  args.a = tensor(dh, MOEKIT_DTYPE_BF16, 2, P, 2 * I, 0);
  args.b = tensor(w1, MOEKIT_DTYPE_BF16, 3, E, 2 * I, H);
  args.offsets = tensor(expert_offsets, MOEKIT_DTYPE_INT32, 1, E + 1, 0, 0);
  args.c = tensor(dxe, MOEKIT_DTYPE_BF16, 2, P, H, 0);
  gemm_once(handle, &desc, &args);

  CHECK(moekit_combine_desc_init(&combine_desc));
  combine_desc.max_tokens = T;
  combine_desc.top_k = K;
  combine_desc.hidden = H;
  combine_desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_combine_plan_create(handle, &combine_desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_combine_args_init(&combine_args));
  combine_args.grouped = tensor(dxe, MOEKIT_DTYPE_BF16, 2, P, H, 0);
  combine_args.grouped_pos = tensor(grouped_pos, MOEKIT_DTYPE_INT32, 1, P, 0, 0);
  combine_args.out = tensor(dx_chain, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  CHECK(moekit_broadcast_backward(plan, &combine_args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

/* Step 8: dlogits from ds (rounded to bf16, as the layer does before its GEMMs), then dx += dlogits Wr and
 * dWr = dlogits^T x, two GEMMs with a single group. */
static void backward_router(moekit_handle_t handle) {
  static int32_t one_group[2] = {0, T};
  moekit_router_desc_t router_desc;
  moekit_router_bwd_args_t router_args;
  moekit_gemm_desc_t desc;
  moekit_gemm_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_router_desc_init(&router_desc));
  router_desc.max_tokens = T;
  router_desc.experts = E;
  router_desc.top_k = K;
  router_desc.kind = MOEKIT_ROUTER_SOFTMAX_TOPK;
  router_desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_router_plan_create(handle, &router_desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_router_bwd_args_init(&router_args));
  router_args.logits = tensor(logits, MOEKIT_DTYPE_BF16, 2, T, E, 0);
  router_args.indices = tensor(indices, MOEKIT_DTYPE_INT32, 2, T, K, 0);
  router_args.dscores = tensor(dscores, MOEKIT_DTYPE_FP32, 2, T, K, 0);
  router_args.dlogits = tensor(dlogits, MOEKIT_DTYPE_BF16, 2, T, E, 0);
  CHECK(moekit_router_backward(plan, &router_args, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));

  CHECK(moekit_gemm_desc_init(&desc));
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.b_layout = MOEKIT_GEMM_B_KN; /* Wr [E, H] read as [1, K, N] */
  desc.groups = 1;
  desc.max_rows = T;
  desc.gather_rows = T;
  desc.n = H;
  desc.k = E;
  desc.dtype = MOEKIT_DTYPE_BF16;
  CHECK(moekit_gemm_args_init(&args));
  args.a = tensor(dlogits, MOEKIT_DTYPE_BF16, 2, T, E, 0);
  args.b = tensor(w_router, MOEKIT_DTYPE_BF16, 3, 1, E, H);
  args.offsets = tensor(one_group, MOEKIT_DTYPE_INT32, 1, 2, 0, 0);
  args.c = tensor(dx_chain, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  args.beta = 1.0; /* add to the experts' part of dx */
  gemm_once(handle, &desc, &args);

  desc.mode = MOEKIT_GEMM_VARLEN_K;
  desc.out_dtype = MOEKIT_DTYPE_FP32;
  args.b = tensor(x, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  args.c = tensor(dw_router_chain, MOEKIT_DTYPE_FP32, 3, 1, E, H);
  args.beta = 0.0;
  gemm_once(handle, &desc, &args);
}

/* ---------------------------------------------------------------------------------------------- */
/* The layer in one call each way                                                                 */
/* ---------------------------------------------------------------------------------------------- */

static void layer_forward_backward(moekit_handle_t handle) {
  moekit_moe_desc_t desc;
  moekit_moe_fwd_args_t fwd;
  moekit_moe_bwd_args_t bwd;
  moekit_plan_t plan;
  size_t saved_bytes = 0;
  void* saved;
  CHECK(moekit_moe_desc_init(&desc));
  desc.max_tokens = T;
  desc.hidden = H;
  desc.intermediate = I;
  desc.router_experts = E;
  desc.experts = E;
  desc.top_k = K;
  desc.weight_grad_dtype = MOEKIT_DTYPE_FP32;
  CHECK(moekit_moe_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_plan_saved_size(plan, &saved_bytes));
  saved = malloc(saved_bytes);
  if (saved == NULL) check(MOEKIT_STATUS_OUT_OF_MEMORY, "malloc(saved)");

  CHECK(moekit_moe_fwd_args_init(&fwd));
  fwd.x = tensor(x, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  fwd.w_router = tensor(w_router, MOEKIT_DTYPE_BF16, 2, E, H, 0);
  fwd.w1 = tensor(w1, MOEKIT_DTYPE_BF16, 3, E, 2 * I, H);
  fwd.w2 = tensor(w2, MOEKIT_DTYPE_BF16, 3, E, H, I);
  fwd.out = tensor(out_layer, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  CHECK(moekit_moe_forward(plan, &fwd, saved, saved_bytes, workspace, workspace_bytes, NULL));

  CHECK(moekit_moe_bwd_args_init(&bwd));
  bwd.x = fwd.x;
  bwd.dout = tensor(dout, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  bwd.w_router = fwd.w_router;
  bwd.w1 = fwd.w1;
  bwd.w2 = fwd.w2;
  bwd.dx = tensor(dx_layer, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  bwd.dw_router = tensor(dw_router_layer, MOEKIT_DTYPE_FP32, 2, E, H, 0);
  bwd.dw1 = tensor(dw1_layer, MOEKIT_DTYPE_FP32, 3, E, 2 * I, H);
  bwd.dw2 = tensor(dw2_layer, MOEKIT_DTYPE_FP32, 3, E, H, I);
  CHECK(moekit_moe_backward(plan, &bwd, saved, saved_bytes, workspace, workspace_bytes, NULL));

  free(saved);
  CHECK(moekit_plan_destroy(plan));
}

/* The experts alone (expert parallelism): the rows x[gather_idx], already grouped by expert, give y directly. */
static uint16_t x_grouped[P * H], y_experts[P * H];

static void experts_forward(moekit_handle_t handle) {
  moekit_moe_desc_t desc;
  moekit_experts_fwd_args_t args;
  moekit_plan_t plan;
  size_t saved_bytes = 0;
  void* saved;
  int i;
  for (i = 0; i < P; ++i) memcpy(&x_grouped[i * H], &x[gather_idx[i] * H], H * sizeof *x);
  CHECK(moekit_moe_desc_init(&desc));
  desc.max_tokens = P; /* the row bound */
  desc.hidden = H;
  desc.intermediate = I;
  desc.experts = E;
  CHECK(moekit_experts_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_plan_saved_size(plan, &saved_bytes));
  saved = malloc(saved_bytes);
  if (saved == NULL) check(MOEKIT_STATUS_OUT_OF_MEMORY, "malloc(saved)");
  CHECK(moekit_experts_fwd_args_init(&args));
  args.x = tensor(x_grouped, MOEKIT_DTYPE_BF16, 2, P, H, 0);
  args.offsets = tensor(expert_offsets, MOEKIT_DTYPE_INT32, 1, E + 1, 0, 0);
  args.w1 = tensor(w1, MOEKIT_DTYPE_BF16, 3, E, 2 * I, H);
  args.w2 = tensor(w2, MOEKIT_DTYPE_BF16, 3, E, H, I);
  args.y = tensor(y_experts, MOEKIT_DTYPE_BF16, 2, P, H, 0);
  CHECK(moekit_experts_forward(plan, &args, saved, saved_bytes, workspace, workspace_bytes, NULL));
  free(saved);
  CHECK(moekit_plan_destroy(plan));
}

/* ---------------------------------------------------------------------------------------------- */
/* Comparison                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

static int mismatches = 0;

/* The layer rounds at the same points as the chain (docs/math.md section 8), so the two agree; report how closely and
 * fail past a bf16-sized relative error. */
static void compare(const char* name, const double* chain, const double* layer, size_t count, int identical) {
  double diff = 0.0, norm = 0.0, relative;
  size_t i;
  for (i = 0; i < count; ++i) {
    diff += (chain[i] - layer[i]) * (chain[i] - layer[i]);
    norm += layer[i] * layer[i];
  }
  relative = norm > 0.0 ? sqrt(diff / norm) : INFINITY;
  printf("  %-9s ||layer|| = %10.6f  ||chain - layer|| / ||layer|| = %.3g%s\n", name, sqrt(norm), relative,
         identical ? " (bitwise identical)" : "");
  if (!(norm > 0.0) || !(relative <= 1e-2)) {
    fprintf(stderr, "building_blocks: %s by hand does not match the layer\n", name);
    ++mismatches;
  }
}

static double as_double[E * 2 * I * H], as_double_ref[E * 2 * I * H];

static void compare_bf16(const char* name, const uint16_t* chain, const uint16_t* layer, size_t count) {
  size_t i;
  for (i = 0; i < count; ++i) {
    as_double[i] = bf16_to_float(chain[i]);
    as_double_ref[i] = bf16_to_float(layer[i]);
  }
  compare(name, as_double, as_double_ref, count, memcmp(chain, layer, count * sizeof *chain) == 0);
}

static void compare_fp32(const char* name, const float* chain, const float* layer, size_t count) {
  size_t i;
  for (i = 0; i < count; ++i) {
    as_double[i] = chain[i];
    as_double_ref[i] = layer[i];
  }
  compare(name, as_double, as_double_ref, count, memcmp(chain, layer, count * sizeof *chain) == 0);
}

int main(void) {
  moekit_handle_desc_t handle_desc;
  moekit_handle_t handle;
  int i;

  rng_state = 7;
  fill_bf16(x, T * H, 1.0f);
  fill_bf16(w_router, E * H, 1.0f / sqrtf((float)H));
  fill_bf16(w1, E * 2 * I * H, 1.0f / sqrtf((float)H));
  fill_bf16(w2, E * H * I, 1.0f / sqrtf((float)I));
  fill_bf16(dout, T * H, 1.0f);

  CHECK(moekit_handle_desc_init(&handle_desc));
  handle_desc.backend = MOEKIT_BACKEND_REFERENCE;
  CHECK(moekit_handle_create(&handle_desc, &handle));

  router_logits(handle);
  route(handle);
  dispatch(handle);
  up_projection(handle);
  down_projection(handle);
  combine(handle);

  backward_dgated(handle);
  backward_weight_grads(handle);
  backward_input_grad(handle);
  backward_router(handle);

  layer_forward_backward(handle);
  experts_forward(handle);

  printf("pairs per expert:");
  for (i = 0; i < E; ++i) printf(" %d", (int)(expert_offsets[i + 1] - expert_offsets[i]));
  printf("\nchained building blocks vs moekit_moe_forward / moekit_moe_backward:\n");
  compare_bf16("out", out_chain, out_layer, T * H);
  compare_bf16("dx", dx_chain, dx_layer, T * H);
  compare_fp32("dw_router", dw_router_chain, dw_router_layer, E * H);
  compare_fp32("dw1", dw1_chain, dw1_layer, E * 2 * I * H);
  compare_fp32("dw2", dw2_chain, dw2_layer, E * H * I);
  printf("experts alone (moekit_experts_forward on the grouped rows) vs the chain's y:\n");
  compare_bf16("y", y_experts, y, P * H);

  free(workspace);
  CHECK(moekit_handle_destroy(handle));
  if (mismatches > 0) return EXIT_FAILURE;
  printf("ok\n");
  return EXIT_SUCCESS;
}
