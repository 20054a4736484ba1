// The thread-local last-error text, and the small functions of the ABI that only describe the library:
// status names, the version, last-error access and the tensor-view helper.
#include "capi/translate.h"

#include <cstring>
#include <limits>

namespace moekit {
inline namespace v0 {
namespace capi {

namespace {
thread_local std::string last_error;
}  // namespace

moekit_status_t record_failure(moekit_status_t status, const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    // NOTE: the status still reaches the caller; only the text is lost when even it cannot be stored.
    last_error.clear();
  }
  return status;
}

int32_t enum_value(const void* argument) noexcept {
  int32_t value;
  std::memcpy(&value, argument, sizeof(value));
  return value;
}

size_t copy_text(const std::string& text, char* buf, size_t cap) noexcept {
  if (buf != nullptr && cap > 0) {
    const size_t copied = text.size() < cap - 1 ? text.size() : cap - 1;
    std::memcpy(buf, text.data(), copied);
    buf[copied] = '\0';
  }
  return text.size();
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit

extern "C" {

MOEKIT_API int32_t moekit_get_version(void) { return MOEKIT_VERSION_NUMBER; }

MOEKIT_API const char* moekit_status_string(moekit_status_t status) {
  switch (moekit::capi::enum_value(&status)) {
    case MOEKIT_SUCCESS: return "MOEKIT_SUCCESS";
    case MOEKIT_STATUS_INVALID_VALUE: return "MOEKIT_STATUS_INVALID_VALUE";
    case MOEKIT_STATUS_VALIDATION_FAILED: return "MOEKIT_STATUS_VALIDATION_FAILED";
    case MOEKIT_STATUS_NOT_SUPPORTED: return "MOEKIT_STATUS_NOT_SUPPORTED";
    case MOEKIT_STATUS_INSUFFICIENT_WORKSPACE: return "MOEKIT_STATUS_INSUFFICIENT_WORKSPACE";
    case MOEKIT_STATUS_OUT_OF_MEMORY: return "MOEKIT_STATUS_OUT_OF_MEMORY";
    case MOEKIT_STATUS_EXECUTION_FAILED: return "MOEKIT_STATUS_EXECUTION_FAILED";
    case MOEKIT_STATUS_INTERNAL_ERROR: return "MOEKIT_STATUS_INTERNAL_ERROR";
  }
  return "unknown status";
}

MOEKIT_API size_t moekit_get_last_error(char* buf, size_t cap) {
  return moekit::capi::copy_text(moekit::capi::last_error, buf, cap);
}

MOEKIT_API moekit_tensor_t moekit_tensor_make(void* data, moekit_dtype_t dtype, int32_t rank, const int64_t* shape,
                                              moekit_device_t device) {
  moekit_tensor_t t{};
  t.data = data;
  t.dtype = moekit::capi::enum_value(&dtype);
  t.rank = rank;
  t.device = device;
  // NOTE: "never fails": a rank outside 0..MOEKIT_MAX_RANK is kept as given (validation reports it later) and
  // only the dimensions that fit are filled.
  int32_t dims = rank < 0 ? 0 : (rank > MOEKIT_MAX_RANK ? MOEKIT_MAX_RANK : rank);
  // Saturated at INT64_MAX where the shape's product does not fit: validation then rejects the strides.
  const int64_t max = std::numeric_limits<int64_t>::max();
  int64_t stride = 1;
  for (int32_t i = dims - 1; i >= 0; --i) {
    t.shape[i] = shape != nullptr ? shape[i] : 0;
    t.stride[i] = stride;
    const int64_t extent = t.shape[i] > 1 ? t.shape[i] : 1;
    stride = stride > max / extent ? max : stride * extent;
  }
  return t;
}

}  // extern "C"
