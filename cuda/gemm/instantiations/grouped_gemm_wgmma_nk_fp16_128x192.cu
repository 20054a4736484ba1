// The sm_90a grouped GEMM tile kernel (wgmma) with pingpong consumers for varlen M, B [E, n, k], the STORE and BIAS
// epilogues, A not gathered, fp16 operands, 128x192 tiles per consumer (one instantiation per translation unit).
#include "cuda/gemm/grouped_gemm_wgmma_kernel.cuh"

template void moekit::cuda::gemm::launch_wgmma_tiles<MOEKIT_DTYPE_FP16, moekit::GemmTile::m128_n192,
                                                     moekit::cuda::gemm::Operands::varlen_m_nk>(
    const moekit::cuda::gemm::GroupedGemmProblem&, const moekit::cuda::gemm::WgmmaOperandMaps&, int, bool,
    cudaStream_t);
