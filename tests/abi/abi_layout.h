/* Prints the size of every public struct of moekit.h and the value of every public constant, one per line.
 * Included by header_c99.c and header_cxx17.cpp: the two outputs must be identical (C and C++ callers see one
 * layout), and on LP64 platforms equal to layout_lp64.txt (a changed size or value is an ABI change, made on
 * purpose by updating that file). */
#ifndef MOEKIT_TESTS_ABI_LAYOUT_H
#define MOEKIT_TESTS_ABI_LAYOUT_H

#include <stdio.h>

#include <moekit/moekit.h>

#define ABI_PRINT_SIZE(type) printf("sizeof(%s) = %u\n", #type, (unsigned)sizeof(type))
#define ABI_PRINT_VALUE(name) printf("%s = %lld\n", #name, (long long)(name))

static void abi_print_layout(void) {
  ABI_PRINT_VALUE(MOEKIT_VERSION_MAJOR);
  ABI_PRINT_VALUE(MOEKIT_VERSION_MINOR);
  ABI_PRINT_VALUE(MOEKIT_VERSION_PATCH);
  ABI_PRINT_VALUE(MOEKIT_VERSION_NUMBER);
  ABI_PRINT_VALUE(MOEKIT_MAX_RANK);

  ABI_PRINT_VALUE(MOEKIT_SUCCESS);
  ABI_PRINT_VALUE(MOEKIT_STATUS_INVALID_VALUE);
  ABI_PRINT_VALUE(MOEKIT_STATUS_NOT_SUPPORTED);
  ABI_PRINT_VALUE(MOEKIT_STATUS_INSUFFICIENT_WORKSPACE);
  ABI_PRINT_VALUE(MOEKIT_STATUS_OUT_OF_MEMORY);
  ABI_PRINT_VALUE(MOEKIT_STATUS_EXECUTION_FAILED);
  ABI_PRINT_VALUE(MOEKIT_STATUS_INTERNAL_ERROR);

  ABI_PRINT_VALUE(MOEKIT_DTYPE_INVALID);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_BF16);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_FP16);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_FP32);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_FP64);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_INT32);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_INT64);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_FP8_E4M3);
  ABI_PRINT_VALUE(MOEKIT_DTYPE_FP8_E5M2);

  ABI_PRINT_VALUE(MOEKIT_DEVICE_CPU);
  ABI_PRINT_VALUE(MOEKIT_DEVICE_CUDA);
  ABI_PRINT_VALUE(MOEKIT_BACKEND_REFERENCE);
  ABI_PRINT_VALUE(MOEKIT_BACKEND_CUDA);
  ABI_PRINT_VALUE(MOEKIT_HANDLE_VALIDATE);

  ABI_PRINT_VALUE(MOEKIT_ROUTER_SOFTMAX_TOPK);
  ABI_PRINT_VALUE(MOEKIT_ROUTER_TOPK_SOFTMAX);
  ABI_PRINT_VALUE(MOEKIT_ROUTER_TOPK);
  ABI_PRINT_VALUE(MOEKIT_ROUTER_SIGMOID);

  ABI_PRINT_VALUE(MOEKIT_ACT_SWIGLU);
  ABI_PRINT_VALUE(MOEKIT_ACT_GEGLU);
  ABI_PRINT_VALUE(MOEKIT_ACT_REGLU);
  ABI_PRINT_VALUE(MOEKIT_ACT_SWIGLU_OAI);
  ABI_PRINT_VALUE(MOEKIT_ACT_GELU);
  ABI_PRINT_VALUE(MOEKIT_ACT_RELU);
  ABI_PRINT_VALUE(MOEKIT_ACT_SILU);
  ABI_PRINT_VALUE(MOEKIT_ACT_RELU2);
  ABI_PRINT_VALUE(MOEKIT_GLU_CONCAT);
  ABI_PRINT_VALUE(MOEKIT_GLU_INTERLEAVED);

  ABI_PRINT_VALUE(MOEKIT_GEMM_VARLEN_M);
  ABI_PRINT_VALUE(MOEKIT_GEMM_VARLEN_K);
  ABI_PRINT_VALUE(MOEKIT_GEMM_B_NK);
  ABI_PRINT_VALUE(MOEKIT_GEMM_B_KN);
  ABI_PRINT_VALUE(MOEKIT_GEMM_GATHER_NONE);
  ABI_PRINT_VALUE(MOEKIT_GEMM_GATHER_A);
  ABI_PRINT_VALUE(MOEKIT_GEMM_GATHER_B);
  ABI_PRINT_VALUE(MOEKIT_EPILOGUE_STORE);
  ABI_PRINT_VALUE(MOEKIT_EPILOGUE_BIAS);
  ABI_PRINT_VALUE(MOEKIT_EPILOGUE_GATED);
  ABI_PRINT_VALUE(MOEKIT_EPILOGUE_DGATED);

  ABI_PRINT_SIZE(moekit_status_t);
  ABI_PRINT_SIZE(moekit_dtype_t);
  ABI_PRINT_SIZE(moekit_device_t);
  ABI_PRINT_SIZE(moekit_tensor_t);
  ABI_PRINT_SIZE(moekit_handle_t);
  ABI_PRINT_SIZE(moekit_plan_t);
  ABI_PRINT_SIZE(moekit_handle_desc_t);
  ABI_PRINT_SIZE(moekit_router_desc_t);
  ABI_PRINT_SIZE(moekit_router_fwd_args_t);
  ABI_PRINT_SIZE(moekit_router_bwd_args_t);
  ABI_PRINT_SIZE(moekit_dispatch_desc_t);
  ABI_PRINT_SIZE(moekit_dispatch_args_t);
  ABI_PRINT_SIZE(moekit_gemm_desc_t);
  ABI_PRINT_SIZE(moekit_gemm_args_t);
  ABI_PRINT_SIZE(moekit_combine_desc_t);
  ABI_PRINT_SIZE(moekit_combine_args_t);
  ABI_PRINT_SIZE(moekit_bias_grad_desc_t);
  ABI_PRINT_SIZE(moekit_db1_args_t);
  ABI_PRINT_SIZE(moekit_db2_ds_args_t);
  ABI_PRINT_SIZE(moekit_sparse_ffn_desc_t);
  ABI_PRINT_SIZE(moekit_group_select_args_t);
  ABI_PRINT_SIZE(moekit_load_balance_args_t);
  ABI_PRINT_SIZE(moekit_moe_desc_t);
  ABI_PRINT_SIZE(moekit_moe_fwd_args_t);
  ABI_PRINT_SIZE(moekit_moe_bwd_args_t);
  ABI_PRINT_SIZE(moekit_experts_fwd_args_t);
  ABI_PRINT_SIZE(moekit_experts_bwd_args_t);
  ABI_PRINT_SIZE(moekit_token_experts_fwd_args_t);
  ABI_PRINT_SIZE(moekit_token_experts_bwd_args_t);
  ABI_PRINT_SIZE(moekit_sparse_ffn_fwd_args_t);
  ABI_PRINT_SIZE(moekit_sparse_ffn_bwd_args_t);
}

#endif /* MOEKIT_TESTS_ABI_LAYOUT_H */
