#include "fuzz_call.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "capi/validate.h"
#include "capi/value_checks.h"
#include "fuzz_c_calls.h"
#include "fuzz_check.h"

namespace moekit_fuzz {

namespace {

using moekit::capi::dtype_bytes;

// The most bytes a view may address for the harness to back it with memory. A view addressing more, but less than
// kUnbacked, is one a caller may pass with a large enough buffer behind it, so an edit making one is undone; one
// addressing kUnbacked bytes or more describes no memory a 64-bit process can have, so the library must reject it
// before it reads through it (AddressSanitizer reports it if it does not).
constexpr __int128 kMaxBacked = 1 << 18;
constexpr __int128 kUnbacked = static_cast<__int128>(std::numeric_limits<int64_t>::max()) + 1;
constexpr uint8_t kPoison = 0xa5;

// The int64 nearest to v: the edits' arithmetic must not overflow where the library's would.
int64_t clamped(__int128 v) {
  return static_cast<int64_t>(
      std::clamp<__int128>(v, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
}

bool is_integer(int32_t dtype) { return dtype == MOEKIT_DTYPE_INT32 || dtype == MOEKIT_DTYPE_INT64; }

moekit_tensor_t contiguous_view(int32_t dtype, const std::vector<int64_t>& shape) {
  moekit_tensor_t t{};
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int32_t d = t.rank - 1; d >= 0; --d) {
    t.shape[d] = shape[static_cast<size_t>(d)];
    t.stride[d] = stride;
    stride *= std::max<int64_t>(shape[static_cast<size_t>(d)], 1);
  }
  t.device = moekit_device_t{MOEKIT_DEVICE_CPU, 0};
  return t;
}

bool has_zero_extent(const moekit_tensor_t& t) {
  if (t.rank < 1 || t.rank > MOEKIT_MAX_RANK) return false;
  for (int32_t d = 0; d < t.rank; ++d)
    if (t.shape[d] == 0) return true;
  return false;
}

// Where a view's elements lie, for a view the harness can reason about: rank 0..4, no negative extent, a known
// dtype. `bytes` is the distance from data to the end of its furthest element (0 without elements).
struct Footprint {
  bool known = false;
  __int128 bytes = 0;
  __int128 elements = 0;
};

Footprint footprint(const moekit_tensor_t& t) {
  Footprint f;
  const size_t elem = dtype_bytes(t.dtype);
  if (t.rank < 0 || t.rank > MOEKIT_MAX_RANK || elem == 0) return f;
  __int128 last = 0, elements = 1;
  for (int32_t d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0) return f;
    elements = std::min<__int128>(elements * t.shape[d], kUnbacked);
    if (t.shape[d] > 1) {
      const __int128 stride = t.stride[d] < 0 ? -static_cast<__int128>(t.stride[d]) : t.stride[d];
      last = std::min<__int128>(last + (t.shape[d] - 1) * stride, kUnbacked);
    }
  }
  f.known = true;
  f.elements = elements;
  f.bytes = elements == 0 ? 0 : std::min<__int128>((last + 1) * static_cast<__int128>(elem), kUnbacked);
  return f;
}

// The element offsets of a view the harness backed (known footprint within kMaxBacked), in row-major order.
std::vector<int64_t> element_offsets(const moekit_tensor_t& t) {
  std::vector<int64_t> offsets;
  const Footprint f = footprint(t);
  if (!f.known || f.bytes > kMaxBacked || f.elements > kMaxBacked) return offsets;
  for (int32_t d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1 && t.stride[d] < 0) return offsets;
  offsets.resize(static_cast<size_t>(f.elements));
  for (size_t i = 0; i < offsets.size(); ++i) {
    int64_t linear = static_cast<int64_t>(i), offset = 0;
    for (int32_t d = t.rank - 1; d >= 0; --d) {
      offset += (linear % t.shape[d]) * (t.shape[d] > 1 ? t.stride[d] : 0);
      linear /= t.shape[d];
    }
    offsets[i] = offset;
  }
  return offsets;
}

// Values exact in bf16, fp16, fp32 and fp64 alike.
const double kSmall[] = {0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, 1.5, -0.75, 3.0, -3.0, 0.125, -1.25, 0.375, 4.0};

uint16_t to_fp16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  if ((bits & 0x7fffffffu) == 0) return static_cast<uint16_t>(sign);
  if (exponent <= 0) return static_cast<uint16_t>(sign);
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) | ((bits >> 13) & 0x3ffu));
}

void store(uint8_t* p, int32_t dtype, double value, int64_t integer) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: {
      const float f = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      const uint16_t half = static_cast<uint16_t>(bits >> 16);
      std::memcpy(p, &half, sizeof(half));
      return;
    }
    case MOEKIT_DTYPE_FP16: {
      const uint16_t half = to_fp16(static_cast<float>(value));
      std::memcpy(p, &half, sizeof(half));
      return;
    }
    case MOEKIT_DTYPE_FP32: {
      const float f = static_cast<float>(value);
      std::memcpy(p, &f, sizeof(f));
      return;
    }
    case MOEKIT_DTYPE_FP64: std::memcpy(p, &value, sizeof(value)); return;
    case MOEKIT_DTYPE_INT32: {
      const int32_t i = static_cast<int32_t>(static_cast<uint32_t>(integer));
      std::memcpy(p, &i, sizeof(i));
      return;
    }
    case MOEKIT_DTYPE_INT64: std::memcpy(p, &integer, sizeof(integer)); return;
    default: return;
  }
}

// Whether the element at p is NaN or infinite (-inf excepted when `masked`); an integer never is.
bool non_finite(const uint8_t* p, int32_t dtype, bool masked) {
  double value;
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: {
      uint16_t half;
      std::memcpy(&half, p, sizeof(half));
      const uint32_t bits = static_cast<uint32_t>(half) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      value = f;
      break;
    }
    case MOEKIT_DTYPE_FP16: {
      uint16_t half;
      std::memcpy(&half, p, sizeof(half));
      if ((half & 0x7c00u) != 0x7c00u) return false;
      const double inf = std::numeric_limits<double>::infinity();
      value = (half & 0x3ffu) != 0 ? std::numeric_limits<double>::quiet_NaN() : (half & 0x8000u) ? -inf : inf;
      break;
    }
    case MOEKIT_DTYPE_FP32: {
      float f;
      std::memcpy(&f, p, sizeof(f));
      value = f;
      break;
    }
    case MOEKIT_DTYPE_FP64: std::memcpy(&value, p, sizeof(value)); break;
    default: return false;
  }
  return std::isnan(value) || (std::isinf(value) && !(masked && value < 0));
}

const int32_t kDtypes[] = {MOEKIT_DTYPE_INVALID,
                           MOEKIT_DTYPE_BF16,
                           MOEKIT_DTYPE_FP16,
                           MOEKIT_DTYPE_FP32,
                           MOEKIT_DTYPE_FP64,
                           MOEKIT_DTYPE_INT32,
                           MOEKIT_DTYPE_INT64,
                           MOEKIT_DTYPE_FP8_E4M3,
                           MOEKIT_DTYPE_FP8_E5M2,
                           7,
                           -1,
                           1 << 30};
const moekit_device_t kDevices[] = {{MOEKIT_DEVICE_CPU, 0},
                                    {MOEKIT_DEVICE_CPU, 3},
                                    {MOEKIT_DEVICE_CUDA, 0},
                                    {MOEKIT_DEVICE_CUDA, 1},
                                    {0, 0},
                                    {7, 0},
                                    {-1, -1}};

// A plan of another operation, for the run calls that must turn it away.
moekit_plan_t foreign_plan(moekit_handle_t handle, bool router) {
  static moekit_plan_t plans[2] = {};
  moekit_plan_t& plan = plans[router ? 1 : 0];
  if (plan == nullptr) {
    if (router) {
      moekit_router_desc_t d;
      moekit_router_desc_init(&d);
      d.max_tokens = d.experts = d.top_k = 1;
      moekit_router_plan_create(handle, &d, &plan);
    } else {
      moekit_dispatch_desc_t d;
      moekit_dispatch_desc_init(&d);
      d.max_tokens = d.top_k = d.experts = 1;
      moekit_dispatch_plan_create(handle, &d, &plan);
    }
  }
  return plan;
}

bool ends_with(const std::string& text, const char* ending) {
  const size_t n = std::strlen(ending);
  return text.size() >= n && text.compare(text.size() - n, n, ending) == 0;
}

std::string said(const Outcome& o) {
  return std::string(moekit_status_string(o.status)) + (o.message.empty() ? "" : " \"" + o.message + "\"");
}

// Checks a VALIDATION_FAILED of `call`: from a validating handle, saying whether the operation ran, naming a tensor
// of the call (an output, if it ran). Returns whether it ran.
bool output_failed(const Call& call, const std::string& message) {
  if (!call.validating) violation(call.op, "VALIDATION_FAILED without MOEKIT_HANDLE_VALIDATE: \"" + message + "\"");
  const bool output = ends_with(message, moekit::capi::kOutputFailureEnding);
  if (!output && !ends_with(message, moekit::capi::kInputFailureEnding))
    violation(call.op, "VALIDATION_FAILED does not say whether the operation ran: \"" + message + "\"");
  const std::string name = argument_named(message);
  for (const Slot& slot : call.slots)
    if (slot.name == name && (!output || slot.role != Role::input)) return output;
  violation(call.op, std::string("VALIDATION_FAILED names no ") + (output ? "output" : "tensor") + " of the call: \"" +
                         message + "\"");
}

// A validating call against the same call on a handle without the flag: the same refusal (status and argument; the
// rest may differ, as plan ids do), or, for a bad value the reference backend refuses, VALIDATION_FAILED of an
// input; where that one succeeded, success or VALIDATION_FAILED, and the same bytes in every tensor once the
// operation ran.
void check_agrees(const Call& call, const Outcome& got, const Outcome& plain, bool ran) {
  const std::string versus = ": " + said(got) + ", without MOEKIT_HANDLE_VALIDATE " + said(plain);
  if (plain.status != MOEKIT_SUCCESS) {
    const bool value_refused = plain.status == MOEKIT_STATUS_INVALID_VALUE &&
                               got.status == MOEKIT_STATUS_VALIDATION_FAILED && !ran;
    const bool same = got.status == plain.status && argument_named(got.message) == argument_named(plain.message);
    if (!value_refused && !same) violation(call.op, "a refusal changed with validation" + versus);
    return;
  }
  if (got.status != MOEKIT_SUCCESS && got.status != MOEKIT_STATUS_VALIDATION_FAILED)
    violation(call.op, "validation made a successful call fail" + versus);
  if (ran && got.tensors != plain.tensors) violation(call.op, "validation changed what the call wrote" + versus);
}

}  // namespace

PlanRef own_plan(moekit_plan_t plan) {
  return PlanRef(plan, [](moekit_plan_t p) { moekit_plan_destroy(p); });
}

Block::Block(size_t bytes) : data_(static_cast<uint8_t*>(std::malloc(bytes))), size_(bytes) {
  if (data_ == nullptr && bytes > 0) violation("harness", "out of host memory");
}

Block::~Block() { std::free(data_); }

struct Engine::State {
  struct SlotState {
    moekit_tensor_t view{};
    bool has_data = true;  // false: data NULL
    size_t misalign = 0;
    int alias = -1;  // the slot whose block this one's data lies in
    size_t alias_offset = 0;
    int mode = 0;  // contents: 0 valid, 1 raw bits, 2 boundary values
    uint64_t seed = 0;
    std::vector<std::pair<uint64_t, Edit>> overrides;  // (element, value)
    std::unique_ptr<Block> block;
    std::vector<uint8_t> writable;  // per byte of block: a writable slot's view covers it
  };

  Call& call;
  std::vector<SlotState> slots;
  bool valid = true;            // only edits the contract allows
  bool judged_invalid = false;  // the call's judge says it must fail
  bool coupled_edit = false;    // an edit changed what other arguments must be: presence rules no longer known
  bool clean = true;            // no edit changed what a tensor holds: a validating handle finds no bad input value
  int plan_choice = 0;          // 0 the call's plan, 1 NULL, 2 a plan of another operation, 3 the other plan
  bool null_handle = false;
  bool null_args = false;
  int workspace_choice = 0;  // 0 NULL, 1 a small misaligned block
  size_t workspace_bytes = 0;
  int saved_choice = 0;  // 0 the buffer, 1 NULL, 2 misaligned by 8 bytes
  size_t saved_bytes;
  std::vector<std::pair<size_t, uint8_t>> saved_flips;  // (byte of the header, xor mask)
  std::unique_ptr<Block> workspace, saved;
  std::vector<uint8_t> saved_writable;

  State(Call& c, uint64_t seed) : call(c), slots(c.slots.size()), saved_bytes(c.saved_bytes) {
    for (size_t i = 0; i < slots.size(); ++i) {
      SlotState& s = slots[i];
      const Slot& slot = c.slots[i];
      s.seed = seed ^ (0x1000193ull * (i + 1));
      if (slot.passed) {
        s.view = contiguous_view(slot.dtype, slot.shape);
      } else {
        s.has_data = false;
      }
    }
  }

  size_t slot_count() const { return slots.size(); }

  void invalidate() { valid = false; }

  // A view counts as passed when it has data or no elements.
  bool present(size_t i) const { return slots[i].has_data || has_zero_extent(slots[i].view); }

  // A presence toggle: passed <-> absent.
  void toggle_presence(size_t i) {
    SlotState& s = slots[i];
    const Slot& slot = call.slots[i];
    const bool passing = !present(i);
    if (passing) {
      s.view = contiguous_view(slot.dtype, slot.shape);
      s.has_data = true;
    } else {
      s.view = moekit_tensor_t{};
      s.has_data = false;
    }
    const bool allowed = slot.presence == Presence::optional || slot.presence == Presence::ignored ||
                         (slot.presence == Presence::required && passing) ||
                         (slot.presence == Presence::forbidden && !passing);
    if (!allowed) invalidate();
  }

  void alias(size_t i, uint64_t raw) {
    const size_t owner = raw % slots.size();
    if (owner == i) return;
    SlotState& s = slots[i];
    s.alias = static_cast<int>(owner);
    const size_t elem = std::max<size_t>(dtype_bytes(s.view.dtype), 1);
    s.alias_offset = ((raw >> 8) % 16) * elem;
    clean = false;
    // Inputs may share memory; the contents of one then overwrite the other's, so only slots that take any value
    // stay valid.
    const auto any_value = [this](size_t k) {
      const Slot& slot = call.slots[k];
      return slot.role == Role::input && (slot.content.kind == Content::floats || slot.content.any);
    };
    if (!any_value(i) || !any_value(owner)) invalidate();
  }

  void view_edit(size_t i, const Edit& e) {
    SlotState& s = slots[i];
    moekit_tensor_t& v = s.view;
    const moekit_tensor_t before = v;
    const int d = (e.arg >> 2) % MOEKIT_MAX_RANK;
    switch (e.kind % 16) {
      case 0: toggle_presence(i); return;
      case 1:
        s.has_data = false;
        if (!has_zero_extent(v) && call.slots[i].presence != Presence::optional &&
            call.slots[i].presence != Presence::ignored)
          invalidate();
        return;
      case 2:
        v.dtype = kDtypes[e.raw % (sizeof(kDtypes) / sizeof(kDtypes[0]))];
        if (v.dtype != before.dtype) invalidate();
        break;
      case 3:
        v.rank = static_cast<int32_t>(e.int64(v.rank));
        if (v.rank != before.rank) invalidate();
        break;
      case 4:
        v.shape[d] = e.int64(v.shape[d]);
        if (v.shape[d] != before.shape[d]) invalidate();
        break;
      case 5:
        v.stride[d] = e.int64(v.stride[d]);
        if (v.stride[d] != before.stride[d] && d < v.rank && v.shape[d] > 1) invalidate();
        break;
      case 6: {
        // Wider rows, a view into a larger buffer: still valid.
        if (v.rank < 2 || v.rank > MOEKIT_MAX_RANK) return;
        const int dim = static_cast<int>(e.raw % static_cast<uint64_t>(v.rank - 1));
        v.stride[dim] = clamped(static_cast<__int128>(v.stride[dim]) * static_cast<int64_t>(1 + e.raw % 3) +
                                static_cast<int64_t>((e.raw >> 8) % 5));
        for (int outer = dim - 1; outer >= 0; --outer)
          v.stride[outer] = std::max(v.stride[outer], clamped(static_cast<__int128>(v.stride[outer + 1]) *
                                                              std::max<int64_t>(v.shape[outer + 1], 1)));
        break;
      }
      case 7:
        v.device = kDevices[e.raw % (sizeof(kDevices) / sizeof(kDevices[0]))];
        if (v.device.type != MOEKIT_DEVICE_CPU) invalidate();
        break;
      case 8:
        v.reserved[e.arg & 1] = e.raw;
        if (e.raw != 0) invalidate();
        break;
      case 9:
        s.misalign = 1 + e.raw % 15;
        if (s.misalign % std::max<size_t>(dtype_bytes(v.dtype), 1) != 0) invalidate();
        break;
      case 10: alias(i, e.raw); break;
      case 11: {
        const int32_t rank = static_cast<int32_t>(e.int64(v.rank));
        const bool with_shape = e.arg & 0x10;
        const moekit_tensor_t made = fuzz_tensor_make(nullptr, v.dtype, rank, with_shape ? v.shape : nullptr, v.device);
        if (std::memcmp(&made, &v, sizeof(made)) != 0) invalidate();
        v = made;
        break;
      }
      case 12: {
        const size_t other = e.raw % slots.size();
        std::swap(v, slots[other].view);
        std::swap(s.has_data, slots[other].has_data);
        if (std::memcmp(&v, &slots[other].view, sizeof(v)) != 0) invalidate();
        break;
      }
      case 13: {
        const int a = static_cast<int>(e.raw % MOEKIT_MAX_RANK), b = static_cast<int>((e.raw >> 8) % MOEKIT_MAX_RANK);
        std::swap(v.shape[a], v.shape[b]);
        std::swap(v.stride[a], v.stride[b]);
        if (std::memcmp(&v, &before, sizeof(v)) != 0) invalidate();
        break;
      }
      case 14:
        // A dimension of extent 0 or 1 is never stepped along: any stride is valid there.
        if (d >= v.rank || v.shape[d] > 1) return;
        v.stride[d] = e.int64(v.stride[d]);
        break;
      default:
        v.stride[d] = clamped(std::max<__int128>(static_cast<__int128>(v.stride[d]) - 1 - (e.raw % 2), 0));
        if (d < v.rank && v.shape[d] > 1 && v.stride[d] != before.stride[d]) invalidate();
        break;
    }
    // An edit that asks for more memory than the harness backs, but that a caller could back, is undone.
    const Footprint f = footprint(v);
    if (f.known && f.bytes > kMaxBacked && f.bytes < kUnbacked) v = before;
  }

  void value_edit(size_t i, const Edit& e) {
    SlotState& s = slots[i];
    const Content& content = call.slots[i].content;
    const bool any_value = content.kind == Content::floats || content.any;
    switch (e.kind % 6) {
      case 0:
      case 1: s.mode = 1 + e.kind % 2; break;
      case 2: s.overrides.emplace_back(e.raw, e); break;
      case 3: toggle_presence(i); return;
      case 4: alias(i, e.raw); return;
      default: s.seed ^= e.raw; return;
    }
    // New contents: an output's are never filled, so they change nothing.
    if (!any_value) invalidate();
    if (call.slots[i].role != Role::output) clean = false;
  }

  // Edits of what is not a tensor: the plan, the argument struct, the workspace, the saved buffer, the scalars.
  static constexpr size_t kSpecials = 4;

  void special_edit(size_t which, const Edit& e) {
    switch (which) {
      case 0:
        if (!call.plan) {
          null_handle = true;
          invalidate();
        } else {
          plan_choice = 1 + e.kind % 3;
          const bool other_is_valid = call.saved_use != Call::Saved::backward;
          if (plan_choice != 3 || !other_is_valid) invalidate();
          if (plan_choice == 3 && !call.other_plan) plan_choice = 0;
        }
        return;
      case 1:
        if (!call.struct_size) return;  // a host function of plain arguments
        if (e.kind % 2 == 0) {
          null_args = true;
          invalidate();
        } else if (call.struct_size) {
          *call.struct_size = static_cast<size_t>(e.int64(static_cast<int64_t>(call.struct_bytes)));
          if (*call.struct_size < call.struct_bytes) invalidate();
        }
        return;
      case 2:
        // The reference backend needs no workspace: NULL, misaligned and any size are all valid.
        if (e.kind % 2 == 0)
          workspace_choice = 1;
        else
          workspace_bytes = static_cast<size_t>(e.int64(0));
        return;
      default:
        if (call.saved_use == Call::Saved::none) return;
        switch (e.kind % 4) {
          case 0:
            saved_choice = 1;
            if (call.saved_bytes > 0) invalidate();
            return;
          case 1:
            saved_bytes = static_cast<size_t>(e.int64(static_cast<int64_t>(call.saved_bytes)));
            if (saved_bytes < call.saved_bytes) invalidate();
            return;
          case 2:
            saved_choice = 2;
            if (call.saved_bytes > 0) invalidate();
            return;
          default: {
            // The header: magic, plan id, tokens, then 8 reserved bytes. A forward writes it over.
            const size_t byte = e.raw % 32;
            saved_flips.emplace_back(byte, static_cast<uint8_t>(e.arg | 1));
            return;
          }
        }
    }
  }

  void scalar_edit(const Scalar& scalar, const Edit& e) {
    double value;
    if (scalar.real) {
      value = *scalar.real = e.real();
    } else if (scalar.i32) {
      *scalar.i32 = static_cast<int32_t>(e.int64(*scalar.i32));
      value = *scalar.i32;
    } else {
      *scalar.i64 = e.int64(*scalar.i64);
      value = static_cast<double>(*scalar.i64);
    }
    if (!scalar.valid || !scalar.valid(value)) invalidate();
    if (!scalar.valid) coupled_edit = true;
  }

  void edit(const Edit& e, bool views) {
    std::vector<bool> was_present(slot_count());
    for (size_t i = 0; i < slot_count(); ++i) was_present[i] = present(i);
    apply(e, views);
    // Any edit that passes or drops a coupled slot (a toggle, dropped data, a swap, a remade view) changes what
    // the others must be: the call's validity is no longer known.
    for (size_t i = 0; i < slot_count(); ++i)
      if (call.slots[i].coupled && was_present[i] != present(i)) {
        invalidate();
        coupled_edit = true;
      }
  }

  void apply(const Edit& e, bool views) {
    const size_t targets = slot_count() + kSpecials + call.scalars.size();
    const size_t target = e.target % targets;
    if (target < slot_count()) {
      if (views)
        view_edit(target, e);
      else
        value_edit(target, e);
    } else if (target < slot_count() + kSpecials) {
      special_edit(target - slot_count(), e);
    } else {
      scalar_edit(call.scalars[target - slot_count() - kSpecials], e);
    }
  }

  // Bytes a slot's block must hold from the view's start: its footprint, or the valid view's when the edits made
  // one the library must turn away.
  size_t needed_bytes(size_t i) const {
    const SlotState& s = slots[i];
    Footprint f = footprint(s.view);
    if (!f.known || f.bytes > kMaxBacked) f = footprint(contiguous_view(call.slots[i].dtype, call.slots[i].shape));
    return static_cast<size_t>(f.bytes);
  }

  void lay_out() {
    std::vector<size_t> sizes(slots.size(), 0);
    for (size_t i = 0; i < slots.size(); ++i) {
      SlotState& s = slots[i];
      if (!s.has_data) continue;
      // The end of the chain of aliases (none if the chain runs in a circle).
      int owner = s.alias;
      for (size_t steps = 0; owner >= 0 && slots[static_cast<size_t>(owner)].alias >= 0; ++steps)
        owner = steps < slots.size() ? slots[static_cast<size_t>(owner)].alias : -1;
      if (owner == static_cast<int>(i) || (owner >= 0 && !slots[static_cast<size_t>(owner)].has_data)) owner = -1;
      s.alias = owner;
      const size_t start = owner >= 0 ? s.alias_offset : 0;
      const size_t end = start + s.misalign + needed_bytes(i);
      const size_t o = owner >= 0 ? static_cast<size_t>(owner) : i;
      sizes[o] = std::max(sizes[o], end);
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      SlotState& s = slots[i];
      if (s.has_data && s.alias < 0) {
        s.block = std::make_unique<Block>(sizes[i]);
        std::memset(s.block->data(), call.slots[i].role == Role::output ? kPoison : 0, s.block->size());
        s.writable.assign(s.block->size(), 0);
      }
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      SlotState& s = slots[i];
      if (!s.has_data) {
        s.view.data = nullptr;
        continue;
      }
      Block& block = *slots[s.alias >= 0 ? static_cast<size_t>(s.alias) : i].block;
      s.view.data = block.data() + (s.alias >= 0 ? s.alias_offset : 0) + s.misalign;
    }
    workspace = std::make_unique<Block>(64);
    std::memset(workspace->data(), 0x3c, workspace->size());
  }

  SlotState& owner_of(size_t i) { return slots[slots[i].alias >= 0 ? static_cast<size_t>(slots[i].alias) : i]; }

  // Whether slot i's block holds its data alone: no other slot's lies in it, and it lies in no other's.
  bool alone(size_t i) const {
    if (slots[i].alias >= 0) return false;
    for (const SlotState& other : slots)
      if (other.alias == static_cast<int>(i)) return false;
    return true;
  }

  bool holds_non_finite(size_t i, bool masked) const {
    const moekit_tensor_t& view = *call.slots[i].field;
    const size_t elem = dtype_bytes(view.dtype);
    for (int64_t offset : element_offsets(view))
      if (non_finite(static_cast<const uint8_t*>(view.data) + offset * static_cast<int64_t>(elem), view.dtype, masked))
        return true;
    return false;
  }

  // Before the call: the first input of a valid call that holds a value its Checked refuses; "" if none.
  std::string refused_input() const {
    if (!valid) return "";
    for (size_t i = 0; i < slots.size(); ++i) {
      const Slot& slot = call.slots[i];
      if (slots[i].has_data && slot.role != Role::output && slot.checked != Checked::rows &&
          holds_non_finite(i, slot.checked == Checked::masked))
        return slot.name;
    }
    return "";
  }

  // After a success: the first output the call alone writes that holds NaN or an infinity; "" if none.
  std::string non_finite_output() const {
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].has_data && call.slots[i].role == Role::output && alone(i) && holds_non_finite(i, false))
        return call.slots[i].name;
    return "";
  }

  void fill(size_t i) {
    SlotState& s = slots[i];
    const Slot& slot = call.slots[i];
    if (!s.has_data || slot.role == Role::output) return;
    const std::vector<int64_t> offsets = element_offsets(s.view);
    const size_t elem = dtype_bytes(s.view.dtype);
    const std::vector<int64_t>& table = boundary_int64s();
    std::mt19937_64 rng(s.seed);
    const Content& c = slot.content;
    std::vector<int64_t> ints(offsets.size());
    if (c.kind == Content::offsets) {
      for (size_t k = 1; k < ints.size(); ++k)
        ints[k] = c.hi > 0 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(c.hi + 1)) : 0;
      std::sort(ints.begin(), ints.end());
    }
    const int64_t per_group = slot.shape.size() == 2 ? std::max<int64_t>(slot.shape[1], 1) : 1;
    for (size_t k = 0; k < offsets.size(); ++k) {
      const uint64_t r = rng();
      double value = kSmall[r % (sizeof(kSmall) / sizeof(kSmall[0]))];
      int64_t integer = static_cast<int64_t>(r % 64);
      switch (c.kind) {
        case Content::floats: break;
        case Content::indices:
          integer = c.hi > c.lo ? c.lo + static_cast<int64_t>(r % static_cast<uint64_t>(c.hi - c.lo)) : c.lo;
          break;
        case Content::offsets: integer = ints[k]; break;
        case Content::subsample:
          integer = static_cast<int64_t>(k) / per_group * c.hi + static_cast<int64_t>(r % static_cast<uint64_t>(c.hi));
          break;
      }
      if (s.mode == 1) {
        integer = static_cast<int64_t>(r);
        std::memcpy(&value, &r, sizeof(value));
      } else if (s.mode == 2) {
        integer = table[r % table.size()];
        const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   1e38,
                                   -0.0,
                                   1e-45};
        value = specials[r % (sizeof(specials) / sizeof(specials[0]))];
      }
      if (!is_integer(s.view.dtype) && c.kind != Content::floats) value = static_cast<double>(integer);
      uint8_t* p = static_cast<uint8_t*>(s.view.data) + offsets[k] * static_cast<int64_t>(elem);
      if (s.mode == 1 && !is_integer(s.view.dtype))
        std::memcpy(p, &r, elem);
      else
        store(p, s.view.dtype, value, integer);
    }
    for (const auto& [element, e] : s.overrides) {
      if (offsets.empty()) break;
      uint8_t* p = static_cast<uint8_t*>(s.view.data) + offsets[element % offsets.size()] * static_cast<int64_t>(elem);
      store(p, s.view.dtype, e.real(), e.int64(0));
    }
  }

  // What the call may write through slot i: the view it passes (a judge may have said what a raw pointer gets).
  void mark_writable(size_t i) {
    SlotState& s = slots[i];
    const moekit_tensor_t& view = *call.slots[i].field;
    if (!s.has_data || call.slots[i].role == Role::input) return;
    SlotState& owner = owner_of(i);
    const size_t elem = dtype_bytes(view.dtype);
    const size_t base = static_cast<size_t>(static_cast<const uint8_t*>(view.data) - owner.block->data());
    for (int64_t offset : element_offsets(view))
      for (size_t b = 0; b < elem; ++b) {
        const size_t at = base + static_cast<size_t>(offset) * elem + b;
        if (at < owner.writable.size()) owner.writable[at] = 1;
      }
  }

  void make_saved() {
    if (call.saved_use == Call::Saved::none) return;
    const size_t plan_bytes = call.forward_saved ? call.forward_saved->size() : call.saved_bytes;
    const size_t misalign = saved_choice == 2 ? 8 : 0;
    // NOTE: malloc's 16-byte alignment is the reference backend's rule for saved buffers.
    saved = std::make_unique<Block>(plan_bytes + misalign);
    std::memset(saved->data(), 0, saved->size());
    if (call.forward_saved) std::memcpy(saved->data() + misalign, call.forward_saved->data(), plan_bytes);
    for (const auto& [byte, mask] : saved_flips)
      if (misalign + byte < saved->size()) saved->data()[misalign + byte] ^= mask;
    saved_writable.assign(saved->size(), call.saved_use == Call::Saved::forward ? 1 : 0);
  }

  // Why the contract rejects the call as the edits left it, from rules moekit.h states outright; "" where none
  // applies (the call may still be invalid: the harness does not know every rule).
  std::string rejection() const {
    if (judged_invalid) return "its arguments break the function's rules";
    if (call.plan && plan_choice == 1) return "the plan is NULL";
    if (call.plan && plan_choice == 2) return "the plan is of another operation";
    if (!call.plan && null_handle && call.handle) return "the handle is NULL";
    if (null_args) return "the argument struct is NULL";
    if (call.struct_size && *call.struct_size < call.struct_bytes) return "struct_size is too small";
    for (const Scalar& scalar : call.scalars) {
      const double value = scalar.real ? *scalar.real : scalar.i32 ? *scalar.i32 : static_cast<double>(*scalar.i64);
      if (scalar.valid && !scalar.valid(value)) return scalar.name + " breaks its rule";
    }
    if (call.saved_use != Call::Saved::none && call.saved_bytes > 0) {
      if (saved_choice == 1) return "the saved buffer is NULL";
      if (saved_choice == 2) return "the saved buffer is misaligned";
      if (saved_bytes < call.saved_bytes) return "saved_bytes is too small";
    }
    if (call.saved_use == Call::Saved::backward) {
      if (plan_choice == 3) return "the saved buffer is another plan's";
      const size_t misalign = saved_choice == 2 ? 8 : 0;
      if (std::memcmp(saved->data() + misalign, call.forward_saved->data(), 24) != 0)
        return "the saved buffer's header was altered";
    }
    if (coupled_edit || call.judge) return "";
    for (size_t i = 0; i < slots.size(); ++i) {
      const SlotState& s = slots[i];
      const Slot& slot = call.slots[i];
      const moekit_tensor_t& v = s.view;
      const bool passed = present(i);
      if (slot.presence == Presence::required && !passed) return slot.name + " is missing";
      if (slot.presence == Presence::forbidden && passed) return slot.name + " must be absent";
      if (!passed || slot.presence == Presence::ignored) continue;
      if (v.rank < 0 || v.rank > MOEKIT_MAX_RANK) return slot.name + " has a rank outside 0..4";
      if (v.device.type != MOEKIT_DEVICE_CPU) return slot.name + " is not on the CPU";
      if (v.reserved[0] != 0 || v.reserved[1] != 0) return slot.name + " has reserved fields set";
      const size_t elem = dtype_bytes(v.dtype);
      if (elem > 1 && reinterpret_cast<uintptr_t>(v.data) % elem != 0) return slot.name + " is misaligned";
      int64_t span_after = 1;
      bool empty = false;
      for (int32_t d = v.rank - 1; d >= 0; --d) {
        if (v.shape[d] < 0) return slot.name + " has a negative extent";
        empty = empty || v.shape[d] == 0;
        if (v.shape[d] <= 1) continue;
        if (d == v.rank - 1 && v.stride[d] != 1) return slot.name + "'s last dimension is not contiguous";
        if (v.stride[d] < span_after) return slot.name + "'s strides overlap";
        span_after = clamped(static_cast<__int128>(v.stride[d]) * v.shape[d]);
      }
      if (!empty && elem > 0 && footprint(v).bytes >= kUnbacked) return slot.name + " reaches past 2^63 bytes";
    }
    return "";
  }
};

Engine::Engine(Call& call, uint64_t seed) : s_(std::make_unique<State>(call, seed)) {}
Engine::~Engine() = default;

void Engine::view_edit(const Edit& e) { s_->edit(e, true); }
void Engine::value_edit(const Edit& e) { s_->edit(e, false); }

Outcome Engine::run(const Outcome* plain) {
  State& s = *s_;
  Call& call = s.call;
  s.lay_out();
  for (size_t i = 0; i < s.slots.size(); ++i) s.fill(i);
  for (size_t i = 0; i < s.slots.size(); ++i) *call.slots[i].field = s.slots[i].view;
  if (call.judge) {
    const auto room = [&s](size_t i) -> size_t {
      const State::SlotState& slot = s.slots[i];
      if (!slot.has_data) return 0;
      const Block& block = *s.owner_of(i).block;
      return block.size() - static_cast<size_t>(static_cast<const uint8_t*>(slot.view.data) - block.data());
    };
    switch (call.judge(call, room)) {
      case Call::Verdict::skip: return Outcome{};
      case Call::Verdict::invalid: s.judged_invalid = true; break;
      case Call::Verdict::unknown: s.invalidate(); break;
      case Call::Verdict::valid: break;
    }
  }
  for (size_t i = 0; i < s.slots.size(); ++i) s.mark_writable(i);
  s.make_saved();
  const std::string rejection = s.rejection();

  std::vector<std::string> names = {"plan", "args", "handle", "workspace", "workspace_bytes", "saved", "saved_bytes"};
  std::vector<std::vector<uint8_t>> before;
  std::vector<Block*> blocks;
  for (size_t i = 0; i < s.slots.size(); ++i) {
    names.push_back(call.slots[i].name);
    if (s.slots[i].block) blocks.push_back(s.slots[i].block.get());
  }
  for (const Scalar& scalar : call.scalars) names.push_back(scalar.name);
  blocks.push_back(s.workspace.get());
  if (s.saved) blocks.push_back(s.saved.get());
  for (Block* b : blocks) before.emplace_back(b->data(), b->data() + b->size());

  RunArgs run{};
  switch (s.plan_choice) {
    case 0: run.plan = call.plan.get(); break;
    case 1: run.plan = nullptr; break;
    case 2: run.plan = foreign_plan(call.handle, call.op.rfind("moekit_router", 0) != 0); break;
    default: run.plan = call.other_plan.get(); break;
  }
  run.handle = s.null_handle ? nullptr : call.handle;
  run.null_args = s.null_args;
  run.workspace = s.workspace_choice == 1 ? s.workspace->data() + 3 : nullptr;
  run.workspace_bytes = s.workspace_bytes;
  if (s.saved) {
    run.saved = s.saved_choice == 1 ? nullptr : s.saved->data() + (s.saved_choice == 2 ? 8 : 0);
    run.saved_bytes = s.saved_bytes;
  }

  const std::string refused = call.validating ? s.refused_input() : "";
  mark_last_error();
  Outcome outcome;
  const moekit_status_t status = outcome.status = call.run(run);
  check_status(call.op, status, names);
  if (status != MOEKIT_SUCCESS) outcome.message = last_error(call.op);
  const bool output_failure = status == MOEKIT_STATUS_VALIDATION_FAILED && output_failed(call, outcome.message);
  // The operation ran: it wrote its outputs (and a forward its saved buffer).
  const bool ran = status == MOEKIT_SUCCESS || output_failure;

  for (size_t b = 0; b < blocks.size(); ++b) {
    const Block& block = *blocks[b];
    const std::vector<uint8_t>* writable = nullptr;
    if (ran) {
      if (block.size() == s.saved_writable.size() && blocks[b] == s.saved.get()) writable = &s.saved_writable;
      for (const State::SlotState& slot : s.slots)
        if (slot.block.get() == blocks[b]) writable = &slot.writable;
    }
    for (size_t k = 0; k < block.size(); ++k)
      if (block.data()[k] != before[b][k] && !(writable && (*writable)[k])) {
        std::string where = b + 1 == blocks.size() && s.saved ? "the saved buffer" : "a tensor, the workspace or saved";
        for (size_t i = 0; i < s.slots.size(); ++i)
          if (s.slots[i].block.get() == blocks[b]) where = call.slots[i].name;
        if (blocks[b] == s.workspace.get()) where = "the workspace";
        violation(call.op, std::string(status == MOEKIT_SUCCESS ? "succeeded" : "failed") + " but wrote byte " +
                               std::to_string(k) + " of " + where + (ran ? ", outside every output" : ""));
      }
  }
  for (const State::SlotState& slot : s.slots)
    if (slot.block) outcome.tensors.emplace_back(slot.block->data(), slot.block->data() + slot.block->size());
  if (ran && !refused.empty()) violation(call.op, "ran although its input " + refused + " holds a value it refuses");
  const std::string non_finite = call.validating && status == MOEKIT_SUCCESS ? s.non_finite_output() : "";
  if (!non_finite.empty()) violation(call.op, "passed validation, but its output " + non_finite + " holds NaN or inf");
  if (ran && !rejection.empty())
    violation(call.op, std::string(status == MOEKIT_SUCCESS ? "succeeded" : "ran") + " although " + rejection);
  const bool bad_value_found = status == MOEKIT_STATUS_VALIDATION_FAILED && (output_failure || !s.clean);
  if (status != MOEKIT_SUCCESS && !bad_value_found && s.valid && rejection.empty())
    violation(call.op, "rejected a valid call: " + said(outcome));
  if (plain) check_agrees(call, outcome, *plain, ran);
  return outcome;
}

std::shared_ptr<Block> Engine::take_saved() { return std::shared_ptr<Block>(std::move(s_->saved)); }

}  // namespace moekit_fuzz
