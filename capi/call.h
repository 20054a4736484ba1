// The preconditions every run function checks before its tensors, and in this order: the plan (non-NULL, made
// for this operation), the argument struct (non-NULL, filled by its *_init function); and after the tensors: the
// workspace and, for layers, the saved-activation buffer. A run function then hands the backend what it got.
#pragma once

#include <cstddef>
#include <string>

#include "src/backend.h"
#include "capi/translate.h"
#include "capi/validate.h"
#include "capi/value_checks.h"
#include "cuda/common/status_error.h"
#include "moekit/moekit.h"
#include "src/plan.h"

namespace moekit {
inline namespace v0 {
namespace capi {

// Throws INVALID_VALUE naming `name` unless p is non-NULL and struct_size is at least `expected` (this
// header's sizeof): the message tells the caller to fill the struct with `init_function`.
void check_struct(const char* name, const void* p, size_t struct_size, size_t expected, const char* init_function);

template <class Struct>
const Struct& checked_struct(const char* name, const Struct* p, const char* init_function) {
  check_struct(name, p, p ? p->struct_size : 0, sizeof(Struct), init_function);
  return *p;
}

// The plan of a run call: non-NULL and created for `kind`.
const moekit_plan& checked_plan(moekit_plan_t plan, OpKind kind);

// The backend and the tensor rules of a checked plan's handle.
Backend& backend_of(const moekit_plan& plan);
TensorRules tensor_rules(const moekit_plan& plan);
TensorRules tensor_rules(const moekit_handle& handle);

// Workspace of a run call that needs `needed` bytes: at least that many (else INSUFFICIENT_WORKSPACE), non-NULL
// when that is > 0, aligned to 256 bytes on a CUDA handle and 16 on the reference one.
Workspace checked_workspace(const moekit_plan& plan, void* workspace, size_t workspace_bytes, size_t needed);

// The saved buffer of a layer forward (writes it) or backward (reads it). A training plan needs a non-NULL buffer
// of at least plan.saved_bytes (else INSUFFICIENT_WORKSPACE), aligned to 256 bytes on a CUDA handle and 16 on
// the reference one; an inference plan needs none for its forward and has no backward (INVALID_VALUE).
enum class SavedUse { forward, backward };
void check_saved(const moekit_plan& plan, SavedUse use, const void* saved, size_t saved_bytes);

// The workspace one direction of a layer needs.
size_t layer_workspace_bytes(const moekit_plan& plan, SavedUse use);

// The body of every *_desc_init / *_args_init: zero the struct (absent tensors, 0 flags) and set struct_size; the
// caller then sets the non-zero defaults.
template <class Struct>
Struct& init_struct(const char* name, Struct* p) {
  if (p == nullptr) throw_invalid(std::string(name) + ": is NULL");
  *p = Struct{};
  p->struct_size = sizeof(Struct);
  return *p;
}

// The body of every layer's *_bwd_args_init: init_struct, then both gradient groups requested (the default).
template <class BwdArgs>
void init_backward_args(BwdArgs* args) {
  BwdArgs& a = init_struct("args", args);
  a.compute_input_grad = 1;
  a.compute_weight_grad = 1;
}

// The body of every run function: plan, argument struct, the operation's tensor checks (`check(plan, args)`),
// workspace (`workspace_need(plan)` bytes), `saved_check(plan)` (a layer's saved buffer); then
// `call(plan, args, workspace)`, which calls the backend. On a handle made with MOEKIT_HANDLE_VALIDATE,
// `values(plan, args)` lists the value checks run around it.
template <class Args, class Check, class Need, class SavedCheck, class Values, class Call>
moekit_status_t run_call(moekit_plan_t plan, OpKind kind, const Args* args, const char* init_function, void* workspace,
                         size_t workspace_bytes, void* stream, Check&& check, Need&& workspace_need,
                         SavedCheck&& saved_check, Values&& values, Call&& call) {
  return translate([&] {
    const moekit_plan& p = checked_plan(plan, kind);
    const Args& a = checked_struct("args", args, init_function);
    check(p, a);
    Workspace ws = checked_workspace(p, workspace, workspace_bytes, workspace_need(p));
    saved_check(p);
    if (!validating(*p.handle)) {
      call(p, a, ws);
      return;
    }
    run_validated(backend_of(p), values(p, a), stream, [&] { call(p, a, ws); });
  });
}

// A building block's run function: run_call without a saved buffer.
template <class Args, class Check, class Values, class Call>
moekit_status_t run_checked(moekit_plan_t plan, OpKind kind, const Args* args, const char* init_function,
                            void* workspace, size_t workspace_bytes, void* stream, Check&& check, Values&& values,
                            Call&& call) {
  return run_call(
      plan, kind, args, init_function, workspace, workspace_bytes, stream, check,
      [](const moekit_plan& p) { return p.workspace_bytes; }, [](const moekit_plan&) {}, values, call);
}

// A layer's run function: run_call with the saved buffer checked after the workspace.
template <class Args, class Check, class Values, class Call>
moekit_status_t run_layer_checked(moekit_plan_t plan, OpKind kind, const Args* args, const char* init_function,
                                  SavedUse use, const void* saved, size_t saved_bytes, void* workspace,
                                  size_t workspace_bytes, void* stream, Check&& check, Values&& values, Call&& call) {
  return run_call(
      plan, kind, args, init_function, workspace, workspace_bytes, stream, check,
      [&](const moekit_plan& p) { return layer_workspace_bytes(p, use); },
      [&](const moekit_plan& p) { check_saved(p, use, saved, saved_bytes); }, values, call);
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
