//! MLX affine quantization: `w ≈ scales * q + biases` per group of
//! `group_size` consecutive elements along the last axis, `q` packed into
//! uint32 words (`32 / bits` elements per word, low bits first).

use super::{stream, wrap};
use crate::array::{unlist, Array};
use crate::error::OpError;
use crate::ffi;

/// The parameters of MLX's affine quantization: `bits` per element (2, 3,
/// 4, 5, 6 or 8) and `group_size` consecutive elements along the last axis
/// sharing one scale and one bias (32, 64 or 128).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    /// Bits per quantized element.
    pub bits: i32,
    /// Elements per group (one scale and one bias each).
    pub group_size: i32,
}

/// A quantized matrix (or a stack of them, e.g. MoE experts `[E, N, K]`).
#[derive(Clone, Debug)]
pub struct Quantized {
    /// Packed uint32 `[..., N, K * bits / 32]`.
    pub weight: Array,
    /// `[..., N, K / group_size]`, in the activation dtype or narrower
    /// (a checkpoint's f16 scales with f32 activations).
    pub scales: Array,
    /// `[..., N, K / group_size]`, in the scales' dtype.
    pub biases: Array,
    /// Elements per group.
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
}

impl Quantized {
    /// The quantization parameters the matrix was packed with.
    pub fn spec(&self) -> QuantSpec {
        QuantSpec {
            bits: self.bits,
            group_size: self.group_size,
        }
    }
}

/// Quantize `w` along its last axis.
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<Quantized, OpError> {
    let l = ffi::quantize(w.inner(), group_size, bits, stream())
        .map_err(OpError::from_cxx("quantize"))?;
    let mut parts = unlist(&l).into_iter();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(weight), Some(scales), Some(biases)) => Ok(Quantized {
            weight,
            scales,
            biases,
            group_size,
            bits,
        }),
        _ => Err(OpError::new(
            "quantize",
            "MLX returned no biases for affine mode",
        )),
    }
}

impl Quantized {
    /// The unpacked matrix, in the scales' dtype.
    pub fn dequantize(&self) -> Result<Array, OpError> {
        // SAFETY: the biases pointer borrows self for the call.
        wrap("dequantize", unsafe {
            ffi::dequantize(
                self.weight.inner(),
                self.scales.inner(),
                Array::ptr(Some(&self.biases)),
                self.group_size,
                self.bits,
                stream(),
            )
        })
    }

    /// `x @ Wᵀ` (`transpose`) or `x @ W`, without unpacking W.
    pub fn matmul(&self, x: &Array, transpose: bool) -> Result<Array, OpError> {
        // SAFETY: the biases pointer borrows self for the call.
        wrap("quantized_matmul", unsafe {
            ffi::quantized_matmul(
                x.inner(),
                self.weight.inner(),
                self.scales.inner(),
                Array::ptr(Some(&self.biases)),
                transpose,
                self.group_size,
                self.bits,
                stream(),
            )
        })
    }

    /// `x[lhs_indices] @ W[rhs_indices]ᵀ` with matrix-level gathers (mlx-lm's SwitchGLU path).
    pub fn gather_matmul(
        &self,
        x: &Array,
        lhs_indices: Option<&Array>,
        rhs_indices: Option<&Array>,
        transpose: bool,
        sorted_indices: bool,
    ) -> Result<Array, OpError> {
        // SAFETY: all pointers are null or borrow arrays that outlive the call.
        wrap("gather_qmm", unsafe {
            ffi::gather_qmm(
                x.inner(),
                self.weight.inner(),
                self.scales.inner(),
                Array::ptr(Some(&self.biases)),
                Array::ptr(lhs_indices),
                Array::ptr(rhs_indices),
                transpose,
                self.group_size,
                self.bits,
                sorted_indices,
                stream(),
            )
        })
    }
}
