// Fuzz target: handle and plan creation, for every descriptor kind of moekit.h.
//
// Byte 0 picks the kind (handle, router, dispatch, grouped GEMM, combine, bias grad, group select, sparse FFN, MoE
// layer, experts); the configuration block's first 4 bytes are an int moekit_status_string must name (as any
// status, "unknown status" included); each edit sets one field of a valid descriptor of that kind
// (edit.target picks the field, edit.int64 / edit.real give the value) or breaks the call itself (NULL descriptor,
// NULL output pointer, NULL handle). Then the create function runs, and:
//   - the status and message hold to fuzz_check.h's property (the message names a field or argument);
//   - on failure the output pointer still holds what the caller left in it;
//   - on success the plan (or handle) answers its queries: sizes, moekit_plan_describe's text and its truncated
//     copies, and a size query with a NULL output pointer fails naming "bytes".
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/plan_descs.h"
#include "fuzz_c_calls.h"
#include "fuzz_check.h"
#include "fuzz_input.h"
#include "fuzz_ops.h"
#include "moekit/moekit.h"

using namespace moekit_fuzz;

namespace {

// One descriptor field an edit may set.
struct Field {
  const char* name;
  void* p;
  enum Type { i32, u32, i64, u64, real } type;

  void set(const Edit& e) const {
    switch (type) {
      case i32: *static_cast<int32_t*>(p) = static_cast<int32_t>(e.int64(*static_cast<int32_t*>(p))); return;
      case u32: *static_cast<uint32_t*>(p) = static_cast<uint32_t>(e.int64(*static_cast<uint32_t*>(p))); return;
      case i64: *static_cast<int64_t*>(p) = e.int64(*static_cast<int64_t*>(p)); return;
      case u64: {
        const size_t size = *static_cast<size_t*>(p);
        *static_cast<size_t*>(p) = static_cast<size_t>(e.int64(static_cast<int64_t>(size)));
        return;
      }
      case real: *static_cast<double*>(p) = e.real(); return;
    }
  }
};

template <class T>
Field field(const char* name, T& value) {
  if constexpr (std::is_same_v<T, int32_t>) return Field{name, &value, Field::i32};
  if constexpr (std::is_same_v<T, uint32_t>) return Field{name, &value, Field::u32};
  if constexpr (std::is_same_v<T, int64_t>) return Field{name, &value, Field::i64};
  if constexpr (std::is_same_v<T, size_t>) return Field{name, &value, Field::u64};
  if constexpr (std::is_same_v<T, double>) return Field{name, &value, Field::real};
}

// A valid descriptor of each kind: the CPU tests' (cpu/plan_descs.h), and the list of its fields.
struct Descriptors {
  moekit_handle_desc_t handle;
  moekit_router_desc_t router = plan_descs::router_desc();
  moekit_dispatch_desc_t dispatch = plan_descs::dispatch_desc();
  moekit_gemm_desc_t gemm = plan_descs::gated_gemm_desc();
  moekit_combine_desc_t combine = plan_descs::combine_desc();
  moekit_bias_grad_desc_t bias_grad = plan_descs::bias_grad_desc();
  moekit_sparse_ffn_desc_t sparse_ffn = plan_descs::sparse_ffn_desc();
  moekit_moe_desc_t moe = plan_descs::moe_desc();

  Descriptors() {
    moekit_handle_desc_init(&handle);
    handle.num_threads = 1;
  }
};

std::vector<Field> fields_of(int kind, Descriptors& d) {
  switch (kind) {
    case 0: {
      moekit_handle_desc_t& h = d.handle;
      return {field("struct_size", h.struct_size), field("backend", h.backend), field("device_index", h.device_index),
              field("flags", h.flags), field("num_threads", h.num_threads)};
    }
    case 1: {
      moekit_router_desc_t& r = d.router;
      return {field("struct_size", r.struct_size),
              field("max_tokens", r.max_tokens),
              field("experts", r.experts),
              field("top_k", r.top_k),
              field("kind", r.kind),
              field("renormalize", r.renormalize),
              field("scale", r.scale),
              field("dtype", r.dtype),
              field("load_balance_coeff", r.load_balance_coeff),
              field("z_loss_coeff", r.z_loss_coeff)};
    }
    case 2: {
      moekit_dispatch_desc_t& s = d.dispatch;
      return {field("struct_size", s.struct_size),
              field("max_tokens", s.max_tokens),
              field("top_k", s.top_k),
              field("max_pairs", s.max_pairs),
              field("experts", s.experts),
              field("expert_begin", s.expert_begin)};
    }
    case 3: {
      moekit_gemm_desc_t& g = d.gemm;
      return {field("struct_size", g.struct_size),
              field("mode", g.mode),
              field("b_layout", g.b_layout),
              field("gather", g.gather),
              field("epilogue", g.epilogue),
              field("activation", g.activation),
              field("glu_layout", g.glu_layout),
              field("glu_limit", g.glu_limit),
              field("groups", g.groups),
              field("max_rows", g.max_rows),
              field("gather_rows", g.gather_rows),
              field("n", g.n),
              field("k", g.k),
              field("dtype", g.dtype),
              field("out_dtype", g.out_dtype)};
    }
    case 4: {
      moekit_combine_desc_t& c = d.combine;
      return {field("struct_size", c.struct_size), field("max_tokens", c.max_tokens), field("top_k", c.top_k),
              field("max_pairs", c.max_pairs),     field("hidden", c.hidden),         field("dtype", c.dtype)};
    }
    case 5: {
      moekit_bias_grad_desc_t& b = d.bias_grad;
      return {field("struct_size", b.struct_size), field("experts", b.experts),
              field("max_rows", b.max_rows),       field("width", b.width),
              field("max_tokens", b.max_tokens),   field("dtype", b.dtype),
              field("out_dtype", b.out_dtype)};
    }
    case 6:
    case 7: {
      moekit_sparse_ffn_desc_t& s = d.sparse_ffn;
      return {field("struct_size", s.struct_size), field("max_tokens", s.max_tokens),
              field("d_model", s.d_model),         field("d_ff", s.d_ff),
              field("group_size", s.group_size),   field("top_groups", s.top_groups),
              field("subsample", s.subsample),     field("dtype", s.dtype),
              field("inference", s.inference),     field("weight_grad_dtype", s.weight_grad_dtype)};
    }
    default: {
      moekit_moe_desc_t& m = d.moe;
      return {field("struct_size", m.struct_size),
              field("max_tokens", m.max_tokens),
              field("hidden", m.hidden),
              field("intermediate", m.intermediate),
              field("router_experts", m.router_experts),
              field("experts", m.experts),
              field("expert_begin", m.expert_begin),
              field("top_k", m.top_k),
              field("activation", m.activation),
              field("glu_layout", m.glu_layout),
              field("glu_limit", m.glu_limit),
              field("router", m.router),
              field("renormalize", m.renormalize),
              field("router_scale", m.router_scale),
              field("has_b1", m.has_b1),
              field("has_b2", m.has_b2),
              field("inference", m.inference),
              field("dtype", m.dtype),
              field("weight_grad_dtype", m.weight_grad_dtype),
              field("backward_overwrites_saved", m.backward_overwrites_saved),
              field("backward_scratch_in_dw1", m.backward_scratch_in_dw1),
              field("load_balance_coeff", m.load_balance_coeff),
              field("z_loss_coeff", m.z_loss_coeff)};
    }
  }
}

const char* const kKindNames[] = {"moekit_handle_create",
                                  "moekit_router_plan_create",
                                  "moekit_dispatch_plan_create",
                                  "moekit_gemm_plan_create",
                                  "moekit_combine_plan_create",
                                  "moekit_bias_grad_plan_create",
                                  "moekit_group_select_plan_create",
                                  "moekit_sparse_ffn_plan_create",
                                  "moekit_moe_plan_create",
                                  "moekit_experts_plan_create"};
constexpr int kKinds = sizeof(kKindNames) / sizeof(kKindNames[0]);

// The breaks of the call itself, after the fields in edit.target's range.
enum Break { null_desc, null_output, null_handle, kBreaks };

moekit_status_t create(int kind, moekit_handle_t handle, const Descriptors& d, bool null_desc, moekit_plan_t* plan) {
  switch (kind) {
    case 1: return moekit_router_plan_create(handle, null_desc ? nullptr : &d.router, plan);
    case 2: return moekit_dispatch_plan_create(handle, null_desc ? nullptr : &d.dispatch, plan);
    case 3: return moekit_gemm_plan_create(handle, null_desc ? nullptr : &d.gemm, plan);
    case 4: return moekit_combine_plan_create(handle, null_desc ? nullptr : &d.combine, plan);
    case 5: return moekit_bias_grad_plan_create(handle, null_desc ? nullptr : &d.bias_grad, plan);
    case 6: return moekit_group_select_plan_create(handle, null_desc ? nullptr : &d.sparse_ffn, plan);
    case 7: return moekit_sparse_ffn_plan_create(handle, null_desc ? nullptr : &d.sparse_ffn, plan);
    case 8: return moekit_moe_plan_create(handle, null_desc ? nullptr : &d.moe, plan);
    default: return moekit_experts_plan_create(handle, null_desc ? nullptr : &d.moe, plan);
  }
}

// Every *_desc_init rejects NULL, naming "desc".
void check_init_rejects_null(int kind) {
  mark_last_error();
  moekit_status_t status;
  switch (kind) {
    case 0: status = moekit_handle_desc_init(nullptr); break;
    case 1: status = moekit_router_desc_init(nullptr); break;
    case 2: status = moekit_dispatch_desc_init(nullptr); break;
    case 3: status = moekit_gemm_desc_init(nullptr); break;
    case 4: status = moekit_combine_desc_init(nullptr); break;
    case 5: status = moekit_bias_grad_desc_init(nullptr); break;
    case 6:
    case 7: status = moekit_sparse_ffn_desc_init(nullptr); break;
    default: status = moekit_moe_desc_init(nullptr); break;
  }
  if (status == MOEKIT_SUCCESS) violation("*_desc_init(NULL)", "succeeded");
  check_status("*_desc_init(NULL)", status, {"desc"});
}

// A created plan answers its queries.
void check_plan(const std::string& call, moekit_plan_t plan) {
  size_t bytes = 0;
  mark_last_error();
  check_status(call + ": moekit_plan_workspace_size", moekit_plan_workspace_size(plan, &bytes), {});
  check_status(call + ": moekit_plan_saved_size", moekit_plan_saved_size(plan, &bytes), {});
  const moekit_status_t null_bytes = moekit_plan_saved_size(plan, nullptr);
  if (null_bytes == MOEKIT_SUCCESS) violation(call, "moekit_plan_saved_size(plan, NULL) succeeded");
  check_status(call + ": moekit_plan_saved_size(plan, NULL)", null_bytes, {"bytes"});
  const size_t length = moekit_plan_describe(plan, nullptr, 0);
  if (length == 0) violation(call, "moekit_plan_describe gives no text");
  std::string text(length + 1, '#');
  if (moekit_plan_describe(plan, &text[0], text.size()) != length || text[length] != '\0')
    violation(call, "moekit_plan_describe: the copy disagrees with the length query");
  char small[8];
  if (moekit_plan_describe(plan, small, sizeof(small)) != length || small[sizeof(small) - 1] != '\0' ||
      std::strncmp(small, text.c_str(), sizeof(small) - 1) != 0)
    violation(call, "moekit_plan_describe: a truncated copy is not the text's NUL-terminated start");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const int kind = in.byte() % kKinds;
  const Config config{in.config()};
  // The configuration block is otherwise unused: its first 4 bytes are a status to name (any int, as from C).
  int32_t status_value;
  std::memcpy(&status_value, config.bytes.data(), sizeof(status_value));
  const char* status_name = fuzz_status_string(status_value);
  if (status_name == nullptr || *status_name == '\0') violation("moekit_status_string", "no text");
  Descriptors d;
  std::vector<Field> fields = fields_of(kind, d);
  bool breaks[kBreaks] = {};
  while (in.more()) {
    const Edit e = in.edit();
    const size_t target = e.target % (fields.size() + kBreaks);
    if (target < fields.size())
      fields[target].set(e);
    else
      breaks[target - fields.size()] = true;
  }
  check_init_rejects_null(kind);

  const std::string call = kKindNames[kind];
  std::vector<std::string> names = {"desc", "plan", "handle"};
  for (const Field& f : fields) names.push_back(f.name);
  // The caller's output variable: it must hold this on failure.
  void* const untouched = reinterpret_cast<void*>(uintptr_t{0x5a5a5a50});

  mark_last_error();
  if (kind == 0) {
    moekit_handle_t handle = static_cast<moekit_handle_t>(untouched);
    const moekit_status_t status =
        moekit_handle_create(breaks[null_desc] ? nullptr : &d.handle, breaks[null_output] ? nullptr : &handle);
    check_status(call, status, names);
    if (status != MOEKIT_SUCCESS) {
      if (handle != untouched) violation(call, "failed but wrote the output handle");
      return 0;
    }
    if (handle == nullptr || handle == untouched) violation(call, "succeeded without a handle");
    moekit_handle_destroy(handle);
    return 0;
  }

  moekit_plan_t plan = static_cast<moekit_plan_t>(untouched);
  const moekit_status_t status = create(kind, breaks[null_handle] ? nullptr : fuzz_handle(), d, breaks[null_desc],
                                        breaks[null_output] ? nullptr : &plan);
  check_status(call, status, names);
  if (status != MOEKIT_SUCCESS) {
    if (plan != untouched) violation(call, "failed but wrote the output plan");
    return 0;
  }
  if (plan == nullptr || plan == untouched) violation(call, "succeeded without a plan");
  check_plan(call, plan);
  moekit_plan_destroy(plan);
  return 0;
}
