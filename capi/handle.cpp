// Handles (one backend on one device) and the plan queries shared by every operation.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "capi/desc.h"
#include "capi/plan_create.h"
#include "capi/translate.h"
#include "cuda/common/status_error.h"
#include "src/plan.h"
#include "src/reference/reference_backend.h"
#ifdef MOEKIT_WITH_CUDA
#include "src/cuda_backend/cuda_backend.h"
#endif

namespace moekit {
inline namespace v0 {
namespace capi {

const moekit_handle& checked_handle(moekit_handle_t handle) {
  if (handle == nullptr) throw_invalid("handle: is NULL");
  return *handle;
}

namespace {

std::unique_ptr<Backend> make_backend(const moekit_handle_desc_t& desc) {
  if (desc.backend == MOEKIT_BACKEND_REFERENCE) return std::make_unique<ref::ReferenceBackend>(desc.num_threads);
#ifdef MOEKIT_WITH_CUDA
  return std::make_unique<cuda::CudaBackend>(desc.device_index, (desc.flags & MOEKIT_HANDLE_VALIDATE) != 0);
#else
  throw_not_supported("backend: this build of moekit has no CUDA backend");
#endif
}

const moekit_plan& checked_plan_any(moekit_plan_t plan) {
  if (plan == nullptr) throw_invalid("plan: is NULL");
  return *plan;
}

}  // namespace

std::string plan_description(moekit_plan_t plan) noexcept {
  if (plan == nullptr) return {};
  try {
    return plan->handle->backend->describe(*plan);
  } catch (...) {
    // NOTE: only a failed host allocation can land here; the caller then reads "" (length 0).
    return {};
  }
}

void log_plan_description(moekit_plan_t plan) {
  const char* log = std::getenv("MOEKIT_LOG_CONFIG");
  if (log == nullptr || std::strcmp(log, "0") == 0) return;
  std::fprintf(stderr, "moekit: %s\n", plan_description(plan).c_str());
}

namespace {

size_t* checked_output(size_t* bytes) {
  if (bytes == nullptr) throw_invalid("bytes: the output pointer is NULL");
  return bytes;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using moekit::capi::translate;

extern "C" {

MOEKIT_API moekit_status_t moekit_handle_desc_init(moekit_handle_desc_t* desc) {
  return translate([&] { moekit::capi::init_struct("desc", desc).backend = MOEKIT_BACKEND_REFERENCE; });
}

MOEKIT_API moekit_status_t moekit_handle_create(const moekit_handle_desc_t* desc, moekit_handle_t* handle) {
  using namespace moekit::capi;
  return translate([&] {
    moekit_handle_desc_t d = checked_struct("desc", desc, "moekit_handle_desc_init");
    if (handle == nullptr) moekit::throw_invalid("handle: the output pointer is NULL");
    d.struct_size = sizeof(moekit_handle_desc_t);
    require_one_of("backend", d.backend, {MOEKIT_BACKEND_REFERENCE, MOEKIT_BACKEND_CUDA}, "REFERENCE (0), CUDA (1)");
    require_non_negative("device_index", d.device_index);
    if ((d.flags & ~static_cast<uint32_t>(MOEKIT_HANDLE_VALIDATE)) != 0)
      moekit::throw_invalid("flags: unknown bits set (" + std::to_string(d.flags) + ")");
    require_non_negative("num_threads", d.num_threads);
    auto made = std::make_unique<moekit_handle>();
    made->desc = d;
    made->backend = make_backend(d);
    *handle = made.release();
  });
}

MOEKIT_API moekit_status_t moekit_handle_destroy(moekit_handle_t handle) {
  return translate([&] { delete handle; });
}

MOEKIT_API moekit_status_t moekit_plan_destroy(moekit_plan_t plan) {
  return translate([&] { delete plan; });
}

MOEKIT_API moekit_status_t moekit_plan_workspace_size(moekit_plan_t plan, size_t* bytes) {
  return translate([&] {
    const moekit_plan& p = moekit::capi::checked_plan_any(plan);
    *moekit::capi::checked_output(bytes) = p.workspace_bytes;
  });
}

MOEKIT_API moekit_status_t moekit_plan_layer_workspace_sizes(moekit_plan_t plan, size_t* forward_bytes,
                                                             size_t* backward_bytes) {
  return translate([&] {
    const moekit_plan& p = moekit::capi::checked_plan_any(plan);
    if (forward_bytes != nullptr) *forward_bytes = p.forward_workspace_bytes;
    if (backward_bytes != nullptr) *backward_bytes = p.backward_workspace_bytes;
  });
}

MOEKIT_API moekit_status_t moekit_plan_saved_size(moekit_plan_t plan, size_t* bytes) {
  return translate([&] {
    const moekit_plan& p = moekit::capi::checked_plan_any(plan);
    *moekit::capi::checked_output(bytes) = p.saved_bytes;
  });
}

MOEKIT_API size_t moekit_plan_describe(moekit_plan_t plan, char* buf, size_t cap) {
  return moekit::capi::copy_text(moekit::capi::plan_description(plan), buf, cap);
}

}  // extern "C"
