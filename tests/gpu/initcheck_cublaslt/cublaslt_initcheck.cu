// Shows that compute-sanitizer initcheck does not see the stores of cuBLASLt's kernels: D is written by one
// cuBLASLt matmul into fresh memory, then a plain kernel reads every element of D once. initcheck reports m x n
// uninitialized reads although the sum printed is the product's. run.sh builds and runs it on the GPU machine;
// run_on_device.sh relies on this to accept initcheck reports on reads of cuBLASLt outputs.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>

__global__ void read_all(const __nv_bfloat16* d, size_t n, float* sum) {
  float s = 0;
  for (size_t i = threadIdx.x + size_t(blockIdx.x) * blockDim.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    s += __bfloat162float(d[i]);
  atomicAdd(sum, s);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s M N K\n", argv[0]);
    return 2;
  }
  const int m = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]);
  const size_t workspace_bytes = size_t{4} << 20;
  __nv_bfloat16 *a = nullptr, *b = nullptr, *d = nullptr;
  float* sum = nullptr;
  void* workspace = nullptr;
  cudaMalloc(&a, size_t(m) * k * 2);
  cudaMalloc(&b, size_t(n) * k * 2);
  cudaMalloc(&d, size_t(m) * n * 2);
  cudaMalloc(&sum, sizeof(float));
  cudaMalloc(&workspace, workspace_bytes);
  cudaMemset(a, 0x3c, size_t(m) * k * 2);  // every element 0x3c3c (about 0.0115)
  cudaMemset(b, 0x3c, size_t(n) * k * 2);
  cudaMemset(sum, 0, sizeof(float));

  // Row-major D [m, n] = A [m, k] B^T (B stored [n, k]) is column-major D^T [n, m] = B^T' A^T'.
  cublasLtHandle_t handle;
  cublasLtCreate(&handle);
  cublasLtMatmulDesc_t op;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t transposed = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof(transposed));
  cublasLtMatrixLayout_t layout_b, layout_a, layout_d;
  cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_16BF, k, n, k);
  cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_16BF, k, m, k);
  cublasLtMatrixLayoutCreate(&layout_d, CUDA_R_16BF, n, m, n);
  cublasLtMatmulPreference_t preference;
  cublasLtMatmulPreferenceCreate(&preference);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof(workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(handle, op, layout_b, layout_a, layout_d, layout_d, preference, 1, &heuristic,
                                 &found);
  const float alpha = 1, beta = 0;
  const int status = cublasLtMatmul(handle, op, &alpha, b, layout_b, a, layout_a, &beta, d, layout_d, d, layout_d,
                                    &heuristic.algo, workspace, workspace_bytes, nullptr);
  read_all<<<64, 256>>>(d, size_t(m) * n, sum);
  float host_sum = 0;
  cudaMemcpy(&host_sum, sum, sizeof(float), cudaMemcpyDeviceToHost);
  std::printf("m %d n %d k %d: algorithms found %d, matmul status %d, sum %g (expected %g), %s\n", m, n, k, found,
              status, host_sum, double(m) * n * k * 0.01147461 * 0.01147461,
              cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
