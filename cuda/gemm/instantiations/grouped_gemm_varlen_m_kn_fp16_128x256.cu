// The grouped GEMM tile kernel for varlen M, B [E, k, n], fp16 operands, 128x256 tiles (one instantiation per translation unit).
#include "cuda/gemm/grouped_gemm_kernel.cuh"

template void moekit::cuda::gemm::launch_gemm_tiles<MOEKIT_DTYPE_FP16, moekit::GemmTile::m128_n256,
                                                    moekit::cuda::gemm::Operands::varlen_m_kn>(
    const moekit::cuda::gemm::GroupedGemmProblem&, cudaStream_t);
