//! How the quantized kernels treat their activations.

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
}

impl ActivationPrecision {
    /// The code passed through the C++ Primitive (part of `is_equivalent`).
    pub(crate) fn code(self) -> i32 {
        match self {
            ActivationPrecision::Exact => 0,
            ActivationPrecision::Int8 => 1,
        }
    }

    pub(crate) fn from_code(code: i32) -> Option<ActivationPrecision> {
        match code {
            0 => Some(ActivationPrecision::Exact),
            1 => Some(ActivationPrecision::Int8),
            _ => None,
        }
    }
}
