/*
 * run_dlopen.c — use libmoekit.so with no link-time dependency on it (C99; link with -ldl only).
 *
 *   run_dlopen /path/to/libmoekit.so
 *
 * moekit.h is included for its types and constants only; every function is reached through dlsym. The program
 *  1. resolves EVERY public function of moekit.h by name (the test fails if one is missing),
 *  2. checks moekit_get_version() == MOEKIT_VERSION_NUMBER of the header it was compiled with,
 *  3. creates a reference (CPU) handle and runs the router forward and the dispatch on three tokens, comparing
 *     every output with values worked out by hand below,
 *  4. checks that moekit_subsample_rows draws exactly what the steps spelled out in moekit.h (and docs/api.md)
 *     give, reimplemented here,
 *  5. checks that a malformed request answers MOEKIT_STATUS_INVALID_VALUE with a message.
 * Exit status 0 when everything matches, 1 otherwise.
 */
#include <dlfcn.h>
#include <math.h> /* INFINITY only: nothing from libm is called */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moekit/moekit.h>

/* Every function that moekit.h declares. tests/abi/public_symbols.txt holds the same list; the ABI test keeps
 * that file equal to the header and to the library's exports. */
static const char* const public_functions[] = {
    "moekit_bias_grad_desc_init",         "moekit_bias_grad_plan_create",       "moekit_broadcast_backward",
    "moekit_combine",                     "moekit_combine_args_init",           "moekit_combine_desc_init",
    "moekit_combine_plan_create",         "moekit_db1",                         "moekit_db1_args_init",
    "moekit_db2_ds",                      "moekit_db2_ds_args_init",            "moekit_dispatch",
    "moekit_dispatch_args_init",          "moekit_dispatch_desc_init",          "moekit_dispatch_plan_create",
    "moekit_experts_backward",            "moekit_experts_bwd_args_init",       "moekit_experts_forward",
    "moekit_experts_fwd_args_init",       "moekit_experts_plan_create",         "moekit_gemm",
    "moekit_gemm_args_init",              "moekit_gemm_desc_init",              "moekit_gemm_plan_create",
    "moekit_get_last_error",              "moekit_get_version",                 "moekit_group_select",
    "moekit_group_select_args_init",      "moekit_group_select_plan_create",    "moekit_handle_create",
    "moekit_handle_desc_init",            "moekit_handle_destroy",              "moekit_load_balance_args_init",
    "moekit_load_balance_update",         "moekit_moe_backward",                "moekit_moe_bwd_args_init",
    "moekit_moe_desc_init",               "moekit_moe_forward",                 "moekit_moe_fwd_args_init",
    "moekit_moe_plan_create",             "moekit_plan_describe",               "moekit_plan_destroy",
    "moekit_plan_layer_workspace_sizes",  "moekit_plan_saved_size",             "moekit_plan_workspace_size",
    "moekit_router_backward",             "moekit_router_bwd_args_init",        "moekit_router_desc_init",
    "moekit_router_forward",              "moekit_router_fwd_args_init",        "moekit_router_plan_create",
    "moekit_sparse_ffn_backward",         "moekit_sparse_ffn_bwd_args_init",    "moekit_sparse_ffn_desc_init",
    "moekit_sparse_ffn_forward",          "moekit_sparse_ffn_fwd_args_init",    "moekit_sparse_ffn_plan_create",
    "moekit_status_string",               "moekit_subsample_rows",              "moekit_tensor_make",
    "moekit_token_experts_backward",      "moekit_token_experts_bwd_args_init", "moekit_token_experts_forward",
    "moekit_token_experts_fwd_args_init", "moekit_token_experts_plan_create",
};

/* The functions this program calls, typed as in moekit.h. */
static struct {
  int32_t (*get_version)(void);
  const char* (*status_string)(moekit_status_t);
  size_t (*get_last_error)(char*, size_t);
  moekit_tensor_t (*tensor_make)(void*, moekit_dtype_t, int32_t, const int64_t*, moekit_device_t);
  moekit_status_t (*handle_desc_init)(moekit_handle_desc_t*);
  moekit_status_t (*handle_create)(const moekit_handle_desc_t*, moekit_handle_t*);
  moekit_status_t (*handle_destroy)(moekit_handle_t);
  moekit_status_t (*plan_destroy)(moekit_plan_t);
  moekit_status_t (*plan_workspace_size)(moekit_plan_t, size_t*);
  moekit_status_t (*router_desc_init)(moekit_router_desc_t*);
  moekit_status_t (*router_plan_create)(moekit_handle_t, const moekit_router_desc_t*, moekit_plan_t*);
  moekit_status_t (*router_fwd_args_init)(moekit_router_fwd_args_t*);
  moekit_status_t (*router_forward)(moekit_plan_t, const moekit_router_fwd_args_t*, void*, size_t, void*);
  moekit_status_t (*dispatch_desc_init)(moekit_dispatch_desc_t*);
  moekit_status_t (*dispatch_plan_create)(moekit_handle_t, const moekit_dispatch_desc_t*, moekit_plan_t*);
  moekit_status_t (*dispatch_args_init)(moekit_dispatch_args_t*);
  moekit_status_t (*dispatch)(moekit_plan_t, const moekit_dispatch_args_t*, void*, size_t, void*);
  moekit_status_t (*subsample_rows)(uint64_t, int64_t, int64_t, int64_t, int32_t*);
} api;

/* Points `pointer` at `function` inside the loaded library. The sizeof operand is never evaluated (so it makes
 * no link-time reference), but it makes the compiler check the pointer's type against the header's prototype.
 * memcpy: ISO C has no cast from the void* that dlsym returns to a function pointer; POSIX guarantees this. */
#define LOAD(library, pointer, function)                     \
  do {                                                       \
    void* address_ = dlsym((library), #function);            \
    (void)sizeof((pointer) = function);                      \
    if (address_ == NULL) {                                  \
      fprintf(stderr, "run_dlopen: %s not found\n", #function); \
      exit(EXIT_FAILURE);                                    \
    }                                                        \
    memcpy(&(pointer), &address_, sizeof(pointer));          \
  } while (0)

static int failures = 0;

static void expect(int condition, const char* what) {
  if (!condition) {
    fprintf(stderr, "run_dlopen: FAILED: %s\n", what);
    ++failures;
  }
}

/* Stops at the first failing call: what follows would only repeat it. */
static void check(moekit_status_t status, const char* call) {
  char message[1024];
  if (status == MOEKIT_SUCCESS) return;
  api.get_last_error(message, sizeof message);
  fprintf(stderr, "run_dlopen: %s failed: %s: %s\n", call, api.status_string(status), message);
  exit(EXIT_FAILURE);
}
#define CHECK(call) check((call), #call)

static moekit_tensor_t host_view(void* data, moekit_dtype_t dtype, int32_t rank, int64_t d0, int64_t d1) {
  const int64_t shape[2] = {d0, d1};
  moekit_device_t cpu;
  cpu.type = MOEKIT_DEVICE_CPU;
  cpu.index = 0;
  return api.tensor_make(data, dtype, rank, shape, cpu);
}

static void expect_ints(const int32_t* got, const int32_t* want, int count, const char* name) {
  int i;
  for (i = 0; i < count; ++i) {
    if (got[i] != want[i]) {
      fprintf(stderr, "run_dlopen: FAILED: %s[%d] = %d, expected %d\n", name, i, (int)got[i], (int)want[i]);
      ++failures;
    }
  }
}

enum { TOKENS = 3, EXPERTS = 4, TOP_K = 2, PAIRS = TOKENS * TOP_K, POISON = 0x7eadbeef };

/* ln 3: two logits that differ by ln 3 get the softmax scores 3/4 and 1/4. */
#define LN3 1.0986122886681098f

/* Router forward, softmax over the top-2 of each row. By hand:
 *   token 0: logits (-5, -ln3, -7, 0)   -> experts (3, 1), scores (3/4, 1/4)
 *   token 1: logits (-9, 2, 2, 1)       -> experts (1, 2), scores (1/2, 1/2)  (a tie goes to the lower id)
 *   token 2: logits (3-ln3, -inf, 3, -1) -> experts (2, 0), scores (3/4, 1/4)  (-inf masks expert 1)
 * Pairs p = t*K + k route to experts (3, 1, 1, 2, 2, 0), so the counts per expert are (1, 2, 2, 1). */
static void run_router(moekit_handle_t handle, int32_t indices[PAIRS]) {
  float logits[TOKENS * EXPERTS] = {-5.0f, -LN3, -7.0f, 0.0f,  -9.0f, 2.0f, 2.0f, 1.0f,
                                    3.0f - LN3, -INFINITY, 3.0f, -1.0f};
  static const int32_t want_indices[PAIRS] = {3, 1, 1, 2, 2, 0};
  static const float want_scores[PAIRS] = {0.75f, 0.25f, 0.5f, 0.5f, 0.75f, 0.25f};
  static const int32_t want_counts[EXPERTS] = {1, 2, 2, 1};
  float scores[PAIRS];
  int32_t counts[EXPERTS];
  moekit_router_desc_t desc;
  moekit_router_fwd_args_t args;
  moekit_plan_t plan = NULL;
  size_t workspace_bytes = 0;
  void* workspace;
  int i;

  CHECK(api.router_desc_init(&desc));
  desc.max_tokens = TOKENS;
  desc.experts = EXPERTS;
  desc.top_k = TOP_K;
  desc.kind = MOEKIT_ROUTER_SOFTMAX_TOPK;
  desc.dtype = MOEKIT_DTYPE_FP32;
  CHECK(api.router_plan_create(handle, &desc, &plan));
  CHECK(api.plan_workspace_size(plan, &workspace_bytes));
  workspace = workspace_bytes > 0 ? malloc(workspace_bytes) : NULL;
  if (workspace_bytes > 0 && workspace == NULL) check(MOEKIT_STATUS_OUT_OF_MEMORY, "malloc(workspace)");

  for (i = 0; i < PAIRS; ++i) {
    scores[i] = -1.0f;
    indices[i] = POISON;
  }
  for (i = 0; i < EXPERTS; ++i) counts[i] = POISON;

  CHECK(api.router_fwd_args_init(&args));
  args.logits = host_view(logits, MOEKIT_DTYPE_FP32, 2, TOKENS, EXPERTS);
  args.scores = host_view(scores, MOEKIT_DTYPE_FP32, 2, TOKENS, TOP_K);
  args.indices = host_view(indices, MOEKIT_DTYPE_INT32, 2, TOKENS, TOP_K);
  args.counts = host_view(counts, MOEKIT_DTYPE_INT32, 1, EXPERTS, 0);
  CHECK(api.router_forward(plan, &args, workspace, workspace_bytes, NULL));

  expect_ints(indices, want_indices, PAIRS, "router indices");
  expect_ints(counts, want_counts, EXPERTS, "router counts");
  for (i = 0; i < PAIRS; ++i) {
    const float error = scores[i] - want_scores[i];
    if (!(error < 1e-6f && error > -1e-6f)) {
      fprintf(stderr, "run_dlopen: FAILED: router scores[%d] = %.9g, expected %.9g\n", i, scores[i], want_scores[i]);
      ++failures;
    }
  }
  printf("router forward: indices (%d %d | %d %d | %d %d), scores (%.4f %.4f | %.4f %.4f | %.4f %.4f)\n",
         (int)indices[0], (int)indices[1], (int)indices[2], (int)indices[3], (int)indices[4], (int)indices[5],
         scores[0], scores[1], scores[2], scores[3], scores[4], scores[5]);

  free(workspace);
  CHECK(api.plan_destroy(plan));
}

/* Dispatch of the router's pairs (3, 1, 1, 2, 2, 0) to the local experts [expert_begin, expert_begin + experts):
 * a stable sort of the valid pairs by expert id; pairs of other experts are dropped. The expected tensors are
 * the caller's; rows past the number of valid pairs must keep their poison. */
static void run_dispatch(moekit_handle_t handle, const int32_t indices[PAIRS], int64_t experts, int64_t expert_begin,
                         const int32_t* want_offsets, const int32_t want_gather[PAIRS],
                         const int32_t want_pair[PAIRS], const int32_t want_grouped_pos[PAIRS]) {
  int32_t offsets[EXPERTS + 1], gather_idx[PAIRS], pair_idx[PAIRS], grouped_pos[PAIRS];
  moekit_dispatch_desc_t desc;
  moekit_dispatch_args_t args;
  moekit_plan_t plan = NULL;
  size_t workspace_bytes = 0;
  void* workspace;
  int i;

  CHECK(api.dispatch_desc_init(&desc));
  desc.max_tokens = TOKENS;
  desc.top_k = TOP_K;
  desc.experts = experts;
  desc.expert_begin = expert_begin;
  CHECK(api.dispatch_plan_create(handle, &desc, &plan));
  CHECK(api.plan_workspace_size(plan, &workspace_bytes));
  workspace = workspace_bytes > 0 ? malloc(workspace_bytes) : NULL;
  if (workspace_bytes > 0 && workspace == NULL) check(MOEKIT_STATUS_OUT_OF_MEMORY, "malloc(workspace)");

  for (i = 0; i < PAIRS; ++i) gather_idx[i] = pair_idx[i] = grouped_pos[i] = POISON;
  for (i = 0; i <= EXPERTS; ++i) offsets[i] = POISON;

  CHECK(api.dispatch_args_init(&args));
  args.indices = host_view((void*)indices, MOEKIT_DTYPE_INT32, 2, TOKENS, TOP_K);
  args.expert_offsets = host_view(offsets, MOEKIT_DTYPE_INT32, 1, experts + 1, 0);
  args.gather_idx = host_view(gather_idx, MOEKIT_DTYPE_INT32, 1, PAIRS, 0);
  args.pair_idx = host_view(pair_idx, MOEKIT_DTYPE_INT32, 1, PAIRS, 0);
  args.grouped_pos = host_view(grouped_pos, MOEKIT_DTYPE_INT32, 1, PAIRS, 0);
  CHECK(api.dispatch(plan, &args, workspace, workspace_bytes, NULL));

  expect_ints(offsets, want_offsets, (int)experts + 1, "dispatch expert_offsets");
  expect_ints(gather_idx, want_gather, PAIRS, "dispatch gather_idx");
  expect_ints(pair_idx, want_pair, PAIRS, "dispatch pair_idx");
  expect_ints(grouped_pos, want_grouped_pos, PAIRS, "dispatch grouped_pos");
  printf("dispatch to experts [%d, %d): %d valid pairs, pair_idx (", (int)expert_begin,
         (int)(expert_begin + experts), (int)offsets[experts]);
  for (i = 0; i < offsets[experts] && i < PAIRS; ++i) printf(i ? " %d" : "%d", (int)pair_idx[i]);
  printf(")\n");

  free(workspace);
  CHECK(api.plan_destroy(plan));
}

/* The subsample rows of the sparse FFN, drawn as moekit.h spells it: SplitMix64 steps, then a partial
 * Fisher-Yates shuffle of 0..G-1 per group, in group order. */
static void subsample_rows_by_hand(uint64_t seed, int64_t num_groups, int64_t group_size, int64_t rows_per_group,
                                   int32_t* out) {
  uint64_t state = seed;
  int32_t perm[128];
  int64_t g, j;
  for (g = 0; g < num_groups; ++g) {
    for (j = 0; j < group_size; ++j) perm[j] = (int32_t)j;
    for (j = 0; j < rows_per_group; ++j) {
      uint64_t z;
      int64_t r;
      int32_t swap;
      state += 0x9E3779B97F4A7C15ull;
      z = state;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      r = j + (int64_t)(z % (uint64_t)(group_size - j));
      swap = perm[j];
      perm[j] = perm[r];
      perm[r] = swap;
      out[g * rows_per_group + j] = (int32_t)(g * group_size + perm[j]);
    }
  }
}

static void run_subsample_rows(void) {
  enum { GROUPS = 3, GROUP_SIZE = 16, ROWS = 5 };
  int32_t got[GROUPS * ROWS], want[GROUPS * ROWS];
  int i;
  for (i = 0; i < GROUPS * ROWS; ++i) got[i] = POISON;
  CHECK(api.subsample_rows(2024u, GROUPS, GROUP_SIZE, ROWS, got));
  subsample_rows_by_hand(2024u, GROUPS, GROUP_SIZE, ROWS, want);
  expect_ints(got, want, GROUPS * ROWS, "subsample rows");
  printf("subsample rows (seed 2024, 3 groups of 16, 5 rows each), group 0: %d %d %d %d %d\n", (int)got[0],
         (int)got[1], (int)got[2], (int)got[3], (int)got[4]);
}

/* A router plan asking for more experts per token than exist is malformed. */
static void run_invalid_request(moekit_handle_t handle) {
  moekit_router_desc_t desc;
  moekit_plan_t plan = NULL;
  moekit_status_t status;
  char message[1024] = "";

  CHECK(api.router_desc_init(&desc));
  desc.max_tokens = TOKENS;
  desc.experts = EXPERTS;
  desc.top_k = EXPERTS + 1;
  status = api.router_plan_create(handle, &desc, &plan);
  api.get_last_error(message, sizeof message);
  expect(status == MOEKIT_STATUS_INVALID_VALUE, "top_k > experts answers MOEKIT_STATUS_INVALID_VALUE");
  expect(plan == NULL, "a failed plan creation leaves the plan untouched (NULL)");
  expect(message[0] != '\0', "a failed call leaves a last-error message");
  printf("top_k > experts: %s: %s\n", api.status_string(status), message);
}

int main(int argc, char** argv) {
  void* library;
  size_t i, missing = 0;
  int32_t version;
  int32_t indices[PAIRS];
  moekit_handle_desc_t handle_desc;
  moekit_handle_t handle = NULL;

  if (argc != 2) {
    fprintf(stderr, "usage: %s /path/to/libmoekit.so\n", argv[0]);
    return 2;
  }
  library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "run_dlopen: dlopen(%s): %s\n", argv[1], dlerror());
    return EXIT_FAILURE;
  }

  /* 1. Every public function is exported. */
  for (i = 0; i < sizeof public_functions / sizeof public_functions[0]; ++i) {
    if (dlsym(library, public_functions[i]) == NULL) {
      fprintf(stderr, "run_dlopen: FAILED: %s is not exported by %s\n", public_functions[i], argv[1]);
      ++missing;
    }
  }
  printf("resolved %zu of %zu public functions\n", sizeof public_functions / sizeof public_functions[0] - missing,
         sizeof public_functions / sizeof public_functions[0]);
  if (missing > 0) return EXIT_FAILURE;

  LOAD(library, api.get_version, moekit_get_version);
  LOAD(library, api.status_string, moekit_status_string);
  LOAD(library, api.get_last_error, moekit_get_last_error);
  LOAD(library, api.tensor_make, moekit_tensor_make);
  LOAD(library, api.handle_desc_init, moekit_handle_desc_init);
  LOAD(library, api.handle_create, moekit_handle_create);
  LOAD(library, api.handle_destroy, moekit_handle_destroy);
  LOAD(library, api.plan_destroy, moekit_plan_destroy);
  LOAD(library, api.plan_workspace_size, moekit_plan_workspace_size);
  LOAD(library, api.router_desc_init, moekit_router_desc_init);
  LOAD(library, api.router_plan_create, moekit_router_plan_create);
  LOAD(library, api.router_fwd_args_init, moekit_router_fwd_args_init);
  LOAD(library, api.router_forward, moekit_router_forward);
  LOAD(library, api.dispatch_desc_init, moekit_dispatch_desc_init);
  LOAD(library, api.dispatch_plan_create, moekit_dispatch_plan_create);
  LOAD(library, api.dispatch_args_init, moekit_dispatch_args_init);
  LOAD(library, api.dispatch, moekit_dispatch);
  LOAD(library, api.subsample_rows, moekit_subsample_rows);

  /* 2. The library is the version this program was compiled against. */
  version = api.get_version();
  printf("moekit_get_version() = %d, MOEKIT_VERSION_NUMBER = %d\n", (int)version, (int)MOEKIT_VERSION_NUMBER);
  expect(version == MOEKIT_VERSION_NUMBER, "moekit_get_version() == MOEKIT_VERSION_NUMBER");

  /* 3. Real work on a reference (CPU) handle. */
  CHECK(api.handle_desc_init(&handle_desc));
  handle_desc.backend = MOEKIT_BACKEND_REFERENCE;
  handle_desc.num_threads = 1;
  CHECK(api.handle_create(&handle_desc, &handle));

  run_router(handle, indices);
  {
    /* All four experts: e0 <- p5; e1 <- p1, p2; e2 <- p3, p4; e3 <- p0. */
    static const int32_t offsets[] = {0, 1, 3, 5, 6};
    static const int32_t gather[PAIRS] = {2, 0, 1, 1, 2, 0};
    static const int32_t pair[PAIRS] = {5, 1, 2, 3, 4, 0};
    static const int32_t grouped_pos[PAIRS] = {5, 1, 2, 3, 4, 0};
    run_dispatch(handle, indices, 4, 0, offsets, gather, pair, grouped_pos);
  }
  {
    /* Expert parallelism, this rank holds experts 2 and 3: local 0 (id 2) <- p3, p4; local 1 (id 3) <- p0.
     * Pairs 1, 2, 5 go elsewhere (grouped_pos -1); rows 3..5 of gather_idx and pair_idx are never written. */
    static const int32_t offsets[] = {0, 2, 3};
    static const int32_t gather[PAIRS] = {1, 2, 0, POISON, POISON, POISON};
    static const int32_t pair[PAIRS] = {3, 4, 0, POISON, POISON, POISON};
    static const int32_t grouped_pos[PAIRS] = {2, -1, -1, 0, 1, -1};
    run_dispatch(handle, indices, 2, 2, offsets, gather, pair, grouped_pos);
  }

  /* 4. The host helper of the sparse FFN follows its published steps. */
  run_subsample_rows();

  /* 5. Errors come back as a status and a message. */
  run_invalid_request(handle);

  CHECK(api.handle_destroy(handle));
  dlclose(library);
  if (failures > 0) {
    fprintf(stderr, "run_dlopen: %d check(s) failed\n", failures);
    return EXIT_FAILURE;
  }
  printf("ok\n");
  return EXIT_SUCCESS;
}
