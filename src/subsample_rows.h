// The host helper behind moekit_subsample_rows (docs/math.md section 7): the fixed energy-estimation rows of the sparse
// FFN, drawn reproducibly from a seed by the exact steps moekit.h documents, so any language can redraw them.
#pragma once

#include <cstdint>

namespace moekit {
inline namespace v0 {

// Writes out[num_groups * rows_per_group] (group-major): rows_per_group distinct global neuron ids g*G + j per
// group g. Throws INVALID_VALUE unless num_groups >= 0 and 1 <= rows_per_group <= group_size.
void subsample_rows(uint64_t seed, int64_t num_groups, int64_t group_size, int64_t rows_per_group, int32_t* out);

}  // namespace v0
}  // namespace moekit
