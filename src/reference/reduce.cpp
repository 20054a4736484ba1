// Placeholder until this family is written: every method reports NOT_SUPPORTED.
#include "error.h"
#include "reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::combine(const moekit_plan&, const moekit_combine_args_t&, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }
void ReferenceBackend::db1(const moekit_plan&, const moekit_db1_args_t&, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }
void ReferenceBackend::db2_ds(const moekit_plan&, const moekit_db2_ds_args_t&, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
