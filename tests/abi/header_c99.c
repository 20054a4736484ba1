/* moekit.h compiled as strict C99 with every warning an error (the build of this file IS the test), then the
 * layout a C caller sees, printed for comparison with the C++ view (see abi_layout.h). */
#include <moekit/moekit.h>

#include "abi_layout.h"

int main(void) {
  abi_print_layout();
  return 0;
}
