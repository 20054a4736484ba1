// The MoE layer's token-side steps for the GPU oracle (tests/gpu/test_moe_layer_oracle.cpp), as plain kernels that
// share nothing with cuda/: the combine of docs/math.md section 3, step 4 / section 4, step 7 with section 8's rounding
// points, the rounded add of the router's dx part (docs/math.md section 4, step 8), and grouped rows scaled by their
// pair's score. The per-expert products come from gemm_oracle.h's cublaslt_product.
#pragma once

#include <cstdint>

#include "moekit/moekit.h"

namespace moekit_test {

// out[t] = round(sum over k ascending of w[t K + k] * round(rows[grouped_pos[t K + k]])) in fp32, rows [P, width]
// of `rows_dtype` (fp32 products or the storage dtype), out [T, width] of `dtype`; weights NULL means 1, a negative
// grouped_pos a dropped pair.
void device_combine_pairs(const void* rows, moekit_dtype_t rows_dtype, const int32_t* grouped_pos, const float* weights,
                          int64_t tokens, int64_t top_k, int64_t width, moekit_dtype_t dtype, void* out);

// out[i] = round(out[i] + addend[i]) for `count` values of `dtype`, addend fp32.
void device_add_rounded(void* out, moekit_dtype_t dtype, const float* addend, int64_t count);

// dst[i] = round(scale[pair_idx[i]] * src[gather_idx[i]]) for rows [rows, width] of `dtype`.
void device_scaled_gather_rows(const void* src, int64_t width, const int32_t* gather_idx, const float* scale,
                               const int32_t* pair_idx, int64_t rows, moekit_dtype_t dtype, void* dst);

}  // namespace moekit_test
