/*
 * consumer.c — the smallest program built against an INSTALLED moekit: one MoE layer forward (fp32, SwiGLU, top-2
 * of 4 experts) on the reference backend, with nothing but <moekit/moekit.h> and the library.
 *
 * tests/install/ builds it four ways from the install tree (find_package(moekit) and pkg-config, each linked
 * shared and static) and runs it: exit 0 when the loaded library's version is the header's and the output is
 * finite and non-zero, 1 with the library's message otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <moekit/moekit.h>

enum { T = 16, H = 32, I = 16, E = 4, K = 2 };

static void check(moekit_status_t status, const char* call) {
  char message[512];
  if (status == MOEKIT_SUCCESS) return;
  moekit_get_last_error(message, sizeof message);
  fprintf(stderr, "consumer: %s failed: %s: %s\n", call, moekit_status_string(status), message);
  exit(EXIT_FAILURE);
}
#define CHECK(call) check((call), #call)

/* Values in [-scale, scale) from a fixed linear congruential stream: enough for a smoke test. */
static void fill(float* values, size_t count, float scale) {
  static uint32_t state = 12345u;
  size_t i;
  for (i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    values[i] = scale * ((float)(state >> 8) / 8388608.0f - 1.0f);
  }
}

static moekit_tensor_t view(float* data, int32_t rank, int64_t d0, int64_t d1, int64_t d2) {
  const int64_t shape[3] = {d0, d1, d2};
  const moekit_device_t cpu = {MOEKIT_DEVICE_CPU, 0};
  return moekit_tensor_make(data, MOEKIT_DTYPE_FP32, rank, shape, cpu);
}

int main(void) {
  static float x[T * H], w_router[E * H], w1[E * 2 * I * H], w2[E * H * I], out[T * H];
  moekit_handle_desc_t handle_desc;
  moekit_handle_t handle;
  moekit_moe_desc_t desc;
  moekit_plan_t plan;
  moekit_moe_fwd_args_t fwd;
  size_t workspace_bytes = 0, i;
  void* workspace;
  double sum_of_squares = 0.0;

  if (moekit_get_version() != MOEKIT_VERSION_NUMBER) {
    fprintf(stderr, "consumer: library version %d, header version %d\n", (int)moekit_get_version(),
            MOEKIT_VERSION_NUMBER);
    return EXIT_FAILURE;
  }

  CHECK(moekit_handle_desc_init(&handle_desc));
  handle_desc.backend = MOEKIT_BACKEND_REFERENCE;
  CHECK(moekit_handle_create(&handle_desc, &handle));

  CHECK(moekit_moe_desc_init(&desc));
  desc.max_tokens = T;
  desc.hidden = H;
  desc.intermediate = I;
  desc.router_experts = E;
  desc.experts = E;
  desc.top_k = K;
  desc.dtype = MOEKIT_DTYPE_FP32;
  desc.inference = 1; /* forward only: no saved buffer */
  CHECK(moekit_moe_plan_create(handle, &desc, &plan));
  CHECK(moekit_plan_workspace_size(plan, &workspace_bytes));
  workspace = malloc(workspace_bytes > 0 ? workspace_bytes : 1);
  if (workspace == NULL) return EXIT_FAILURE;

  fill(x, T * H, 1.0f);
  fill(w_router, E * H, 0.2f);
  fill(w1, E * 2 * I * H, 0.2f);
  fill(w2, E * H * I, 0.2f);

  CHECK(moekit_moe_fwd_args_init(&fwd));
  fwd.x = view(x, 2, T, H, 0);
  fwd.w_router = view(w_router, 2, E, H, 0);
  fwd.w1 = view(w1, 3, E, 2 * I, H);
  fwd.w2 = view(w2, 3, E, H, I);
  fwd.out = view(out, 2, T, H, 0);
  CHECK(moekit_moe_forward(plan, &fwd, NULL, 0, workspace, workspace_bytes, NULL));

  for (i = 0; i < T * H; ++i) sum_of_squares += (double)out[i] * out[i];
  printf("consumer: moekit %d, MoE layer forward on the reference backend, ||out||^2 = %.6f\n",
         (int)moekit_get_version(), sum_of_squares);

  free(workspace);
  CHECK(moekit_plan_destroy(plan));
  CHECK(moekit_handle_destroy(handle));
  /* No libm, so that the program needs no link flag of its own: NaN fails both comparisons. */
  return (sum_of_squares > 0.0 && sum_of_squares < 1e30) ? EXIT_SUCCESS : EXIT_FAILURE;
}
