//! MLX's fused "fast" ops: normalisation, rotary embeddings, attention.

use super::{stream, wrap};
use crate::array::Array;
use crate::error::OpError;
use crate::ffi;

/// The position of a sequence's first token for RoPE.
#[derive(Clone, Copy, Debug)]
pub enum RopeOffset<'a> {
    /// A position shared by every batch entry.
    Static(i32),
    /// A scalar int32 array (or one per batch entry), kept on the device.
    Dynamic(&'a Array),
}

/// Which attention mask to apply.
#[derive(Clone, Copy, Debug)]
pub enum AttentionMask<'a> {
    /// No mask: every query sees every key.
    None,
    /// Lower-triangular, aligned to the end of the keys.
    Causal,
    /// Additive (float) or boolean mask broadcastable to `[B, H, L, S]`.
    Array(&'a Array),
}

impl Array {
    /// MLX's `fast::rms_norm` over the last axis (the reference our kernel is tested against).
    pub fn rms_norm_mlx(&self, weight: Option<&Array>, eps: f32) -> Result<Array, OpError> {
        // SAFETY: the weight pointer is null or borrows an array for the call.
        wrap("rms_norm", unsafe {
            ffi::fast_rms_norm(self.inner(), Array::ptr(weight), eps, stream())
        })
    }

    /// MLX's `fast::layer_norm` over the last axis, with optional weight and bias.
    pub fn layer_norm(
        &self,
        weight: Option<&Array>,
        bias: Option<&Array>,
        eps: f32,
    ) -> Result<Array, OpError> {
        // SAFETY: the pointers are null or borrow arrays for the call.
        wrap("layer_norm", unsafe {
            ffi::fast_layer_norm(
                self.inner(),
                Array::ptr(weight),
                Array::ptr(bias),
                eps,
                stream(),
            )
        })
    }

    /// Rotary embedding of the first `dims` features of `[..., L, D]`.
    /// `traditional` rotates interleaved pairs (llama.cpp / GGUF layout);
    /// `freqs`, when given, replaces `base` (llama3 / yarn scaling).
    pub fn rope(
        &self,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offset: RopeOffset<'_>,
        freqs: Option<&Array>,
    ) -> Result<Array, OpError> {
        // SAFETY: the pointers are null or borrow arrays for the call.
        unsafe {
            match offset {
                RopeOffset::Static(o) => wrap(
                    "rope",
                    ffi::fast_rope(
                        self.inner(),
                        dims,
                        traditional,
                        base,
                        scale,
                        o,
                        Array::ptr(freqs),
                        stream(),
                    ),
                ),
                RopeOffset::Dynamic(o) => wrap(
                    "rope",
                    ffi::fast_rope_dynamic(
                        self.inner(),
                        dims,
                        traditional,
                        base,
                        scale,
                        o.inner(),
                        Array::ptr(freqs),
                        stream(),
                    ),
                ),
            }
        }
    }
}

/// `softmax(q·kᵀ·scale + mask)·v` for `q [B, Hq, L, D]`, `k, v [B, Hkv, S, D]` (GQA when Hq > Hkv).
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array, OpError> {
    let (mode, arr) = match mask {
        AttentionMask::None => ("", None),
        AttentionMask::Causal => ("causal", None),
        AttentionMask::Array(a) => ("array", Some(a)),
    };
    // SAFETY: the mask pointer is null or borrows an array for the call.
    wrap("scaled_dot_product_attention", unsafe {
        ffi::fast_sdpa(
            q.inner(),
            k.inner(),
            v.inner(),
            scale,
            mode,
            Array::ptr(arr),
            stream(),
        )
    })
}
