// Fuzz target: the tensor views of every run call on the reference backend.
//
// Byte 0 picks the run call (fuzz_ops.h's Op) and whether it is also made on a handle with MOEKIT_HANDLE_VALIDATE, the
// configuration block its shapes and variants; each edit then changes one view of a valid call (shape, strides, rank,
// dtype, device, reserved fields, NULL data, alignment, overlap with another tensor, a view made by moekit_tensor_make,
// two views swapped, sizes near 2^63) or the call itself (plan, argument struct, workspace, saved buffer, scalars). The
// Engine (fuzz_call.h) makes the call and checks the property.
#include <cstddef>
#include <cstdint>

#include "fuzz_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moekit_fuzz::fuzz_run_call(data, size, moekit_fuzz::Edits::views);
  return 0;
}
