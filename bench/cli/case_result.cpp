#include "case_result.h"

#include <algorithm>

namespace moekit_bench {

TimeStats summarize(std::vector<double> us) {
  TimeStats t;
  if (us.empty()) return t;
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  t.median_us = n % 2 == 1 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
  t.min_us = us.front();
  t.max_us = us.back();
  return t;
}

const char* status_name(CaseStatus status) {
  switch (status) {
    case CaseStatus::ok: return "ok";
    case CaseStatus::not_supported: return "not_supported";
    default: return "failed";
  }
}

bool CheckResult::ok() const {
  if (status != CaseStatus::ok) return status == CaseStatus::not_supported;
  return std::all_of(outputs.begin(), outputs.end(), [](const OutputCheck& o) { return o.ok; });
}

}  // namespace moekit_bench
