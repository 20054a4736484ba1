// The sm_90a grouped GEMM tile kernel (wgmma) for varlen M, B [E, k, n], the STORE and BIAS epilogues, fp16 operands,
// 128x128 tiles, ping-pong consumers (one instantiation per translation unit).
#include "cuda/gemm/grouped_gemm_wgmma_kernel.cuh"

template void moekit::cuda::gemm::launch_wgmma_tiles<MOEKIT_DTYPE_FP16, moekit::GemmTile::m128_n128,
                                                     moekit::cuda::gemm::Operands::varlen_m_kn, false,
                                                     moekit::GemmSchedule::pingpong>(
    const moekit::cuda::gemm::GroupedGemmProblem&, const moekit::cuda::gemm::WgmmaOperandMaps&, int, bool,
    cudaStream_t);
