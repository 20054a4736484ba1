#include "common/test_util.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "src/numeric.h"

namespace moekit_test {

size_t dtype_size(moekit_dtype_t dtype) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16:
    case MOEKIT_DTYPE_FP16: return 2;
    case MOEKIT_DTYPE_FP32:
    case MOEKIT_DTYPE_INT32: return 4;
    case MOEKIT_DTYPE_FP64:
    case MOEKIT_DTYPE_INT64: return 8;
    default: return 1;
  }
}

HostTensor::HostTensor(moekit_dtype_t dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  bytes_.assign(static_cast<size_t>(numel()) * dtype_size(dtype_), 0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

moekit_tensor_t HostTensor::view() {
  moekit_device_t cpu{MOEKIT_DEVICE_CPU, 0};
  return moekit_tensor_make(bytes_.data(), dtype_, static_cast<int32_t>(shape_.size()), shape_.data(), cpu);
}

double HostTensor::get(int64_t i) const {
  const uint8_t* p = bytes_.data() + static_cast<size_t>(i) * dtype_size(dtype_);
  uint16_t half;
  switch (dtype_) {
    case MOEKIT_DTYPE_BF16: std::memcpy(&half, p, 2); return moekit::bf16_to_float(half);
    case MOEKIT_DTYPE_FP16: std::memcpy(&half, p, 2); return moekit::fp16_to_float(half);
    case MOEKIT_DTYPE_FP32: { float f; std::memcpy(&f, p, 4); return f; }
    case MOEKIT_DTYPE_FP64: { double d; std::memcpy(&d, p, 8); return d; }
    case MOEKIT_DTYPE_INT32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case MOEKIT_DTYPE_INT64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

void HostTensor::set(int64_t i, double v) {
  uint8_t* p = bytes_.data() + static_cast<size_t>(i) * dtype_size(dtype_);
  uint16_t half;
  switch (dtype_) {
    case MOEKIT_DTYPE_BF16: half = moekit::float_to_bf16(static_cast<float>(moekit::round_to(v, dtype_))); std::memcpy(p, &half, 2); return;
    case MOEKIT_DTYPE_FP16: half = moekit::float_to_fp16(static_cast<float>(moekit::round_to(v, dtype_))); std::memcpy(p, &half, 2); return;
    case MOEKIT_DTYPE_FP32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    case MOEKIT_DTYPE_FP64: std::memcpy(p, &v, 8); return;
    case MOEKIT_DTYPE_INT32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); return; }
    case MOEKIT_DTYPE_INT64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); return; }
    default: return;
  }
}

std::vector<double> HostTensor::values() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get(i);
  return out;
}

void HostTensor::set_values(const std::vector<double>& v) {
  for (int64_t i = 0; i < numel(); ++i) set(i, v[static_cast<size_t>(i)]);
}

void HostTensor::fill_uniform(std::mt19937_64& rng, double scale) {
  bool integer = dtype_ == MOEKIT_DTYPE_INT32 || dtype_ == MOEKIT_DTYPE_INT64;
  std::uniform_real_distribution<double> dist(integer ? 0.0 : -scale, scale);
  for (int64_t i = 0; i < numel(); ++i) set(i, integer ? std::floor(dist(rng)) : dist(rng));
}

void HostTensor::fill_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < numel(); ++i) set(i, dist(rng));
}

void HostTensor::poison() {
  bool integer = dtype_ == MOEKIT_DTYPE_INT32 || dtype_ == MOEKIT_DTYPE_INT64;
  for (int64_t i = 0; i < numel(); ++i) set(i, integer ? 0x7eadbeef : std::numeric_limits<double>::quiet_NaN());
}

bool HostTensor::bytes_equal(const HostTensor& other) const {
  return dtype_ == other.dtype_ && shape_ == other.shape_ && bytes_ == other.bytes_;
}

ErrorMetrics compare(const std::vector<double>& out, const std::vector<double>& ref, int64_t width,
                     const std::vector<int64_t>& segments) {
  int64_t rows = width == 0 ? 0 : static_cast<int64_t>(ref.size()) / width;
  std::vector<double> row_diff(static_cast<size_t>(rows)), row_ref(static_cast<size_t>(rows));
  bool any_nan = false;
  for (int64_t r = 0; r < rows; ++r) {
    double d2 = 0, r2 = 0;
    for (int64_t c = 0; c < width; ++c) {
      size_t i = static_cast<size_t>(r * width + c);
      if (std::isnan(out[i])) any_nan = true;
      double d = out[i] - ref[i];
      d2 += d * d;
      r2 += ref[i] * ref[i];
    }
    row_diff[static_cast<size_t>(r)] = d2;
    row_ref[static_cast<size_t>(r)] = r2;
  }
  return metrics_from_row_sums(row_diff, row_ref, width, segments, any_nan);
}

ErrorMetrics metrics_from_row_sums(const std::vector<double>& row_diff, const std::vector<double>& row_ref,
                                   int64_t width, const std::vector<int64_t>& segments, bool any_nan) {
  ErrorMetrics m{0, 0, 0, any_nan};
  const int64_t rows = static_cast<int64_t>(row_ref.size());
  double ref_sq = 0, diff_sq = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ref_sq += row_ref[static_cast<size_t>(r)];
    diff_sq += row_diff[static_cast<size_t>(r)];
  }
  double eps = 1e-3 * std::sqrt(ref_sq / std::max<double>(1.0, static_cast<double>(rows * width)));
  for (int64_t r = 0; r < rows; ++r)
    m.worst_row = std::max(m.worst_row, std::sqrt(row_diff[static_cast<size_t>(r)]) /
                                            (std::sqrt(row_ref[static_cast<size_t>(r)]) + eps));
  m.whole = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  std::vector<int64_t> bounds = segments.empty() ? std::vector<int64_t>{0, rows} : segments;
  // NOTE: segments count rows of `width` values; a bound past the rows is a caller's mistake (e.g. the rows of a
  // [E, M, N] tensor taken as E rows of M*N), never read past.
  for (int64_t b : bounds)
    if (b < 0 || b > rows)
      throw std::invalid_argument("compare: segment bound " + std::to_string(b) + " outside the " +
                                  std::to_string(rows) + " rows of width " + std::to_string(width));
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    double d2 = 0, r2 = 0;
    for (int64_t r = bounds[s]; r < bounds[s + 1]; ++r) {
      d2 += row_diff[static_cast<size_t>(r)];
      r2 += row_ref[static_cast<size_t>(r)];
    }
    if (bounds[s + 1] > bounds[s]) m.worst_segment = std::max(m.worst_segment, r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2));
  }
  if (m.any_nan) m.whole = m.worst_segment = m.worst_row = std::numeric_limits<double>::infinity();
  return m;
}

Bounds bounds_for(moekit_dtype_t dtype) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: return {1e-2, 2e-2, 5e-2};
    case MOEKIT_DTYPE_FP16: return {2e-3, 4e-3, 1e-2};
    case MOEKIT_DTYPE_FP32: return {1e-5, 1e-5, 1e-5};
    default: return {1e-12, 1e-12, 1e-12};
  }
}

bool within(const ErrorMetrics& m, const Bounds& b) {
  return !m.any_nan && m.whole <= b.whole && m.worst_segment <= b.segment && m.worst_row <= b.row;
}

std::string describe(const ErrorMetrics& m) {
  return "whole " + std::to_string(m.whole) + ", worst segment " + std::to_string(m.worst_segment) +
         ", worst row " + std::to_string(m.worst_row) + (m.any_nan ? ", NaN present" : "");
}

std::string last_error() {
  size_t length = moekit_get_last_error(nullptr, 0);
  std::string text(length + 1, '\0');
  moekit_get_last_error(&text[0], text.size());
  text.resize(length);
  return text;
}

std::string plan_description(moekit_plan_t plan) {
  const size_t length = moekit_plan_describe(plan, nullptr, 0);
  std::string text(length + 1, '\0');
  moekit_plan_describe(plan, &text[0], text.size());
  text.resize(length);
  return text;
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  const char* old = std::getenv(name);
  had_old_ = old != nullptr;
  if (had_old_) old_ = old;
  if (value != nullptr)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

ScopedEnv::~ScopedEnv() {
  if (had_old_)
    setenv(name_.c_str(), old_.c_str(), 1);
  else
    unsetenv(name_.c_str());
}

std::vector<int64_t> as_integers(const HostTensor& t) {
  std::vector<int64_t> out;
  for (double v : t.values()) out.push_back(static_cast<int64_t>(v));
  return out;
}

double max_abs(const HostTensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.get(i)));
  return m;
}

double rms(const HostTensor& t) {
  double sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sq += t.get(i) * t.get(i);
  return t.numel() == 0 ? 0.0 : std::sqrt(sq / static_cast<double>(t.numel()));
}

ReferenceHandle::ReferenceHandle(int32_t num_threads) {
  moekit_handle_desc_t desc;
  MOEKIT_REQUIRE_OK(moekit_handle_desc_init(&desc));
  desc.backend = MOEKIT_BACKEND_REFERENCE;
  desc.num_threads = num_threads;
  MOEKIT_REQUIRE_OK(moekit_handle_create(&desc, &handle));
}

ReferenceHandle::~ReferenceHandle() { moekit_handle_destroy(handle); }

PlanOwner::~PlanOwner() { moekit_plan_destroy(plan); }

void PlanOwner::size_workspace() {
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  workspace.resize(bytes);
}

AlignedBuffer AlignedBuffer::non_null(size_t bytes) {
  AlignedBuffer buffer(bytes);
  if (buffer.chunks_.empty()) buffer.chunks_.resize(1);
  return buffer;
}

AlignedBuffer saved_buffer(moekit_plan_t plan) {
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &bytes));
  return AlignedBuffer(bytes);
}

AlignedBuffer workspace_buffer(moekit_plan_t plan) {
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  return AlignedBuffer(bytes);
}

LayerWorkspaceSizes layer_workspace_sizes(moekit_plan_t plan) {
  LayerWorkspaceSizes sizes;
  size_t total = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &total));
  MOEKIT_REQUIRE_OK(moekit_plan_layer_workspace_sizes(plan, &sizes.forward, &sizes.backward));
  CHECK(std::max(sizes.forward, sizes.backward) == total);
  return sizes;
}

}  // namespace moekit_test
