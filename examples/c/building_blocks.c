/*
 * building_blocks.c — an MoE layer forward chained by hand from moekit's building blocks (C99, static link),
 * checked against the layer operation moekit_moe_forward. Reference (CPU) backend, host memory.
 *
 *   logits = x Wr^T              grouped GEMM, one group (a dense GEMM)
 *   scores, indices = router     softmax over the top-k logits
 *   CSR = dispatch(indices)      expert_offsets, gather_idx, pair_idx, grouped_pos
 *   h, a = x[gather] W1^T        grouped GEMM, varlen M, rows of x gathered, gated (SwiGLU) epilogue
 *   y = a W2^T                   grouped GEMM, varlen M
 *   out = combine(y, scores)     out_t = sum over k of s[t,k] y[grouped_pos[t,k]]
 *
 * docs/api.md quotes this file. Exit status 0 when the chain matches the layer, 1 otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moekit/moekit.h>

enum { T = 64, H = 64, I = 32, E = 4, K = 2, P = T * K };

static void check(moekit_status_t status, const char* call) {
  char message[1024];
  if (status == MOEKIT_SUCCESS) return;
  moekit_get_last_error(message, sizeof message);
  fprintf(stderr, "building_blocks: %s failed: %s: %s\n", call, moekit_status_string(status), message);
  exit(EXIT_FAILURE);
}
#define CHECK(call) check((call), #call)

/* SplitMix64 and round-to-nearest-even bf16, as in moe_layer.c. */
static uint64_t rng_state = 7;

static float rng_uniform(float scale) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)((2.0 * (double)(z >> 11) * (1.0 / 9007199254740992.0) - 1.0) * scale);
}

static uint16_t float_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static float bf16_to_float(uint16_t value) {
  const uint32_t bits = (uint32_t)value << 16;
  float result;
  memcpy(&result, &bits, sizeof result);
  return result;
}

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

/* The same layer in one call, in inference mode (no saved buffer). */
static void layer_forward(moekit_handle_t handle) {
  moekit_moe_desc_t desc;
  moekit_moe_fwd_args_t args;
  moekit_plan_t plan;
  CHECK(moekit_moe_desc_init(&desc));
  desc.max_tokens = T;
  desc.hidden = H;
  desc.intermediate = I;
  desc.router_experts = E;
  desc.experts = E;
  desc.top_k = K;
  desc.inference = 1;
  CHECK(moekit_moe_plan_create(handle, &desc, &plan));
  reserve_workspace(plan);
  CHECK(moekit_moe_fwd_args_init(&args));
  args.x = tensor(x, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  args.w_router = tensor(w_router, MOEKIT_DTYPE_BF16, 2, E, H, 0);
  args.w1 = tensor(w1, MOEKIT_DTYPE_BF16, 3, E, 2 * I, H);
  args.w2 = tensor(w2, MOEKIT_DTYPE_BF16, 3, E, H, I);
  args.out = tensor(out_layer, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  CHECK(moekit_moe_forward(plan, &args, NULL, 0, workspace, workspace_bytes, NULL));
  CHECK(moekit_plan_destroy(plan));
}

int main(void) {
  moekit_handle_desc_t handle_desc;
  moekit_handle_t handle;
  double diff = 0.0, norm = 0.0;
  int i, identical;

  fill_bf16(x, T * H, 1.0f);
  fill_bf16(w_router, E * H, 1.0f / sqrtf((float)H));
  fill_bf16(w1, E * 2 * I * H, 1.0f / sqrtf((float)H));
  fill_bf16(w2, E * H * I, 1.0f / sqrtf((float)I));

  CHECK(moekit_handle_desc_init(&handle_desc));
  handle_desc.backend = MOEKIT_BACKEND_REFERENCE;
  CHECK(moekit_handle_create(&handle_desc, &handle));

  router_logits(handle);
  route(handle);
  dispatch(handle);
  up_projection(handle);
  down_projection(handle);
  combine(handle);
  layer_forward(handle);

  printf("pairs per expert:");
  for (i = 0; i < E; ++i) printf(" %d", (int)(expert_offsets[i + 1] - expert_offsets[i]));
  printf("\n");

  /* The layer rounds at the same points as the chain (SPEC section 8), so the two agree; report how closely. */
  for (i = 0; i < T * H; ++i) {
    const double a = bf16_to_float(out_chain[i]), b = bf16_to_float(out_layer[i]);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  identical = memcmp(out_chain, out_layer, sizeof out_chain) == 0;
  printf("||out||: %.6f, ||chain - layer|| / ||layer|| = %.3g%s\n", sqrt(norm), sqrt(diff / norm),
         identical ? " (bitwise identical)" : "");

  free(workspace);
  CHECK(moekit_handle_destroy(handle));
  if (!(norm > 0.0) || !(sqrt(diff / norm) <= 1e-2)) {
    fprintf(stderr, "building_blocks: the chained forward does not match moekit_moe_forward\n");
    return EXIT_FAILURE;
  }
  printf("ok\n");
  return EXIT_SUCCESS;
}
