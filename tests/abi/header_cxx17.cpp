// moekit.h compiled as strict C++17 with every warning an error (the build of this file IS the test), then the
// layout a C++ caller sees, printed for comparison with the C view (see abi_layout.h).
#include <moekit/moekit.h>

#include <cstddef>
#include <type_traits>

#include "abi_layout.h"

// The argument structs are plain C data: a C++ caller may memcpy them and the *_init functions fill them.
template <typename T>
constexpr bool is_plain_c_struct = std::is_standard_layout_v<T> && std::is_trivially_copyable_v<T>;

static_assert(is_plain_c_struct<moekit_tensor_t> && is_plain_c_struct<moekit_device_t>,
              "tensor views are plain C structs");
static_assert(offsetof(moekit_handle_desc_t, struct_size) == 0 && offsetof(moekit_moe_desc_t, struct_size) == 0 &&
                  offsetof(moekit_moe_fwd_args_t, struct_size) == 0 &&
                  offsetof(moekit_sparse_ffn_bwd_args_t, struct_size) == 0,
              "every argument struct begins with struct_size");
static_assert(is_plain_c_struct<moekit_moe_fwd_args_t> && is_plain_c_struct<moekit_moe_bwd_args_t> &&
                  is_plain_c_struct<moekit_gemm_args_t> && is_plain_c_struct<moekit_sparse_ffn_fwd_args_t>,
              "argument structs are plain C structs");
static_assert(sizeof(moekit_status_t) == sizeof(int), "moekit_status_t is as wide as an int, in C++ as in C");

int main() {
  abi_print_layout();
  return 0;
}
