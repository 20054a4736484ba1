// Fuzz target: the values the run calls on the reference backend read, with well-formed views.
//
// Byte 0 picks the run call (fuzz_ops.h's Op) and whether it is also made on a handle with MOEKIT_HANDLE_VALIDATE, the
// configuration block its shapes and variants (T = 0 included); each edit then changes what a valid call reads rather
// than how its views look: the contents of a tensor (index and offset values out of range, NaN and infinite floats, raw
// bits), whether an optional tensor is passed, which inputs share memory, the scalars (betas, flags, alpha, the
// load-balance numbers, subsample_rows' arguments), the plan, the workspace and the saved buffer (NULL, too small,
// misaligned, its header altered). The Engine (fuzz_call.h) makes the call and checks the property.
#include <cstddef>
#include <cstdint>

#include "fuzz_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moekit_fuzz::fuzz_run_call(data, size, moekit_fuzz::Edits::values);
  return 0;
}
