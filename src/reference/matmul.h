// The dense float64 matrix product every reference GEMM goes through: cache-blocked, packed, with a
// register-blocked micro-kernel (AVX2 + FMA when the CPU has it) and tiles spread over the reference threads.
//
// Determinism: each output element is one chain of fused multiply-adds in ascending k,
//   c = accumulate ? c_old : 0;  for k = 0 .. K-1: c = fma(A(i,k), B(k,j), c)
// so its bits depend neither on the thread count nor on the tiling, and the portable kernel (std::fma) gives
// the same bits as the vector one.
#pragma once

#include <cstdint>
#include <vector>

namespace moekit {
inline namespace v0 {
namespace ref {

// A read-only strided view: element (i, j) is data[row(i) * row_stride + col(j) * col_stride], where
// row(i) = row_index ? row_index[i] : i and col(j) likewise. Transposes are strides; gathers are indices.
struct MatrixView {
  const double* data = nullptr;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
  const int64_t* row_index = nullptr;
  const int64_t* col_index = nullptr;
};

// C [m, n] with row stride ldc (C(i, j) = c[i * ldc + j]) gets A [m, k] times B [k, n].
struct MatmulTask {
  int64_t m = 0, n = 0, k = 0;
  MatrixView a, b;
  double* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;  // false: the old C is never read
};

// Runs every task (their outputs must not overlap) in one parallel region over output tiles.
void matmul(const std::vector<MatmulTask>& tasks);
void matmul(const MatmulTask& task);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
