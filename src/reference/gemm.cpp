// Placeholder until this family is written: every method reports NOT_SUPPORTED.
#include "error.h"
#include "reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::gemm(const moekit_plan&, const moekit_gemm_args_t&, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
