// Placeholder until this family is written: every method reports NOT_SUPPORTED.
#include "error.h"
#include "reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::experts_forward(const moekit_plan&, const moekit_experts_fwd_args_t&, void*, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }
void ReferenceBackend::experts_backward(const moekit_plan&, const moekit_experts_bwd_args_t&, const void*, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
