// Plain stores of registers into shared memory at an address XORed with a flip inside the asm: the way to write a
// swizzled tile (the 128-byte swizzle flips address bits 4..6) from a fixed per-thread base address.
#pragma once

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {

// Stores 4 bytes at shared address `address ^ flip`. NOTE: the XOR sits inside the asm: written in C++, the
// compiler kept one precomputed address per flip across the whole tile walk, and those spilled.
__device__ __forceinline__ void store_shared_flipped(uint32_t address, uint32_t flip, uint32_t value) {
  asm volatile(
      "{\n .reg .b32 flipped;\n xor.b32 flipped, %0, %2;\n st.shared.b32 [flipped], %1;\n}\n" ::"r"(address),
      "r"(value), "r"(flip)
      : "memory");
}

// Stores 8 bytes (lo, hi) at shared address `address ^ flip`, as store_shared_flipped.
__device__ __forceinline__ void store_shared_flipped_pair(uint32_t address, uint32_t flip, uint32_t lo, uint32_t hi) {
  asm volatile(
      "{\n .reg .b32 flipped;\n xor.b32 flipped, %0, %3;\n st.shared.v2.b32 [flipped], {%1, %2};\n}\n" ::"r"(address),
      "r"(lo), "r"(hi), "r"(flip)
      : "memory");
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
