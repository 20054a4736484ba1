// The bf16 instantiation of the group energy + top-kg kernel (one instantiation per translation unit).
#include "cuda/sparse_ffn/group_energy_topk.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

template void launch_group_energy_topk_typed<__nv_bfloat16>(const GroupEnergyArgs&, cudaStream_t);

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
