// One run call of the C ABI as the fuzz targets see it: the tensor views of its argument struct (slots), its
// scalars, its workspace and saved buffer, and how to make it. A builder of fuzz_ops.h describes a valid call; an
// Engine applies the input's edits to it (to the views, or to the values and buffers), places every tensor in a
// heap block of its own (so AddressSanitizer sees a read or write past any of them), makes the call and checks:
//   - the status and message, as fuzz_check.h says;
//   - a call that does not succeed wrote nothing: every block (outputs poisoned beforehand, inputs, workspace,
//     saved buffer) is byte-identical afterwards;
//   - a call that succeeds wrote only inside its outputs' views (and the saved buffer of a forward);
//   - a call that stayed valid (only edits the contract allows) succeeds, and one the harness knows is invalid
//     does not.
// On a handle made with MOEKIT_HANDLE_VALIDATE the call may also answer VALIDATION_FAILED, which no other handle
// does: for an input (the message ends so, and nothing is written) only when an edit changed a tensor's values,
// for an output (it then wrote inside its outputs' views only) at any time, and always naming a tensor of the call
// (an output for an output). Once the operation ran, no input of a valid call held a value its Checked refuses,
// and after a success no float output holds NaN or an infinity (what the call does not write keeps its finite
// poison). The same call on a handle without the flag is made first, and the validating one must agree with it:
// the same status and argument where it refused, else VALIDATION_FAILED of an input; where it succeeded, success
// or VALIDATION_FAILED, and the same output bytes whenever the operation ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "moekit/moekit.h"

namespace moekit_fuzz {

enum class Role {
  input,   // read only
  output,  // written (read too when a beta asks for it); poisoned before the call
  inout,   // read and written, with valid contents (dscores, ema)
};

// How the contents of an input are made so that the call is valid.
struct Content {
  enum Kind {
    floats,     // any value
    indices,    // integers in [lo, hi)
    offsets,    // non-decreasing from 0, the last at most hi
    subsample,  // row g of [NG, spg]: neuron ids in [g*hi, (g+1)*hi)
  } kind = floats;
  int64_t lo = 0, hi = 0;
  bool any = false;  // indices: the call accepts every value (it drops those out of range)
};

// Whether a valid call passes the tensor.
enum class Presence {
  required,
  optional,
  forbidden,  // must be absent
  ignored,    // never read (a gradient not requested): either is valid
};

// Which values of a floating-point input (or inout) a validating handle must refuse before the operation runs.
enum class Checked {
  all,     // NaN or infinite, anywhere in the tensor
  masked,  // NaN or +inf, anywhere (logits: -inf masks an expert)
  rows,    // only in the rows the call reads, which the harness does not follow (grouped tensors)
};

struct Slot {
  std::string name;
  moekit_tensor_t* field;
  int32_t dtype;
  std::vector<int64_t> shape;
  Role role;
  Content content;
  Presence presence = Presence::required;
  bool passed = true;    // the call as built passes it (false: absent)
  bool coupled = false;  // whether it is passed changes what the other slots must be
  Checked checked = Checked::all;
};

// A scalar field of the argument struct (or of the call) an edit may set.
struct Scalar {
  std::string name;
  double* real = nullptr;
  int32_t* i32 = nullptr;
  int64_t* i64 = nullptr;
  std::function<bool(double)> valid;  // nullptr: any value may make the call invalid
};

using PlanRef = std::shared_ptr<moekit_plan>;
PlanRef own_plan(moekit_plan_t plan);

// Heap bytes of exactly the asked size (AddressSanitizer guards both ends).
class Block {
 public:
  explicit Block(size_t bytes);
  ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};

// What the run function passes besides the argument struct.
struct RunArgs {
  moekit_plan_t plan;
  moekit_handle_t handle;
  bool null_args;
  void* workspace;
  size_t workspace_bytes;
  void* saved;
  size_t saved_bytes;
};

struct Call {
  std::string op;
  bool validating = false;  // the plans and the handle were made with MOEKIT_HANDLE_VALIDATE
  PlanRef plan;
  PlanRef other_plan;  // the same operation, another plan (its saved buffers are not this plan's)
  moekit_handle_t handle = nullptr;
  std::shared_ptr<void> args;
  size_t* struct_size = nullptr;
  size_t struct_bytes = 0;  // sizeof the argument struct
  std::vector<Slot> slots;
  std::vector<Scalar> scalars;
  enum class Saved { none, forward, backward } saved_use = Saved::none;
  size_t saved_bytes = 0;                // what the plan needs (0: inference)
  std::shared_ptr<Block> forward_saved;  // backward: what the forward of `plan` left
  std::function<moekit_status_t(const RunArgs&)> run;
  // A host function without a plan may judge an input itself once the views are laid out; `room(i)` is how many
  // bytes slot i's data has behind it. It may shrink what would not fit, or skip an input the harness cannot make
  // a defined call of.
  enum class Verdict { skip, invalid, unknown, valid };
  std::function<Verdict(Call&, const std::function<size_t(size_t)>& room)> judge;
};

// What a call left: its status, its message (on a failure) and the bytes of every tensor's block afterwards.
struct Outcome {
  moekit_status_t status = MOEKIT_SUCCESS;
  std::string message;
  std::vector<std::vector<uint8_t>> tensors;
};

class Engine {
 public:
  Engine(Call& call, uint64_t seed);
  ~Engine();

  // Edits of the tensor views (shape, strides, dtype, rank, device, NULL data, alignment, overlap, ...).
  void view_edit(const Edit& e);
  // Edits of the contents, the scalars, the presence of optional tensors, the workspace and the saved buffer.
  void value_edit(const Edit& e);
  // Lays the views out, fills them, makes the call and checks the property. A validating call is also checked
  // against `plain`, what the same call with the same edits left on a handle without the flag.
  Outcome run(const Outcome* plain = nullptr);
  // The saved buffer after run() (what a forward filled).
  std::shared_ptr<Block> take_saved();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace moekit_fuzz
