#include "run_meta.h"

#include <ctime>

#include "moekit/moekit.h"

#ifndef MOEKIT_BENCH_GIT_SHA
#define MOEKIT_BENCH_GIT_SHA "unknown"
#endif

namespace moekit_bench {

std::string moekit_version_text() {
  const int32_t v = moekit_get_version();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string configure_time_git_sha() { return MOEKIT_BENCH_GIT_SHA; }

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace moekit_bench
