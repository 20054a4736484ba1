// A GPU oracle for grouped GEMM shapes too large for the CPU reference (tests/gpu/test_gemm.cpp): random fills
// and row gathers on the device, one cuBLASLt product per group (fp32 out), the gated / dgated epilogue math of
// docs/math.md sections 3-4 by simple one-row-per-warp kernels, and the per-row sums section 9's metrics are made of.
// Independent of cuda/gemm/ except for the fp32 activation formulas (cuda/common/activation.cuh), which the
// small-shape tests check against the float64 reference.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moekit/moekit.h"

namespace moekit_test {

// data[i] = uniform in [-scale, scale] from a hash of (seed, i), rounded to dtype (bf16, fp16 or fp32).
void device_fill_uniform(void* data, moekit_dtype_t dtype, int64_t count, double scale, uint64_t seed);

// dst[r] = src[idx[r]] for r < rows, rows of `width` 2-byte values, both dense.
void device_gather_rows(const void* src, int64_t width, const int32_t* idx, int64_t rows, void* dst);

// Row-major fp32 C [m, n] (ldc) = op(A) op(B) with bf16 / fp16 A and B: A is [m, k] (lda) or, a_trans, [k, m];
// B is [k, n] (ldb) or, b_trans, [n, k]. Nothing is done when m, n or k is 0 (then C is zeroed if k is 0).
void cublaslt_product(cublasLtHandle_t handle, moekit_dtype_t dtype, int64_t m, int64_t n, int64_t k, const void* a,
                      int64_t lda, bool a_trans, const void* b, int64_t ldb, bool b_trans, float* c, int64_t ldc);

// GATED (docs/math.md section 3, steps 1-2) from the fp32 product [rows, h width]: h = round(product),
// a = round(act(h)).
void device_gated_reference(const float* product, int64_t rows, int64_t act_width, int32_t activation,
                            int32_t glu_layout, float limit, moekit_dtype_t dtype, void* h, void* a);

// DGATED (docs/math.md section 4, step 1) from the fp32 product dA [rows, I]: s = row_scale[pair_idx[r]];
// ds[pair_idx[r]] = dA . a, dh = round(dact(h, s dA)), a' = round(s a).
void device_dgated_reference(const float* product, const void* h, const float* row_scale, const int32_t* pair_idx,
                             int64_t rows, int64_t act_width, int32_t activation, int32_t glu_layout, float limit,
                             moekit_dtype_t dtype, void* dh, void* a_scaled, float* ds);

// For every row r of two dense [rows, width] tensors: err2[r] = sum (out - ref)^2, ref2[r] = sum ref^2 (double),
// nan[r] = 1 when out has a NaN in that row.
void device_row_errors(const void* out, moekit_dtype_t out_dtype, const void* ref, moekit_dtype_t ref_dtype,
                       int64_t rows, int64_t width, double* err2, double* ref2, int32_t* nan);

}  // namespace moekit_test
