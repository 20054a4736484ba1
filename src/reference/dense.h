// Moving data between caller tensors (any float dtype, any strides) and the dense row-major float64 / int64
// arrays the reference math works on. Writes round to the destination's dtype: the last rounding point.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace ref {

// Product of the shape (1 for rank 0).
int64_t numel(const moekit_tensor_t& t);
// Product of the dimensions after the first (the width of one row); 1 for rank <= 1.
int64_t row_width(const moekit_tensor_t& t);

// The first `rows` rows (all when rows < 0) of a bf16/fp16/fp32/fp64 tensor, dense row-major.
std::vector<double> read_values(const moekit_tensor_t& t, int64_t rows = -1);
// The first `rows` rows of an int32/int64 tensor.
std::vector<int64_t> read_indices(const moekit_tensor_t& t, int64_t rows = -1);

// Writes rows [row_begin, row_end) of `values` (dense, row-major, the whole tensor's row width) into t,
// rounding to t.dtype. row_end < 0 means all rows. Rows outside the range are not touched.
void write_values(const moekit_tensor_t& t, const std::vector<double>& values, int64_t row_begin = 0,
                  int64_t row_end = -1);
void write_indices(const moekit_tensor_t& t, const std::vector<int64_t>& values, int64_t row_begin = 0,
                   int64_t row_end = -1);

// Rounds every element in place to `dtype` (a rounding point of docs/math.md section 8).
void round_all(std::vector<double>& values, int32_t dtype);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
