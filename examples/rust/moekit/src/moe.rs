//! The MoE layer (docs/math.md sections 3 and 4): a plan, its workspace, forward and backward.
use std::marker::PhantomData;

use moekit_sys as sys;

use crate::buffer::AlignedBuffer;
use crate::error::{check, Error, Result};
use crate::handle::Handle;
use crate::tensor::{raw_mut_or_absent, raw_or_absent, Tensor, TensorMut};

/// Floating-point dtypes of a layer (fp64 on the reference backend only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Bf16,
    Fp16,
    Fp32,
    Fp64,
}

impl Dtype {
    fn raw(self) -> sys::moekit_dtype_t {
        match self {
            Dtype::Bf16 => sys::MOEKIT_DTYPE_BF16,
            Dtype::Fp16 => sys::MOEKIT_DTYPE_FP16,
            Dtype::Fp32 => sys::MOEKIT_DTYPE_FP32,
            Dtype::Fp64 => sys::MOEKIT_DTYPE_FP64,
        }
    }
}

/// The expert activation (`moekit_activation_t`); the gated ones read a `2I`-wide `h`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    SwiGlu,
    GeGlu,
    ReGlu,
    /// gpt-oss's clamped SwiGLU with limit L.
    SwiGluOai {
        limit: f64,
    },
    Gelu,
    Relu,
    Silu,
    Relu2,
}

/// How the router turns logits into scores (`moekit_router_kind_t`, docs/math.md section 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterKind {
    /// Softmax over the K selected logits.
    SoftmaxTopK,
    /// Softmax over all experts, then top-k; `renormalize` divides by the selected sum.
    TopKSoftmax { renormalize: bool },
    /// Top-k of already-activated logits.
    TopK { renormalize: bool },
    /// Sigmoid, selection by sigmoid + bias, times `scale`.
    Sigmoid { renormalize: bool, scale: f64 },
}

/// The shape and options of a layer. `MoeConfig::new` sets the defaults of `moekit_moe_desc_init`: SwiGLU with
/// concatenated halves, softmax over the top-k, no biases, training, bf16, weight gradients in the layer dtype.
#[derive(Clone, Debug)]
pub struct MoeConfig {
    pub max_tokens: usize,
    pub hidden: usize,
    pub intermediate: usize,
    /// Experts the router chooses among (rows of Wr).
    pub router_experts: usize,
    /// Local experts held in W1, W2 (fewer than `router_experts` under expert parallelism).
    pub experts: usize,
    /// Global id of local expert 0.
    pub expert_begin: usize,
    pub top_k: usize,
    pub activation: Activation,
    /// Even rows of W1 are the gate, odd rows the up projection (instead of two halves).
    pub interleaved_glu: bool,
    pub router: RouterKind,
    pub has_b1: bool,
    pub has_b2: bool,
    /// Forward only: no saved activations, no backward.
    pub inference: bool,
    pub dtype: Dtype,
    /// dWr, dW1, db1, dW2, db2: the layer dtype (None) or fp32.
    pub weight_grad_dtype: Option<Dtype>,
    /// The router's load-balancing loss (docs/math.md section 1.1): 0 = off; softmax router kinds only.
    pub load_balance_coeff: f64,
    /// The router z-loss: 0 = off.
    pub z_loss_coeff: f64,
}

impl MoeConfig {
    pub fn new(max_tokens: usize, hidden: usize, intermediate: usize, experts: usize, top_k: usize) -> MoeConfig {
        MoeConfig {
            max_tokens,
            hidden,
            intermediate,
            router_experts: experts,
            experts,
            expert_begin: 0,
            top_k,
            activation: Activation::SwiGlu,
            interleaved_glu: false,
            router: RouterKind::SoftmaxTopK,
            has_b1: false,
            has_b2: false,
            inference: false,
            dtype: Dtype::Bf16,
            weight_grad_dtype: None,
            load_balance_coeff: 0.0,
            z_loss_coeff: 0.0,
        }
    }

    fn desc(&self) -> Result<sys::moekit_moe_desc_t> {
        let mut desc = sys::moekit_moe_desc_t::default();
        // SAFETY: desc is a valid, writable struct.
        check(unsafe { sys::moekit_moe_desc_init(&mut desc) })?;
        desc.max_tokens = to_i64(self.max_tokens, "max_tokens")?;
        desc.hidden = to_i64(self.hidden, "hidden")?;
        desc.intermediate = to_i64(self.intermediate, "intermediate")?;
        desc.router_experts = to_i64(self.router_experts, "router_experts")?;
        desc.experts = to_i64(self.experts, "experts")?;
        desc.expert_begin = to_i64(self.expert_begin, "expert_begin")?;
        desc.top_k = to_i64(self.top_k, "top_k")?;
        desc.activation = match self.activation {
            Activation::SwiGlu => sys::MOEKIT_ACT_SWIGLU,
            Activation::GeGlu => sys::MOEKIT_ACT_GEGLU,
            Activation::ReGlu => sys::MOEKIT_ACT_REGLU,
            Activation::SwiGluOai { limit } => {
                desc.glu_limit = limit;
                sys::MOEKIT_ACT_SWIGLU_OAI
            }
            Activation::Gelu => sys::MOEKIT_ACT_GELU,
            Activation::Relu => sys::MOEKIT_ACT_RELU,
            Activation::Silu => sys::MOEKIT_ACT_SILU,
            Activation::Relu2 => sys::MOEKIT_ACT_RELU2,
        };
        desc.glu_layout = if self.interleaved_glu { sys::MOEKIT_GLU_INTERLEAVED } else { sys::MOEKIT_GLU_CONCAT };
        let (kind, renormalize) = match self.router {
            RouterKind::SoftmaxTopK => (sys::MOEKIT_ROUTER_SOFTMAX_TOPK, false),
            RouterKind::TopKSoftmax { renormalize } => (sys::MOEKIT_ROUTER_TOPK_SOFTMAX, renormalize),
            RouterKind::TopK { renormalize } => (sys::MOEKIT_ROUTER_TOPK, renormalize),
            RouterKind::Sigmoid { renormalize, scale } => {
                desc.router_scale = scale;
                (sys::MOEKIT_ROUTER_SIGMOID, renormalize)
            }
        };
        desc.router = kind;
        desc.renormalize = i32::from(renormalize);
        desc.has_b1 = i32::from(self.has_b1);
        desc.has_b2 = i32::from(self.has_b2);
        desc.inference = i32::from(self.inference);
        desc.dtype = self.dtype.raw();
        desc.weight_grad_dtype = self.weight_grad_dtype.map_or(sys::MOEKIT_DTYPE_INVALID, Dtype::raw);
        desc.load_balance_coeff = self.load_balance_coeff;
        desc.z_loss_coeff = self.z_loss_coeff;
        Ok(desc)
    }
}

fn to_i64(value: usize, name: &str) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::invalid_value(format!("{name}: {value} does not fit an int64")))
}

/// The layer's parameters: Wr [router_experts, H], W1 [E, 2I, H] ([E, I, H] non-gated), W2 [E, H, I], and the
/// optional b1 [E, 2I], b2 [E, H] and (sigmoid router) selection bias [router_experts] fp32.
#[derive(Clone, Copy)]
pub struct MoeWeights<'a> {
    pub w_router: Tensor<'a>,
    pub w1: Tensor<'a>,
    pub w2: Tensor<'a>,
    pub b1: Option<Tensor<'a>>,
    pub b2: Option<Tensor<'a>>,
    pub router_bias: Option<Tensor<'a>>,
}

impl<'a> MoeWeights<'a> {
    pub fn new(w_router: Tensor<'a>, w1: Tensor<'a>, w2: Tensor<'a>) -> MoeWeights<'a> {
        MoeWeights { w_router, w1, w2, b1: None, b2: None, router_bias: None }
    }
}

/// What a forward writes: `out [T, H] = beta_out * out + layer(x)`, and optionally the routing it chose: scores
/// [T, K] fp32, indices [T, K] int32/int64 (global expert ids), counts [router_experts] int32; and the auxiliary
/// losses that are on, one fp32 element each (fp64 in an fp64 layer).
pub struct MoeOutputs<'a> {
    pub out: TensorMut<'a>,
    pub scores: Option<TensorMut<'a>>,
    pub indices: Option<TensorMut<'a>>,
    pub counts: Option<TensorMut<'a>>,
    pub beta_out: f64,
    pub load_balance_loss: Option<TensorMut<'a>>,
    pub z_loss: Option<TensorMut<'a>>,
}

impl<'a> MoeOutputs<'a> {
    pub fn new(out: TensorMut<'a>) -> MoeOutputs<'a> {
        MoeOutputs {
            out,
            scores: None,
            indices: None,
            counts: None,
            beta_out: 0.0,
            load_balance_loss: None,
            z_loss: None,
        }
    }
}

/// What a backward writes. A present `dx` asks for the input gradient; any present weight gradient asks for all
/// of them (dw_router, dw1, dw2, and db1 / db2 with biases). `grad = beta * grad + new`; beta 0 never reads the old
/// value. With auxiliary losses on, their gradients enter dx and dw_router, scaled by the losses' upstream gradients
/// (one element each; None = 1).
#[derive(Default)]
pub struct MoeGradients<'a> {
    pub dx: Option<TensorMut<'a>>,
    pub dw_router: Option<TensorMut<'a>>,
    pub dw1: Option<TensorMut<'a>>,
    pub db1: Option<TensorMut<'a>>,
    pub dw2: Option<TensorMut<'a>>,
    pub db2: Option<TensorMut<'a>>,
    pub beta_dx: f64,
    pub beta_dw_router: f64,
    pub beta_dw1: f64,
    pub beta_db1: f64,
    pub beta_dw2: f64,
    pub beta_db2: f64,
    pub dload_balance_loss: Option<Tensor<'a>>,
    pub dz_loss: Option<Tensor<'a>>,
}

/// The activations a forward saves for its backward (`moekit_plan_saved_size` bytes; empty in inference mode).
/// The library stamps it with the plan that filled it and rejects it anywhere else.
pub struct Saved {
    buffer: AlignedBuffer,
}

/// An MoE layer plan on a handle it borrows, with the workspace its calls use.
pub struct MoeLayer<'h> {
    plan: sys::moekit_plan_t,
    workspace: AlignedBuffer,
    saved_bytes: usize,
    _handle: PhantomData<&'h Handle>,
}

impl<'h> MoeLayer<'h> {
    pub fn new(handle: &'h Handle, config: &MoeConfig) -> Result<MoeLayer<'h>> {
        let desc = config.desc()?;
        let mut plan = std::ptr::null_mut();
        // SAFETY: the handle is alive (borrowed for 'h) and desc initialised; plan is written only on success.
        check(unsafe { sys::moekit_moe_plan_create(handle.as_raw(), &desc, &mut plan) })?;
        // From here on `layer` owns the plan, so an error below still destroys it.
        let mut layer = MoeLayer { plan, workspace: AlignedBuffer::new(0), saved_bytes: 0, _handle: PhantomData };
        let mut workspace_bytes = 0;
        // SAFETY: plan is valid; the outputs are writable.
        check(unsafe { sys::moekit_plan_workspace_size(plan, &mut workspace_bytes) })?;
        check(unsafe { sys::moekit_plan_saved_size(plan, &mut layer.saved_bytes) })?;
        layer.workspace = AlignedBuffer::new(workspace_bytes);
        Ok(layer)
    }

    /// A buffer for this layer's saved activations (reuse it from step to step).
    pub fn new_saved(&self) -> Saved {
        Saved { buffer: AlignedBuffer::new(self.saved_bytes) }
    }

    /// Bytes of scratch memory each call uses (allocated once, held by the layer).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.len()
    }

    /// Bytes of saved activations a forward keeps for the backward.
    pub fn saved_bytes(&self) -> usize {
        self.saved_bytes
    }

    /// `out = beta_out * out + MoE(x)` for x [T, H], T <= max_tokens; fills `saved` for the backward.
    pub fn forward(
        &mut self,
        x: Tensor<'_>,
        weights: &MoeWeights<'_>,
        outputs: MoeOutputs<'_>,
        saved: &mut Saved,
    ) -> Result<()> {
        let mut args = sys::moekit_moe_fwd_args_t::default();
        // SAFETY: args is a valid, writable struct.
        check(unsafe { sys::moekit_moe_fwd_args_init(&mut args) })?;
        args.x = x.raw();
        args.w_router = weights.w_router.raw();
        args.router_bias = raw_or_absent(weights.router_bias.as_ref());
        args.w1 = weights.w1.raw();
        args.b1 = raw_or_absent(weights.b1.as_ref());
        args.w2 = weights.w2.raw();
        args.b2 = raw_or_absent(weights.b2.as_ref());
        args.out = outputs.out.raw();
        args.scores = raw_mut_or_absent(outputs.scores.as_ref());
        args.indices = raw_mut_or_absent(outputs.indices.as_ref());
        args.counts = raw_mut_or_absent(outputs.counts.as_ref());
        args.beta_out = outputs.beta_out;
        args.load_balance_loss = raw_mut_or_absent(outputs.load_balance_loss.as_ref());
        args.z_loss = raw_mut_or_absent(outputs.z_loss.as_ref());
        // SAFETY: every view covers memory borrowed for this call (inputs shared, outputs exclusive); the library
        // checks their shapes against the plan and writes only the outputs, `saved` and the workspace, whose sizes
        // are passed. The reference backend computes synchronously, so nothing outlives the call.
        check(unsafe {
            sys::moekit_moe_forward(
                self.plan,
                &args,
                saved.buffer.as_mut_ptr(),
                saved.buffer.len(),
                self.workspace.as_mut_ptr(),
                self.workspace.len(),
                std::ptr::null_mut(),
            )
        })
    }

    /// The gradients of the layer for `dout` [T, H], from the `saved` of this layer's forward on the same, unmodified
    /// `x` and weights.
    pub fn backward(
        &mut self,
        x: Tensor<'_>,
        dout: Tensor<'_>,
        weights: &MoeWeights<'_>,
        gradients: MoeGradients<'_>,
        saved: &Saved,
    ) -> Result<()> {
        let mut args = sys::moekit_moe_bwd_args_t::default();
        // SAFETY: args is a valid, writable struct.
        check(unsafe { sys::moekit_moe_bwd_args_init(&mut args) })?;
        args.x = x.raw();
        args.dout = dout.raw();
        args.w_router = weights.w_router.raw();
        args.w1 = weights.w1.raw();
        args.w2 = weights.w2.raw();
        args.b2 = raw_or_absent(weights.b2.as_ref());
        args.dx = raw_mut_or_absent(gradients.dx.as_ref());
        args.dw_router = raw_mut_or_absent(gradients.dw_router.as_ref());
        args.dw1 = raw_mut_or_absent(gradients.dw1.as_ref());
        args.db1 = raw_mut_or_absent(gradients.db1.as_ref());
        args.dw2 = raw_mut_or_absent(gradients.dw2.as_ref());
        args.db2 = raw_mut_or_absent(gradients.db2.as_ref());
        args.compute_input_grad = i32::from(gradients.dx.is_some());
        let weight_grads = [&gradients.dw_router, &gradients.dw1, &gradients.db1, &gradients.dw2, &gradients.db2];
        args.compute_weight_grad = i32::from(weight_grads.iter().any(|grad| grad.is_some()));
        args.beta_dx = gradients.beta_dx;
        args.beta_dw_router = gradients.beta_dw_router;
        args.beta_dw1 = gradients.beta_dw1;
        args.beta_db1 = gradients.beta_db1;
        args.beta_dw2 = gradients.beta_dw2;
        args.beta_db2 = gradients.beta_db2;
        args.dload_balance_loss = raw_or_absent(gradients.dload_balance_loss.as_ref());
        args.dz_loss = raw_or_absent(gradients.dz_loss.as_ref());
        // SAFETY: as in forward; `saved` is only read.
        check(unsafe {
            sys::moekit_moe_backward(
                self.plan,
                &args,
                saved.buffer.as_ptr(),
                saved.buffer.len(),
                self.workspace.as_mut_ptr(),
                self.workspace.len(),
                std::ptr::null_mut(),
            )
        })
    }
}

impl Drop for MoeLayer<'_> {
    fn drop(&mut self) {
        // SAFETY: plan came from moekit_moe_plan_create and is destroyed once, before its handle (borrowed).
        let _ = unsafe { sys::moekit_plan_destroy(self.plan) };
    }
}
