// Picks the group energy + top-kg instantiation for the storage dtype; the instantiations live in
// group_energy_topk_{bf16,fp16}.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sparse_ffn/group_select.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

template <class T>
void launch_group_energy_topk_typed(const GroupEnergyArgs& args, cudaStream_t stream);
extern template void launch_group_energy_topk_typed<__nv_bfloat16>(const GroupEnergyArgs&, cudaStream_t);
extern template void launch_group_energy_topk_typed<__half>(const GroupEnergyArgs&, cudaStream_t);

void launch_group_energy_topk(Storage storage, const GroupEnergyArgs& args, cudaStream_t stream) {
  if (storage == Storage::bf16) launch_group_energy_topk_typed<__nv_bfloat16>(args, stream);
  else launch_group_energy_topk_typed<__half>(args, stream);
}

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
