// The one way a plan is made: check the handle, the descriptor struct and the output pointer, let the operation's
// `resolve` check the fields and fill in the defaults, copy the result into a fresh plan with a new id, and ask
// the backend for its sizes. The caller's *plan is written only when everything succeeded.
#pragma once

#include <memory>
#include <string>

#include "src/backend.h"
#include "capi/call.h"
#include "capi/translate.h"
#include "cuda/common/status_error.h"
#include "src/plan.h"

namespace moekit {
inline namespace v0 {
namespace capi {

const moekit_handle& checked_handle(moekit_handle_t handle);

// The plan's moekit_plan_describe text; "" for NULL. Never throws.
std::string plan_description(moekit_plan_t plan) noexcept;

// With MOEKIT_LOG_CONFIG set (and not "0"), prints the new plan's description on stderr, once.
void log_plan_description(moekit_plan_t plan);

template <class Desc>
moekit_status_t create_plan(moekit_handle_t handle, const Desc* desc, moekit_plan_t* plan, OpKind kind,
                            Desc moekit_plan::*member, const char* init_function,
                            void (*resolve)(const moekit_handle&, Desc&)) {
  return translate([&] {
    const moekit_handle& h = checked_handle(handle);
    Desc resolved = checked_struct("desc", desc, init_function);
    if (plan == nullptr) throw_invalid("plan: the output pointer is NULL");
    resolved.struct_size = sizeof(Desc);
    resolve(h, resolved);
    auto made = std::make_unique<moekit_plan>();
    made->kind = kind;
    made->handle = handle;
    made->id = next_plan_id();
    (*made).*member = resolved;
    h.backend->plan_sizes(*made);
    *plan = made.release();
    log_plan_description(*plan);
  });
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
