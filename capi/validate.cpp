#include "capi/validate.h"

#include <cstdint>
#include <limits>

#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace capi {

namespace {

std::string join(const std::vector<std::string>& parts) {
  std::string out = "[";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out + "]";
}

std::string shape_text(const moekit_tensor_t& t) {
  std::vector<std::string> parts;
  for (int32_t i = 0; i < t.rank && i < MOEKIT_MAX_RANK; ++i) parts.push_back(std::to_string(t.shape[i]));
  return join(parts);
}

std::string stride_text(const moekit_tensor_t& t) {
  std::vector<std::string> parts;
  for (int32_t i = 0; i < t.rank && i < MOEKIT_MAX_RANK; ++i) parts.push_back(std::to_string(t.stride[i]));
  return join(parts);
}

std::string device_text(moekit_device_t d) {
  if (d.type == MOEKIT_DEVICE_CPU) return "CPU";
  if (d.type == MOEKIT_DEVICE_CUDA) return "CUDA:" + std::to_string(d.index);
  return "device type " + std::to_string(d.type);
}

// a * b, saturated at INT64_MAX (both non-negative), so huge shapes cannot wrap around a check.
int64_t saturating_product(int64_t a, int64_t b) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return std::numeric_limits<int64_t>::max();
  return a * b;
}

bool rank_in_range(const moekit_tensor_t& t) { return t.rank >= 0 && t.rank <= MOEKIT_MAX_RANK; }

// Every dimension that is stepped along follows the next one without a gap (row-major, dense).
bool is_contiguous(const moekit_tensor_t& t) {
  int64_t expected_stride = 1;
  for (int32_t i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] > 1 && t.stride[i] != expected_stride) return false;
    expected_stride = saturating_product(expected_stride, t.shape[i]);
  }
  return true;
}

}  // namespace

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: return "bf16";
    case MOEKIT_DTYPE_FP16: return "fp16";
    case MOEKIT_DTYPE_FP32: return "fp32";
    case MOEKIT_DTYPE_FP64: return "fp64";
    case MOEKIT_DTYPE_INT32: return "int32";
    case MOEKIT_DTYPE_INT64: return "int64";
    case MOEKIT_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case MOEKIT_DTYPE_FP8_E5M2: return "fp8_e5m2";
    default: return "an unknown dtype";
  }
}

bool is_float_dtype(int32_t dtype) {
  return dtype == MOEKIT_DTYPE_BF16 || dtype == MOEKIT_DTYPE_FP16 || dtype == MOEKIT_DTYPE_FP32 ||
         dtype == MOEKIT_DTYPE_FP64;
}

bool is_present(const moekit_tensor_t& t) {
  if (t.data != nullptr) return true;
  if (t.rank <= 0 || !rank_in_range(t)) return false;
  for (int32_t i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return true;
  return false;
}

int64_t leading_extent(const char* name, const moekit_tensor_t& t, const char* symbol, int64_t bound,
                       const char* bound_name, int64_t minus) {
  std::string prefix = std::string(name) + ": ";
  if (!is_present(t)) throw_invalid(prefix + "required tensor is missing (data is NULL)");
  if (t.rank < 1 || t.rank > MOEKIT_MAX_RANK)
    throw_invalid(prefix + "expected a tensor of rank >= 1 whose first dimension gives " + symbol + ", got rank " +
                  std::to_string(t.rank));
  std::string what =
      minus ? symbol + std::string(" = shape[0] - ") + std::to_string(minus) : symbol + std::string(" = shape[0]");
  // NOTE: compared before subtracting, so that a shape[0] near INT64_MIN cannot wrap around.
  if (t.shape[0] < minus) throw_invalid(prefix + what + " is negative (shape " + shape_text(t) + ")");
  int64_t value = t.shape[0] - minus;
  if (value <= bound) return value;
  throw_invalid(prefix + what + " = " + std::to_string(value) + " exceeds the plan's " + bound_name + " = " +
                std::to_string(bound));
}

TensorCheck::TensorCheck(const TensorRules& rules, const char* name, const moekit_tensor_t& t)
    : rules_(rules), name_(name), t_(t) {}

TensorCheck& TensorCheck::dtype(int32_t dtype) {
  dtypes_ = {dtype};
  return *this;
}

TensorCheck& TensorCheck::dtype_in(std::initializer_list<int32_t> dtypes) {
  dtypes_.assign(dtypes.begin(), dtypes.end());
  return *this;
}

TensorCheck& TensorCheck::index_dtype() { return dtype_in({MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64}); }

TensorCheck& TensorCheck::score_dtype(int32_t plan_dtype) {
  if (plan_dtype == MOEKIT_DTYPE_FP64) return dtype_in({MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_FP64});
  return dtype(MOEKIT_DTYPE_FP32);
}

TensorCheck& TensorCheck::shape(std::initializer_list<Extent> dims) {
  dims_.assign(dims.begin(), dims.end());
  flat_ = false;
  return *this;
}

TensorCheck& TensorCheck::flat(Extent count) {
  dims_ = {std::move(count)};
  flat_ = true;
  return *this;
}

TensorCheck& TensorCheck::optional() {
  need_ = Need::optional;
  return *this;
}

TensorCheck& TensorCheck::required_iff(bool needed, const std::string& why_absent) {
  need_ = needed ? Need::required : Need::forbidden;
  why_absent_ = why_absent;
  return *this;
}

TensorCheck& TensorCheck::optional_iff(bool allowed, const std::string& why_absent) {
  need_ = allowed ? Need::optional : Need::forbidden;
  why_absent_ = why_absent;
  return *this;
}

TensorCheck& TensorCheck::required_if(bool needed) {
  if (needed) need_ = Need::required;
  return *this;
}

TensorCheck& TensorCheck::used_if(bool used) {
  if (!used) need_ = Need::ignored;
  return *this;
}

TensorCheck& TensorCheck::contiguous_if(bool needed, const std::string& why) {
  if (needed) why_contiguous_ = why;
  return *this;
}

void TensorCheck::fail(const std::string& what) const { throw_invalid(std::string(name_) + ": " + what); }

bool TensorCheck::check() const {
  if (need_ == Need::ignored) return false;
  bool present = is_present(t_);
  if (!present) {
    if (need_ == Need::required) fail("required tensor is missing (data is NULL)");
    return false;
  }
  if (need_ == Need::forbidden) fail("must be absent (data NULL): " + why_absent_);
  check_dtype();
  if (flat_)
    check_flat();
  else
    check_shape();
  check_strides();
  if (!why_contiguous_.empty()) check_contiguous();
  check_extent();
  check_alignment();
  check_device();
  check_reserved();
  return true;
}

void TensorCheck::check_dtype() const {
  for (int32_t d : dtypes_)
    if (t_.dtype == d) return;
  std::string expected;
  for (size_t i = 0; i < dtypes_.size(); ++i) expected += (i ? " or " : "") + std::string(dtype_name(dtypes_[i]));
  fail("expected dtype " + expected + ", got " + dtype_name(t_.dtype) + " (" + std::to_string(t_.dtype) + ")");
}

void TensorCheck::check_shape() const {
  bool matches = t_.rank == static_cast<int32_t>(dims_.size());
  for (int32_t i = 0; matches && i < t_.rank; ++i) matches = t_.shape[i] == dims_[static_cast<size_t>(i)].value;
  if (matches) return;
  // NOTE: the message is built only on failure: run calls check every tensor, and this is their host overhead.
  std::vector<std::string> symbols, values;
  for (const Extent& e : dims_) {
    symbols.push_back(e.symbol);
    values.push_back(std::to_string(e.value));
  }
  std::string expected = join(symbols) + " = " + join(values);
  if (t_.rank != static_cast<int32_t>(dims_.size()))
    fail("expected rank " + std::to_string(dims_.size()) + " " + expected + ", got rank " + std::to_string(t_.rank));
  fail("expected shape " + expected + ", got " + shape_text(t_));
}

void TensorCheck::check_flat() const {
  const Extent& count = dims_.front();
  if (t_.rank < 1 || t_.rank > MOEKIT_MAX_RANK)
    fail("expected " + count.symbol + " = " + std::to_string(count.value) + " elements, got rank " +
         std::to_string(t_.rank));
  int64_t numel = 1;
  for (int32_t i = 0; i < t_.rank; ++i) {
    if (t_.shape[i] < 0) fail("shape " + shape_text(t_) + " has a negative extent");
    numel = saturating_product(numel, t_.shape[i]);
  }
  if (numel != count.value)
    fail("expected " + count.symbol + " = " + std::to_string(count.value) + " elements (read flat), got shape " +
         shape_text(t_));
  if (!is_contiguous(t_))
    fail("is read flat, so it must be contiguous; strides " + stride_text(t_) + " with shape " + shape_text(t_) +
         " are not");
}

void TensorCheck::check_contiguous() const {
  if (!is_contiguous(t_))
    fail("must be contiguous (" + why_contiguous_ + "); strides " + stride_text(t_) + " with shape " +
         shape_text(t_) + " are not");
}

void TensorCheck::check_strides() const {
  // Only dimensions that are stepped along matter (extent > 1). The last must be contiguous; each other must
  // step past everything the dimensions after it span, so no two elements share an address.
  int64_t span_after = 1;
  for (int32_t i = t_.rank - 1; i >= 0; --i) {
    if (t_.shape[i] <= 1) continue;
    if (i == t_.rank - 1 && t_.stride[i] != 1)
      fail("the last dimension must be contiguous (stride 1), got strides " + stride_text(t_));
    if (t_.stride[i] < span_after)
      fail("strides " + stride_text(t_) + " with shape " + shape_text(t_) + " overlap: stride[" + std::to_string(i) +
           "] must be >= " + std::to_string(span_after));
    span_after = saturating_product(t_.stride[i], t_.shape[i]);
  }
}

void TensorCheck::check_extent() const {
  // The bytes from data to the end of the furthest element must fit in an int64: no memory holds more, and the
  // backends address elements with int64 offsets, which strides that large would overflow.
  const int64_t max = std::numeric_limits<int64_t>::max();
  int64_t last = 0;
  for (int32_t i = 0; i < t_.rank; ++i) {
    if (t_.shape[i] == 0) return;
    if (t_.shape[i] > 1) {
      const int64_t step = saturating_product(t_.shape[i] - 1, t_.stride[i]);
      last = step > max - last ? max : last + step;
    }
  }
  const int64_t elem = static_cast<int64_t>(dtype_bytes(t_.dtype));
  if (last > max / elem - 1)
    fail("strides " + stride_text(t_) + " with shape " + shape_text(t_) +
         " reach past 2^63 bytes from data, more than any memory holds");
}

void TensorCheck::check_alignment() const {
  if (t_.data == nullptr) return;
  size_t alignment = dtype_bytes(t_.dtype);
  // NOTE: the CUDA kernels load float matrices in 16-byte vectors (TMA, cp.async), as moekit.h states.
  if (rules_.cuda && is_float_dtype(t_.dtype) && t_.rank >= 2) alignment = 16;
  if (alignment > 1 && reinterpret_cast<uintptr_t>(t_.data) % alignment != 0)
    fail("data pointer is not aligned to " + std::to_string(alignment) + " bytes");
}

void TensorCheck::check_device() const {
  const moekit_device_t want = rules_.device;
  bool same = t_.device.type == want.type && (want.type != MOEKIT_DEVICE_CUDA || t_.device.index == want.index);
  if (!same)
    fail("expected a " + device_text(want) + " tensor for a " + (rules_.cuda ? "CUDA" : "reference") + " handle, got " +
         device_text(t_.device));
}

void TensorCheck::check_reserved() const {
  if (t_.reserved[0] != 0 || t_.reserved[1] != 0) fail("reserved fields must be 0");
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
