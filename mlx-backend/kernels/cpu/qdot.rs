//! The register-blocked quantized dot product for this CPU, by how x was
//! prepared: [`super::row_lanes`] for int16 x of one scale per group (4+
//! rows), else [`super::qdot512`] on AVX-512 (16 words per block),
//! [`super::qdot256`] on AVX2 (8). Callers prepare x once
//! ([`super::quant::PreparedX`] picks the lanes) and call [`dot_rows`].

use std::ops::Range;

use super::quant::{PreparedX, QView};
use super::simd::Element;
use super::{qdot256, qdot512};

pub(crate) use qdot512::{OutStrides, RowMajorChunks};

/// True when one of the blocked kernels runs on this CPU (otherwise the
/// portable bodies in [`super::quant`] serve).
#[inline]
pub(crate) fn available() -> bool {
    qdot512::available() || qdot256::available()
}

/// `Σ_k x[i][k] · W[r][k]` (scales and biases applied) for every prepared x
/// row `i` in `xrows` and weight row `r` in `rows`: `out[i * x_stride +
/// j * w_stride]` holds x row `xrows.start + i` against weight row
/// `rows.start + j`.
///
/// # Panics
/// As the kernel's `dot_rows`: no blocked kernel, x prepared for another
/// layout, rows outside the matrix, `out` too short.
pub(crate) fn dot_rows<P: Element>(
    px: &PreparedX,
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    strides: OutStrides,
) {
    if let Some(g16) = &px.group16 {
        super::row_lanes::dot_rows(g16, &px.group_sums, xrows, w, rows, out, strides)
    } else if px.lanes == 16 {
        qdot512::dot_rows(px, xrows, w, rows, out, strides)
    } else {
        qdot256::dot_rows(px, xrows, w, rows, out, strides)
    }
}
