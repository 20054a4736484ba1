/*
 * moekit.h — the whole public C API of moekit.
 *
 * moekit computes the training (forward and backward) kernels of Mixture-of-Experts layers and of
 * group-sparse SwiGLU FFNs. The math of every operation is written in docs/math.md; this header states the
 * calling contract. It compiles as C99 and as C++ and needs no CUDA header.
 *
 * Conventions that hold for every function below:
 *  - Every function returns moekit_status_t. On any status other than MOEKIT_SUCCESS, nothing the caller
 *    passed as an output was written (one exception: MOEKIT_STATUS_VALIDATION_FAILED for a bad output value,
 *    see MOEKIT_HANDLE_VALIDATE), and moekit_get_last_error() holds a message naming the argument.
 *  - Tensors are borrowed views (moekit_tensor_t). Shapes and strides count elements. A CUDA handle reads
 *    and writes device memory, a reference handle host memory; the view's `device` must match the handle.
 *  - Plan, then run: a plan holds the host decisions for one problem shape (a descriptor whose tensors would
 *    have more than 2^56 elements at the plan's bounds is INVALID_VALUE); the run functions only enqueue
 *    work on the caller's stream (a cudaStream_t passed as void*; NULL = the legacy default stream; ignored
 *    by the reference backend, which computes synchronously). No run function synchronises the host (except on
 *    a handle made with MOEKIT_HANDLE_VALIDATE, a debug mode), and none allocates device memory: scratch memory is
 *    the caller's workspace, whose size the plan reports.
 *  - Shapes that only the device knows (the number of valid token-expert pairs) are bounded on the host:
 *    every grouped tensor has P = tokens * top_k rows (P_max for general routing); rows past the valid count
 *    are never read and never written.
 *  - Thread safety: a handle or plan may be used from any thread, one call at a time per handle; distinct
 *    handles are independent. moekit_get_last_error() is per thread.
 *  - Argument structs begin with `struct_size`; fill them with the matching *_init function, which sets
 *    struct_size and every default, so a program built against an older header keeps working.
 *  - Results are bitwise identical from run to run, stream to stream and buffer to buffer.
 */
#ifndef MOEKIT_MOEKIT_H
#define MOEKIT_MOEKIT_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(MOEKIT_BUILDING_LIBRARY)
#    define MOEKIT_API __declspec(dllexport)
#  else
#    define MOEKIT_API
#  endif
#else
#  define MOEKIT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Version                                                                                          */
/* ------------------------------------------------------------------------------------------------ */

#define MOEKIT_VERSION_MAJOR 0
#define MOEKIT_VERSION_MINOR 2
#define MOEKIT_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH; this encoding never changes. */
#define MOEKIT_VERSION_NUMBER (MOEKIT_VERSION_MAJOR * 10000 + MOEKIT_VERSION_MINOR * 100 + MOEKIT_VERSION_PATCH)

/* The version of the library actually loaded, in the encoding of MOEKIT_VERSION_NUMBER. */
MOEKIT_API int32_t moekit_get_version(void);

/* ------------------------------------------------------------------------------------------------ */
/* Status codes and errors                                                                          */
/* ------------------------------------------------------------------------------------------------ */

/* Values are fixed forever and grouped by category (hundreds). */
typedef enum moekit_status {
  MOEKIT_SUCCESS = 0,
  /* 1xx: the request is malformed — fix the call. */
  MOEKIT_STATUS_INVALID_VALUE = 100,
  MOEKIT_STATUS_VALIDATION_FAILED = 101, /* a handle with MOEKIT_HANDLE_VALIDATE found a bad value in a tensor */
  /* 2xx: a valid request this build or device cannot serve — a framework may fall back. */
  MOEKIT_STATUS_NOT_SUPPORTED = 200,
  /* 3xx: resources. */
  MOEKIT_STATUS_INSUFFICIENT_WORKSPACE = 300, /* the workspace or saved buffer passed is too small */
  MOEKIT_STATUS_OUT_OF_MEMORY = 301,          /* a host allocation (plan, handle) failed */
  /* 4xx: execution. */
  MOEKIT_STATUS_EXECUTION_FAILED = 400, /* a CUDA launch or driver call failed; the message has the CUDA error */
  /* 5xx: a bug in moekit; please report it with the message. */
  MOEKIT_STATUS_INTERNAL_ERROR = 500
} moekit_status_t;

/* Static text naming the status ("MOEKIT_STATUS_INVALID_VALUE"); "unknown status" for other values. */
MOEKIT_API const char* moekit_status_string(moekit_status_t status);

/* Copies this thread's last error message (NUL-terminated, truncated to cap - 1 characters) into buf and
 * returns the full message length (without the NUL). The message of the last call on this thread that did
 * not succeed; "" if none failed. buf may be NULL when cap is 0 (to query the length). */
MOEKIT_API size_t moekit_get_last_error(char* buf, size_t cap);

/* ------------------------------------------------------------------------------------------------ */
/* Tensors                                                                                          */
/* ------------------------------------------------------------------------------------------------ */

typedef enum moekit_dtype {
  MOEKIT_DTYPE_INVALID = 0,
  MOEKIT_DTYPE_BF16 = 1,
  MOEKIT_DTYPE_FP16 = 2,
  MOEKIT_DTYPE_FP32 = 3,
  MOEKIT_DTYPE_FP64 = 4, /* reference backend only (finite-difference checks) */
  MOEKIT_DTYPE_INT32 = 5,
  MOEKIT_DTYPE_INT64 = 6,
  MOEKIT_DTYPE_FP8_E4M3 = 16, /* reserved; not supported yet */
  MOEKIT_DTYPE_FP8_E5M2 = 17  /* reserved; not supported yet */
} moekit_dtype_t;

/* As DLPack's DLDeviceType. */
typedef enum moekit_device_type {
  MOEKIT_DEVICE_CPU = 1,
  MOEKIT_DEVICE_CUDA = 2
} moekit_device_type_t;

typedef struct moekit_device {
  int32_t type;  /* moekit_device_type_t */
  int32_t index; /* CUDA ordinal; 0 for the CPU */
} moekit_device_t;

#define MOEKIT_MAX_RANK 4

/* A borrowed, strided view; moekit never frees it. An "absent" optional tensor has data == NULL (and rank 0, as
 * the *_init functions leave it); a tensor with a zero extent is present even with data == NULL (as PyTorch hands
 * out empty tensors). Strides count elements; the last dimension must be contiguous (stride 1) unless a function
 * says otherwise; the other dimensions need not be contiguous but must not overlap (stride[i] >= stride[i+1] *
 * shape[i+1]; dimensions of extent 1 are exempt), and the furthest element must end less than 2^63 bytes past
 * data (no memory holds more). Data must be aligned to its element size (16 bytes on a CUDA handle for
 * bf16/fp16/fp32 matrices). A tensor "read flat" may have any rank with the stated element count, and must then be
 * contiguous. Tensors of scores and score gradients documented as fp32 may also be fp64 in an fp64 plan (reference
 * backend). */
typedef struct moekit_tensor {
  void* data;
  int32_t dtype; /* moekit_dtype_t */
  int32_t rank;  /* 0..MOEKIT_MAX_RANK */
  int64_t shape[MOEKIT_MAX_RANK];
  int64_t stride[MOEKIT_MAX_RANK];
  moekit_device_t device;
  uint64_t reserved[2]; /* must be 0 (later: fp8 scale tensors) */
} moekit_tensor_t;

/* A contiguous row-major view of `rank` dimensions on `device`. Never fails; shape may be NULL when rank is 0. */
MOEKIT_API moekit_tensor_t moekit_tensor_make(void* data, moekit_dtype_t dtype, int32_t rank, const int64_t* shape,
                                              moekit_device_t device);

/* ------------------------------------------------------------------------------------------------ */
/* Handles and plans                                                                                */
/* ------------------------------------------------------------------------------------------------ */

typedef struct moekit_handle* moekit_handle_t;
typedef struct moekit_plan* moekit_plan_t; /* one type for every operation; each plan knows its operation */

typedef enum moekit_backend {
  MOEKIT_BACKEND_REFERENCE = 0, /* CPU, float64 accumulation: the oracle and a real fallback */
  MOEKIT_BACKEND_CUDA = 1       /* NVIDIA Hopper (sm_90) */
} moekit_backend_t;

enum {
  /* Validation mode: every run function (and moekit_load_balance_update) also checks the VALUES of its tensors,
   * which the argument checks of the host cannot see, and answers the first bad one with
   * MOEKIT_STATUS_VALIDATION_FAILED. Checked:
   *  - expert ids: the router backward's indices in [0, E); token-experts topk_idx in [-1, E) (-1 = "not on this
   *    rank"; other ids outside [0, E), dropped silently without the flag, fail); dispatch indices >= -1 (ids of
   *    other ranks' experts are valid there);
   *  - offsets (expert offsets, tok_offsets): entry 0 is 0, no entry is below the one before, and the last entry
   *    (the count of rows or pairs they claim) is at most the rows P of the tensors they index;
   *  - positions: gather_idx in [0, S) (the gathered source's rows: T), pair_idx in [0, P), grouped_pos in [-1, P),
   *    for the rows below offsets[E] where an offsets tensor says which rows are valid; subsample_rows of group g in
   *    [g*G, (g+1)*G);
   *  - NaN and infinite values in every floating-point input (logits may hold -inf, which masks an expert; not in
   *    topk_weights, where a dropped pair's weight is never read and a valid pair's shows in out), and,
   *    after the computation, in every floating-point output. Grouped tensors are checked only in the rows the call
   *    reads or writes (below offsets[E], or the rows grouped_pos / pair_idx name), never in rows past them.
   * When: at the end of the call, which synchronises its stream. The inputs are checked first; when one fails, the
   * operation is not run and nothing is written. Otherwise the operation runs, its outputs are checked, and a NaN or
   * infinite output also returns VALIDATION_FAILED (the outputs then hold what the operation wrote). The first
   * failure is the first tensor in the order of the argument struct (inputs, then outputs), then its first element
   * in row-major order; the message names the tensor, the element and the rule broken, e.g.
   * "topk_idx: element [3, 1] is outside [-1, 8)" or "out: element [0, 5] is NaN".
   * Cost: the checks read every checked tensor once, and a call synchronises its stream up to twice (a debug mode,
   * not for production runs; docs/reliability.md says how to measure the cost). A CUDA handle with the flag owns a
   * few bytes of device and pinned host memory for the failure record. A validating call cannot be captured in a
   * CUDA graph: on a capturing stream it returns NOT_SUPPORTED and enqueues nothing, so the capture stays valid.
   * Without the flag nothing is checked on the device, and no value makes a CUDA handle read or write out of
   * bounds: the comment of each index tensor says, marked "(CUDA)", whether a bad entry is skipped or clamped (the
   * results are then wrong, never an access outside the tensors). A reference handle reads the values on the host
   * anyway and answers bad offsets and positions with INVALID_VALUE, with or without the flag (with the flag,
   * VALIDATION_FAILED comes first). */
  MOEKIT_HANDLE_VALIDATE = 1u << 0
};

typedef struct moekit_handle_desc {
  size_t struct_size;
  int32_t backend;      /* moekit_backend_t; default REFERENCE */
  int32_t device_index; /* CUDA ordinal; default 0 */
  uint32_t flags;       /* MOEKIT_HANDLE_*; default 0 */
  int32_t num_threads;  /* reference backend worker threads; 0 (default) = hardware concurrency */
} moekit_handle_desc_t;

MOEKIT_API moekit_status_t moekit_handle_desc_init(moekit_handle_desc_t* desc);

/* Creates a handle. NOT_SUPPORTED for a CUDA handle when this build has no CUDA or the device is not sm_90.
 * A handle is cheap; it owns no device memory (with MOEKIT_HANDLE_VALIDATE: a few bytes for its failure record). */
MOEKIT_API moekit_status_t moekit_handle_create(const moekit_handle_desc_t* desc, moekit_handle_t* handle);
/* Accepts NULL. The plans created from a handle must be destroyed before it. */
MOEKIT_API moekit_status_t moekit_handle_destroy(moekit_handle_t handle);

/* Accepts NULL. */
MOEKIT_API moekit_status_t moekit_plan_destroy(moekit_plan_t plan);
/* Bytes of scratch memory every run of this plan needs (0 is possible; then workspace may be NULL).
 * A workspace holds nothing between calls; on a CUDA handle it is device memory aligned to 256 bytes (16 bytes of
 * host memory on a reference handle). */
MOEKIT_API moekit_status_t moekit_plan_workspace_size(moekit_plan_t plan, size_t* bytes);
/* A layer plan's workspace per direction: the bytes its forward and its backward each need (either pointer may be
 * NULL). moekit_plan_workspace_size is the larger, so one buffer of that size serves both; a caller that allocates
 * the workspace per call (a framework's caching allocator) takes only what the direction needs. The backward of an
 * inference plan: 0 (it has none). Any other plan: its workspace size for both. */
MOEKIT_API moekit_status_t moekit_plan_layer_workspace_sizes(moekit_plan_t plan, size_t* forward_bytes,
                                                             size_t* backward_bytes);
/* Bytes of the saved-activation buffer a layer forward fills and its backward reads (layers only; 0 for the
 * building blocks and in inference mode). 256-byte aligned device memory on a CUDA handle (16-byte aligned host
 * memory on a reference handle). */
MOEKIT_API moekit_status_t moekit_plan_saved_size(moekit_plan_t plan, size_t* bytes);
/* What the plan runs, as text: the operation and its dimensions, the sizes, then the backend's choice — on a CUDA
 * handle each grouped GEMM's kernel configuration (kernel family, tile, cluster, transposition, how A, B and C move,
 * and, where a choice depends on the call's beta, alpha, bias or row strides, the kernel of each case); a layer
 * lists its building blocks, one per line. The configuration is fixed when the plan is created: a run executes what
 * this text says. Copies the text (NUL-terminated, truncated to cap - 1 characters) into buf and returns its full
 * length without the NUL, as moekit_get_last_error does; buf may be NULL when cap is 0 (to query the length). A NULL
 * plan gives "" and 0. Setting MOEKIT_LOG_CONFIG=1 prints the same text on stderr once, when a plan is created. */
MOEKIT_API size_t moekit_plan_describe(moekit_plan_t plan, char* buf, size_t cap);

/* ------------------------------------------------------------------------------------------------ */
/* Shared enumerations                                                                              */
/* ------------------------------------------------------------------------------------------------ */

typedef enum moekit_router_kind {
  MOEKIT_ROUTER_SOFTMAX_TOPK = 0, /* top-k of the logits, softmax over the K selected values (SonicMoE) */
  MOEKIT_ROUTER_TOPK_SOFTMAX = 1, /* softmax over all E, then top-k (Qwen) */
  MOEKIT_ROUTER_TOPK = 2,         /* top-k of already-activated logits; renormalising needs positive values */
  MOEKIT_ROUTER_SIGMOID = 3       /* sigmoid, selection by sigmoid + bias, scale (DeepSeek-V3) */
} moekit_router_kind_t;

typedef enum moekit_activation {
  MOEKIT_ACT_SWIGLU = 0,     /* silu(gate) * up */
  MOEKIT_ACT_GEGLU = 1,      /* gelu_tanh(gate) * up */
  MOEKIT_ACT_REGLU = 2,      /* relu(gate) * up */
  MOEKIT_ACT_SWIGLU_OAI = 3, /* gpt-oss: min(gate,L) * sigmoid(1.702 min(gate,L)) * (clamp(up,-L,L) + 1) */
  MOEKIT_ACT_GELU = 16,      /* non-gated (h is I wide): gelu_tanh */
  MOEKIT_ACT_RELU = 17,
  MOEKIT_ACT_SILU = 18,
  MOEKIT_ACT_RELU2 = 19 /* relu(h)^2 */
} moekit_activation_t;

typedef enum moekit_glu_layout {
  MOEKIT_GLU_CONCAT = 0,     /* rows 0..I-1 of each expert's W1 are the gate, I..2I-1 the up projection */
  MOEKIT_GLU_INTERLEAVED = 1 /* even rows gate, odd rows up */
} moekit_glu_layout_t;

/* ------------------------------------------------------------------------------------------------ */
/* Level 1 — Router (docs/math.md section 1)                                                        */
/* ------------------------------------------------------------------------------------------------ */

typedef struct moekit_router_desc {
  size_t struct_size;
  int64_t max_tokens; /* T may be anything in 0..max_tokens at run time */
  int64_t experts;    /* E >= 1 */
  int64_t top_k;      /* 1 <= K <= min(E, 32) */
  int32_t kind;       /* moekit_router_kind_t; default SOFTMAX_TOPK */
  int32_t renormalize; /* kinds TOPK_SOFTMAX, TOPK, SIGMOID: s = r / sum(r); default 0 */
  double scale;       /* SIGMOID kind: multiplies the scores; default 1 */
  int32_t dtype;      /* logits dtype: bf16, fp16, fp32 or fp64 (reference); default bf16 */
  /* Auxiliary losses (docs/math.md section 1.1): finite, >= 0; 0 (default) = off. f_e = the share of the T*K
   * selections that chose e (no gradient), P_e = the mean over the tokens of softmax(logits[t])_e over all E. The
   * load-balancing loss needs a softmax kind (SOFTMAX_TOPK, TOPK_SOFTMAX): NOT_SUPPORTED for TOPK and SIGMOID at
   * plan creation. The z-loss serves every kind. The backward adds their gradients into dlogits before it is
   * rounded. */
  double load_balance_coeff; /* LB = coeff * E * sum_e f_e P_e */
  double z_loss_coeff;       /* Z = coeff * mean_t logsumexp(logits[t])^2 */
} moekit_router_desc_t;

MOEKIT_API moekit_status_t moekit_router_desc_init(moekit_router_desc_t* desc);
MOEKIT_API moekit_status_t moekit_router_plan_create(moekit_handle_t handle, const moekit_router_desc_t* desc,
                                                     moekit_plan_t* plan);

typedef struct moekit_router_fwd_args {
  size_t struct_size;
  moekit_tensor_t logits; /* [T, E] dtype; -inf masks an expert; a row needs >= K finite values */
  moekit_tensor_t bias;   /* [E] fp32, SIGMOID kind only, optional: steers selection, not the scores */
  moekit_tensor_t scores; /* out [T, K] fp32 (or fp64 with fp64 logits), in selection order */
  moekit_tensor_t indices; /* out [T, K] int32 or int64: selected expert ids, value-descending, ties to lower id */
  moekit_tensor_t counts;  /* out [E] int32, optional: pairs selected per expert (overwritten) */
  /* out, optional, and only when the matching coefficient is not 0: the loss value, one fp32 element (fp64 in an
   * fp64 plan) read flat (any rank >= 1), overwritten; 0 when T = 0. */
  moekit_tensor_t load_balance_loss;
  moekit_tensor_t z_loss;
} moekit_router_fwd_args_t;

typedef struct moekit_router_bwd_args {
  size_t struct_size;
  moekit_tensor_t logits;   /* [T, E] the forward's logits */
  moekit_tensor_t indices;  /* [T, K] the forward's indices (always the router's own, even for dropped pairs); an id
                               outside [0, E): the pair is skipped (CUDA) */
  moekit_tensor_t dscores;  /* [T, K] fp32: gradient of the scores (0 for dropped pairs) */
  moekit_tensor_t dlogits;  /* out [T, E] fp32 or the logits dtype */
  int32_t accumulate;       /* 1: dlogits += gradient; 0: dlogits = gradient (old values never read) */
  /* With a coefficient not 0 the backward adds that loss's gradient into dlogits, scaled by the loss's upstream
   * gradient: one fp32 element (fp64 in an fp64 plan) read flat, optional (absent = 1), and only when the
   * coefficient is not 0. The losses' f_e is counted from `indices`. */
  moekit_tensor_t dload_balance_loss;
  moekit_tensor_t dz_loss;
} moekit_router_bwd_args_t;

MOEKIT_API moekit_status_t moekit_router_fwd_args_init(moekit_router_fwd_args_t* args);
MOEKIT_API moekit_status_t moekit_router_bwd_args_init(moekit_router_bwd_args_t* args);
MOEKIT_API moekit_status_t moekit_router_forward(moekit_plan_t plan, const moekit_router_fwd_args_t* args,
                                                 void* workspace, size_t workspace_bytes, void* stream);
MOEKIT_API moekit_status_t moekit_router_backward(moekit_plan_t plan, const moekit_router_bwd_args_t* args,
                                                  void* workspace, size_t workspace_bytes, void* stream);

/* ------------------------------------------------------------------------------------------------ */
/* Level 1 — Dispatch metadata: the deterministic CSR (docs/math.md section 2)                      */
/* ------------------------------------------------------------------------------------------------ */

typedef struct moekit_dispatch_desc {
  size_t struct_size;
  int64_t max_tokens;   /* T bound */
  int64_t top_k;        /* K >= 1 for fixed routing; 0 selects general routing */
  int64_t max_pairs;    /* general routing: P_max; ignored (= T*K) for fixed routing */
  int64_t experts;      /* local experts E >= 1 */
  int64_t expert_begin; /* e0: global id of local expert 0 (expert parallelism); default 0 */
} moekit_dispatch_desc_t;

MOEKIT_API moekit_status_t moekit_dispatch_desc_init(moekit_dispatch_desc_t* desc);
MOEKIT_API moekit_status_t moekit_dispatch_plan_create(moekit_handle_t handle, const moekit_dispatch_desc_t* desc,
                                                       moekit_plan_t* plan);

typedef struct moekit_dispatch_args {
  size_t struct_size;
  /* Fixed routing: */
  moekit_tensor_t indices;     /* [T, K] int32/int64 global expert ids; ids outside [e0, e0+E) drop the pair */
  /* General routing (top_k = 0): the pairs sorted by token; indices is then [P] int32/int64 ids, where this
   * call's P (<= max_pairs) is its row count, and every output below has P rows */
  moekit_tensor_t tok_offsets; /* [T+1] int32: token t owns pairs tok_offsets[t] .. tok_offsets[t+1]; bad entries
                                  (CUDA): the pair count tok_offsets[T] is clamped to [0, P] */
  /* Outputs (P = T*K, or P_max): */
  moekit_tensor_t expert_offsets; /* out [E+1] int32 */
  moekit_tensor_t gather_idx;     /* out [P] int32: token of grouped row i */
  moekit_tensor_t pair_idx;       /* out [P] int32: pair of grouped row i */
  moekit_tensor_t grouped_pos;    /* out [P] int32: grouped row of pair p, -1 when dropped */
} moekit_dispatch_args_t;

MOEKIT_API moekit_status_t moekit_dispatch_args_init(moekit_dispatch_args_t* args);
MOEKIT_API moekit_status_t moekit_dispatch(moekit_plan_t plan, const moekit_dispatch_args_t* args, void* workspace,
                                           size_t workspace_bytes, void* stream);

/* ------------------------------------------------------------------------------------------------ */
/* Level 1 — Grouped GEMM (docs/math.md section 5)                                                  */
/* ------------------------------------------------------------------------------------------------ */

typedef enum moekit_gemm_mode {
  MOEKIT_GEMM_VARLEN_M = 0, /* C[rows of e] = A[rows of e] op(B[e]) */
  MOEKIT_GEMM_VARLEN_K = 1  /* C[e] = A[rows of e]^T B[rows of e] */
} moekit_gemm_mode_t;

typedef enum moekit_gemm_b_layout {
  MOEKIT_GEMM_B_NK = 0, /* varlen M: B [E, N, K] (weights as stored, e.g. W1 [E, 2I, H]) */
  MOEKIT_GEMM_B_KN = 1  /* varlen M: B [E, K, N] (e.g. W2 [E, H, I] in the backward) */
} moekit_gemm_b_layout_t;

typedef enum moekit_gemm_gather {
  MOEKIT_GEMM_GATHER_NONE = 0,
  MOEKIT_GEMM_GATHER_A = 1, /* row r of A is A_src[gather_idx[r]] */
  MOEKIT_GEMM_GATHER_B = 2  /* varlen K only: row r of B is B_src[gather_idx[r]] */
} moekit_gemm_gather_t;

typedef enum moekit_gemm_epilogue {
  MOEKIT_EPILOGUE_STORE = 0,  /* C = alpha AB + beta C */
  MOEKIT_EPILOGUE_BIAS = 1,   /* C = alpha AB + bias[e] + beta C (varlen M) */
  MOEKIT_EPILOGUE_GATED = 2,  /* varlen M: h = alpha AB (+ bias[e]), stored rounded; a = act(rounded h) */
  MOEKIT_EPILOGUE_DGATED = 3  /* varlen M: dA = alpha AB; outputs dh, a' = s a, ds = dA . a
                                 (docs/math.md section 4, step 1) */
} moekit_gemm_epilogue_t;

typedef struct moekit_gemm_desc {
  size_t struct_size;
  int32_t mode;      /* moekit_gemm_mode_t */
  int32_t b_layout;  /* moekit_gemm_b_layout_t (varlen M); default NK */
  int32_t gather;    /* moekit_gemm_gather_t */
  int32_t epilogue;  /* moekit_gemm_epilogue_t; varlen K supports STORE only */
  int32_t activation; /* GATED / DGATED: moekit_activation_t */
  int32_t glu_layout; /* GATED / DGATED, gated activations: moekit_glu_layout_t */
  double glu_limit;   /* SWIGLU_OAI's L; default 7 */
  int64_t groups;     /* E */
  int64_t max_rows;   /* bound of M, the rows of the grouped operand (P): each call's M = rows of gather_idx (with
                         gather) or of a (without), anything in 0..max_rows */
  int64_t gather_rows; /* bound of S, the rows of the gathered source tensor (e.g. T) in 0..gather_rows; ignored
                          without gather */
  int64_t n;          /* varlen M: output width N (for GATED, h's width); varlen K: C's last dim N */
  int64_t k;          /* varlen M: reduction length K; varlen K: C's middle dim M (columns of A) */
  int32_t dtype;      /* operand dtype: bf16, fp16, fp32, fp64 (reference) */
  int32_t out_dtype;  /* C dtype: the operand dtype or fp32; default MOEKIT_DTYPE_INVALID (from *_init) = dtype;
                         GATED and DGATED store h / dh in the operand dtype */
} moekit_gemm_desc_t;

MOEKIT_API moekit_status_t moekit_gemm_desc_init(moekit_gemm_desc_t* desc);
MOEKIT_API moekit_status_t moekit_gemm_plan_create(moekit_handle_t handle, const moekit_gemm_desc_t* desc,
                                                   moekit_plan_t* plan);

typedef struct moekit_gemm_args {
  size_t struct_size;
  moekit_tensor_t a;          /* varlen M: [M or S (gather A), k]; varlen K: [M or S (gather A), k] */
  moekit_tensor_t b;          /* varlen M: [E, n, k] or [E, k, n] (DGATED: the product dA is as wide as a, so n/2
                                 instead of n for a gated activation); varlen K: [M or S (gather B), n] */
  moekit_tensor_t offsets;    /* [E+1] int32 on the device: group e owns rows offsets[e] .. offsets[e+1]; bad entries
                                 (CUDA): clamped to [0, M], each group to a non-negative length */
  moekit_tensor_t gather_idx; /* [M] int32/int64, with gather A or B (absent otherwise); an entry outside [0, S)
                                 (CUDA): clamped to [0, S) */
  moekit_tensor_t bias;       /* [E, n] operand dtype, BIAS (required) and GATED (optional) */
  moekit_tensor_t c;          /* out: STORE/BIAS [max_rows, n] (varlen M) or [E, k, n] (varlen K);
                                 GATED: h [max_rows, n]; DGATED: dh [max_rows, n] (n = h's width) */
  moekit_tensor_t h;          /* DGATED in: [max_rows, n] the stored pre-activation */
  moekit_tensor_t act;        /* GATED out: a [max_rows, n/2] (n for non-gated); DGATED out: a' = s a */
  moekit_tensor_t row_scale;  /* DGATED in: [P = M] fp32 scores, read flat at pair_idx[r] */
  moekit_tensor_t pair_idx;   /* DGATED in: [max_rows] int32; an entry outside [0, P) (CUDA): the row is skipped (a
                                 scale of 0, no ds written) */
  moekit_tensor_t dscores;    /* DGATED out: [P = M] fp32 read flat, ds[pair_idx[r]] = dA_r . a_r; others untouched */
  double alpha;               /* default 1 */
  double beta;                /* STORE/BIAS only; 0 (default): C is never read */
} moekit_gemm_args_t;

MOEKIT_API moekit_status_t moekit_gemm_args_init(moekit_gemm_args_t* args);
MOEKIT_API moekit_status_t moekit_gemm(moekit_plan_t plan, const moekit_gemm_args_t* args, void* workspace,
                                       size_t workspace_bytes, void* stream);

/* ------------------------------------------------------------------------------------------------ */
/* Level 1 — Combine, broadcast backward, db1, db2 + ds (docs/math.md section 6)                    */
/* ------------------------------------------------------------------------------------------------ */

typedef struct moekit_combine_desc {
  size_t struct_size;
  int64_t max_tokens;
  int64_t top_k;     /* K >= 1; 0 = variable top-k through tok_offsets */
  int64_t max_pairs; /* variable top-k: P_max; ignored (= T*K) otherwise */
  int64_t hidden;    /* H */
  int32_t dtype;     /* of y / out */
} moekit_combine_desc_t;

MOEKIT_API moekit_status_t moekit_combine_desc_init(moekit_combine_desc_t* desc);
MOEKIT_API moekit_status_t moekit_combine_plan_create(moekit_handle_t handle, const moekit_combine_desc_t* desc,
                                                      moekit_plan_t* plan);

typedef struct moekit_combine_args {
  size_t struct_size;
  moekit_tensor_t grouped;     /* [P, H]: y (combine) or dxe (broadcast backward), grouped rows */
  moekit_tensor_t scores;      /* combine: [T, K] fp32 (or [P] with variable top-k); broadcast: absent.
                                  Variable top-k: this call's P (<= max_pairs) is the row count of grouped_pos */
  moekit_tensor_t grouped_pos; /* [P] int32: grouped row of pair p, -1 for a dropped pair (contributes 0); any entry
                                  outside [0, rows of grouped) (CUDA): the pair is skipped, as a dropped one */
  moekit_tensor_t tok_offsets; /* [T+1] int32, variable top-k only; bad entries (CUDA): clamped to [0, P], each
                                  token to a non-negative count */
  moekit_tensor_t out;         /* out [T, H]: out_t = beta out_t + sum over pairs of t, ascending (fp32 sum) */
  double beta;                 /* 0: out is never read */
} moekit_combine_args_t;

MOEKIT_API moekit_status_t moekit_combine_args_init(moekit_combine_args_t* args);
/* out_t = beta out_t + sum_k s[t,k] y[grouped_pos[t,k]] */
MOEKIT_API moekit_status_t moekit_combine(moekit_plan_t plan, const moekit_combine_args_t* args, void* workspace,
                                          size_t workspace_bytes, void* stream);
/* dx_t = beta dx_t + sum_k dxe[grouped_pos[t,k]] (scores must be absent) */
MOEKIT_API moekit_status_t moekit_broadcast_backward(moekit_plan_t plan, const moekit_combine_args_t* args,
                                                     void* workspace, size_t workspace_bytes, void* stream);

typedef struct moekit_bias_grad_desc {
  size_t struct_size;
  int64_t experts;  /* E */
  int64_t max_rows; /* P */
  int64_t width;    /* db1: 2I (or I); db2: H */
  int64_t max_tokens; /* db2: T (rows of dout) */
  int32_t dtype;    /* of dh / dout */
  int32_t out_dtype; /* of db1 / db2: the dtype or fp32; default MOEKIT_DTYPE_INVALID (from *_init) = dtype */
} moekit_bias_grad_desc_t;

MOEKIT_API moekit_status_t moekit_bias_grad_desc_init(moekit_bias_grad_desc_t* desc);
MOEKIT_API moekit_status_t moekit_bias_grad_plan_create(moekit_handle_t handle, const moekit_bias_grad_desc_t* desc,
                                                        moekit_plan_t* plan);

typedef struct moekit_db1_args {
  size_t struct_size;
  moekit_tensor_t dh;      /* [P, width] grouped rows */
  moekit_tensor_t offsets; /* [E+1] int32; bad entries (CUDA): clamped to [0, P], each expert to a non-negative
                              length */
  moekit_tensor_t db1;     /* out [E, width]: beta db1 + sum of the expert's rows (fp32 sum in row order) */
  double beta;
} moekit_db1_args_t;

typedef struct moekit_db2_ds_args {
  size_t struct_size;
  moekit_tensor_t dout;       /* [T, H] */
  moekit_tensor_t scores;     /* [T, K] fp32, read flat as [P]; P = rows of gather_idx */
  moekit_tensor_t b2;         /* [E, H] bias of the down projection, optional: without it ds is untouched */
  moekit_tensor_t offsets;    /* [E+1] int32; bad entries (CUDA): clamped as db1's */
  moekit_tensor_t gather_idx; /* [P] int32: token of grouped row i; an entry outside [0, T) (CUDA): clamped */
  moekit_tensor_t pair_idx;   /* [P] int32: pair of grouped row i; an entry outside [0, P) (CUDA): the row is
                                 skipped (weight 0, no ds update) */
  moekit_tensor_t db2;        /* out [E, H], optional: beta db2 + sum over the expert's rows of s dout_t */
  moekit_tensor_t dscores;    /* in/out [T, K] fp32, read flat: ds[p] += dout_t . b2[e] for every valid pair;
                                 required with b2, optional without */
  double beta;
} moekit_db2_ds_args_t;

MOEKIT_API moekit_status_t moekit_db1_args_init(moekit_db1_args_t* args);
MOEKIT_API moekit_status_t moekit_db2_ds_args_init(moekit_db2_ds_args_t* args);
MOEKIT_API moekit_status_t moekit_db1(moekit_plan_t plan, const moekit_db1_args_t* args, void* workspace,
                                      size_t workspace_bytes, void* stream);
MOEKIT_API moekit_status_t moekit_db2_ds(moekit_plan_t plan, const moekit_db2_ds_args_t* args, void* workspace,
                                         size_t workspace_bytes, void* stream);

/* ------------------------------------------------------------------------------------------------ */
/* Level 1 — Sparse-FFN group selection, load balance, subsample rows (docs/math.md section 7)      */
/* ------------------------------------------------------------------------------------------------ */

typedef struct moekit_sparse_ffn_desc {
  size_t struct_size;
  int64_t max_tokens;
  int64_t d_model;    /* D */
  int64_t d_ff;       /* F, a multiple of group_size */
  int64_t group_size; /* G: 16, 32, 64 or 128 */
  int64_t top_groups; /* kg: groups kept per token, 1..F/G */
  int64_t subsample;  /* spg: rows per group the energy is estimated from; 0 (default) = all G */
  int32_t dtype;      /* bf16, fp16, fp32, fp64 (reference) */
  int32_t inference;  /* layer only: no backward follows, no saved buffer */
  int32_t weight_grad_dtype; /* layer only: dtype of dWg, dWu, dWd: dtype or fp32; default MOEKIT_DTYPE_INVALID
                                (from *_init) = dtype */
} moekit_sparse_ffn_desc_t;

MOEKIT_API moekit_status_t moekit_sparse_ffn_desc_init(moekit_sparse_ffn_desc_t* desc);
/* A plan for group selection alone (moekit_group_select). */
MOEKIT_API moekit_status_t moekit_group_select_plan_create(moekit_handle_t handle,
                                                           const moekit_sparse_ffn_desc_t* desc, moekit_plan_t* plan);

typedef struct moekit_group_select_args {
  size_t struct_size;
  moekit_tensor_t x;         /* [T, D] */
  moekit_tensor_t w_gate;    /* [F, D] */
  moekit_tensor_t subsample_rows; /* [F/G, spg] int32 global neuron ids, required iff spg > 0; an id outside its
                                     group (CUDA): clamped to the group's first neuron */
  moekit_tensor_t lb_bias;   /* [F/G] fp32, optional: energy *= exp(bias) */
  moekit_tensor_t groups;    /* out [T, kg] int32: selected groups, energy-descending, ties to lower id */
  moekit_tensor_t counts;    /* out [F/G] int32, optional: tokens selecting each group (overwritten) */
} moekit_group_select_args_t;

MOEKIT_API moekit_status_t moekit_group_select_args_init(moekit_group_select_args_t* args);
MOEKIT_API moekit_status_t moekit_group_select(moekit_plan_t plan, const moekit_group_select_args_t* args,
                                               void* workspace, size_t workspace_bytes, void* stream);

typedef struct moekit_load_balance_args {
  size_t struct_size;
  moekit_tensor_t counts; /* [NG] int32, int64 or fp32: selections per group, summed over what the caller wants */
  moekit_tensor_t ema;    /* in/out [NG] fp32 */
  moekit_tensor_t bias;   /* in/out [NG] fp32 */
  double tokens;          /* tokens the counts were taken over (> 0) */
  int64_t top_groups;     /* kg: target = kg / NG */
  double momentum;        /* m; default 0.99 */
  double gamma;           /* step; default 1e-3 */
  double bias_max;        /* clamp; default 0.5 */
} moekit_load_balance_args_t;

MOEKIT_API moekit_status_t moekit_load_balance_args_init(moekit_load_balance_args_t* args);
/* freq = counts / tokens; ema = m ema + (1-m) freq; target = kg/NG; bias -= gamma sign(ema - target) where
 * ema < target/2 or ema > 2 target (strict); bias = clamp(bias, -bias_max, bias_max). Enqueued on stream. */
MOEKIT_API moekit_status_t moekit_load_balance_update(moekit_handle_t handle, const moekit_load_balance_args_t* args,
                                                      void* stream);

/* Host function: draws `rows_per_group` distinct neuron ids per group, reproducibly from `seed`, into
 * out[num_groups * rows_per_group] (group-major; ids are global: g*G + j). The exact steps, so any language
 * can reproduce them: state = seed; for g in 0..NG-1: perm = [0, 1, ..., G-1]; for j in 0..spg-1:
 *   state += 0x9E3779B97F4A7C15; z = state; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
 *   z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^= z >> 31  (SplitMix64, all mod 2^64);
 *   r = j + z mod (G - j); swap(perm[j], perm[r]); out[g*spg + j] = g*G + perm[j].
 * 1 <= rows_per_group <= group_size. */
MOEKIT_API moekit_status_t moekit_subsample_rows(uint64_t seed, int64_t num_groups, int64_t group_size,
                                                 int64_t rows_per_group, int32_t* out);

/* ------------------------------------------------------------------------------------------------ */
/* Level 2 — The MoE layer (docs/math.md sections 3 and 4)                                          */
/* ------------------------------------------------------------------------------------------------ */

typedef struct moekit_moe_desc {
  size_t struct_size;
  int64_t max_tokens;   /* T bound; each call takes T = x.shape[0] in 0..max_tokens */
  int64_t hidden;       /* H */
  int64_t intermediate; /* I: one GLU half (the whole h for non-gated activations) */
  int64_t router_experts; /* experts the router chooses among (rows of Wr) */
  int64_t experts;      /* local experts E held in W1, W2 (= router_experts without expert parallelism) */
  int64_t expert_begin; /* global id of local expert 0; pairs routed elsewhere are dropped; default 0 */
  int64_t top_k;        /* K */
  int32_t activation;   /* moekit_activation_t; default SWIGLU */
  int32_t glu_layout;   /* moekit_glu_layout_t; default CONCAT */
  double glu_limit;     /* SWIGLU_OAI's L; default 7 */
  int32_t router;       /* moekit_router_kind_t; default SOFTMAX_TOPK */
  int32_t renormalize;
  double router_scale;  /* SIGMOID kind; default 1 */
  int32_t has_b1;       /* b1 [E, 2I] present */
  int32_t has_b2;       /* b2 [E, H] present */
  int32_t inference;    /* forward only: stores no h, needs no saved buffer */
  int32_t dtype;        /* bf16 (default), fp16, fp32, fp64 (reference) */
  int32_t weight_grad_dtype; /* dWr, dW1, db1, dW2, db2: dtype or fp32; default MOEKIT_DTYPE_INVALID (from *_init)
                                = dtype */
  int32_t backward_overwrites_saved; /* 1: the backward may write dh over the saved h, so the workspace needs no
                                        room for dh ([P, 2I]) and saved serves ONE backward call (it is spent after
                                        it); default 0 */
  int32_t backward_scratch_in_dw1; /* 1: the backward may keep its scratch (a', dxe) in dw1 before it writes dW1
                                      there, so the workspace needs no room for it where dw1 is as large (the
                                      CUDA backend splits dxe into column chunks to make it fit); each
                                      backward call then computes the weight gradients into a contiguous dw1 with
                                      beta_dw1 = 0 (docs/api.md); default 0 */
  /* The router's auxiliary losses, as in moekit_router_desc_t (docs/math.md section 1.1); 0 (default) = off. Their
   * gradients enter dlogits, hence dx and dWr. */
  double load_balance_coeff;
  double z_loss_coeff;
} moekit_moe_desc_t;

MOEKIT_API moekit_status_t moekit_moe_desc_init(moekit_moe_desc_t* desc);
MOEKIT_API moekit_status_t moekit_moe_plan_create(moekit_handle_t handle, const moekit_moe_desc_t* desc,
                                                  moekit_plan_t* plan);

typedef struct moekit_moe_fwd_args {
  size_t struct_size;
  moekit_tensor_t x;           /* [T, H] */
  moekit_tensor_t w_router;    /* [router_experts, H] */
  moekit_tensor_t router_bias; /* [router_experts] fp32, SIGMOID kind, optional (selection only) */
  moekit_tensor_t w1;          /* [E, 2I, H] ([E, I, H] non-gated) */
  moekit_tensor_t b1;          /* [E, 2I], iff has_b1 */
  moekit_tensor_t w2;          /* [E, H, I] */
  moekit_tensor_t b2;          /* [E, H], iff has_b2 */
  moekit_tensor_t out;         /* out [T, H] = beta_out out + sum over valid pairs of s y */
  moekit_tensor_t scores;      /* out [T, K] fp32, optional */
  moekit_tensor_t indices;     /* out [T, K] int32/int64, optional: global expert ids */
  moekit_tensor_t counts;      /* out [router_experts] int32, optional: pairs per expert (before dropping) */
  double beta_out;             /* 0: out is never read */
  moekit_tensor_t load_balance_loss; /* out, optional, as in moekit_router_fwd_args_t */
  moekit_tensor_t z_loss;            /* out, optional, as in moekit_router_fwd_args_t */
} moekit_moe_fwd_args_t;

typedef struct moekit_moe_bwd_args {
  size_t struct_size;
  moekit_tensor_t x;        /* [T, H] the same, unmodified x the forward read */
  moekit_tensor_t dout;     /* [T, H] */
  moekit_tensor_t w_router; /* [router_experts, H] */
  moekit_tensor_t w1;       /* [E, 2I, H] */
  moekit_tensor_t w2;       /* [E, H, I] */
  moekit_tensor_t b2;       /* [E, H], iff has_b2 (enters ds) */
  /* Input gradient (compute_input_grad): */
  moekit_tensor_t dx;       /* out [T, H] */
  /* Weight gradients (compute_weight_grad), in weight_grad_dtype: */
  moekit_tensor_t dw_router; /* [router_experts, H] */
  moekit_tensor_t dw1;       /* [E, 2I, H] */
  moekit_tensor_t db1;       /* [E, 2I], iff has_b1 */
  moekit_tensor_t dw2;       /* [E, H, I] */
  moekit_tensor_t db2;       /* [E, H], iff has_b2 */
  int32_t compute_input_grad;  /* default 1 */
  int32_t compute_weight_grad; /* default 1 */
  /* grad = beta * grad + new; 0: the old value is never read. Gradients of a group not requested (flag 0) are
   * neither checked nor touched, so they may be absent. */
  double beta_dx, beta_dw_router, beta_dw1, beta_db1, beta_dw2, beta_db2;
  /* The auxiliary losses' upstream gradients, as in moekit_router_bwd_args_t (optional, absent = 1). */
  moekit_tensor_t dload_balance_loss;
  moekit_tensor_t dz_loss;
} moekit_moe_bwd_args_t;

MOEKIT_API moekit_status_t moekit_moe_fwd_args_init(moekit_moe_fwd_args_t* args);
MOEKIT_API moekit_status_t moekit_moe_bwd_args_init(moekit_moe_bwd_args_t* args);
/* Fills `saved` (moekit_plan_saved_size bytes; NULL/0 in inference mode) for the backward. */
MOEKIT_API moekit_status_t moekit_moe_forward(moekit_plan_t plan, const moekit_moe_fwd_args_t* args, void* saved,
                                              size_t saved_bytes, void* workspace, size_t workspace_bytes,
                                              void* stream);
/* Reads `saved` as the forward of THIS plan left it (another plan's buffer: INVALID_VALUE); never writes it, so
 * the input- and weight-gradient calls may come in either order. A plan with backward_overwrites_saved = 1 is the
 * exception: its backward writes dh over h and marks `saved` spent, so one backward call per forward computes
 * every gradient wanted; a second backward of the same buffer is INVALID_VALUE on the reference backend and
 * undefined on the CUDA backend (which never reads the header back: that would synchronise). A plan with
 * backward_scratch_in_dw1 = 1 needs compute_weight_grad = 1, beta_dw1 = 0 and a contiguous dw1 in every backward
 * call (else INVALID_VALUE naming the argument): before it writes dW1, the CUDA backend keeps a' and dxe there
 * when dw1 holds at least as many bytes, and the workspace has no section for them. */
MOEKIT_API moekit_status_t moekit_moe_backward(moekit_plan_t plan, const moekit_moe_bwd_args_t* args,
                                               const void* saved, size_t saved_bytes, void* workspace,
                                               size_t workspace_bytes, void* stream);

/* ------------------------------------------------------------------------------------------------ */
/* Level 2 — The experts alone, on pre-grouped rows (expert parallelism)                            */
/* ------------------------------------------------------------------------------------------------ */

/* y_i = act(x_i W1[e]^T + b1[e]) W2[e]^T + b2[e] for each grouped row i of expert e; no router, no scores,
 * no combine: what an expert-parallel framework runs between its all-to-all dispatch and combine. Uses the
 * fields hidden, intermediate, experts, activation, glu_layout, glu_limit, has_b1, has_b2, inference, dtype,
 * weight_grad_dtype, backward_overwrites_saved, backward_scratch_in_dw1 (as moekit_moe_backward says) of
 * moekit_moe_desc_t, and max_tokens as the row bound P. */
MOEKIT_API moekit_status_t moekit_experts_plan_create(moekit_handle_t handle, const moekit_moe_desc_t* desc,
                                                      moekit_plan_t* plan);

typedef struct moekit_experts_fwd_args {
  size_t struct_size;
  moekit_tensor_t x;       /* [P, H] grouped rows */
  moekit_tensor_t offsets; /* [E+1] int32: expert e owns rows offsets[e] .. offsets[e+1]; bad entries (CUDA):
                              clamped to [0, P], each expert to a non-negative length */
  moekit_tensor_t w1, b1, w2, b2;
  moekit_tensor_t y;       /* out [P, H] (rows past offsets[E] untouched) */
} moekit_experts_fwd_args_t;

typedef struct moekit_experts_bwd_args {
  size_t struct_size;
  moekit_tensor_t x, offsets, w1, w2;
  moekit_tensor_t dy;      /* [P, H] */
  moekit_tensor_t dx;      /* out [P, H] */
  moekit_tensor_t dw1, db1, dw2, db2;
  int32_t compute_input_grad, compute_weight_grad;
  double beta_dx, beta_dw1, beta_db1, beta_dw2, beta_db2;
} moekit_experts_bwd_args_t;

MOEKIT_API moekit_status_t moekit_experts_fwd_args_init(moekit_experts_fwd_args_t* args);
MOEKIT_API moekit_status_t moekit_experts_bwd_args_init(moekit_experts_bwd_args_t* args);
MOEKIT_API moekit_status_t moekit_experts_forward(moekit_plan_t plan, const moekit_experts_fwd_args_t* args,
                                                  void* saved, size_t saved_bytes, void* workspace,
                                                  size_t workspace_bytes, void* stream);
MOEKIT_API moekit_status_t moekit_experts_backward(moekit_plan_t plan, const moekit_experts_bwd_args_t* args,
                                                   const void* saved, size_t saved_bytes, void* workspace,
                                                   size_t workspace_bytes, void* stream);

/* ------------------------------------------------------------------------------------------------ */
/* Level 2 — The experts on token-major rows (expert parallelism)                                   */
/* ------------------------------------------------------------------------------------------------ */

/* What an expert-parallel framework runs on the tokens its all-to-all dispatch delivered in the non-expanded layout
 * (DeepEP's): every received token once, x [N, H], with its K choices as LOCAL expert ids topk_idx [N, K] and their
 * weights topk_weights [N, K]. moekit groups the pairs by local expert itself (the deterministic CSR of
 * docs/math.md section 2), runs each expert's MLP on its pairs and combines every token's pairs:
 *   out_t = beta_out out_t + sum over the valid k, ascending, of w[t,k] y_{t,k},
 *   y_{t,k} = act(x_t W1[e]^T + b1[e]) W2[e]^T + b2[e],  e = topk_idx[t,k]  (docs/math.md section 3.1).
 * A pair is valid when 0 <= topk_idx[t,k] < experts. Any other id — -1 ("not on this rank"), any id >= experts,
 * any negative id — drops the pair everywhere, silently (not an error): it adds nothing to out, dx or the weight
 * gradients, its weight is never read, and its d(topk_weights) is 0. A token whose pairs are all dropped gets
 * out_t = beta_out out_t: zeros with beta_out = 0, never garbage.
 * Uses the fields max_tokens (the bound of N), top_k (K >= 1, not bounded by experts), hidden, intermediate,
 * experts (the local experts E), activation, glu_layout, glu_limit, has_b1, has_b2, inference, dtype,
 * weight_grad_dtype, backward_overwrites_saved and backward_scratch_in_dw1 (as moekit_moe_backward says) of
 * moekit_moe_desc_t; expert_begin must be 0 (the ids are already local); the router fields are ignored. The workspace and saved sizes come from these bounds (P = max_tokens * top_k pairs), so one plan
 * serves every N in 0..max_tokens; all memory is the caller's.
 * Both backends compute it. The CUDA backend takes bf16 or fp16 storage with H and I multiples of 8 (other plans:
 * NOT_SUPPORTED) and gives the MoE layer's bits for out and the weight gradients on the same routing. The run
 * functions only enqueue work (no host synchronisation, no allocation: the grouping stays on the device), so they
 * can be captured in a CUDA graph. */
MOEKIT_API moekit_status_t moekit_token_experts_plan_create(moekit_handle_t handle, const moekit_moe_desc_t* desc,
                                                            moekit_plan_t* plan);

typedef struct moekit_token_experts_fwd_args {
  size_t struct_size;
  moekit_tensor_t x;            /* [N, H], N in 0..max_tokens */
  moekit_tensor_t topk_idx;     /* [N, K] int32/int64: local expert ids; an id outside [0, E) drops the pair */
  moekit_tensor_t topk_weights; /* [N, K] fp32 (or fp64 in an fp64 plan): the weight of each pair */
  moekit_tensor_t w1;           /* [E, 2I, H] ([E, I, H] non-gated) */
  moekit_tensor_t b1;           /* [E, 2I], iff has_b1 */
  moekit_tensor_t w2;           /* [E, H, I] */
  moekit_tensor_t b2;           /* [E, H], iff has_b2 */
  moekit_tensor_t out;          /* out [N, H] = beta_out out + sum over the valid pairs of w y */
  double beta_out;              /* 0: out is never read */
} moekit_token_experts_fwd_args_t;

typedef struct moekit_token_experts_bwd_args {
  size_t struct_size;
  moekit_tensor_t x, topk_idx, topk_weights; /* the same, unmodified tensors the forward read */
  moekit_tensor_t w1;            /* [E, 2I, H] */
  moekit_tensor_t w2;            /* [E, H, I] */
  moekit_tensor_t b2;            /* [E, H], iff has_b2 (enters dtopk_weights) */
  moekit_tensor_t dout;          /* [N, H] */
  /* Input gradients (compute_input_grad): */
  moekit_tensor_t dx;            /* out [N, H] */
  moekit_tensor_t dtopk_weights; /* out [N, K] fp32 (or fp64 in an fp64 plan), optional: overwritten with
                                    dout_t . y_{t,k}, 0 for a dropped pair */
  /* Weight gradients (compute_weight_grad), in weight_grad_dtype: */
  moekit_tensor_t dw1, db1, dw2, db2; /* as the MoE layer's; db1 iff has_b1, db2 iff has_b2 */
  int32_t compute_input_grad;    /* default 1 */
  int32_t compute_weight_grad;   /* default 1 */
  /* grad = beta * grad + new; 0: the old value is never read. Gradients of a group not requested are neither
   * checked nor touched. */
  double beta_dx, beta_dw1, beta_db1, beta_dw2, beta_db2;
} moekit_token_experts_bwd_args_t;

MOEKIT_API moekit_status_t moekit_token_experts_fwd_args_init(moekit_token_experts_fwd_args_t* args);
MOEKIT_API moekit_status_t moekit_token_experts_bwd_args_init(moekit_token_experts_bwd_args_t* args);
/* Fills `saved` (moekit_plan_saved_size bytes; NULL/0 in inference mode) for the backward. */
MOEKIT_API moekit_status_t moekit_token_experts_forward(moekit_plan_t plan,
                                                        const moekit_token_experts_fwd_args_t* args, void* saved,
                                                        size_t saved_bytes, void* workspace, size_t workspace_bytes,
                                                        void* stream);
/* Reads `saved` as the forward of THIS plan left it, never writes it: the input- and weight-gradient calls may
 * come in either order. A plan with backward_overwrites_saved = 1 is the exception, as moekit_moe_backward says:
 * dh overwrites h and one backward call per forward computes every gradient wanted. */
MOEKIT_API moekit_status_t moekit_token_experts_backward(moekit_plan_t plan,
                                                         const moekit_token_experts_bwd_args_t* args,
                                                         const void* saved, size_t saved_bytes, void* workspace,
                                                         size_t workspace_bytes, void* stream);

/* ------------------------------------------------------------------------------------------------ */
/* Level 2 — The sparse SwiGLU FFN layer (docs/math.md section 7)                                   */
/* ------------------------------------------------------------------------------------------------ */

MOEKIT_API moekit_status_t moekit_sparse_ffn_plan_create(moekit_handle_t handle, const moekit_sparse_ffn_desc_t* desc,
                                                         moekit_plan_t* plan);

typedef struct moekit_sparse_ffn_fwd_args {
  size_t struct_size;
  moekit_tensor_t x;              /* [T, D] */
  moekit_tensor_t w_gate;         /* [F, D] */
  moekit_tensor_t w_up;           /* [F, D] */
  moekit_tensor_t w_down;         /* [D, F] */
  moekit_tensor_t subsample_rows; /* [F/G, spg] int32, iff spg > 0 (a bad id: as in moekit_group_select_args_t) */
  moekit_tensor_t lb_bias;        /* [F/G] fp32, optional */
  moekit_tensor_t out;            /* out [T, D] = beta_out out + y */
  moekit_tensor_t groups;         /* out [T, kg] int32, optional */
  moekit_tensor_t counts;         /* out [F/G] int32, optional */
  double beta_out;
} moekit_sparse_ffn_fwd_args_t;

typedef struct moekit_sparse_ffn_bwd_args {
  size_t struct_size;
  moekit_tensor_t x, w_gate, w_up, w_down;
  moekit_tensor_t dout;   /* [T, D] */
  moekit_tensor_t dx;     /* out [T, D] */
  moekit_tensor_t dw_gate, dw_up, dw_down; /* out; only selected groups' rows/columns change when beta = 1 */
  int32_t compute_input_grad, compute_weight_grad;
  double beta_dx, beta_dw_gate, beta_dw_up, beta_dw_down;
} moekit_sparse_ffn_bwd_args_t;

MOEKIT_API moekit_status_t moekit_sparse_ffn_fwd_args_init(moekit_sparse_ffn_fwd_args_t* args);
MOEKIT_API moekit_status_t moekit_sparse_ffn_bwd_args_init(moekit_sparse_ffn_bwd_args_t* args);
MOEKIT_API moekit_status_t moekit_sparse_ffn_forward(moekit_plan_t plan, const moekit_sparse_ffn_fwd_args_t* args,
                                                     void* saved, size_t saved_bytes, void* workspace,
                                                     size_t workspace_bytes, void* stream);
MOEKIT_API moekit_status_t moekit_sparse_ffn_backward(moekit_plan_t plan, const moekit_sparse_ffn_bwd_args_t* args,
                                                      const void* saved, size_t saved_bytes, void* workspace,
                                                      size_t workspace_bytes, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEKIT_MOEKIT_H */
