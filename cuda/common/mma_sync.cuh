// Warp-level tensor-core primitives (sm_80+ forms, valid on sm_90): ldmatrix fragment loads from shared memory
// and the m16n8k16 bf16/fp16 mma with fp32 accumulators.
//
// Fragment layouts (lane = 4 * group + quad): A 16x16 row-major in 4 registers of 2 values: a0 (row group,
// cols 2quad..+1), a1 (row group+8, same cols), a2 (row group, cols 2quad+8..+9), a3 (row group+8, cols +8);
// B 16x8 in 2 registers: b0 (k 2quad..+1, col group), b1 (k 2quad+8..+9, col group); C 16x8 fp32 in 4: c0, c1
// (row group, cols 2quad, 2quad+1), c2, c3 (row group+8, same cols).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {

// Four 8x8 matrices of 16-bit values: lanes 8i..8i+7 give the row addresses (16 bytes each) of matrix i, and
// register i of lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As ldmatrix_x4, each matrix transposed: register i of lane l receives rows 2(l%4), 2(l%4)+1 of column l/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a b on one 16x8x16 tile; T is the 16-bit operand type (__nv_bfloat16 or __half).
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
