// Warpgroup tensor-core primitives of sm_90a: shared-memory matrix descriptors, the wgmma.mma_async issue for
// m64nNk16 with both operands in shared memory and fp32 accumulators in registers, and the fence / commit / wait
// that order it, plus setmaxnreg (registers moved between warpgroup roles).
//
// Accumulator layout of m64nN (per warpgroup, thread t = 32 w + l): register 4i + 2h + c holds row
// 16 w + l/4 + 8 h, column 8 i + 2 (l % 4) + c, the mma.sync C layout repeated over N / 8 column blocks.
//
// Only valid in code compiled for sm_90a; callers guard their kernels with MOEKIT_SM90A_ENABLED.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOEKIT_SM90A_ENABLED 1
#else
#define MOEKIT_SM90A_ENABLED 0
#endif

namespace moekit {
inline namespace v0 {
namespace cuda {

// Descriptor of a K-major operand tile in the 128-byte swizzle: rows of 64 16-bit values (128 bytes), 8-row
// groups 1024 bytes apart, 16-byte chunk c of row r stored at chunk c ^ (r % 8). `address` is the tile's (or a
// 16-wide reduction step's: + 32 bytes per step) shared address; the tile must start 1024-byte aligned.
__device__ __forceinline__ uint64_t wgmma_kmajor_sw128_descriptor(uint32_t address) {
  constexpr uint64_t leading_byte_offset = 1;  // NOTE: unused by swizzled K-major layouts; 1 by convention
  constexpr uint64_t stride_byte_offset = 1024 >> 4;
  constexpr uint64_t swizzle_128b = 1;
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (leading_byte_offset << 16) | (stride_byte_offset << 32) |
         (swizzle_128b << 62);
}

// Descriptor of an MN-major operand tile in the 128-byte swizzle: rows of 64 16-bit values along N (or M), one row
// per reduction index, 8-row groups 1024 bytes apart (one swizzle atom: 64 x 8), 16-byte chunk c of row r stored
// at chunk c ^ (r % 8); successive 64-wide column blocks `block_bytes` apart. `address` is the tile's (or a 16-deep
// reduction step's: + 2048 bytes per step) shared address, 1024-byte aligned. The wgmma that reads it must say so
// (the `a_mn_major` / `b_mn_major` of wgmma_m64k16).
__device__ __forceinline__ uint64_t wgmma_mnmajor_sw128_descriptor(uint32_t address, uint32_t block_bytes) {
  const uint64_t leading_byte_offset = block_bytes >> 4;  // between 64-wide column blocks
  constexpr uint64_t stride_byte_offset = 1024 >> 4;      // between groups of 8 reduction rows
  constexpr uint64_t swizzle_128b = 1;
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (leading_byte_offset << 16) | (stride_byte_offset << 32) |
         (swizzle_128b << 62);
}

// Orders this thread's register accesses to the accumulators before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most `pending` committed wgmma groups of this warpgroup are in flight.
template <int pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}

// Keeps the compiler from moving accesses of `value` across an asynchronous wgmma that reads or writes it.
__device__ __forceinline__ void wgmma_fence_operand(float& value) { asm volatile("" : "+f"(value)::"memory"); }

template <int N>
__device__ __forceinline__ void wgmma_fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) wgmma_fence_operand(d[i]);
}

// Gives this warpgroup's registers back (dec) or takes more (inc); the count is per thread, a multiple of 8.
template <int registers>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(registers));
}
template <int registers>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(registers));
}

// d (64 x 256 fp32, 128 per thread) += A (64 x 16, descriptor) B (256 x 16, descriptor); TYPE names the operands,
// TRANS_A / TRANS_B is "1" for an MN-major operand, else "0".
#define MOEKIT_WGMMA_M64N256K16(TYPE, TRANS_A, TRANS_B)                                                                        \
  asm volatile(                                                                                             \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {"                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                                  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                                  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                                  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                                  \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                                  \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                                  \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                                                  \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"                                                  \
      "}, %128, %129, p, 1, 1, " TRANS_A ", " TRANS_B ";\n}\n"                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                        \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),                        \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),                        \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),                        \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),                        \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),                        \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),                        \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),                        \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),                        \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),                        \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),                        \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),                        \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),                        \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),                        \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),                        \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])                         \
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))

// d (64 x 128 fp32, 64 per thread) += A (64 x 16, descriptor) B (128 x 16, descriptor); the rest as above.
#define MOEKIT_WGMMA_M64N128K16(TYPE, TRANS_A, TRANS_B)                                                                        \
  asm volatile(                                                                                             \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {"                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                                  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                                  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                                  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                                                  \
      "}, %64, %65, p, 1, 1, " TRANS_A ", " TRANS_B ";\n}\n"                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                        \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),                        \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),                        \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),                        \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),                        \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),                        \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),                        \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                         \
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))

// The four (N, type) forms of one transpose pair, inside wgmma_m64k16.
#define MOEKIT_WGMMA_SHAPES(TRANS_A, TRANS_B)              \
  if constexpr (N == 256 && bf16)                          \
    MOEKIT_WGMMA_M64N256K16("bf16", TRANS_A, TRANS_B);    \
  else if constexpr (N == 256)                             \
    MOEKIT_WGMMA_M64N256K16("f16", TRANS_A, TRANS_B);     \
  else if constexpr (bf16)                                 \
    MOEKIT_WGMMA_M64N128K16("bf16", TRANS_A, TRANS_B);    \
  else                                                     \
    MOEKIT_WGMMA_M64N128K16("f16", TRANS_A, TRANS_B)

// d += A B^T for a 64 x N tile by descriptor: A [64, 16] K-major (or, with a_mn_major, stored as [16, 64] with the
// 64 contiguous), B [N, 16] K-major (or, with b_mn_major, stored as [16, N] with N contiguous); accumulate = false
// overwrites d. Issued by the whole warpgroup; asynchronous until wgmma_wait.
template <int N, class T, bool a_mn_major, bool b_mn_major>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 128 || N == 256, "m64nNk16 is instantiated for N = 128 and 256");
  constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
  static_assert(bf16 || std::is_same<T, __half>::value, "bf16 or fp16 operands");
  if constexpr (a_mn_major && b_mn_major) {
    MOEKIT_WGMMA_SHAPES("1", "1");
  } else if constexpr (a_mn_major) {
    MOEKIT_WGMMA_SHAPES("1", "0");
  } else if constexpr (b_mn_major) {
    MOEKIT_WGMMA_SHAPES("0", "1");
  } else {
    MOEKIT_WGMMA_SHAPES("0", "0");
  }
}

#undef MOEKIT_WGMMA_SHAPES
#undef MOEKIT_WGMMA_M64N256K16
#undef MOEKIT_WGMMA_M64N128K16

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
