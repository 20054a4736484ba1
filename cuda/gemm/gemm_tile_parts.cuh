// Device pieces shared by the grouped GEMM's tile kernels (mma.sync: grouped_gemm_kernel.cuh, wgmma:
// grouped_gemm_wgmma_kernel.cuh): the operand dtype of a moekit dtype, the K-major 128-byte swizzle both use in
// shared memory, the CONCAT gate/up column pairing, and the epilogues with their rounding points (h rounded and
// stored, a computed from the rounded h; alpha, bias and beta in fp32), each on 8 values of one row read from an
// fp32 staging tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/activation.cuh"
#include "cuda/common/storage.cuh"
#include "cuda/gemm/grouped_gemm.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

template <int32_t Dtype>
struct StorageFor;
template <>
struct StorageFor<MOEKIT_DTYPE_BF16> {
  using type = __nv_bfloat16;
};
template <>
struct StorageFor<MOEKIT_DTYPE_FP16> {
  using type = __half;
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a K-major tile (rows of 64 values = 128 bytes): the chunk
// is XORed with the row's low 3 bits, so the 8 rows one ldmatrix reads hit 8 different bank groups.
__device__ __forceinline__ uint32_t kmajor_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of chunk `chunk` (8 values) of reduction row `k` in an MN-major tile of `width` values per row (the
// wgmma kernel's blocks of 64 columns are the 128-byte-swizzle case).
template <int width>
__device__ __forceinline__ uint32_t mnmajor_offset(int k, int chunk) {
  return static_cast<uint32_t>(k * width * 2 + ((chunk ^ (k & 7)) << 4));
}

// The source row of grouped row r with a gather: gather_idx[r] clamped to [0, source_rows).
__device__ __forceinline__ int64_t gather_row(const GroupedGemmProblem& p, int64_t r) {
  const int64_t src = load_index(p.gather_idx, r, p.gather_int64);
  return min(max(src, int64_t{0}), p.source_rows - 1);
}

// A DGATED row's score: row_scale[pair_idx[r]], or 0 for an entry outside [0, pairs).
__device__ __forceinline__ float pair_scale(const GroupedGemmProblem& p, int64_t r) {
  const int32_t pair = p.pair_idx[r];
  return pair >= 0 && pair < p.pairs ? p.row_scale[pair] : 0.0f;
}

// The tiles of a varlen-K product: one per group x m tile x n tile (C[e] is [m, n]).
__host__ __device__ __forceinline__ int64_t varlen_k_tile_count(const GroupedGemmProblem& p, int64_t bm) {
  return p.groups * ((p.m + bm - 1) / bm) * p.n_tiles;
}

// Where a logical column of the gated product lives in h / B. For a gated activation in the CONCAT layout the
// product's columns are reordered in blocks of 16: 8 gate columns j..j+7 then the 8 up columns of the same j, so
// that a fragment's gate and up values sit in one thread (and one 64-column warp tile).
__device__ __forceinline__ int64_t concat_pair_column(int64_t logical, int64_t act_width) {
  return (logical >> 4) * 8 + (logical & 7) + ((logical & 8) ? act_width : 0);
}

template <class T>
__device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  const Vec16<T> raw = load16(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = to_float(raw.v[i]);
}

// Rounds 8 values to T and stores them (16 bytes); `rounded` receives the stored values back in fp32.
// NOTE: outputs are stored evict-first (st.global.cs): this kernel never reads them again, and the operands that
// the next tiles re-read stay in L2.
template <class T>
__device__ __forceinline__ void store8_rounded(T* p, const float (&in)[8], float (&rounded)[8]) {
  uint32_t pairs[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    pairs[i] = round_pair<T>(in[2 * i], in[2 * i + 1]);
    const float2 back = unpack_pair<T>(pairs[i]);
    rounded[2 * i] = back.x;
    rounded[2 * i + 1] = back.y;
  }
  __stcs(reinterpret_cast<uint4*>(p), make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]));
}

template <class T>
__device__ __forceinline__ void store8(T* p, const float (&in)[8]) {
  float unused[8];
  store8_rounded(p, in, unused);
}

__device__ __forceinline__ void load8_fp32(const float* p, float (&out)[8]) {
  const float4 lo = *reinterpret_cast<const float4*>(p);
  const float4 hi = *reinterpret_cast<const float4*>(p + 4);
  out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
  out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
}

__device__ __forceinline__ void store8_fp32(float* p, const float (&in)[8]) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(in[0], in[1], in[2], in[3]));
  __stcs(reinterpret_cast<float4*>(p + 4), make_float4(in[4], in[5], in[6], in[7]));
}

// 8 values of C in its dtype, as fp32.
template <class T>
__device__ __forceinline__ void load8_c(const void* c, bool fp32, int64_t offset, float (&out)[8]) {
  if (fp32)
    load8_fp32(static_cast<const float*>(c) + offset, out);
  else
    load8(static_cast<const T*>(c) + offset, out);
}

template <class T>
__device__ __forceinline__ void store8_c(void* c, bool fp32, int64_t offset, const float (&in)[8]) {
  if (fp32)
    store8_fp32(static_cast<float*>(c) + offset, in);
  else
    store8(static_cast<T*>(c) + offset, in);
}

// The gate and up values of 8 activation columns from the 16 INTERLEAVED values holding them (gate, up, gate, ...).
__device__ __forceinline__ void split_interleaved(const float (&lo)[8], const float (&hi)[8], float (&g)[8],
                                                  float (&u)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    g[i] = lo[2 * i], u[i] = lo[2 * i + 1];
    g[i + 4] = hi[2 * i], u[i + 4] = hi[2 * i + 1];
  }
}

// Gate and up values of activation columns j..j+7 in a row of h or of a bias: the CONCAT layout keeps them at
// columns j and act_width + j, INTERLEAVED at 2j and 2j + 1.
template <class T>
__device__ __forceinline__ void load_glu8(const T* row, int64_t j, int64_t act_width, bool interleaved,
                                          float (&g)[8], float (&u)[8]) {
  if (!interleaved) {
    load8(row + j, g);
    load8(row + act_width + j, u);
    return;
  }
  float lo[8], hi[8];
  load8(row + 2 * j, lo);
  load8(row + 2 * j + 8, hi);
  split_interleaved(lo, hi, g, u);
}

// Rounds gate and up values to T and stores them at their layout's columns (as load_glu8 reads them); g_stored and
// u_stored receive the stored values in fp32.
template <class T>
__device__ __forceinline__ void store_glu8(T* row, int64_t j, int64_t act_width, bool interleaved,
                                           const float (&g)[8], const float (&u)[8], float (&g_stored)[8],
                                           float (&u_stored)[8]) {
  if (!interleaved) {
    store8_rounded(row + j, g, g_stored);
    store8_rounded(row + act_width + j, u, u_stored);
    return;
  }
  float lo[8], hi[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[2 * i] = g[i], lo[2 * i + 1] = u[i];
    hi[2 * i] = g[i + 4], hi[2 * i + 1] = u[i + 4];
  }
  store8_rounded(row + 2 * j, lo, lo);
  store8_rounded(row + 2 * j + 8, hi, hi);
  split_interleaved(lo, hi, g_stored, u_stored);
}

// ------------------------------------------------------------------------------------------------------------
// Epilogues: each call handles 8 values of one row of the tile, read from the fp32 staging tile.
// ------------------------------------------------------------------------------------------------------------

// v = alpha * staged[0..8) + bias[group, col..col+8) (no bias when p.bias is null). !Scaled: the caller knows
// alpha = 1 and no bias, and v is the staged values (the GATED epilogues' common case, without the 16 multiplies
// and the bias's predicated instructions per 8 values).
template <class T, bool Scaled = true>
__device__ __forceinline__ void scaled_plus_bias(const GroupedGemmProblem& p, const float* staged, int64_t group,
                                                 int64_t col, float (&v)[8]) {
  load8_fp32(staged, v);
  if constexpr (Scaled) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] *= p.alpha;
    if (p.bias != nullptr) {
      float bias[8];
      load8(static_cast<const T*>(p.bias) + group * p.bias_stride + col, bias);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] += bias[i];
    }
  }
}

// STORE / BIAS (varlen M) and varlen K: C = alpha product + bias + beta C.
template <class T>
__device__ __forceinline__ void epilogue_store(const GroupedGemmProblem& p, const float* staged, int64_t group,
                                               int64_t c_offset, int64_t col) {
  float v[8];
  scaled_plus_bias<T>(p, staged, group, col, v);
  if (p.beta != 0.0f) {
    float old[8];
    load8_c<T>(p.c, p.c_fp32, c_offset, old);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] += p.beta * old[i];
  }
  store8_c<T>(p.c, p.c_fp32, c_offset, v);
}

// GATED with a non-gated activation: h = round(alpha product + bias), a = round(act(h)), both at column col.
template <class T, bool Scaled = true>
__device__ __forceinline__ void epilogue_gated_plain(const GroupedGemmProblem& p, const DeviceActivation& act,
                                                     const float* staged, int64_t group, int64_t row, int64_t col) {
  float v[8], h[8];
  scaled_plus_bias<T, Scaled>(p, staged, group, col, v);
  store8_rounded(static_cast<T*>(p.c) + row * p.ldc + col, v, h);
  with_plain_kind(act.kind, [&](auto kind) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = plain_forward<decltype(kind)::value>(h[i]);
  });
  store8(static_cast<T*>(p.act) + row * p.ld_act + col, v);
}

// GATED with a gated activation: 8 gate and 8 up values of activation columns j..j+7 (staged apart), stored at
// their layout's h columns; a from the rounded h.
template <class T, bool Scaled = true>
__device__ __forceinline__ void epilogue_gated_glu(const GroupedGemmProblem& p, const DeviceActivation& act,
                                                   const float* staged_gate, const float* staged_up,
                                                   int64_t group, int64_t row, int64_t j) {
  const bool interleaved = p.glu_layout == MOEKIT_GLU_INTERLEAVED;
  float g[8], u[8];
  load8_fp32(staged_gate, g);
  load8_fp32(staged_up, u);
  if constexpr (Scaled) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      g[i] *= p.alpha;
      u[i] *= p.alpha;
    }
    if (p.bias != nullptr) {
      float bg[8], bu[8];
      load_glu8(static_cast<const T*>(p.bias) + group * p.bias_stride, j, p.act_width, interleaved, bg, bu);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        g[i] += bg[i];
        u[i] += bu[i];
      }
    }
  }
  float hg[8], hu[8];
  store_glu8(static_cast<T*>(p.c) + row * p.ldc, j, p.act_width, interleaved, g, u, hg, hu);
  float a[8];
  with_gated_kind(act.kind, [&](auto kind) {
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = gated_forward<decltype(kind)::value>(act.limit, hg[i], hu[i]);
  });
  store8(static_cast<T*>(p.act) + row * p.ld_act + j, a);
}

// DGATED's gated part for kind K over 8 activation columns j..j+7 of one row: dgate and dup stored at their layout's
// columns of dh_row, a = act(g, u) left in `a` (unscaled); returns this part of dA . a (fp32, in column order).
// Scaled: dA = alpha * the product (false: alpha == 1, which is the same value).
template <class T, int32_t K, bool Scaled>
__device__ __forceinline__ float dgated_glu8(const GroupedGemmProblem& p, float limit, const float (&da_raw)[8],
                                             const float (&g)[8], const float (&u)[8], T* dh_row, int64_t j,
                                             bool interleaved, float scale, float (&a)[8]) {
  float dg[8], du[8], dot = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float da = Scaled ? p.alpha * da_raw[i] : da_raw[i];
    a[i] = gated_forward<K>(limit, g[i], u[i]);
    dot += da * a[i];
    gated_backward<K>(limit, g[i], u[i], scale * da, dg[i], du[i]);
  }
  float unused_g[8], unused_u[8];
  store_glu8(dh_row, j, p.act_width, interleaved, dg, du, unused_g, unused_u);
  return dot;
}

// DGATED for activation columns j..j+7 of one row, given h's values there (a gated activation: gate g and up u; else
// z in g, u unused): returns this part of dA . a (fp32, in column order). SwigluConcat: the caller knows the
// activation is SwiGLU, the layout CONCAT and alpha 1 (the MoE layer's backward), and this copy branches on none.
template <class T, bool SwigluConcat = false>
__device__ __forceinline__ float epilogue_dgated_from_h(const GroupedGemmProblem& p, const DeviceActivation& act,
                                                        const float* staged, const float (&g)[8], const float (&u)[8],
                                                        int64_t row, int64_t j, float scale) {
  float da_raw[8];
  load8_fp32(staged, da_raw);
  T* dh_row = static_cast<T*>(p.c) + row * p.ldc;
  float a[8], dot = 0.0f;
  if constexpr (SwigluConcat) {
    dot = dgated_glu8<T, MOEKIT_ACT_SWIGLU, false>(p, act.limit, da_raw, g, u, dh_row, j, false, scale, a);
  } else if (is_gated_activation(act.kind)) {
    const bool interleaved = p.glu_layout == MOEKIT_GLU_INTERLEAVED;
    with_gated_kind(act.kind, [&](auto kind) {
      dot = dgated_glu8<T, decltype(kind)::value, true>(p, act.limit, da_raw, g, u, dh_row, j, interleaved, scale, a);
    });
  } else {
    float dz[8];
    with_plain_kind(act.kind, [&](auto kind) {
      constexpr int32_t K = decltype(kind)::value;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float da = p.alpha * da_raw[i];
        a[i] = plain_forward<K>(g[i]);
        dot += da * a[i];
        dz[i] = scale * da * plain_grad<K>(g[i]);
      }
    });
    store8(dh_row + j, dz);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] *= scale;
  store8(static_cast<T*>(p.act) + row * p.ld_act + j, a);
  return dot;
}

// DGATED for activation columns j..j+7 of one row, h read from global memory: epilogue_dgated_from_h.
template <class T>
__device__ __forceinline__ float epilogue_dgated(const GroupedGemmProblem& p, const DeviceActivation& act,
                                                 const float* staged, int64_t row, int64_t j, float scale) {
  const T* h_row = static_cast<const T*>(p.h) + row * p.ldh;
  float g[8], u[8];
  if (is_gated_activation(act.kind))
    load_glu8(h_row, j, p.act_width, p.glu_layout == MOEKIT_GLU_INTERLEAVED, g, u);
  else
    load8(h_row + j, g);
  return epilogue_dgated_from_h<T>(p, act, staged, g, u, row, j, scale);
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
