#include "fuzz_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace moekit_fuzz {

namespace {

// moekit_subsample_rows rejects a negative group count with this message. The number is one no edit makes but by
// chance (it is in no table, and far from every value an edit moves by a small step).
constexpr int64_t kMarkGroups = -1000000007;
const char* const kMarkMessage = "num_groups: must be >= 0, got -1000000007";

bool known_status(moekit_status_t status) {
  switch (status) {
    case MOEKIT_SUCCESS:
    case MOEKIT_STATUS_INVALID_VALUE:
    case MOEKIT_STATUS_VALIDATION_FAILED:
    case MOEKIT_STATUS_NOT_SUPPORTED:
    case MOEKIT_STATUS_INSUFFICIENT_WORKSPACE:
    case MOEKIT_STATUS_OUT_OF_MEMORY:
    case MOEKIT_STATUS_EXECUTION_FAILED:
    case MOEKIT_STATUS_INTERNAL_ERROR: return true;
  }
  return false;
}

}  // namespace

void violation(const std::string& call, const std::string& what) {
  std::fprintf(stderr, "moekit fuzz: %s: %s\n", call.c_str(), what.c_str());
  std::fflush(stderr);
  std::abort();
}

void mark_last_error() {
  if (moekit_subsample_rows(0, kMarkGroups, 1, 1, nullptr) != MOEKIT_STATUS_INVALID_VALUE ||
      last_error("moekit_subsample_rows") != kMarkMessage)
    violation("moekit_subsample_rows", "the marker call did not fail with its known message");
}

std::string last_error(const std::string& call) {
  const size_t length = moekit_get_last_error(nullptr, 0);
  std::string text(length + 1, '#');
  if (moekit_get_last_error(&text[0], text.size()) != length || text[length] != '\0')
    violation(call, "moekit_get_last_error: the copy disagrees with the length query");
  text.resize(length);
  char small[4];
  std::memset(small, '#', sizeof(small));
  if (moekit_get_last_error(small, sizeof(small)) != length)
    violation(call, "moekit_get_last_error: a truncated copy returned another length");
  const size_t kept = std::min(length, sizeof(small) - 1);
  if (text.compare(0, kept, small, kept) != 0 || small[kept] != '\0')
    violation(call, "moekit_get_last_error: a truncated copy is not the message's NUL-terminated start");
  return text;
}

std::string argument_named(const std::string& message) {
  const size_t colon = message.find(": ");
  return colon == std::string::npos ? std::string() : message.substr(0, colon);
}

void check_status(const std::string& call, moekit_status_t status, const std::vector<std::string>& names) {
  if (!known_status(status)) violation(call, "returned a status moekit.h does not define: " + std::to_string(status));
  if (status == MOEKIT_SUCCESS) return;
  const std::string message = last_error(call);
  const std::string said = std::string(moekit_status_string(status)) + " \"" + message + "\"";
  if (status == MOEKIT_STATUS_INTERNAL_ERROR) violation(call, "INTERNAL_ERROR: " + said);
  if (message.empty()) violation(call, "failed with an empty message: " + said);
  if (message == kMarkMessage) violation(call, "failed without leaving a message of its own: " + said);
  if (std::find(names.begin(), names.end(), argument_named(message)) == names.end())
    violation(call, "the message does not begin with the name of one of the call's arguments: " + said);
}

}  // namespace moekit_fuzz
