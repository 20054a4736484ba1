//! One MoE layer forward and backward from safe Rust, on moekit's reference (CPU) backend: bf16, T = 256 tokens,
//! H = 256, I = 128 (SwiGLU), E = 8 experts, top-2 with the softmax over the two selected logits, weight gradients
//! in fp32 (the layer of examples/c/moe_layer.c). Prints the norms, the routing counts and the time of each call;
//! checks the counts add up to T*K, every norm is finite and non-zero, and a second forward gives the same bits.
//!
//!   MOEKIT_DIR=<install prefix> cargo run --offline --example moe_layer
use std::process::ExitCode;
use std::time::Instant;

use moekit::{
    Bf16, Dtype, Handle, MoeConfig, MoeGradients, MoeLayer, MoeOutputs, MoeWeights, Saved, Tensor, TensorMut,
};

const T: usize = 256;
const H: usize = 256;
const I: usize = 128;
const E: usize = 8;
const K: usize = 2;

/// SplitMix64 (the C examples' generator): uniform values in [-scale, scale).
struct Rng(u64);

impl Rng {
    fn uniform(&mut self, scale: f32) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        ((2.0 * unit - 1.0) * f64::from(scale)) as f32
    }

    fn bf16(&mut self, count: usize, scale: f32) -> Vec<Bf16> {
        (0..count).map(|_| Bf16::from_f32(self.uniform(scale))).collect()
    }
}

fn norm<T: Copy>(values: &[T], to_f64: impl Fn(T) -> f64) -> f64 {
    values.iter().map(|&v| to_f64(v) * to_f64(v)).sum::<f64>().sqrt()
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("moe_layer: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let handle = Handle::reference()?;
    let mut config = MoeConfig::new(T, H, I, E, K);
    config.dtype = Dtype::Bf16;
    config.weight_grad_dtype = Some(Dtype::Fp32);
    let mut layer = MoeLayer::new(&handle, &config)?;
    let mut saved: Saved = layer.new_saved();

    // x ~ U(-1, 1), each weight ~ U(-1, 1) / sqrt(fan-in), so every output is O(1).
    let mut rng = Rng(42);
    let x = rng.bf16(T * H, 1.0);
    let w_router = rng.bf16(E * H, 1.0 / (H as f32).sqrt());
    let w1 = rng.bf16(E * 2 * I * H, 1.0 / (H as f32).sqrt());
    let w2 = rng.bf16(E * H * I, 1.0 / (I as f32).sqrt());
    let dout = rng.bf16(T * H, 1.0);
    let weights = MoeWeights::new(
        Tensor::new(&w_router, &[E, H])?,
        Tensor::new(&w1, &[E, 2 * I, H])?,
        Tensor::new(&w2, &[E, H, I])?,
    );
    let x_view = Tensor::new(&x, &[T, H])?;

    let mut out = vec![Bf16::default(); T * H];
    let mut counts = vec![0i32; E];
    let start = Instant::now();
    let mut outputs = MoeOutputs::new(TensorMut::new(&mut out, &[T, H])?);
    outputs.counts = Some(TensorMut::new(&mut counts, &[E])?);
    layer.forward(x_view, &weights, outputs, &mut saved)?;
    let forward_ms = start.elapsed().as_secs_f64() * 1e3;

    let (mut dx, mut dw_router) = (vec![Bf16::default(); T * H], vec![0f32; E * H]);
    let (mut dw1, mut dw2) = (vec![0f32; E * 2 * I * H], vec![0f32; E * H * I]);
    let start = Instant::now();
    let gradients = MoeGradients {
        dx: Some(TensorMut::new(&mut dx, &[T, H])?),
        dw_router: Some(TensorMut::new(&mut dw_router, &[E, H])?),
        dw1: Some(TensorMut::new(&mut dw1, &[E, 2 * I, H])?),
        dw2: Some(TensorMut::new(&mut dw2, &[E, H, I])?),
        ..MoeGradients::default()
    };
    layer.backward(x_view, Tensor::new(&dout, &[T, H])?, &weights, gradients, &saved)?;
    let backward_ms = start.elapsed().as_secs_f64() * 1e3;

    let mut out_again = vec![Bf16::default(); T * H];
    layer.forward(x_view, &weights, MoeOutputs::new(TensorMut::new(&mut out_again, &[T, H])?), &mut saved)?;

    println!("moekit {} (reference backend)", moekit::version());
    println!("layer: bf16, T={T} H={H} I={I} E={E} K={K}, SwiGLU, softmax over the top-k, fp32 weight gradients");
    println!("workspace: {} bytes, saved activations: {} bytes", layer.workspace_bytes(), layer.saved_bytes());
    println!("time: forward {forward_ms:.3} ms, backward {backward_ms:.3} ms");
    println!("pairs per expert: {counts:?}");
    if counts.iter().map(|&c| c as usize).sum::<usize>() != T * K {
        return Err("the per-expert counts do not add up to T*K".into());
    }
    let bf16 = |v: Bf16| f64::from(v.to_f32());
    let fp32 = |v: f32| f64::from(v);
    let norms = [
        ("out", norm(&out, bf16)),
        ("dx", norm(&dx, bf16)),
        ("dw_router", norm(&dw_router, fp32)),
        ("dw1", norm(&dw1, fp32)),
        ("dw2", norm(&dw2, fp32)),
    ];
    for (name, value) in norms {
        println!("  ||{name:<9}|| = {value:.6}");
        if !(value.is_finite() && value > 0.0) {
            return Err(format!("||{name}|| = {value} is not a finite positive number").into());
        }
    }
    if out != out_again {
        return Err("a second forward gave different bits".into());
    }
    println!("second forward: bitwise identical");
    Ok(())
}
