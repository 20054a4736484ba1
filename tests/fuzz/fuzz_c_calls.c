#include "fuzz_c_calls.h"

moekit_tensor_t fuzz_tensor_make(void* data, int32_t dtype, int32_t rank, const int64_t* shape,
                                 moekit_device_t device) {
  return moekit_tensor_make(data, dtype, rank, shape, device);
}

const char* fuzz_status_string(int32_t status) { return moekit_status_string(status); }
