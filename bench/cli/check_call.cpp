#include "platform.h"

namespace moekit_bench {

void check_call(moekit_status_t status, const char* what) {
  if (status == MOEKIT_SUCCESS) return;
  std::string message(moekit_get_last_error(nullptr, 0), '\0');
  moekit_get_last_error(message.data(), message.size() + 1);
  throw CaseFailure(status, std::string(what) + ": " + moekit_status_string(status) + ": " + message);
}

}  // namespace moekit_bench
