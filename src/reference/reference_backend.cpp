#include "src/reference/reference_backend.h"

#include <string>

#include "src/reference/parallel.h"

namespace moekit {
inline namespace v0 {
namespace ref {

ReferenceBackend::ReferenceBackend(int num_threads) { set_thread_count(num_threads); }

std::string ReferenceBackend::describe(const moekit_plan& plan) const {
  return plan_summary(plan) + ": reference backend (CPU, float64 accumulation, " + std::to_string(thread_count()) +
         " threads)";
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
