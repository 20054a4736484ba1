//! Tensor views borrowed from slices. A view's shape must cover its slice exactly (contiguous, row-major), which
//! is what makes handing it to the library safe: the library checks shapes against the plan and touches nothing
//! past them. `Tensor` borrows shared (an input, never written), `TensorMut` exclusive (an output).
use std::marker::PhantomData;

use moekit_sys as sys;

use crate::error::{Error, Result};
use crate::scalar::Element;

/// A read-only view of a slice as a contiguous tensor of up to 4 dimensions.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    raw: sys::moekit_tensor_t,
    _data: PhantomData<&'a [u8]>,
}

/// A writable view of a slice as a contiguous tensor of up to 4 dimensions.
pub struct TensorMut<'a> {
    raw: sys::moekit_tensor_t,
    _data: PhantomData<&'a mut [u8]>,
}

impl<'a> Tensor<'a> {
    pub fn new<T: Element>(data: &'a [T], shape: &[usize]) -> Result<Tensor<'a>> {
        let raw = describe(data.as_ptr() as *mut T, T::DTYPE, data.len(), shape)?;
        Ok(Tensor { raw, _data: PhantomData })
    }

    pub fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.rank as usize]
    }

    pub(crate) fn raw(&self) -> sys::moekit_tensor_t {
        self.raw
    }
}

impl<'a> TensorMut<'a> {
    pub fn new<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<TensorMut<'a>> {
        let raw = describe(data.as_mut_ptr(), T::DTYPE, data.len(), shape)?;
        Ok(TensorMut { raw, _data: PhantomData })
    }

    pub fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.rank as usize]
    }

    pub(crate) fn raw(&self) -> sys::moekit_tensor_t {
        self.raw
    }
}

/// The C view of `len` elements at `data` as `shape`, after checking the shape covers them exactly.
fn describe<T>(data: *mut T, dtype: sys::moekit_dtype_t, len: usize, shape: &[usize]) -> Result<sys::moekit_tensor_t> {
    if shape.len() > sys::MOEKIT_MAX_RANK {
        return Err(Error::invalid_value(format!("tensor view: rank {} > {}", shape.len(), sys::MOEKIT_MAX_RANK)));
    }
    let elements = shape.iter().try_fold(1usize, |product, &extent| product.checked_mul(extent));
    if elements != Some(len) {
        return Err(Error::invalid_value(format!(
            "tensor view: shape {shape:?} does not cover a slice of {len} elements"
        )));
    }
    let mut extents = [0i64; sys::MOEKIT_MAX_RANK];
    for (extent, &size) in extents.iter_mut().zip(shape) {
        // Fits: the product of the extents is a slice length, at most isize::MAX.
        *extent = size as i64;
    }
    let cpu = sys::moekit_device_t { r#type: sys::MOEKIT_DEVICE_CPU, index: 0 };
    // SAFETY: moekit_tensor_make only reads `shape.len()` extents and stores the pointer; it never fails.
    Ok(unsafe { sys::moekit_tensor_make(data.cast(), dtype, shape.len() as i32, extents.as_ptr(), cpu) })
}

/// The C view of an optional tensor: absent (NULL data, rank 0) for None.
pub(crate) fn raw_or_absent(tensor: Option<&Tensor<'_>>) -> sys::moekit_tensor_t {
    tensor.map_or_else(sys::moekit_tensor_t::default, Tensor::raw)
}

pub(crate) fn raw_mut_or_absent(tensor: Option<&TensorMut<'_>>) -> sys::moekit_tensor_t {
    tensor.map_or_else(sys::moekit_tensor_t::default, TensorMut::raw)
}
