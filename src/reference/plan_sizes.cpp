// Placeholder until this family is written: every method reports NOT_SUPPORTED.
#include "error.h"
#include "reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::plan_sizes(moekit_plan& plan) const {
  plan.workspace_bytes = 0;
  plan.saved_bytes = 0;
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
