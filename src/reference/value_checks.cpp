// The value checks of MOEKIT_HANDLE_VALIDATE on host memory: each check scanned in order, its elements in row-major
// order, so the first failure found is the one with the smallest code, as the CUDA backend's atomicMin finds it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/common/value_check_code.h"
#include "src/reference/dense.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

// Rows of dim 0 (or entries of `via`) the check covers: all, or those below the bound tensor's entry.
int64_t covered(const ValueCheck& c, int64_t extent) {
  if (c.rows.data == nullptr && c.rows.rank == 0) return extent;
  const std::vector<int64_t> bound = read_indices(c.rows, c.rows_entry + 1);
  return std::clamp<int64_t>(bound.back(), 0, extent);
}

uint32_t float_fault(double v, bool masked) {
  if (std::isnan(v)) return kFaultNaN;
  if (v == INFINITY) return kFaultPositiveInf;
  if (v == -INFINITY && !masked) return kFaultNegativeInf;
  return 0;
}

// The rows a float check reads, ascending.
std::vector<int64_t> checked_rows(const ValueCheck& c) {
  const int64_t rows = c.tensor.shape[0];
  std::vector<int64_t> list;
  if (c.via.data == nullptr && c.via.rank == 0) {
    for (int64_t r = 0, n = covered(c, rows); r < n; ++r) list.push_back(r);
    return list;
  }
  for (int64_t r : read_indices(c.via, covered(c, c.via.shape[0])))
    if (r >= 0 && r < rows) list.push_back(r);
  std::sort(list.begin(), list.end());
  list.erase(std::unique(list.begin(), list.end()), list.end());
  return list;
}

uint64_t check_floats(const ValueCheck& c, uint32_t id) {
  const bool masked = c.rule == ValueRule::finite_or_masked;
  const int64_t width = row_width(c.tensor);
  const std::vector<double> values = read_values(c.tensor);
  for (int64_t r : checked_rows(c))
    for (int64_t j = 0; j < width; ++j) {
      const int64_t at = r * width + j;
      if (uint32_t fault = float_fault(values[static_cast<size_t>(at)], masked))
        return value_failure_code(id, static_cast<uint64_t>(at), fault);
    }
  return kNoValueFailure;
}

uint64_t check_range(const ValueCheck& c, uint32_t id) {
  const int64_t width = row_width(c.tensor);
  const std::vector<int64_t> values = read_indices(c.tensor, covered(c, c.tensor.shape[0]));
  for (size_t at = 0; at < values.size(); ++at) {
    const int64_t row = static_cast<int64_t>(at) / width;
    if (values[at] < c.lo + row * c.shift) return value_failure_code(id, at, kFaultBelowRange);
    if (values[at] >= c.hi + row * c.shift) return value_failure_code(id, at, kFaultAboveRange);
  }
  return kNoValueFailure;
}

uint64_t check_offsets(const ValueCheck& c, uint32_t id) {
  const std::vector<int64_t> v = read_indices(c.tensor);
  if (v.empty()) return kNoValueFailure;
  if (v[0] != 0) return value_failure_code(id, 0, kFaultFirstNotZero);
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] < v[i - 1]) return value_failure_code(id, i, kFaultDecreasing);
  if (v.back() > c.hi) return value_failure_code(id, v.size() - 1, kFaultPastBound);
  return kNoValueFailure;
}

}  // namespace

uint64_t ReferenceBackend::check_values(const std::vector<ValueCheck>& checks, uint32_t first_check, void*) {
  for (size_t i = 0; i < checks.size(); ++i) {
    const ValueCheck& c = checks[i];
    const uint32_t id = first_check + static_cast<uint32_t>(i);
    uint64_t code = kNoValueFailure;
    switch (c.rule) {
      case ValueRule::finite:
      case ValueRule::finite_or_masked: code = check_floats(c, id); break;
      case ValueRule::index_range: code = check_range(c, id); break;
      case ValueRule::offsets: code = check_offsets(c, id); break;
    }
    if (code != kNoValueFailure) return code;
  }
  return kNoValueFailure;
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
