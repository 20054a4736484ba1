// Device-side conversions between the storage dtypes and fp32, and 16-byte vector accesses.
// Kernels are templated on the storage type (__nv_bfloat16, __half, float); each instantiation lives in its own
// translation unit (docs/kernels.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

// Round to nearest even.
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Two values rounded to 16-bit T (nearest even, as from_float) by one conversion, packed low then high.
template <class T>
__device__ __forceinline__ uint32_t round_pair(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t round_pair<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t round_pair<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The two values round_pair packed, back in fp32.
template <class T>
__device__ __forceinline__ float2 unpack_pair(uint32_t packed);
template <>
__device__ __forceinline__ float2 unpack_pair<__nv_bfloat16>(uint32_t packed) {
  return make_float2(__uint_as_float(packed << 16), __uint_as_float(packed & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack_pair<__half>(uint32_t packed) {
  return __half22float2(*reinterpret_cast<const __half2*>(&packed));
}

// 16 bytes of T: 8 bf16/fp16 values or 4 fp32 values.
template <class T>
struct alignas(16) Vec16 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
};

template <class T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  return *reinterpret_cast<Vec16<T>*>(&raw);
}

template <class T>
__device__ __forceinline__ void store16(T* p, const Vec16<T>& value) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&value);
}

// Index tensors may be int32 or int64 (PyTorch's topk gives int64).
__device__ __forceinline__ int64_t load_index(const void* p, int64_t i, bool is_int64) {
  return is_int64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
