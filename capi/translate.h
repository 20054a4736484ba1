// The one door between C callers and moekit's C++ internals: every extern "C" body runs inside translate(),
// which turns any exception into a status and this thread's last-error message, so none crosses the ABI.
#pragma once

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include "cuda/common/status_error.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace capi {

// Stores `message` as this thread's last error and returns `status`. Never throws.
moekit_status_t record_failure(moekit_status_t status, const char* message) noexcept;

// The value of an enum argument of the ABI (4 bytes, as every moekit_*_t enum is). A C caller may pass any int as a C
// enum, and a C++ load of an enum-typed value outside the enumerators' range is undefined, so only its bytes are read.
int32_t enum_value(const void* argument) noexcept;

// The ABI's text copy-out (moekit_get_last_error, moekit_plan_describe): `text` into buf, NUL-terminated and
// truncated to cap - 1 characters (nothing written when buf is NULL or cap is 0); returns text's full length.
size_t copy_text(const std::string& text, char* buf, size_t cap) noexcept;

template <class Body>
moekit_status_t translate(Body&& body) noexcept {
  try {
    body();
    return MOEKIT_SUCCESS;
  } catch (const Error& e) {
    return record_failure(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return record_failure(MOEKIT_STATUS_OUT_OF_MEMORY, "memory: a host allocation failed");
  } catch (const std::exception& e) {
    return record_failure(MOEKIT_STATUS_INTERNAL_ERROR, e.what());
  } catch (...) {
    return record_failure(MOEKIT_STATUS_INTERNAL_ERROR, "internal: an unknown exception reached the C API");
  }
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
