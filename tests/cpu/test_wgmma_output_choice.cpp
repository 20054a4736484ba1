// Which products the wgmma kernel's epilogue writes by TMA stores (output_by_tma, cuda/gemm/grouped_gemm_wgmma.h), a
// pure host function checked without a GPU: STORE, GATED's h and a, varlen K's stores and fp32 reduce-adds take
// TMA; every case the TMA epilogues cannot serve (a bias, beta != 0 outside varlen K's fp32 reduce-adds, GATED with
// the INTERLEAVED layout, alpha != 1, a plain activation or an activation width that is not a multiple of 64,
// DGATED, an empty problem) goes to the threads' epilogue. And which varlen-K problems run as their transpose
// (transposed_weight_gradient, transpose_weight_gradient), and which of them take paired CTAs
// (pairs_weight_gradient). Built with the CUDA backend only.
#include <catch2/catch.hpp>

#if MOEKIT_WITH_CUDA

#include <cstdint>

#include "cuda/gemm/grouped_gemm_wgmma.h"
#include "moekit/moekit.h"

using moekit::cuda::gemm::GroupedGemmProblem;
using moekit::cuda::gemm::output_by_tma;
using moekit::cuda::gemm::pairs_weight_gradient;
using moekit::cuda::gemm::transpose_weight_gradient;
using moekit::cuda::gemm::transposed_weight_gradient;

namespace {

// A bf16 problem of `mode` with epilogue `epilogue` over 8 groups and 4096 rows, alpha 1, beta 0.
GroupedGemmProblem problem(int32_t mode, int32_t epilogue) {
  GroupedGemmProblem p{};
  p.mode = mode;
  p.epilogue = epilogue;
  p.dtype = MOEKIT_DTYPE_BF16;
  p.groups = 8;
  p.rows = 4096;
  p.alpha = 1.0f;
  return p;
}

// The layer's up-projection: a gathered varlen-M GATED SwiGLU product in the CONCAT layout, I = 1024.
GroupedGemmProblem up_projection() {
  GroupedGemmProblem p = problem(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_GATED);
  p.b_layout = MOEKIT_GEMM_B_NK;
  p.gather = MOEKIT_GEMM_GATHER_A;
  p.act_width = 1024;
  p.n = 2 * p.act_width;
  p.k = 512;
  p.activation = MOEKIT_ACT_SWIGLU;
  p.glu_layout = MOEKIT_GLU_CONCAT;
  return p;
}

}  // namespace

TEST_CASE("output_by_tma: GATED by TMA only for a gated activation, CONCAT, alpha 1, no bias, I % 64 == 0", "[gemm]") {
  CHECK(output_by_tma(up_projection()));
  for (int32_t kind : {MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI}) {
    GroupedGemmProblem p = up_projection();
    p.activation = kind;
    CHECK(output_by_tma(p));
  }
  GroupedGemmProblem interleaved = up_projection();
  interleaved.glu_layout = MOEKIT_GLU_INTERLEAVED;
  CHECK_FALSE(output_by_tma(interleaved));
  GroupedGemmProblem scaled = up_projection();
  scaled.alpha = 0.5f;
  CHECK_FALSE(output_by_tma(scaled));
  GroupedGemmProblem biased = up_projection();
  const uint16_t bias[1] = {0};
  biased.bias = bias;
  CHECK_FALSE(output_by_tma(biased));
  GroupedGemmProblem narrow = up_projection();
  narrow.act_width = 96;  // a multiple of 32 (n % 64 == 0) but not of 64: a box would reach into the up columns
  narrow.n = 2 * narrow.act_width;
  CHECK_FALSE(output_by_tma(narrow));
  GroupedGemmProblem plain = up_projection();
  plain.activation = MOEKIT_ACT_GELU;
  plain.n = plain.act_width;
  CHECK_FALSE(output_by_tma(plain));
  GroupedGemmProblem empty = up_projection();
  empty.rows = 0;
  CHECK_FALSE(output_by_tma(empty));
}

TEST_CASE("output_by_tma: STORE and varlen K by TMA, BIAS, beta and DGATED by the threads", "[gemm]") {
  GroupedGemmProblem store = up_projection();
  store.epilogue = MOEKIT_EPILOGUE_STORE;
  CHECK(output_by_tma(store));
  GroupedGemmProblem accumulate = store;
  accumulate.beta = 1.0f;
  CHECK_FALSE(output_by_tma(accumulate));
  GroupedGemmProblem fp32_out = store;
  fp32_out.c_fp32 = true;
  CHECK_FALSE(output_by_tma(fp32_out));
  GroupedGemmProblem bias = store;
  bias.epilogue = MOEKIT_EPILOGUE_BIAS;
  CHECK_FALSE(output_by_tma(bias));
  GroupedGemmProblem dgated = up_projection();
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  dgated.n = dgated.act_width;
  CHECK_FALSE(output_by_tma(dgated));

  GroupedGemmProblem k = problem(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE);
  k.m = 512;
  k.n = 1024;
  k.c_group_stride = k.m * k.n;
  CHECK(output_by_tma(k));  // stores into C of the operand dtype
  GroupedGemmProblem added = k;
  added.c_fp32 = true;
  added.beta = 1.0f;
  CHECK(output_by_tma(added));  // reduce-adds into an fp32 C
  GroupedGemmProblem half_beta = added;
  half_beta.beta = 0.5f;
  CHECK_FALSE(output_by_tma(half_beta));
  GroupedGemmProblem odd_stride = k;
  odd_stride.c_group_stride = k.m * k.n + 4;  // not 16 bytes: no TMA map
  CHECK_FALSE(output_by_tma(odd_stride));
}

TEST_CASE("transposed_weight_gradient: varlen K with B gathered and a bf16 / fp16 C stored by TMA", "[gemm]") {
  // dW1 = dh^T x, x gathered: C [E, 2I, H] with m = 2I = 512, n = H = 1024.
  GroupedGemmProblem dw1 = problem(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE);
  dw1.gather = MOEKIT_GEMM_GATHER_B;
  dw1.m = 512;
  dw1.n = 1024;
  dw1.c_group_stride = dw1.m * dw1.n;
  const uint16_t dh[1] = {0}, x[1] = {0};
  dw1.a = dh;
  dw1.lda = 512;
  dw1.b = x;
  dw1.ldb = 1024;
  dw1.n_tiles = 4;
  CHECK(transposed_weight_gradient(dw1));
  GroupedGemmProblem fp16 = dw1;
  fp16.dtype = MOEKIT_DTYPE_FP16;
  CHECK(transposed_weight_gradient(fp16));
  GroupedGemmProblem fp32_out = dw1;  // fp32 reduce-adds stay in C's own layout
  fp32_out.c_fp32 = true;
  fp32_out.beta = 1.0f;
  CHECK(output_by_tma(fp32_out));
  CHECK_FALSE(transposed_weight_gradient(fp32_out));
  GroupedGemmProblem a_gathered = dw1;  // dW2 = a^T dout with a gathered: A is already the gathered operand
  a_gathered.gather = MOEKIT_GEMM_GATHER_A;
  CHECK_FALSE(transposed_weight_gradient(a_gathered));
  GroupedGemmProblem contiguous = dw1;
  contiguous.gather = MOEKIT_GEMM_GATHER_NONE;
  CHECK_FALSE(transposed_weight_gradient(contiguous));
  GroupedGemmProblem odd_stride = dw1;  // no TMA map for C: the threads' epilogue, not transposed
  odd_stride.c_group_stride += 4;
  CHECK_FALSE(transposed_weight_gradient(odd_stride));
  GroupedGemmProblem up = up_projection();
  CHECK_FALSE(transposed_weight_gradient(up));

  const GroupedGemmProblem t = transpose_weight_gradient(dw1, 256);
  CHECK(t.a == static_cast<const void*>(x));
  CHECK(t.lda == 1024);
  CHECK(t.b == static_cast<const void*>(dh));
  CHECK(t.ldb == 512);
  CHECK(t.m == 1024);
  CHECK(t.n == 512);
  CHECK(t.gather == MOEKIT_GEMM_GATHER_A);
  CHECK(t.n_tiles == 2);
  CHECK(t.c_transposed);
  CHECK(t.c == dw1.c);
  CHECK(t.c_group_stride == dw1.c_group_stride);
  CHECK_FALSE(dw1.c_transposed);
}

TEST_CASE("pairs_weight_gradient: B by TMA and an even count of m tiles", "[gemm]") {
  // dW1 as the kernel runs it (transposed): x^T dh, x gathered as A, C^T's m = H = 1024: 8 m tiles of 128.
  GroupedGemmProblem dw1 = problem(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE);
  dw1.gather = MOEKIT_GEMM_GATHER_A;
  dw1.m = 1024;
  dw1.n = 512;
  CHECK(pairs_weight_gradient(dw1, 128));
  GroupedGemmProblem contiguous = dw1;
  contiguous.gather = MOEKIT_GEMM_GATHER_NONE;
  CHECK(pairs_weight_gradient(contiguous, 128));
  GroupedGemmProblem partial = dw1;  // 7 full m tiles and a partial one: 8, even
  partial.m = 1000;
  CHECK(pairs_weight_gradient(partial, 128));
  GroupedGemmProblem odd = dw1;  // 9 m tiles: the last would have no partner
  odd.m = 1032;
  CHECK_FALSE(pairs_weight_gradient(odd, 128));
  GroupedGemmProblem b_gathered = dw1;  // the fp32 beta = 1 dW1 keeps B gathered: its TMA operand is A, not shared
  b_gathered.gather = MOEKIT_GEMM_GATHER_B;
  CHECK_FALSE(pairs_weight_gradient(b_gathered, 128));
  CHECK_FALSE(pairs_weight_gradient(up_projection(), 128));  // varlen M pairs through its tile list instead
}

#endif
