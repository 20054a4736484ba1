//! Element types a view may hold, and the two 16-bit floats (stored as their bits; std has no f16/bf16).
use moekit_sys as sys;

mod sealed {
    pub trait Sealed {}
}

/// A type whose slices can back a tensor view, with its moekit dtype. Sealed: the dtype must describe the memory
/// exactly, so only this crate implements it.
pub trait Element: Copy + sealed::Sealed {
    const DTYPE: sys::moekit_dtype_t;
}

/// bfloat16: the upper half of an IEEE binary32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// IEEE binary16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

macro_rules! element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: sys::moekit_dtype_t = sys::$dtype;
        }
    )*};
}
element!(
    Bf16 => MOEKIT_DTYPE_BF16,
    F16 => MOEKIT_DTYPE_FP16,
    f32 => MOEKIT_DTYPE_FP32,
    f64 => MOEKIT_DTYPE_FP64,
    i32 => MOEKIT_DTYPE_INT32,
    i64 => MOEKIT_DTYPE_INT64,
);

impl Bf16 {
    /// Rounded to nearest, ties to even; NaN stays a quiet NaN.
    pub fn from_f32(value: f32) -> Bf16 {
        let bits = value.to_bits();
        if value.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        Bf16(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as u16)
    }

    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

impl F16 {
    /// Rounded to nearest, ties to even, subnormals included; beyond the range: infinity; NaN stays a quiet NaN.
    pub fn from_f32(value: f32) -> F16 {
        let bits = value.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let exponent = ((bits >> 23) & 0xFF) as i32;
        let mantissa = bits & 0x7F_FFFF;
        if exponent == 0xFF {
            return F16(sign | 0x7C00 | if mantissa != 0 { 0x0200 } else { 0 });
        }
        let half_exponent = exponent - 127 + 15;
        if half_exponent >= 0x1F {
            return F16(sign | 0x7C00);
        }
        if half_exponent <= 0 {
            // Subnormal (or zero): the significand with its leading 1, in units of 2^-24.
            if half_exponent < -10 {
                return F16(sign);
            }
            let significand = mantissa | 0x80_0000;
            let shift = (14 - half_exponent) as u32;
            let rounded = (significand + (1 << (shift - 1)) - 1 + ((significand >> shift) & 1)) >> shift;
            return F16(sign | rounded as u16);
        }
        // A carry out of the mantissa moves into the exponent (and up to infinity), as it should.
        let rounded = (mantissa + 0x0FFF + ((mantissa >> 13) & 1)) >> 13;
        F16(sign | (((half_exponent as u32) << 10) + rounded) as u16)
    }

    pub fn to_f32(self) -> f32 {
        let sign = if self.0 & 0x8000 != 0 { -1.0f32 } else { 1.0 };
        let exponent = u32::from((self.0 >> 10) & 0x1F);
        let mantissa = u32::from(self.0 & 0x3FF);
        match exponent {
            0 => sign * mantissa as f32 * (1.0 / 16_777_216.0),
            0x1F => f32::from_bits((u32::from(self.0 & 0x8000) << 16) | 0x7F80_0000 | (mantissa << 13)),
            _ => f32::from_bits((u32::from(self.0 & 0x8000) << 16) | ((exponent + 112) << 23) | (mantissa << 13)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f16_survives_a_round_trip_through_f32() {
        for bits in 0..=u16::MAX {
            let value = F16(bits).to_f32();
            if value.is_nan() {
                assert!(F16::from_f32(value).to_f32().is_nan());
            } else {
                assert_eq!(F16::from_f32(value), F16(bits), "{bits:#06x} -> {value}");
            }
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and the next f16 (1 + 2^-10): ties go to the even mantissa, 1.
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0), F16(0x3C00));
        assert_eq!(F16::from_f32(1.0 + 3.0 / 2048.0), F16(0x3C02));
        assert_eq!(F16::from_f32(65520.0), F16(0x7C00)); // rounds past the largest finite value, 65504
        assert_eq!(F16::from_f32(2.0f32.powi(-25)), F16(0)); // half the smallest subnormal: ties to even (0)
        assert_eq!(F16::from_f32(1.5 * 2.0f32.powi(-24)), F16(2));
    }

    #[test]
    fn every_bf16_survives_a_round_trip_and_rounding_is_to_even() {
        for bits in 0..=u16::MAX {
            let value = Bf16(bits).to_f32();
            if !value.is_nan() {
                assert_eq!(Bf16::from_f32(value), Bf16(bits));
            }
        }
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3F80_8000)), Bf16(0x3F80)); // tie, even below
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3F81_8000)), Bf16(0x3F82)); // tie, even above
    }
}
