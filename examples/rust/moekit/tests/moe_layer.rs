//! The safe wrapper on the reference backend, in fp64 so the checks can be tight:
//!  - the forward equals a plain Rust MoE layer (softmax over the top-2 logits, SwiGLU experts);
//!  - every gradient (dx, dWr, dW1, dW2) equals central differences of sum(out * dout);
//!  - failures come back as errors carrying the library's message.
use moekit::{Dtype, Handle, MoeConfig, MoeGradients, MoeLayer, MoeOutputs, MoeWeights, Status, Tensor, TensorMut};

const T: usize = 8;
const H: usize = 8;
const I: usize = 4;
const E: usize = 4;
const K: usize = 2;

/// Picks one parameter tensor of `Params` to nudge.
type Select = fn(&mut Params) -> &mut Vec<f64>;

struct Params {
    x: Vec<f64>,
    w_router: Vec<f64>,
    w1: Vec<f64>,
    w2: Vec<f64>,
    dout: Vec<f64>,
}

fn params() -> Params {
    let mut state = 7u64;
    let mut draw = |count: usize, scale: f64| -> Vec<f64> {
        (0..count)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
            })
            .collect()
    };
    Params {
        x: draw(T * H, 1.0),
        w_router: draw(E * H, 1.0),
        w1: draw(E * 2 * I * H, 0.5),
        w2: draw(E * H * I, 0.5),
        dout: draw(T * H, 1.0),
    }
}

fn config() -> MoeConfig {
    let mut config = MoeConfig::new(T, H, I, E, K);
    config.dtype = Dtype::Fp64;
    config
}

fn weights(p: &Params) -> MoeWeights<'_> {
    MoeWeights::new(
        Tensor::new(&p.w_router, &[E, H]).unwrap(),
        Tensor::new(&p.w1, &[E, 2 * I, H]).unwrap(),
        Tensor::new(&p.w2, &[E, H, I]).unwrap(),
    )
}

fn forward(layer: &mut MoeLayer<'_>, p: &Params) -> Vec<f64> {
    let mut out = vec![0.0; T * H];
    let mut saved = layer.new_saved();
    let outputs = MoeOutputs::new(TensorMut::new(&mut out, &[T, H]).unwrap());
    layer.forward(Tensor::new(&p.x, &[T, H]).unwrap(), &weights(p), outputs, &mut saved).unwrap();
    out
}

/// The layer written out plainly: logits = x Wr^T, the top-K logits (ties to the lower id), softmax over them,
/// each selected expert's W2 (silu(gate) * up) with [gate; up] = W1 x.
fn plain_forward(p: &Params) -> Vec<f64> {
    let mut out = vec![0.0; T * H];
    for t in 0..T {
        let x = &p.x[t * H..(t + 1) * H];
        let dot = |w: &[f64]| w.iter().zip(x).map(|(a, b)| a * b).sum::<f64>();
        let logits: Vec<f64> = (0..E).map(|e| dot(&p.w_router[e * H..(e + 1) * H])).collect();
        let mut order: Vec<usize> = (0..E).collect();
        order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
        let selected = &order[..K];
        let top = logits[selected[0]];
        let weights: Vec<f64> = selected.iter().map(|&e| (logits[e] - top).exp()).collect();
        let sum: f64 = weights.iter().sum();
        for (&e, w) in selected.iter().zip(&weights) {
            let w1 = &p.w1[e * 2 * I * H..(e + 1) * 2 * I * H];
            let a: Vec<f64> = (0..I)
                .map(|i| {
                    let gate = dot(&w1[i * H..(i + 1) * H]);
                    let up = dot(&w1[(I + i) * H..(I + i + 1) * H]);
                    gate / (1.0 + (-gate).exp()) * up
                })
                .collect();
            for h in 0..H {
                let row = &p.w2[e * H * I + h * I..e * H * I + (h + 1) * I];
                out[t * H + h] += w / sum * row.iter().zip(&a).map(|(u, v)| u * v).sum::<f64>();
            }
        }
    }
    out
}

#[test]
fn forward_matches_a_plain_implementation() {
    let handle = Handle::reference().unwrap();
    let mut layer = MoeLayer::new(&handle, &config()).unwrap();
    let p = params();
    let got = forward(&mut layer, &p);
    let want = plain_forward(&p);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "out[{i}] = {g}, plain {w}");
    }
}

#[test]
fn gradients_match_central_differences() {
    let handle = Handle::reference().unwrap();
    let mut layer = MoeLayer::new(&handle, &config()).unwrap();
    let mut p = params();

    let mut saved = layer.new_saved();
    let mut out = vec![0.0; T * H];
    let outputs = MoeOutputs::new(TensorMut::new(&mut out, &[T, H]).unwrap());
    layer.forward(Tensor::new(&p.x, &[T, H]).unwrap(), &weights(&p), outputs, &mut saved).unwrap();
    let (mut dx, mut dw_router) = (vec![f64::NAN; T * H], vec![f64::NAN; E * H]);
    let (mut dw1, mut dw2) = (vec![f64::NAN; E * 2 * I * H], vec![f64::NAN; E * H * I]);
    let gradients = MoeGradients {
        dx: Some(TensorMut::new(&mut dx, &[T, H]).unwrap()),
        dw_router: Some(TensorMut::new(&mut dw_router, &[E, H]).unwrap()),
        dw1: Some(TensorMut::new(&mut dw1, &[E, 2 * I, H]).unwrap()),
        dw2: Some(TensorMut::new(&mut dw2, &[E, H, I]).unwrap()),
        ..MoeGradients::default()
    };
    let (x, dout) = (Tensor::new(&p.x, &[T, H]).unwrap(), Tensor::new(&p.dout, &[T, H]).unwrap());
    layer.backward(x, dout, &weights(&p), gradients, &saved).unwrap();

    // loss = sum(out * dout); each parameter nudged by +-eps (too little to change any token's top-2).
    let eps = 1e-6;
    let analytic: [(&str, &[f64], Select); 4] = [
        ("dx", &dx, |p| &mut p.x),
        ("dw_router", &dw_router, |p| &mut p.w_router),
        ("dw1", &dw1, |p| &mut p.w1),
        ("dw2", &dw2, |p| &mut p.w2),
    ];
    for (name, gradient, select) in analytic {
        for (i, &value) in gradient.iter().enumerate() {
            let original = select(&mut p)[i];
            select(&mut p)[i] = original + eps;
            let plus: f64 = forward(&mut layer, &p).iter().zip(&p.dout).map(|(o, d)| o * d).sum();
            select(&mut p)[i] = original - eps;
            let minus: f64 = forward(&mut layer, &p).iter().zip(&p.dout).map(|(o, d)| o * d).sum();
            select(&mut p)[i] = original;
            let numeric = (plus - minus) / (2.0 * eps);
            assert!(
                (value - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "{name}[{i}] = {value}, central difference {numeric}"
            );
        }
    }
}

#[test]
fn a_wrong_shape_is_an_error_with_the_librarys_message() {
    let handle = Handle::reference().unwrap();
    let mut layer = MoeLayer::new(&handle, &config()).unwrap();
    let p = params();
    let mut saved = layer.new_saved();
    let mut out = vec![0.0; T * H];
    // x as [H, T] instead of [T, H]: same element count, wrong hidden width.
    let x = Tensor::new(&p.x, &[2 * T, H / 2]).unwrap();
    let outputs = MoeOutputs::new(TensorMut::new(&mut out, &[T, H]).unwrap());
    let error = layer.forward(x, &weights(&p), outputs, &mut saved).unwrap_err();
    assert_eq!(error.status(), Status::InvalidValue);
    assert!(error.message().contains('x'), "message: {}", error.message());
    assert!(error.to_string().starts_with("MOEKIT_STATUS_INVALID_VALUE: "), "{error}");
}

#[test]
fn a_view_must_cover_its_slice() {
    let data = vec![0f32; 10];
    let error = Tensor::new(&data, &[3, 4]).err().expect("10 elements are not [3, 4]");
    assert_eq!(error.status(), Status::InvalidValue);
    assert!(Tensor::new(&data, &[1, 1, 1, 1, 10]).is_err(), "rank 5 > MOEKIT_MAX_RANK");
    assert_eq!(Tensor::new(&data, &[2, 5]).unwrap().shape(), &[2, 5]);
}

#[test]
fn saved_activations_belong_to_their_plan() {
    let handle = Handle::reference().unwrap();
    let mut layer = MoeLayer::new(&handle, &config()).unwrap();
    let mut other = MoeLayer::new(&handle, &config()).unwrap();
    let p = params();
    let mut saved = other.new_saved();
    let mut out = vec![0.0; T * H];
    let outputs = MoeOutputs::new(TensorMut::new(&mut out, &[T, H]).unwrap());
    other.forward(Tensor::new(&p.x, &[T, H]).unwrap(), &weights(&p), outputs, &mut saved).unwrap();

    let mut dx = vec![0.0; T * H];
    let gradients = MoeGradients { dx: Some(TensorMut::new(&mut dx, &[T, H]).unwrap()), ..MoeGradients::default() };
    let (x, dout) = (Tensor::new(&p.x, &[T, H]).unwrap(), Tensor::new(&p.dout, &[T, H]).unwrap());
    let error = layer.backward(x, dout, &weights(&p), gradients, &saved).unwrap_err();
    assert_eq!(error.status(), Status::InvalidValue, "{error}");
}
