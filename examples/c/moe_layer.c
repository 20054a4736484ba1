/*
 * moe_layer.c — one MoE layer, forward and backward, through moekit's C API (C99, static link).
 *
 * The layer: bf16, T = 256 tokens, H = 256, I = 128 (SwiGLU: W1 holds 2I rows per expert), E = 8 experts,
 * top-2 routing with the softmax over the two selected logits. Weight gradients are requested in fp32.
 *
 *   moe_layer [--backend cuda|reference]
 *
 * Without --backend the program tries a CUDA handle and falls back to the reference (CPU) backend when the
 * CUDA backend cannot serve the layer (no GPU, a build without CUDA, or an operation not implemented yet);
 * it prints which backend ran. It prints the output and gradient norms and the time of each call, checks that
 * they are finite and non-zero, that the per-expert counts add up to T*K and that a second forward gives the
 * same bits. Exit status 0 on success, 1 on any failure (with the library's message).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, posix_memalign */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moekit/moekit.h>

#define EXAMPLE_NAME "moe_layer"
#include "example_util.h"

#ifdef MOE_LAYER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

enum { TOKENS = 256, HIDDEN = 256, INTERMEDIATE = 128, EXPERTS = 8, TOP_K = 2 };

/* ---------------------------------------------------------------------------------------------- */
/* Error checking                                                                                 */
/* ---------------------------------------------------------------------------------------------- */

static void fail(const char* what) {
  fprintf(stderr, "moe_layer: %s\n", what);
  exit(EXIT_FAILURE);
}

#ifdef MOE_LAYER_WITH_CUDA
static void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  fprintf(stderr, "moe_layer: %s failed: %s\n", call, cudaGetErrorString(status));
  exit(EXIT_FAILURE);
}
#define CHECK_CUDA(call) check_cuda((call), #call)
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Buffers: host memory, mirrored on the GPU when the CUDA backend runs                           */
/* ---------------------------------------------------------------------------------------------- */

typedef struct buffer {
  void* host;
  void* device; /* == host for the reference backend */
  size_t bytes;
} buffer_t;

static int use_cuda = 0;

static buffer_t buffer_alloc(size_t bytes) {
  buffer_t buf;
  buf.bytes = bytes;
  buf.host = NULL;
  /* 256 bytes: what a CUDA handle asks of workspace and saved buffers; harmless on the host. */
  if (posix_memalign(&buf.host, 256, bytes > 0 ? bytes : 1) != 0) fail("out of host memory");
  memset(buf.host, 0, bytes);
  buf.device = buf.host;
#ifdef MOE_LAYER_WITH_CUDA
  if (use_cuda) CHECK_CUDA(cudaMalloc(&buf.device, bytes > 0 ? bytes : 1));
#endif
  return buf;
}

static void buffer_free(buffer_t* buf) {
#ifdef MOE_LAYER_WITH_CUDA
  if (use_cuda) CHECK_CUDA(cudaFree(buf->device));
#endif
  free(buf->host);
  buf->host = buf->device = NULL;
}

static void buffer_upload(const buffer_t* buf) {
#ifdef MOE_LAYER_WITH_CUDA
  if (use_cuda) CHECK_CUDA(cudaMemcpy(buf->device, buf->host, buf->bytes, cudaMemcpyHostToDevice));
#else
  (void)buf;
#endif
}

static void buffer_download(const buffer_t* buf) {
#ifdef MOE_LAYER_WITH_CUDA
  if (use_cuda) CHECK_CUDA(cudaMemcpy(buf->host, buf->device, buf->bytes, cudaMemcpyDeviceToHost));
#else
  (void)buf;
#endif
}

/* A bf16 buffer of `count` values uniform in [-scale, scale), already on the device. */
static buffer_t random_bf16(size_t count, float scale) {
  buffer_t buf = buffer_alloc(count * sizeof(uint16_t));
  uint16_t* values = (uint16_t*)buf.host;
  size_t i;
  for (i = 0; i < count; ++i) values[i] = float_to_bf16(rng_uniform(scale));
  buffer_upload(&buf);
  return buf;
}

static moekit_tensor_t view(const buffer_t* buf, moekit_dtype_t dtype, int32_t rank, int64_t d0, int64_t d1,
                            int64_t d2) {
  const int64_t shape[3] = {d0, d1, d2};
  moekit_device_t device;
  device.type = use_cuda ? MOEKIT_DEVICE_CUDA : MOEKIT_DEVICE_CPU;
  device.index = 0;
  return moekit_tensor_make(buf->device, dtype, rank, shape, device);
}

/* ---------------------------------------------------------------------------------------------- */
/* Reporting                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run functions only enqueue work on a CUDA handle: wait for it before reading the clock. */
static void wait_for_device(void) {
#ifdef MOE_LAYER_WITH_CUDA
  if (use_cuda) CHECK_CUDA(cudaDeviceSynchronize());
#endif
}

static double norm_bf16(const buffer_t* buf) {
  const uint16_t* values = (const uint16_t*)buf->host;
  const size_t count = buf->bytes / sizeof(uint16_t);
  double sum = 0.0;
  size_t i;
  for (i = 0; i < count; ++i) sum += (double)bf16_to_float(values[i]) * bf16_to_float(values[i]);
  return sqrt(sum);
}

static double norm_fp32(const buffer_t* buf) {
  const float* values = (const float*)buf->host;
  const size_t count = buf->bytes / sizeof(float);
  double sum = 0.0;
  size_t i;
  for (i = 0; i < count; ++i) sum += (double)values[i] * values[i];
  return sqrt(sum);
}

/* A norm that is NaN, infinite or zero means something went wrong. */
static void report_norm(const char* name, double norm) {
  printf("  ||%-9s|| = %.6f\n", name, norm);
  if (!(norm > 0.0) || !isfinite(norm)) {
    fprintf(stderr, "moe_layer: ||%s|| = %g is not a finite positive number\n", name, norm);
    exit(EXIT_FAILURE);
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* The layer                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

/* On the CUDA backend, NOT_SUPPORTED (no usable GPU, a build without CUDA, an operation not written yet) goes back
 * to main, which falls back to the reference backend; every other failure ends the program. */
static int not_supported_on_cuda(moekit_status_t status, const char* call) {
  if (status == MOEKIT_STATUS_NOT_SUPPORTED && use_cuda) return 1;
  check(status, call);
  return 0;
}
#define CHECK_OR_FALL_BACK(call, on_fallback)                                           \
  do {                                                                                  \
    status = (call);                                                                    \
    if (not_supported_on_cuda(status, #call)) goto on_fallback;                         \
  } while (0)

/* A handle for `backend` and a plan for the layer: every decision the calls need, from host values only. */
static moekit_status_t create_layer(moekit_backend_t backend, moekit_handle_t* handle, moekit_plan_t* plan) {
  moekit_handle_desc_t handle_desc;
  moekit_moe_desc_t desc;
  moekit_status_t status;

  CHECK(moekit_handle_desc_init(&handle_desc));
  handle_desc.backend = backend;
  CHECK_OR_FALL_BACK(moekit_handle_create(&handle_desc, handle), no_handle);

  CHECK(moekit_moe_desc_init(&desc));
  desc.max_tokens = TOKENS;
  desc.hidden = HIDDEN;
  desc.intermediate = INTERMEDIATE;
  desc.router_experts = EXPERTS;
  desc.experts = EXPERTS;
  desc.top_k = TOP_K;
  desc.activation = MOEKIT_ACT_SWIGLU;
  desc.router = MOEKIT_ROUTER_SOFTMAX_TOPK;
  desc.dtype = MOEKIT_DTYPE_BF16;
  desc.weight_grad_dtype = MOEKIT_DTYPE_FP32;
  CHECK_OR_FALL_BACK(moekit_moe_plan_create(*handle, &desc, plan), no_plan);
  return MOEKIT_SUCCESS;

no_plan:
  CHECK(moekit_handle_destroy(*handle));
no_handle:
  return status;
}

/* Forward, backward, and the forward again; then the report. Returns MOEKIT_SUCCESS, or NOT_SUPPORTED from the
 * CUDA backend. */
static moekit_status_t run_layer(moekit_plan_t plan) {
  const int64_t T = TOKENS, H = HIDDEN, I = INTERMEDIATE, E = EXPERTS, K = TOP_K;
  moekit_status_t status;
  size_t workspace_bytes = 0, saved_bytes = 0;
  buffer_t x, w_router, w1, w2, dout, out, out_again, counts, dx, dw_router, dw1, dw2, workspace, saved;
  moekit_moe_fwd_args_t fwd;
  moekit_moe_bwd_args_t bwd;
  double start, fwd_ms, fwd_again_ms, bwd_ms;
  int64_t pairs_counted = 0;
  int e;

  /* Sizes come from the plan; the caller allocates. */
  CHECK(moekit_plan_workspace_size(plan, &workspace_bytes));
  CHECK(moekit_plan_saved_size(plan, &saved_bytes));

  /* Inputs, scaled so every output is O(1): x ~ U(-1, 1), each weight ~ U(-1, 1) / sqrt(fan-in). The same seed
   * gives the same inputs on every backend. */
  rng_state = 42;
  x = random_bf16((size_t)(T * H), 1.0f);
  w_router = random_bf16((size_t)(E * H), 1.0f / sqrtf((float)H));
  w1 = random_bf16((size_t)(E * 2 * I * H), 1.0f / sqrtf((float)H));
  w2 = random_bf16((size_t)(E * H * I), 1.0f / sqrtf((float)I));
  dout = random_bf16((size_t)(T * H), 1.0f);
  out = buffer_alloc((size_t)(T * H) * sizeof(uint16_t));
  out_again = buffer_alloc((size_t)(T * H) * sizeof(uint16_t));
  counts = buffer_alloc((size_t)E * sizeof(int32_t));
  dx = buffer_alloc((size_t)(T * H) * sizeof(uint16_t));
  dw_router = buffer_alloc((size_t)(E * H) * sizeof(float));
  dw1 = buffer_alloc((size_t)(E * 2 * I * H) * sizeof(float));
  dw2 = buffer_alloc((size_t)(E * H * I) * sizeof(float));
  workspace = buffer_alloc(workspace_bytes);
  saved = buffer_alloc(saved_bytes);

  /* Forward: out = sum over each token's two experts of score * expert(x); fills `saved` for the backward. */
  CHECK(moekit_moe_fwd_args_init(&fwd));
  fwd.x = view(&x, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  fwd.w_router = view(&w_router, MOEKIT_DTYPE_BF16, 2, E, H, 0);
  fwd.w1 = view(&w1, MOEKIT_DTYPE_BF16, 3, E, 2 * I, H);
  fwd.w2 = view(&w2, MOEKIT_DTYPE_BF16, 3, E, H, I);
  fwd.out = view(&out, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  fwd.counts = view(&counts, MOEKIT_DTYPE_INT32, 1, E, 0, 0);
  start = now_seconds();
  CHECK_OR_FALL_BACK(
      moekit_moe_forward(plan, &fwd, saved.device, saved.bytes, workspace.device, workspace.bytes, NULL), release);
  wait_for_device();
  fwd_ms = 1e3 * (now_seconds() - start);

  /* Backward: dx and the weight gradients, overwritten (every beta is 0 by default). */
  CHECK(moekit_moe_bwd_args_init(&bwd));
  bwd.x = fwd.x;
  bwd.dout = view(&dout, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  bwd.w_router = fwd.w_router;
  bwd.w1 = fwd.w1;
  bwd.w2 = fwd.w2;
  bwd.dx = view(&dx, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  bwd.dw_router = view(&dw_router, MOEKIT_DTYPE_FP32, 2, E, H, 0);
  bwd.dw1 = view(&dw1, MOEKIT_DTYPE_FP32, 3, E, 2 * I, H);
  bwd.dw2 = view(&dw2, MOEKIT_DTYPE_FP32, 3, E, H, I);
  start = now_seconds();
  CHECK_OR_FALL_BACK(
      moekit_moe_backward(plan, &bwd, saved.device, saved.bytes, workspace.device, workspace.bytes, NULL), release);
  wait_for_device();
  bwd_ms = 1e3 * (now_seconds() - start);

  /* The same forward again, into another buffer: moekit promises the same bits. */
  fwd.out = view(&out_again, MOEKIT_DTYPE_BF16, 2, T, H, 0);
  start = now_seconds();
  CHECK(moekit_moe_forward(plan, &fwd, saved.device, saved.bytes, workspace.device, workspace.bytes, NULL));
  wait_for_device();
  fwd_again_ms = 1e3 * (now_seconds() - start);

  buffer_download(&out);
  buffer_download(&out_again);
  buffer_download(&counts);
  buffer_download(&dx);
  buffer_download(&dw_router);
  buffer_download(&dw1);
  buffer_download(&dw2);

  printf("backend: %s\n", use_cuda ? "cuda" : "reference (CPU)");
  printf("layer: bf16, T=%lld H=%lld I=%lld E=%lld K=%lld, SwiGLU, softmax over the top-k, fp32 weight gradients\n",
         (long long)T, (long long)H, (long long)I, (long long)E, (long long)K);
  printf("workspace: %zu bytes, saved activations: %zu bytes\n", workspace_bytes, saved_bytes);
  printf("time: forward %.3f ms, backward %.3f ms, forward again %.3f ms\n", fwd_ms, bwd_ms, fwd_again_ms);
  printf("pairs per expert:");
  for (e = 0; e < EXPERTS; ++e) {
    const int32_t count = ((const int32_t*)counts.host)[e];
    printf(" %d", (int)count);
    pairs_counted += count;
  }
  printf("\n");
  if (pairs_counted != T * K) fail("the per-expert counts do not add up to T*K");

  report_norm("out", norm_bf16(&out));
  report_norm("dx", norm_bf16(&dx));
  report_norm("dw_router", norm_fp32(&dw_router));
  report_norm("dw1", norm_fp32(&dw1));
  report_norm("dw2", norm_fp32(&dw2));
  if (memcmp(out.host, out_again.host, out.bytes) != 0) fail("a second forward gave different bits");
  printf("second forward: bitwise identical\n");

release:
  buffer_free(&x);
  buffer_free(&w_router);
  buffer_free(&w1);
  buffer_free(&w2);
  buffer_free(&dout);
  buffer_free(&out);
  buffer_free(&out_again);
  buffer_free(&counts);
  buffer_free(&dx);
  buffer_free(&dw_router);
  buffer_free(&dw1);
  buffer_free(&dw2);
  buffer_free(&workspace);
  buffer_free(&saved);
  return status;
}

/* Creates, runs and destroys the layer on `backend`; NOT_SUPPORTED from the CUDA backend is returned. */
static moekit_status_t run_on(moekit_backend_t backend) {
  moekit_handle_t handle = NULL;
  moekit_plan_t plan = NULL;
  moekit_status_t status;

  use_cuda = backend == MOEKIT_BACKEND_CUDA;
  status = create_layer(backend, &handle, &plan);
  if (status != MOEKIT_SUCCESS) return status;
  status = run_layer(plan);
  CHECK(moekit_plan_destroy(plan));
  CHECK(moekit_handle_destroy(handle));
  return status;
}

int main(int argc, char** argv) {
  const int32_t version = moekit_get_version();
  int try_cuda = 1, cuda_requested = 0;
  char message[1024];

  if (argc == 3 && strcmp(argv[1], "--backend") == 0 && strcmp(argv[2], "cuda") == 0) {
    cuda_requested = 1;
  } else if (argc == 3 && strcmp(argv[1], "--backend") == 0 && strcmp(argv[2], "reference") == 0) {
    try_cuda = 0;
  } else if (argc != 1) {
    fprintf(stderr, "usage: %s [--backend cuda|reference]\n", argv[0]);
    return 2;
  }
  printf("moekit %d.%d.%d\n", (int)(version / 10000), (int)(version / 100 % 100), (int)(version % 100));
#ifndef MOE_LAYER_WITH_CUDA
  /* Built without the CUDA runtime, this program has no way to fill device memory. */
  if (cuda_requested) {
    fprintf(stderr, "moe_layer: built without CUDA, so --backend cuda is not available\n");
    return EXIT_FAILURE;
  }
  if (try_cuda) printf("note: built without CUDA; using the reference backend\n");
  try_cuda = 0;
#endif

  /* The CUDA backend when it can serve the layer, else the reference backend. */
  if (try_cuda) {
    if (run_on(MOEKIT_BACKEND_CUDA) == MOEKIT_SUCCESS) {
      printf("ok\n");
      return EXIT_SUCCESS;
    }
    moekit_get_last_error(message, sizeof message);
    if (cuda_requested) {
      fprintf(stderr, "moe_layer: the CUDA backend cannot run this layer: %s\n", message);
      return EXIT_FAILURE;
    }
    printf("note: the CUDA backend cannot run this layer here (%s); using the reference backend\n", message);
  }
  if (run_on(MOEKIT_BACKEND_REFERENCE) != MOEKIT_SUCCESS) fail("the reference backend failed");
  printf("ok\n");
  return EXIT_SUCCESS;
}
