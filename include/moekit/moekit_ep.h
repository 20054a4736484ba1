/*
 * moekit_ep.h — the expert-parallel (EP) MoE layer, an optional component of moekit (library moekit_ep).
 *
 * The experts of one MoE layer are spread over R ranks: rank r holds experts [r*E, (r+1)*E) of the router's R*E.
 * Each rank routes its own tokens, the ranks exchange how many rows each sends to each expert, every rank sends
 * the rows of its token-expert pairs to the rank owning the expert (all-to-allv), runs its local experts on what
 * it received, sends the results back and combines them; the backward is the mirror image. The per-rank compute
 * is moekit's own operations (router, dispatch, grouped GEMM, combine), so the layer runs on the reference (CPU)
 * backend exchanging through host memory between ranks of one process (the in-process group below, for tests and
 * debugging) and on the CUDA backend over the caller's NCCL communicator. docs/ep.md has the details.
 *
 * The conventions of moekit.h hold (statuses, struct_size-versioned descriptors and arguments, borrowed tensor
 * views, caller-owned workspace and saved buffers whose sizes the plan reports, no allocation in run calls), and:
 *  - Forward and backward are collective: every rank of the communicator calls them, in the same order, with the
 *    same plan descriptor. A rank whose call fails before it communicates (a bad argument) returns at once; the
 *    other ranks then wait in the exchange, as NCCL's own collectives do, so check arguments identically everywhere.
 *  - Errors: moekit_ep_get_last_error() holds this component's per-thread message; it names the argument, or the
 *    inner moekit operation and its own message.
 *  - Results are bitwise reproducible for a fixed rank count (no reduction depends on timing or on which rank's
 *    rows arrive first).
 * This header needs neither CUDA nor NCCL headers: the communicator is passed as void* (an ncclComm_t).
 */
#ifndef MOEKIT_MOEKIT_EP_H
#define MOEKIT_MOEKIT_EP_H

#include "moekit/moekit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Communicators                                                                                    */
/* ------------------------------------------------------------------------------------------------ */

typedef struct moekit_ep_comm* moekit_ep_comm_t;
typedef struct moekit_ep_local_group* moekit_ep_local_group_t;

/* 1 when this build of moekit_ep has the NCCL exchange (CMake MOEKIT_NCCL resolved ON), else 0. */
MOEKIT_API int32_t moekit_ep_has_nccl(void);

/* Copies this thread's last error of the moekit_ep_* functions, as moekit_get_last_error does. */
MOEKIT_API size_t moekit_ep_get_last_error(char* buf, size_t cap);

/* An in-process group of `ranks` ranks (1..1024) exchanging through host memory: rank r's communicator comes from
 * moekit_ep_comm_create_local and is used from its own thread (the ranks' calls meet in the exchange, so R ranks
 * need R threads calling concurrently). Serves reference-backend handles only. */
MOEKIT_API moekit_status_t moekit_ep_local_group_create(int32_t ranks, moekit_ep_local_group_t* group);
/* Accepts NULL. Destroy the communicators made from it first. */
MOEKIT_API moekit_status_t moekit_ep_local_group_destroy(moekit_ep_local_group_t group);
MOEKIT_API moekit_status_t moekit_ep_comm_create_local(moekit_ep_local_group_t group, int32_t rank,
                                                       moekit_ep_comm_t* comm);

/* Wraps the caller's NCCL communicator (an ncclComm_t passed as void*; borrowed: moekit never destroys it) for
 * CUDA-backend handles; the rank and the rank count come from NCCL. NOT_SUPPORTED when moekit_ep_has_nccl() is 0. */
MOEKIT_API moekit_status_t moekit_ep_comm_create_nccl(void* nccl_comm, moekit_ep_comm_t* comm);
/* Accepts NULL. Plans made with it must be destroyed first. */
MOEKIT_API moekit_status_t moekit_ep_comm_destroy(moekit_ep_comm_t comm);
MOEKIT_API moekit_status_t moekit_ep_comm_rank(moekit_ep_comm_t comm, int32_t* rank, int32_t* ranks);

/* ------------------------------------------------------------------------------------------------ */
/* The layer                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

typedef enum moekit_ep_mode {
  /* The per-expert counts are exchanged first and copied to the host (one host synchronisation per forward and
     one per backward), so every all-to-allv moves exactly the rows routed; no pair is ever dropped. */
  MOEKIT_EP_EXACT = 0,
  /* Each rank sends at most `capacity` rows to each rank, in fixed-size slots: no host synchronisation, every
     launch graph-capturable. Pairs past the capacity are dropped (see moekit_ep_fwd_args_t.dropped). */
  MOEKIT_EP_CAPACITY = 1
} moekit_ep_mode_t;

typedef struct moekit_ep_desc {
  size_t struct_size;
  /* The layer on this rank, as moekit_moe_desc_t: max_tokens bounds this rank's T; experts = E, the experts each
     rank holds; router_experts must be ranks * E; expert_begin is ignored (rank * E); inference must be 0;
     load_balance_coeff, z_loss_coeff and backward_overwrites_saved are not read (the layer computes no auxiliary
     loss, and its backward never writes the saved buffer). */
  moekit_moe_desc_t layer;
  int32_t mode;      /* moekit_ep_mode_t; default EXACT */
  int64_t capacity;  /* CAPACITY: rows (token-expert pairs) one rank sends to one rank per call, >= 1 */
} moekit_ep_desc_t;

/* Sets struct_size and the defaults of moekit_moe_desc_init for `layer` (with inference 0), mode EXACT. */
MOEKIT_API moekit_status_t moekit_ep_desc_init(moekit_ep_desc_t* desc);

typedef struct moekit_ep_plan* moekit_ep_plan_t;

/* A plan for this rank. The handle (reference backend with a local communicator, CUDA with an NCCL one) and the
 * communicator are borrowed and must outlive the plan. The layer runs as moekit's grouped GEMMs, the router linear
 * among them, so on the CUDA backend router_experts, hidden and intermediate must be multiples of 8 (the grouped
 * GEMM's rule); otherwise MOEKIT_STATUS_NOT_SUPPORTED, its message naming the field. The memory a plan asks for, with R ranks, P = max_tokens *
 * top_k and M the rows a rank may receive (EXACT: R * max_tokens * min(top_k, E); CAPACITY: R * capacity), is about
 *   workspace: (P + S + 3M) rows of H (S = P exact, R * capacity capacity), M rows of 2I + I, plus the inner
 *              operations' workspaces;
 *   saved:     M rows of H + 2I (the received rows and their pre-activations) and the routing of the T tokens.
 * Not local memory only: it counts the all-to-all buffers. */
MOEKIT_API moekit_status_t moekit_ep_plan_create(moekit_handle_t handle, moekit_ep_comm_t comm,
                                                 const moekit_ep_desc_t* desc, moekit_ep_plan_t* plan);
MOEKIT_API moekit_status_t moekit_ep_plan_destroy(moekit_ep_plan_t plan);
/* Bytes of workspace (either direction) and of the saved buffer the forward fills and the backward reads. */
MOEKIT_API moekit_status_t moekit_ep_plan_sizes(moekit_ep_plan_t plan, size_t* workspace_bytes, size_t* saved_bytes);

typedef struct moekit_ep_fwd_args {
  size_t struct_size;
  moekit_tensor_t x;           /* [T, H] this rank's tokens, T in 0..max_tokens (may differ between ranks) */
  moekit_tensor_t w_router;    /* [R*E, H] the router (the same on every rank) */
  moekit_tensor_t router_bias; /* [R*E] fp32, SIGMOID kind, optional */
  moekit_tensor_t w1;          /* [E, 2I, H] this rank's experts ([E, I, H] non-gated) */
  moekit_tensor_t b1;          /* [E, 2I], iff has_b1 */
  moekit_tensor_t w2;          /* [E, H, I] */
  moekit_tensor_t b2;          /* [E, H], iff has_b2 */
  moekit_tensor_t out;         /* out [T, H] = beta_out out + sum over the kept pairs of s y */
  moekit_tensor_t scores;      /* out [T, K] fp32, optional */
  moekit_tensor_t indices;     /* out [T, K] int32, optional: global expert ids */
  moekit_tensor_t counts;      /* out [R*E] int32, optional: this rank's pairs per expert, before dropping */
  moekit_tensor_t dropped;     /* out [1] int32, optional: this rank's pairs dropped over capacity (0 in EXACT).
                                  A dropped pair adds nothing to out, to any gradient, and its score gradient is 0;
                                  a token whose pairs are all dropped gets out = beta_out out (zeros with 0). Which
                                  pairs: the rows bound for one rank are ordered by expert, then token; those past
                                  the first `capacity` are dropped. */
  double beta_out;             /* 0: out is never read */
} moekit_ep_fwd_args_t;

typedef struct moekit_ep_bwd_args {
  size_t struct_size;
  moekit_tensor_t x;         /* [T, H] the forward's x, unmodified */
  moekit_tensor_t dout;      /* [T, H] */
  moekit_tensor_t w_router;  /* [R*E, H] */
  moekit_tensor_t w1;        /* [E, 2I, H] */
  moekit_tensor_t w2;        /* [E, H, I] */
  moekit_tensor_t b2;        /* [E, H], iff has_b2 */
  moekit_tensor_t dx;        /* out [T, H] (compute_input_grad) */
  /* Weight gradients (compute_weight_grad), in weight_grad_dtype. dw_router is this rank's tokens' share: the
     caller sums it over the ranks (as for any data-parallel weight). dw1..db2 are this rank's experts' gradients
     from every rank's tokens. */
  moekit_tensor_t dw_router; /* [R*E, H] */
  moekit_tensor_t dw1;       /* [E, 2I, H] */
  moekit_tensor_t db1;       /* [E, 2I], iff has_b1 */
  moekit_tensor_t dw2;       /* [E, H, I] */
  moekit_tensor_t db2;       /* [E, H], iff has_b2 */
  /* Both directions move rows, so both flags must be equal on every rank; each defaults to 1. The router's
     gradient feeds dx and dw_router alike, so one call computes the requested ones from one exchange. */
  int32_t compute_input_grad;
  int32_t compute_weight_grad;
  double beta_dx, beta_dw_router, beta_dw1, beta_db1, beta_dw2, beta_db2; /* 0: the old value is never read */
} moekit_ep_bwd_args_t;

MOEKIT_API moekit_status_t moekit_ep_fwd_args_init(moekit_ep_fwd_args_t* args);
MOEKIT_API moekit_status_t moekit_ep_bwd_args_init(moekit_ep_bwd_args_t* args);
/* Fills `saved` (moekit_ep_plan_sizes' saved bytes) for the backward. Collective. */
MOEKIT_API moekit_status_t moekit_ep_forward(moekit_ep_plan_t plan, const moekit_ep_fwd_args_t* args, void* saved,
                                             size_t saved_bytes, void* workspace, size_t workspace_bytes,
                                             void* stream);
/* Reads `saved` as this plan's last forward left it; never writes it. Collective. On the reference backend a
   buffer no forward of this plan filled, or one filled on another T, is INVALID_VALUE ("saved: ..."); a CUDA
   handle cannot read it without synchronising and trusts it, as the single-GPU layers do. */
MOEKIT_API moekit_status_t moekit_ep_backward(moekit_ep_plan_t plan, const moekit_ep_bwd_args_t* args,
                                              const void* saved, size_t saved_bytes, void* workspace,
                                              size_t workspace_bytes, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEKIT_MOEKIT_EP_H */
