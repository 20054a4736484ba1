// Every run function of moekit.h as a valid Call (fuzz_call.h) on the reference backend, at small shapes that the
// configuration block chooses:
//   byte 0  bits 0-1 the storage dtype (bf16, fp16, fp32, fp64), bit 2 int64 index tensors, bit 3 fp64 scores in an
//           fp64 plan, bits 4-5 how far the plan's row bound lies above this call's rows
//   byte 1  T, tokens (5; 0..8)            byte 2  E, experts or groups (4; 1..6)   byte 3  K, top-k (2; 1..4, <= E)
//   byte 4  H, hidden or d_model (16; 1..24)  byte 5  I, intermediate (8; 1..12)
//   bytes 6, 7  the operation's variants (router kind, gemm mode and epilogue, activation, biases, flags, ...)
// The layers' backward calls run their forward first (a valid call, checked like any other) for the saved buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fuzz_call.h"
#include "fuzz_input.h"
#include "moekit/moekit.h"

namespace moekit_fuzz {

enum class Op {
  router_forward,
  router_backward,
  dispatch,
  gemm,
  combine,
  broadcast_backward,
  db1,
  db2_ds,
  group_select,
  load_balance_update,
  moe_forward,
  moe_backward,
  experts_forward,
  experts_backward,
  sparse_ffn_forward,
  sparse_ffn_backward,
  subsample_rows,
  count
};

// A reference handle with one worker thread, made once; `validating`: the one made with MOEKIT_HANDLE_VALIDATE.
moekit_handle_t fuzz_handle(bool validating = false);

std::unique_ptr<Call> make_call(Op op, const Config& config, bool validating);

// One input of a run-call target: byte 0 the Op (bits 0-6) and whether the call is also made on the validating
// handle (bit 7), the configuration block, then edits applied to the call's views or to its values
// (Engine::view_edit, Engine::value_edit); each Engine then makes its call and checks it, the validating one
// against the other's outcome.
enum class Edits { views, values };
void fuzz_run_call(const uint8_t* data, size_t size, Edits edits);

}  // namespace moekit_fuzz
