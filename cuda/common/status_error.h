// The one exception type of moekit's internals and the helpers that raise it.
// Internal code reports a bad argument or an unsupported request by throwing Error; the C ABI layer
// (capi/translate.h) catches it, stores the message in the thread-local last-error text and returns the status.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

class Error : public std::runtime_error {
 public:
  Error(moekit_status_t status, std::string message) : std::runtime_error(std::move(message)), status_(status) {}
  moekit_status_t status() const noexcept { return status_; }

 private:
  moekit_status_t status_;
};

// NOTE: the message must name the argument first ("w1: expected ..."), as every caller reads it that way.
[[noreturn]] inline void throw_invalid(std::string message) {
  throw Error(MOEKIT_STATUS_INVALID_VALUE, std::move(message));
}
[[noreturn]] inline void throw_not_supported(std::string message) {
  throw Error(MOEKIT_STATUS_NOT_SUPPORTED, std::move(message));
}
[[noreturn]] inline void throw_internal(std::string message) {
  throw Error(MOEKIT_STATUS_INTERNAL_ERROR, std::move(message));
}

}  // namespace v0
}  // namespace moekit
