/* The functions of moekit.h that take a C enum, called from C: a C caller may pass any int as an enum, while in C++
 * an enum value outside the enumerators' range is itself undefined, so the C++ targets pass their ints through here. */
#ifndef MOEKIT_FUZZ_C_CALLS_H
#define MOEKIT_FUZZ_C_CALLS_H

#include <stdint.h>

#include "moekit/moekit.h"

#ifdef __cplusplus
extern "C" {
#endif

moekit_tensor_t fuzz_tensor_make(void* data, int32_t dtype, int32_t rank, const int64_t* shape, moekit_device_t device);
const char* fuzz_status_string(int32_t status);

#ifdef __cplusplus
}
#endif

#endif
