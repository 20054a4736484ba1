#include "src/reference/dense.h"

#include "cuda/common/status_error.h"
#include "src/numeric.h"

namespace moekit {
inline namespace v0 {
namespace ref {

int64_t numel(const moekit_tensor_t& t) {
  int64_t count = 1;
  for (int32_t d = 0; d < t.rank; ++d) count *= t.shape[d];
  return count;
}

int64_t row_width(const moekit_tensor_t& t) {
  int64_t width = 1;
  for (int32_t d = 1; d < t.rank; ++d) width *= t.shape[d];
  return width;
}

namespace {

int64_t rows_of(const moekit_tensor_t& t, int64_t rows) {
  int64_t all = t.rank == 0 ? 1 : t.shape[0];
  return rows < 0 ? all : rows;
}

// Element offset (in elements) of the dense row-major position `linear` inside a strided tensor.
int64_t strided_offset(const moekit_tensor_t& t, int64_t linear) {
  int64_t offset = 0;
  for (int32_t d = t.rank - 1; d >= 0; --d) {
    int64_t coordinate = linear % t.shape[d];
    linear /= t.shape[d];
    offset += coordinate * t.stride[d];
  }
  return offset;
}

// Row-major without gaps: the dense position is the element offset (the common case, read without divisions).
bool is_contiguous(const moekit_tensor_t& t) {
  int64_t expected = 1;
  for (int32_t d = t.rank - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.stride[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

double load_value(const moekit_tensor_t& t, int64_t offset) {
  switch (t.dtype) {
    case MOEKIT_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(t.data)[offset]);
    case MOEKIT_DTYPE_FP16: return fp16_to_float(static_cast<const uint16_t*>(t.data)[offset]);
    case MOEKIT_DTYPE_FP32: return static_cast<const float*>(t.data)[offset];
    case MOEKIT_DTYPE_FP64: return static_cast<const double*>(t.data)[offset];
    default: throw_internal("reference: read_values on a non-float tensor");
  }
}

void store_value(const moekit_tensor_t& t, int64_t offset, double v) {
  switch (t.dtype) {
    case MOEKIT_DTYPE_BF16:
      static_cast<uint16_t*>(t.data)[offset] = float_to_bf16(static_cast<float>(round_to(v, MOEKIT_DTYPE_BF16)));
      return;
    case MOEKIT_DTYPE_FP16:
      static_cast<uint16_t*>(t.data)[offset] = float_to_fp16(static_cast<float>(round_to(v, MOEKIT_DTYPE_FP16)));
      return;
    case MOEKIT_DTYPE_FP32: static_cast<float*>(t.data)[offset] = static_cast<float>(v); return;
    case MOEKIT_DTYPE_FP64: static_cast<double*>(t.data)[offset] = v; return;
    default: throw_internal("reference: write_values on a non-float tensor");
  }
}

}  // namespace

std::vector<double> read_values(const moekit_tensor_t& t, int64_t rows) {
  int64_t count = rows_of(t, rows) * row_width(t);
  std::vector<double> values(static_cast<size_t>(count));
  bool contiguous = is_contiguous(t);
  for (int64_t i = 0; i < count; ++i)
    values[static_cast<size_t>(i)] = load_value(t, contiguous ? i : strided_offset(t, i));
  return values;
}

std::vector<int64_t> read_indices(const moekit_tensor_t& t, int64_t rows) {
  int64_t count = rows_of(t, rows) * row_width(t);
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = strided_offset(t, i);
    values[static_cast<size_t>(i)] = t.dtype == MOEKIT_DTYPE_INT64 ? static_cast<const int64_t*>(t.data)[offset]
                                                                   : static_cast<const int32_t*>(t.data)[offset];
  }
  return values;
}

void write_values(const moekit_tensor_t& t, const std::vector<double>& values, int64_t row_begin, int64_t row_end) {
  int64_t width = row_width(t);
  int64_t end = rows_of(t, row_end) * width;
  bool contiguous = is_contiguous(t);
  for (int64_t i = row_begin * width; i < end; ++i)
    store_value(t, contiguous ? i : strided_offset(t, i), values[static_cast<size_t>(i)]);
}

void write_indices(const moekit_tensor_t& t, const std::vector<int64_t>& values, int64_t row_begin,
                   int64_t row_end) {
  int64_t width = row_width(t);
  int64_t end = rows_of(t, row_end) * width;
  for (int64_t i = row_begin * width; i < end; ++i) {
    int64_t offset = strided_offset(t, i);
    if (t.dtype == MOEKIT_DTYPE_INT64)
      static_cast<int64_t*>(t.data)[offset] = values[static_cast<size_t>(i)];
    else
      static_cast<int32_t*>(t.data)[offset] = static_cast<int32_t>(values[static_cast<size_t>(i)]);
  }
}

void round_all(std::vector<double>& values, int32_t dtype) {
  for (double& v : values) v = round_to(v, dtype);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
