// stmatrix (sm_90): warp-wide stores of 8 x 8 matrices of 16-bit values from registers in the mma accumulator
// fragment layout (each lane one 32-bit register per matrix: row lane / 4, columns 2 (lane % 4) and + 1) into shared
// memory, 16 bytes per stored row.
#pragma once

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {

// Four matrices r0..r3, each stored transposed: lane l gives the shared address of stored row l % 8 of matrix
// l / 8, which holds column l % 8 of that matrix's fragment (its 8 rows, in order).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t address, uint32_t r0, uint32_t r1, uint32_t r2,
                                                  uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
