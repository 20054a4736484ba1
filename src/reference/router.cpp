// Placeholder until this family is written: every method reports NOT_SUPPORTED.
#include "error.h"
#include "reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::router_forward(const moekit_plan&, const moekit_router_fwd_args_t&, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }
void ReferenceBackend::router_backward(const moekit_plan&, const moekit_router_bwd_args_t&, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
