// The grouped GEMM tile kernel for varlen M, B [E, n, k], bf16 operands, 128x128 tiles (one instantiation per translation unit).
#include "cuda/gemm/grouped_gemm_kernel.cuh"

template void moekit::cuda::gemm::launch_gemm_tiles<MOEKIT_DTYPE_BF16, moekit::GemmTile::m128_n128,
                                                    moekit::cuda::gemm::Operands::varlen_m_nk>(
    const moekit::cuda::gemm::GroupedGemmProblem&, cudaStream_t);
