// Placeholder until this family is written: every method reports NOT_SUPPORTED.
#include "error.h"
#include "reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::group_select(const moekit_plan&, const moekit_group_select_args_t&, Workspace, void*) { throw_not_supported("reference: not implemented yet"); }
void ReferenceBackend::load_balance_update(const moekit_load_balance_args_t&, void*) { throw_not_supported("reference: not implemented yet"); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
