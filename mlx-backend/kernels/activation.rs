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
    /// x rounded to int16 per packed word of W (8 values at 4 bits, 4 at 8
    /// bits; `d = max|x| / 32767`), then `vpdpwssd` on AVX-512 VNNI: about
    /// twice the multiply-adds per instruction of the f32 FMA, and each x
    /// value off by at most `d/2` (~1.5e-5 of its word's largest |x|, some
    /// 256 times finer than `Int8`). Where the CPU lacks AVX-512 VNNI the
    /// kernels compute as `Exact`.
    Int16,
}

impl ActivationPrecision {
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
