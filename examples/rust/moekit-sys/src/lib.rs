//! Raw bindings to moekit's C API, `include/moekit/moekit.h`, written by hand.
//!
//! Everything here mirrors the header one to one: the same names, `#[repr(C)]` structs with the same fields in the
//! same order, the same constants, every function. The header is the documentation of each item (its contract,
//! shapes and statuses); this crate adds nothing to it. The `header_mirror` test keeps the two in step: it
//! compares every constant, type size and alignment and field offset with what a C program built from the real
//! header prints, and every prototype and field type with the header's text.
//!
//! Safe use goes through the `moekit` crate. Linking: the build script finds libmoekit through `MOEKIT_DIR` (an
//! install prefix) or pkg-config's `moekit.pc`; docs/integration.md shows both.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_void};

// ------------------------------------------------------------------------------------------------------------------
// Version
// ------------------------------------------------------------------------------------------------------------------

pub const MOEKIT_VERSION_MAJOR: i32 = 0;
pub const MOEKIT_VERSION_MINOR: i32 = 2;
pub const MOEKIT_VERSION_PATCH: i32 = 0;
pub const MOEKIT_VERSION_NUMBER: i32 = MOEKIT_VERSION_MAJOR * 10000 + MOEKIT_VERSION_MINOR * 100 + MOEKIT_VERSION_PATCH;

// ------------------------------------------------------------------------------------------------------------------
// Status codes
// ------------------------------------------------------------------------------------------------------------------

/// `moekit_status_t`. A newtype rather than a Rust enum: the library may return a value this crate does not know,
/// which a Rust enum cannot hold. `#[must_use]`, so an ignored status is a warning.
#[must_use = "a moekit status says whether the call did anything; check it"]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct moekit_status_t(pub i32);

pub const MOEKIT_SUCCESS: moekit_status_t = moekit_status_t(0);
pub const MOEKIT_STATUS_INVALID_VALUE: moekit_status_t = moekit_status_t(100);
pub const MOEKIT_STATUS_VALIDATION_FAILED: moekit_status_t = moekit_status_t(101);
pub const MOEKIT_STATUS_NOT_SUPPORTED: moekit_status_t = moekit_status_t(200);
pub const MOEKIT_STATUS_INSUFFICIENT_WORKSPACE: moekit_status_t = moekit_status_t(300);
pub const MOEKIT_STATUS_OUT_OF_MEMORY: moekit_status_t = moekit_status_t(301);
pub const MOEKIT_STATUS_EXECUTION_FAILED: moekit_status_t = moekit_status_t(400);
pub const MOEKIT_STATUS_INTERNAL_ERROR: moekit_status_t = moekit_status_t(500);

// ------------------------------------------------------------------------------------------------------------------
// Enumerations: C enums are ints; the structs store them in int32_t fields, so the constants are i32.
// ------------------------------------------------------------------------------------------------------------------

pub type moekit_dtype_t = i32;
pub const MOEKIT_DTYPE_INVALID: moekit_dtype_t = 0;
pub const MOEKIT_DTYPE_BF16: moekit_dtype_t = 1;
pub const MOEKIT_DTYPE_FP16: moekit_dtype_t = 2;
pub const MOEKIT_DTYPE_FP32: moekit_dtype_t = 3;
pub const MOEKIT_DTYPE_FP64: moekit_dtype_t = 4;
pub const MOEKIT_DTYPE_INT32: moekit_dtype_t = 5;
pub const MOEKIT_DTYPE_INT64: moekit_dtype_t = 6;
pub const MOEKIT_DTYPE_FP8_E4M3: moekit_dtype_t = 16;
pub const MOEKIT_DTYPE_FP8_E5M2: moekit_dtype_t = 17;

pub type moekit_device_type_t = i32;
pub const MOEKIT_DEVICE_CPU: moekit_device_type_t = 1;
pub const MOEKIT_DEVICE_CUDA: moekit_device_type_t = 2;

pub const MOEKIT_MAX_RANK: usize = 4;

pub type moekit_backend_t = i32;
pub const MOEKIT_BACKEND_REFERENCE: moekit_backend_t = 0;
pub const MOEKIT_BACKEND_CUDA: moekit_backend_t = 1;

/// Handle flags (`moekit_handle_desc_t::flags`).
pub const MOEKIT_HANDLE_VALIDATE: u32 = 1 << 0;

pub type moekit_router_kind_t = i32;
pub const MOEKIT_ROUTER_SOFTMAX_TOPK: moekit_router_kind_t = 0;
pub const MOEKIT_ROUTER_TOPK_SOFTMAX: moekit_router_kind_t = 1;
pub const MOEKIT_ROUTER_TOPK: moekit_router_kind_t = 2;
pub const MOEKIT_ROUTER_SIGMOID: moekit_router_kind_t = 3;

pub type moekit_activation_t = i32;
pub const MOEKIT_ACT_SWIGLU: moekit_activation_t = 0;
pub const MOEKIT_ACT_GEGLU: moekit_activation_t = 1;
pub const MOEKIT_ACT_REGLU: moekit_activation_t = 2;
pub const MOEKIT_ACT_SWIGLU_OAI: moekit_activation_t = 3;
pub const MOEKIT_ACT_GELU: moekit_activation_t = 16;
pub const MOEKIT_ACT_RELU: moekit_activation_t = 17;
pub const MOEKIT_ACT_SILU: moekit_activation_t = 18;
pub const MOEKIT_ACT_RELU2: moekit_activation_t = 19;

pub type moekit_glu_layout_t = i32;
pub const MOEKIT_GLU_CONCAT: moekit_glu_layout_t = 0;
pub const MOEKIT_GLU_INTERLEAVED: moekit_glu_layout_t = 1;

pub type moekit_gemm_mode_t = i32;
pub const MOEKIT_GEMM_VARLEN_M: moekit_gemm_mode_t = 0;
pub const MOEKIT_GEMM_VARLEN_K: moekit_gemm_mode_t = 1;

pub type moekit_gemm_b_layout_t = i32;
pub const MOEKIT_GEMM_B_NK: moekit_gemm_b_layout_t = 0;
pub const MOEKIT_GEMM_B_KN: moekit_gemm_b_layout_t = 1;

pub type moekit_gemm_gather_t = i32;
pub const MOEKIT_GEMM_GATHER_NONE: moekit_gemm_gather_t = 0;
pub const MOEKIT_GEMM_GATHER_A: moekit_gemm_gather_t = 1;
pub const MOEKIT_GEMM_GATHER_B: moekit_gemm_gather_t = 2;

pub type moekit_gemm_epilogue_t = i32;
pub const MOEKIT_EPILOGUE_STORE: moekit_gemm_epilogue_t = 0;
pub const MOEKIT_EPILOGUE_BIAS: moekit_gemm_epilogue_t = 1;
pub const MOEKIT_EPILOGUE_GATED: moekit_gemm_epilogue_t = 2;
pub const MOEKIT_EPILOGUE_DGATED: moekit_gemm_epilogue_t = 3;

// ------------------------------------------------------------------------------------------------------------------
// Opaque handles
// ------------------------------------------------------------------------------------------------------------------

/// `struct moekit_handle`: only ever behind a pointer.
#[repr(C)]
pub struct moekit_handle {
    _opaque: [u8; 0],
}
pub type moekit_handle_t = *mut moekit_handle;

/// `struct moekit_plan`: only ever behind a pointer.
#[repr(C)]
pub struct moekit_plan {
    _opaque: [u8; 0],
}
pub type moekit_plan_t = *mut moekit_plan;

// ----------------------------------------------------------------------------------------------------
// Tensors
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_device_t {
    pub r#type: i32,
    pub index: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_tensor_t {
    pub data: *mut c_void,
    pub dtype: i32,
    pub rank: i32,
    pub shape: [i64; MOEKIT_MAX_RANK],
    pub stride: [i64; MOEKIT_MAX_RANK],
    pub device: moekit_device_t,
    pub reserved: [u64; 2],
}

// ----------------------------------------------------------------------------------------------------
// Handles and plans
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_handle_desc_t {
    pub struct_size: usize,
    pub backend: i32,
    pub device_index: i32,
    pub flags: u32,
    pub num_threads: i32,
}

// ----------------------------------------------------------------------------------------------------
// Level 1 — Router (docs/math.md section 1)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_router_desc_t {
    pub struct_size: usize,
    pub max_tokens: i64,
    pub experts: i64,
    pub top_k: i64,
    pub kind: i32,
    pub renormalize: i32,
    pub scale: f64,
    pub dtype: i32,
    pub load_balance_coeff: f64,
    pub z_loss_coeff: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_router_fwd_args_t {
    pub struct_size: usize,
    pub logits: moekit_tensor_t,
    pub bias: moekit_tensor_t,
    pub scores: moekit_tensor_t,
    pub indices: moekit_tensor_t,
    pub counts: moekit_tensor_t,
    pub load_balance_loss: moekit_tensor_t,
    pub z_loss: moekit_tensor_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_router_bwd_args_t {
    pub struct_size: usize,
    pub logits: moekit_tensor_t,
    pub indices: moekit_tensor_t,
    pub dscores: moekit_tensor_t,
    pub dlogits: moekit_tensor_t,
    pub accumulate: i32,
    pub dload_balance_loss: moekit_tensor_t,
    pub dz_loss: moekit_tensor_t,
}

// ----------------------------------------------------------------------------------------------------
// Level 1 — Dispatch metadata: the deterministic CSR (docs/math.md section 2)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_dispatch_desc_t {
    pub struct_size: usize,
    pub max_tokens: i64,
    pub top_k: i64,
    pub max_pairs: i64,
    pub experts: i64,
    pub expert_begin: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_dispatch_args_t {
    pub struct_size: usize,
    pub indices: moekit_tensor_t,
    pub tok_offsets: moekit_tensor_t,
    pub expert_offsets: moekit_tensor_t,
    pub gather_idx: moekit_tensor_t,
    pub pair_idx: moekit_tensor_t,
    pub grouped_pos: moekit_tensor_t,
}

// ----------------------------------------------------------------------------------------------------
// Level 1 — Grouped GEMM (docs/math.md section 5)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_gemm_desc_t {
    pub struct_size: usize,
    pub mode: i32,
    pub b_layout: i32,
    pub gather: i32,
    pub epilogue: i32,
    pub activation: i32,
    pub glu_layout: i32,
    pub glu_limit: f64,
    pub groups: i64,
    pub max_rows: i64,
    pub gather_rows: i64,
    pub n: i64,
    pub k: i64,
    pub dtype: i32,
    pub out_dtype: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_gemm_args_t {
    pub struct_size: usize,
    pub a: moekit_tensor_t,
    pub b: moekit_tensor_t,
    pub offsets: moekit_tensor_t,
    pub gather_idx: moekit_tensor_t,
    pub bias: moekit_tensor_t,
    pub c: moekit_tensor_t,
    pub h: moekit_tensor_t,
    pub act: moekit_tensor_t,
    pub row_scale: moekit_tensor_t,
    pub pair_idx: moekit_tensor_t,
    pub dscores: moekit_tensor_t,
    pub alpha: f64,
    pub beta: f64,
}

// ----------------------------------------------------------------------------------------------------
// Level 1 — Combine, broadcast backward, db1, db2 + ds (docs/math.md section 6)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_combine_desc_t {
    pub struct_size: usize,
    pub max_tokens: i64,
    pub top_k: i64,
    pub max_pairs: i64,
    pub hidden: i64,
    pub dtype: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_combine_args_t {
    pub struct_size: usize,
    pub grouped: moekit_tensor_t,
    pub scores: moekit_tensor_t,
    pub grouped_pos: moekit_tensor_t,
    pub tok_offsets: moekit_tensor_t,
    pub out: moekit_tensor_t,
    pub beta: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_bias_grad_desc_t {
    pub struct_size: usize,
    pub experts: i64,
    pub max_rows: i64,
    pub width: i64,
    pub max_tokens: i64,
    pub dtype: i32,
    pub out_dtype: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_db1_args_t {
    pub struct_size: usize,
    pub dh: moekit_tensor_t,
    pub offsets: moekit_tensor_t,
    pub db1: moekit_tensor_t,
    pub beta: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_db2_ds_args_t {
    pub struct_size: usize,
    pub dout: moekit_tensor_t,
    pub scores: moekit_tensor_t,
    pub b2: moekit_tensor_t,
    pub offsets: moekit_tensor_t,
    pub gather_idx: moekit_tensor_t,
    pub pair_idx: moekit_tensor_t,
    pub db2: moekit_tensor_t,
    pub dscores: moekit_tensor_t,
    pub beta: f64,
}

// ----------------------------------------------------------------------------------------------------
// Level 1 — Sparse-FFN group selection, load balance, subsample rows (docs/math.md section 7)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_sparse_ffn_desc_t {
    pub struct_size: usize,
    pub max_tokens: i64,
    pub d_model: i64,
    pub d_ff: i64,
    pub group_size: i64,
    pub top_groups: i64,
    pub subsample: i64,
    pub dtype: i32,
    pub inference: i32,
    pub weight_grad_dtype: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_group_select_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub w_gate: moekit_tensor_t,
    pub subsample_rows: moekit_tensor_t,
    pub lb_bias: moekit_tensor_t,
    pub groups: moekit_tensor_t,
    pub counts: moekit_tensor_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_load_balance_args_t {
    pub struct_size: usize,
    pub counts: moekit_tensor_t,
    pub ema: moekit_tensor_t,
    pub bias: moekit_tensor_t,
    pub tokens: f64,
    pub top_groups: i64,
    pub momentum: f64,
    pub gamma: f64,
    pub bias_max: f64,
}

// ----------------------------------------------------------------------------------------------------
// Level 2 — The MoE layer (docs/math.md sections 3 and 4)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_moe_desc_t {
    pub struct_size: usize,
    pub max_tokens: i64,
    pub hidden: i64,
    pub intermediate: i64,
    pub router_experts: i64,
    pub experts: i64,
    pub expert_begin: i64,
    pub top_k: i64,
    pub activation: i32,
    pub glu_layout: i32,
    pub glu_limit: f64,
    pub router: i32,
    pub renormalize: i32,
    pub router_scale: f64,
    pub has_b1: i32,
    pub has_b2: i32,
    pub inference: i32,
    pub dtype: i32,
    pub weight_grad_dtype: i32,
    pub backward_overwrites_saved: i32,
    pub backward_scratch_in_dw1: i32,
    pub load_balance_coeff: f64,
    pub z_loss_coeff: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_moe_fwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub w_router: moekit_tensor_t,
    pub router_bias: moekit_tensor_t,
    pub w1: moekit_tensor_t,
    pub b1: moekit_tensor_t,
    pub w2: moekit_tensor_t,
    pub b2: moekit_tensor_t,
    pub out: moekit_tensor_t,
    pub scores: moekit_tensor_t,
    pub indices: moekit_tensor_t,
    pub counts: moekit_tensor_t,
    pub beta_out: f64,
    pub load_balance_loss: moekit_tensor_t,
    pub z_loss: moekit_tensor_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_moe_bwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub dout: moekit_tensor_t,
    pub w_router: moekit_tensor_t,
    pub w1: moekit_tensor_t,
    pub w2: moekit_tensor_t,
    pub b2: moekit_tensor_t,
    pub dx: moekit_tensor_t,
    pub dw_router: moekit_tensor_t,
    pub dw1: moekit_tensor_t,
    pub db1: moekit_tensor_t,
    pub dw2: moekit_tensor_t,
    pub db2: moekit_tensor_t,
    pub compute_input_grad: i32,
    pub compute_weight_grad: i32,
    pub beta_dx: f64,
    pub beta_dw_router: f64,
    pub beta_dw1: f64,
    pub beta_db1: f64,
    pub beta_dw2: f64,
    pub beta_db2: f64,
    pub dload_balance_loss: moekit_tensor_t,
    pub dz_loss: moekit_tensor_t,
}

// ----------------------------------------------------------------------------------------------------
// Level 2 — The experts alone, on pre-grouped rows (expert parallelism)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_experts_fwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub offsets: moekit_tensor_t,
    pub w1: moekit_tensor_t,
    pub b1: moekit_tensor_t,
    pub w2: moekit_tensor_t,
    pub b2: moekit_tensor_t,
    pub y: moekit_tensor_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_experts_bwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub offsets: moekit_tensor_t,
    pub w1: moekit_tensor_t,
    pub w2: moekit_tensor_t,
    pub dy: moekit_tensor_t,
    pub dx: moekit_tensor_t,
    pub dw1: moekit_tensor_t,
    pub db1: moekit_tensor_t,
    pub dw2: moekit_tensor_t,
    pub db2: moekit_tensor_t,
    pub compute_input_grad: i32,
    pub compute_weight_grad: i32,
    pub beta_dx: f64,
    pub beta_dw1: f64,
    pub beta_db1: f64,
    pub beta_dw2: f64,
    pub beta_db2: f64,
}

// ----------------------------------------------------------------------------------------------------
// Level 2 — The experts on token-major rows (expert parallelism)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_token_experts_fwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub topk_idx: moekit_tensor_t,
    pub topk_weights: moekit_tensor_t,
    pub w1: moekit_tensor_t,
    pub b1: moekit_tensor_t,
    pub w2: moekit_tensor_t,
    pub b2: moekit_tensor_t,
    pub out: moekit_tensor_t,
    pub beta_out: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_token_experts_bwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub topk_idx: moekit_tensor_t,
    pub topk_weights: moekit_tensor_t,
    pub w1: moekit_tensor_t,
    pub w2: moekit_tensor_t,
    pub b2: moekit_tensor_t,
    pub dout: moekit_tensor_t,
    pub dx: moekit_tensor_t,
    pub dtopk_weights: moekit_tensor_t,
    pub dw1: moekit_tensor_t,
    pub db1: moekit_tensor_t,
    pub dw2: moekit_tensor_t,
    pub db2: moekit_tensor_t,
    pub compute_input_grad: i32,
    pub compute_weight_grad: i32,
    pub beta_dx: f64,
    pub beta_dw1: f64,
    pub beta_db1: f64,
    pub beta_dw2: f64,
    pub beta_db2: f64,
}

// ----------------------------------------------------------------------------------------------------
// Level 2 — The sparse SwiGLU FFN layer (docs/math.md section 7)
// ----------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_sparse_ffn_fwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub w_gate: moekit_tensor_t,
    pub w_up: moekit_tensor_t,
    pub w_down: moekit_tensor_t,
    pub subsample_rows: moekit_tensor_t,
    pub lb_bias: moekit_tensor_t,
    pub out: moekit_tensor_t,
    pub groups: moekit_tensor_t,
    pub counts: moekit_tensor_t,
    pub beta_out: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct moekit_sparse_ffn_bwd_args_t {
    pub struct_size: usize,
    pub x: moekit_tensor_t,
    pub w_gate: moekit_tensor_t,
    pub w_up: moekit_tensor_t,
    pub w_down: moekit_tensor_t,
    pub dout: moekit_tensor_t,
    pub dx: moekit_tensor_t,
    pub dw_gate: moekit_tensor_t,
    pub dw_up: moekit_tensor_t,
    pub dw_down: moekit_tensor_t,
    pub compute_input_grad: i32,
    pub compute_weight_grad: i32,
    pub beta_dx: f64,
    pub beta_dw_gate: f64,
    pub beta_dw_up: f64,
    pub beta_dw_down: f64,
}

// Every struct above is plain data for which all-zero bytes are a valid value (null pointers, absent tensors), so
// `Default` zeroes it; fill descriptors and argument structs with their `*_init` function afterwards, as in C.
macro_rules! zeroed_default {
    ($($name:ident),* $(,)?) => {$(
        impl Default for $name {
            fn default() -> Self {
                // SAFETY: integers, floats, raw pointers and arrays of them: the zero bit pattern is valid.
                unsafe { std::mem::zeroed() }
            }
        }
    )*};
}
zeroed_default!(
    moekit_device_t,
    moekit_tensor_t,
    moekit_handle_desc_t,
    moekit_router_desc_t,
    moekit_router_fwd_args_t,
    moekit_router_bwd_args_t,
    moekit_dispatch_desc_t,
    moekit_dispatch_args_t,
    moekit_gemm_desc_t,
    moekit_gemm_args_t,
    moekit_combine_desc_t,
    moekit_combine_args_t,
    moekit_bias_grad_desc_t,
    moekit_db1_args_t,
    moekit_db2_ds_args_t,
    moekit_sparse_ffn_desc_t,
    moekit_group_select_args_t,
    moekit_load_balance_args_t,
    moekit_moe_desc_t,
    moekit_moe_fwd_args_t,
    moekit_moe_bwd_args_t,
    moekit_experts_fwd_args_t,
    moekit_experts_bwd_args_t,
    moekit_token_experts_fwd_args_t,
    moekit_token_experts_bwd_args_t,
    moekit_sparse_ffn_fwd_args_t,
    moekit_sparse_ffn_bwd_args_t,
);

// ------------------------------------------------------------------------------------------------------------------
// Functions
// ------------------------------------------------------------------------------------------------------------------

extern "C" {
    // Version, status, errors, tensors
    pub fn moekit_get_version() -> i32;
    pub fn moekit_status_string(status: moekit_status_t) -> *const c_char;
    pub fn moekit_get_last_error(buf: *mut c_char, cap: usize) -> usize;
    pub fn moekit_tensor_make(
        data: *mut c_void,
        dtype: moekit_dtype_t,
        rank: i32,
        shape: *const i64,
        device: moekit_device_t,
    ) -> moekit_tensor_t;

    // Handles and plans
    pub fn moekit_handle_desc_init(desc: *mut moekit_handle_desc_t) -> moekit_status_t;
    pub fn moekit_handle_create(desc: *const moekit_handle_desc_t, handle: *mut moekit_handle_t) -> moekit_status_t;
    pub fn moekit_handle_destroy(handle: moekit_handle_t) -> moekit_status_t;
    pub fn moekit_plan_destroy(plan: moekit_plan_t) -> moekit_status_t;
    pub fn moekit_plan_workspace_size(plan: moekit_plan_t, bytes: *mut usize) -> moekit_status_t;
    pub fn moekit_plan_layer_workspace_sizes(
        plan: moekit_plan_t,
        forward_bytes: *mut usize,
        backward_bytes: *mut usize,
    ) -> moekit_status_t;
    pub fn moekit_plan_saved_size(plan: moekit_plan_t, bytes: *mut usize) -> moekit_status_t;
    pub fn moekit_plan_describe(plan: moekit_plan_t, buf: *mut c_char, cap: usize) -> usize;

    // Router
    pub fn moekit_router_desc_init(desc: *mut moekit_router_desc_t) -> moekit_status_t;
    pub fn moekit_router_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_router_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_router_fwd_args_init(args: *mut moekit_router_fwd_args_t) -> moekit_status_t;
    pub fn moekit_router_bwd_args_init(args: *mut moekit_router_bwd_args_t) -> moekit_status_t;
    pub fn moekit_router_forward(
        plan: moekit_plan_t,
        args: *const moekit_router_fwd_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_router_backward(
        plan: moekit_plan_t,
        args: *const moekit_router_bwd_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;

    // Dispatch
    pub fn moekit_dispatch_desc_init(desc: *mut moekit_dispatch_desc_t) -> moekit_status_t;
    pub fn moekit_dispatch_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_dispatch_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_dispatch_args_init(args: *mut moekit_dispatch_args_t) -> moekit_status_t;
    pub fn moekit_dispatch(
        plan: moekit_plan_t,
        args: *const moekit_dispatch_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;

    // Grouped GEMM
    pub fn moekit_gemm_desc_init(desc: *mut moekit_gemm_desc_t) -> moekit_status_t;
    pub fn moekit_gemm_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_gemm_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_gemm_args_init(args: *mut moekit_gemm_args_t) -> moekit_status_t;
    pub fn moekit_gemm(
        plan: moekit_plan_t,
        args: *const moekit_gemm_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;

    // Combine, broadcast backward, db1, db2 + ds
    pub fn moekit_combine_desc_init(desc: *mut moekit_combine_desc_t) -> moekit_status_t;
    pub fn moekit_combine_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_combine_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_combine_args_init(args: *mut moekit_combine_args_t) -> moekit_status_t;
    pub fn moekit_combine(
        plan: moekit_plan_t,
        args: *const moekit_combine_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_broadcast_backward(
        plan: moekit_plan_t,
        args: *const moekit_combine_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_bias_grad_desc_init(desc: *mut moekit_bias_grad_desc_t) -> moekit_status_t;
    pub fn moekit_bias_grad_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_bias_grad_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_db1_args_init(args: *mut moekit_db1_args_t) -> moekit_status_t;
    pub fn moekit_db2_ds_args_init(args: *mut moekit_db2_ds_args_t) -> moekit_status_t;
    pub fn moekit_db1(
        plan: moekit_plan_t,
        args: *const moekit_db1_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_db2_ds(
        plan: moekit_plan_t,
        args: *const moekit_db2_ds_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;

    // Sparse-FFN group selection, load balance, subsample rows
    pub fn moekit_sparse_ffn_desc_init(desc: *mut moekit_sparse_ffn_desc_t) -> moekit_status_t;
    pub fn moekit_group_select_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_sparse_ffn_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_group_select_args_init(args: *mut moekit_group_select_args_t) -> moekit_status_t;
    pub fn moekit_group_select(
        plan: moekit_plan_t,
        args: *const moekit_group_select_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_load_balance_args_init(args: *mut moekit_load_balance_args_t) -> moekit_status_t;
    pub fn moekit_load_balance_update(
        handle: moekit_handle_t,
        args: *const moekit_load_balance_args_t,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_subsample_rows(
        seed: u64,
        num_groups: i64,
        group_size: i64,
        rows_per_group: i64,
        out: *mut i32,
    ) -> moekit_status_t;

    // The MoE layer
    pub fn moekit_moe_desc_init(desc: *mut moekit_moe_desc_t) -> moekit_status_t;
    pub fn moekit_moe_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_moe_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_moe_fwd_args_init(args: *mut moekit_moe_fwd_args_t) -> moekit_status_t;
    pub fn moekit_moe_bwd_args_init(args: *mut moekit_moe_bwd_args_t) -> moekit_status_t;
    pub fn moekit_moe_forward(
        plan: moekit_plan_t,
        args: *const moekit_moe_fwd_args_t,
        saved: *mut c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_moe_backward(
        plan: moekit_plan_t,
        args: *const moekit_moe_bwd_args_t,
        saved: *const c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;

    // The experts alone
    pub fn moekit_experts_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_moe_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_experts_fwd_args_init(args: *mut moekit_experts_fwd_args_t) -> moekit_status_t;
    pub fn moekit_experts_bwd_args_init(args: *mut moekit_experts_bwd_args_t) -> moekit_status_t;
    pub fn moekit_experts_forward(
        plan: moekit_plan_t,
        args: *const moekit_experts_fwd_args_t,
        saved: *mut c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_experts_backward(
        plan: moekit_plan_t,
        args: *const moekit_experts_bwd_args_t,
        saved: *const c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;

    // The experts on token-major rows
    pub fn moekit_token_experts_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_moe_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_token_experts_fwd_args_init(args: *mut moekit_token_experts_fwd_args_t) -> moekit_status_t;
    pub fn moekit_token_experts_bwd_args_init(args: *mut moekit_token_experts_bwd_args_t) -> moekit_status_t;
    pub fn moekit_token_experts_forward(
        plan: moekit_plan_t,
        args: *const moekit_token_experts_fwd_args_t,
        saved: *mut c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_token_experts_backward(
        plan: moekit_plan_t,
        args: *const moekit_token_experts_bwd_args_t,
        saved: *const c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;

    // The sparse SwiGLU FFN layer
    pub fn moekit_sparse_ffn_plan_create(
        handle: moekit_handle_t,
        desc: *const moekit_sparse_ffn_desc_t,
        plan: *mut moekit_plan_t,
    ) -> moekit_status_t;
    pub fn moekit_sparse_ffn_fwd_args_init(args: *mut moekit_sparse_ffn_fwd_args_t) -> moekit_status_t;
    pub fn moekit_sparse_ffn_bwd_args_init(args: *mut moekit_sparse_ffn_bwd_args_t) -> moekit_status_t;
    pub fn moekit_sparse_ffn_forward(
        plan: moekit_plan_t,
        args: *const moekit_sparse_ffn_fwd_args_t,
        saved: *mut c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
    pub fn moekit_sparse_ffn_backward(
        plan: moekit_plan_t,
        args: *const moekit_sparse_ffn_bwd_args_t,
        saved: *const c_void,
        saved_bytes: usize,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> moekit_status_t;
}
