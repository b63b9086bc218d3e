//! How the quantized kernels treat their activations.

use std::fmt;
use std::str::FromStr;

/// The activation precision of the quantized CPU kernels
/// ([`quantized_matmul_with`](super::quantized_matmul_with),
/// [`gate_qmv_silu_mul_with`](super::gate_qmv_silu_mul_with),
/// [`gather_gate_qmv_silu_mul_with`](super::gather_gate_qmv_silu_mul_with)).
///
/// It only selects how the CPU kernel computes; where an op builds MLX's
/// fallback graph instead (a GPU stream, an ineligible dtype or bit width,
/// the kernel disabled) the mode has no effect and MLX's own precision applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ActivationPrecision {
    /// x widened to f32 and dotted with the dequantized weights in f32 (FMA):
    /// MLX's result to f32 rounding.
    #[default]
    Exact,
    /// x quantized per block of 32 values to int8 as llama.cpp's Q8 does
    /// (`d = max|x| / 127`), then integer dot products with the packed
    /// weights (AVX-512 VNNI, AVX-VNNI or AVX2, picked at run time); the
    /// bias term uses exact sums of x. Faster, and ~1e-3..1e-2 relative
    /// error per dot product (the x rounding, at most `d/2` per value).
    Int8,
    /// x rounded to int16 (`d = max|x| / 32767`, each value off by at most
    /// `d/2`, some 256 times finer than `Int8`), then integer dot products:
    /// `vpdpwssd` on AVX-512 VNNI, `vpmaddwd` on AVX2 (where
    /// `MLX_BACKEND_INT16_AVX2` is not off; otherwise as `Exact`). Below
    /// `row_lanes`' row count (4 x rows on AVX-512, 8 on AVX2) `d` is per
    /// packed word of W (8 values at 4 bits, 4 at 8 bits); from there on
    /// `row_lanes` rounds per group of W. So a row's result can depend on
    /// how many rows share its call, and a request's greedy tokens on its
    /// batch; `Exact` is batch-invariant.
    Int16,
}

impl ActivationPrecision {
    /// The name [`FromStr`] reads: `exact`, `int16` or `int8`.
    pub fn as_str(self) -> &'static str {
        match self {
            ActivationPrecision::Exact => "exact",
            ActivationPrecision::Int16 => "int16",
            ActivationPrecision::Int8 => "int8",
        }
    }

    /// The code passed through the C++ Primitive (part of `is_equivalent`).
    pub(crate) fn code(self) -> i32 {
        match self {
            ActivationPrecision::Exact => 0,
            ActivationPrecision::Int8 => 1,
            ActivationPrecision::Int16 => 2,
        }
    }

    pub(crate) fn from_code(code: i32) -> Option<ActivationPrecision> {
        match code {
            0 => Some(ActivationPrecision::Exact),
            1 => Some(ActivationPrecision::Int8),
            2 => Some(ActivationPrecision::Int16),
            _ => None,
        }
    }
}

impl fmt::Display for ActivationPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name [`ActivationPrecision`]'s [`FromStr`] does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownActivationPrecision(pub String);

impl fmt::Display for UnknownActivationPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown activation precision {:?} (exact, int16 or int8)",
            self.0
        )
    }
}

impl std::error::Error for UnknownActivationPrecision {}

impl FromStr for ActivationPrecision {
    type Err = UnknownActivationPrecision;

    fn from_str(s: &str) -> Result<ActivationPrecision, UnknownActivationPrecision> {
        [
            ActivationPrecision::Exact,
            ActivationPrecision::Int16,
            ActivationPrecision::Int8,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
        .ok_or_else(|| UnknownActivationPrecision(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_unknown_ones_are_typed_errors() {
        for a in [
            ActivationPrecision::Exact,
            ActivationPrecision::Int16,
            ActivationPrecision::Int8,
        ] {
            assert_eq!(a.to_string().parse::<ActivationPrecision>(), Ok(a));
        }
        let e = "fp8".parse::<ActivationPrecision>().unwrap_err();
        assert_eq!(e, UnknownActivationPrecision("fp8".into()));
        assert!(e.to_string().contains("int16"));
    }
}
