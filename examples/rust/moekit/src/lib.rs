//! moekit from safe Rust: the MoE layer's forward and backward on moekit's reference (CPU) backend.
//!
//! - [`Handle`] owns a moekit handle and [`MoeLayer`] a plan; both are freed on drop, and a layer borrows its handle,
//!   so the plan always goes first (as the C API requires).
//! - [`Tensor`] and [`TensorMut`] are views borrowed from slices: a view's shape must cover its slice exactly, so the
//!   library never reaches past the memory the borrow checker handed over, and an output cannot alias an input.
//! - Every failure is an [`Error`] carrying the library's status and its own message ("w1: expected shape ...").
//! - Workspace and saved-activation buffers are allocated by the wrapper, at the sizes the plan reports.
//!
//! The building blocks (router, dispatch, grouped GEMM, ...), the sparse FFN and CUDA handles (device memory) are
//! reachable through the raw bindings, re-exported as [`sys`].
//!
//! The borrow checker enforces the C API's rules. A plan cannot outlive its handle:
//!
//! ```compile_fail
//! use moekit::{Handle, MoeConfig, MoeLayer};
//! let layer = {
//!     let handle = Handle::reference().unwrap();
//!     MoeLayer::new(&handle, &MoeConfig::new(16, 32, 16, 4, 2)).unwrap()
//! }; // error: `handle` dropped here while still borrowed
//! drop(layer);
//! ```
//!
//! and an output cannot alias an input:
//!
//! ```compile_fail
//! let mut data = vec![0f32; 4];
//! let input = moekit::Tensor::new(&data, &[4]).unwrap();
//! let output = moekit::TensorMut::new(&mut data, &[4]).unwrap(); // error: `data` is already borrowed
//! drop((input, output));
//! ```
mod buffer;
mod error;
mod handle;
mod moe;
mod scalar;
mod tensor;

pub use error::{Error, Result, Status};
pub use handle::Handle;
pub use moe::{Activation, Dtype, MoeConfig, MoeGradients, MoeLayer, MoeOutputs, MoeWeights, RouterKind, Saved};
pub use moekit_sys as sys;
pub use scalar::{Bf16, Element, F16};
pub use tensor::{Tensor, TensorMut};

/// The version of the library actually loaded, `MAJOR*10000 + MINOR*100 + PATCH`.
pub fn version() -> i32 {
    // SAFETY: no arguments, no preconditions.
    unsafe { sys::moekit_get_version() }
}
