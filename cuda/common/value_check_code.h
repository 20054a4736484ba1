// The failure code of a value check (MOEKIT_HANDLE_VALIDATE), shared by host and device code: one 64-bit word
// ordered so that the smallest code is the first failure of a call — by check (the order capi/ lists the call's
// tensors), then by element (row-major), so an atomicMin over every failing element keeps the one to report.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOEKIT_HOST_DEVICE __host__ __device__
#else
#define MOEKIT_HOST_DEVICE
#endif

namespace moekit {
inline namespace v0 {

// The rules of ValueRule (src/value_checks.h), as integers the kernels take.
constexpr int32_t kRuleFinite = 0;
constexpr int32_t kRuleFiniteOrMasked = 1;
constexpr int32_t kRuleIndexRange = 2;
constexpr int32_t kRuleOffsets = 3;

// Why an element failed.
enum ValueFault : uint32_t {
  kFaultNaN = 1,
  kFaultPositiveInf = 2,
  kFaultNegativeInf = 3,
  kFaultBelowRange = 4,
  kFaultAboveRange = 5,
  kFaultFirstNotZero = 6,   // offsets[0] != 0
  kFaultDecreasing = 7,     // offsets[i] < offsets[i-1]
  kFaultPastBound = 8,      // the last offset exceeds the rows it indexes
};

constexpr uint64_t kNoValueFailure = ~uint64_t{0};
constexpr int kCheckBits = 12;     // up to 4095 checks per call
constexpr int kPositionBits = 48;  // element positions below 2^48 (larger ones saturate)
constexpr int kFaultBits = 4;

MOEKIT_HOST_DEVICE inline uint64_t value_failure_code(uint32_t check, uint64_t position, uint32_t fault) {
  const uint64_t max_position = (uint64_t{1} << kPositionBits) - 1;
  const uint64_t pos = position < max_position ? position : max_position;
  return (uint64_t{check} << (kPositionBits + kFaultBits)) | (pos << kFaultBits) | fault;
}

MOEKIT_HOST_DEVICE inline uint32_t value_failure_check(uint64_t code) {
  return static_cast<uint32_t>(code >> (kPositionBits + kFaultBits));
}
MOEKIT_HOST_DEVICE inline uint64_t value_failure_position(uint64_t code) {
  return (code >> kFaultBits) & ((uint64_t{1} << kPositionBits) - 1);
}
MOEKIT_HOST_DEVICE inline uint32_t value_failure_fault(uint64_t code) {
  return static_cast<uint32_t>(code & ((1u << kFaultBits) - 1));
}

}  // namespace v0
}  // namespace moekit
