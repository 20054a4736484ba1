#include "src/reference/reference_backend.h"

#include <string>

#include "src/reference/parallel.h"

namespace moekit {
inline namespace v0 {
namespace ref {

ReferenceBackend::ReferenceBackend(int num_threads) { set_thread_count(num_threads); }

std::string ReferenceBackend::describe(const moekit_plan& plan) const {
  const int threads = thread_count();
  return plan_summary(plan) + ": reference backend (CPU, float64 accumulation, " + std::to_string(threads) +
         (threads == 1 ? " thread)" : " threads)");
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
