//! MLX's affine-quantized weight layout as the CPU kernels read it: the
//! validated geometry ([`Layout`]), whole matrices ([`QuantMatrix`]), row
//! views ([`QView`], [`QRow`]), and where a blocked dot product writes
//! ([`OutStrides`]).
//!
//! `W[n,k] = scale * q + bias` per group of `group_size` columns; q packed
//! lowest bits first into u32 words. x is rearranged once per call into
//! block order (see [`super::prepare`]) so that one vector load of packed
//! words lines up with consecutive f32 of x.

use std::ops::Range;

use super::error::{check_len, KernelError};
use super::simd::Element;

#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a, T> {
    /// `[N, K * bits / 32]` packed values, lowest bits first.
    pub w: &'a [u32],
    /// `[N, K / group_size]`.
    pub scales: &'a [T],
    /// `[N, K / group_size]`.
    pub biases: &'a [T],
    pub bits: u32,
    pub group_size: usize,
}

impl<'a, T> QuantMatrix<'a, T> {
    /// Output rows `first..first + count` of this `[n, k]` matrix, as a
    /// matrix of their own (panics outside the matrix).
    pub(crate) fn rows(&self, k: usize, first: usize, count: usize) -> QuantMatrix<'a, T> {
        let words = k * self.bits as usize / 32;
        let groups = k / self.group_size;
        QuantMatrix {
            w: &self.w[first * words..][..count * words],
            scales: &self.scales[first * groups..][..count * groups],
            biases: &self.biases[first * groups..][..count * groups],
            bits: self.bits,
            group_size: self.group_size,
        }
    }
}

/// Validated quantisation geometry of one `[n, k]` matrix (or a stack of them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) bits: u32,
    pub(crate) group_size: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) vals_per_word: usize,
    pub(crate) words_per_row: usize,
    pub(crate) groups_per_row: usize,
    /// log2(words per group): groups are powers of two, so a shift suffices.
    pub(crate) words_per_group_log2: u32,
}

impl Layout {
    pub(crate) fn new(
        bits: u32,
        group_size: usize,
        n: usize,
        k: usize,
    ) -> Result<Self, KernelError> {
        if !matches!(bits, 4 | 8) {
            return Err(KernelError::Unsupported(format!(
                "bits = {bits}, expected 4 or 8"
            )));
        }
        if !matches!(group_size, 32 | 64 | 128) {
            return Err(KernelError::Unsupported(format!(
                "group_size = {group_size}, expected 32, 64 or 128"
            )));
        }
        if k == 0 || !k.is_multiple_of(group_size) {
            return Err(KernelError::Shape(format!(
                "k = {k} must be a positive multiple of group_size {group_size}"
            )));
        }
        let vals_per_word = (32 / bits) as usize;
        Ok(Layout {
            bits,
            group_size,
            n,
            k,
            vals_per_word,
            words_per_row: k / vals_per_word,
            groups_per_row: k / group_size,
            words_per_group_log2: (group_size / vals_per_word).trailing_zeros(),
        })
    }

    /// The low `bits` bits set: one packed value.
    #[inline]
    pub(crate) fn mask(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    /// The group (within a row) that packed word `word` belongs to.
    #[inline]
    pub(crate) fn group_of_word(&self, word: usize) -> usize {
        word >> self.words_per_group_log2
    }
}

/// A validated stack of `mats` quantized matrices.
#[derive(Clone, Copy)]
pub(crate) struct QView<'a, T> {
    pub(crate) w: &'a [u32],
    pub(crate) scales: &'a [T],
    pub(crate) biases: &'a [T],
    pub(crate) lay: Layout,
}

/// One output row's weights.
#[derive(Clone, Copy)]
pub(crate) struct QRow<'a, T> {
    pub(crate) w: &'a [u32],
    pub(crate) scales: &'a [T],
    pub(crate) biases: &'a [T],
}

impl<'a, T: Element> QView<'a, T> {
    pub(crate) fn new(
        name: &str,
        w: &'a [u32],
        scales: &'a [T],
        biases: &'a [T],
        lay: Layout,
        mats: usize,
    ) -> Result<Self, KernelError> {
        let rows = mats.checked_mul(lay.n);
        check_len(
            &format!("{name}.w"),
            w.len(),
            rows.and_then(|r| r.checked_mul(lay.words_per_row)),
        )?;
        let group_len = rows.and_then(|r| r.checked_mul(lay.groups_per_row));
        check_len(&format!("{name}.scales"), scales.len(), group_len)?;
        check_len(&format!("{name}.biases"), biases.len(), group_len)?;
        Ok(QView {
            w,
            scales,
            biases,
            lay,
        })
    }

    pub(crate) fn expert(&self, e: usize) -> Self {
        let (n, wpr, gpr) = (self.lay.n, self.lay.words_per_row, self.lay.groups_per_row);
        QView {
            w: &self.w[e * n * wpr..][..n * wpr],
            scales: &self.scales[e * n * gpr..][..n * gpr],
            biases: &self.biases[e * n * gpr..][..n * gpr],
            lay: self.lay,
        }
    }

    // Called per weight row inside the kernels' loops (2% of a decode step
    // as an out-of-line call).
    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> QRow<'a, T> {
        let (wpr, gpr) = (self.lay.words_per_row, self.lay.groups_per_row);
        QRow {
            w: &self.w[r * wpr..][..wpr],
            scales: &self.scales[r * gpr..][..gpr],
            biases: &self.biases[r * gpr..][..gpr],
        }
    }
}

/// Largest |int16| a value of x is rounded to.
pub(crate) const INT16_MAX: f32 = 32767.0;

/// Where [`dot_rows`] writes: `out[i * x_stride + j * w_stride]` holds x row
/// `xrows.start + i` against weight row `rows.start + j`.
#[derive(Clone, Copy)]
pub(crate) struct OutStrides {
    pub(crate) x_stride: usize,
    pub(crate) w_stride: usize,
}

impl OutStrides {
    /// A `dot_rows` call's ranges: `xrows` inside the `x_rows` prepared x
    /// rows, `rows` inside `w`, and `out` (`out_len`) long enough for both
    /// at these strides. False when there is nothing to compute.
    ///
    /// # Panics
    /// When a range leaves its matrix or `out` is too short.
    pub(crate) fn check<P>(
        &self,
        xrows: &Range<usize>,
        x_rows: usize,
        w: &QView<P>,
        rows: &Range<usize>,
        out_len: usize,
    ) -> bool {
        assert!(xrows.end <= x_rows);
        assert!(rows.end <= w.w.len() / w.lay.words_per_row);
        if xrows.is_empty() || rows.is_empty() {
            return false;
        }
        let last = (xrows.len() - 1) * self.x_stride + (rows.len() - 1) * self.w_stride;
        assert!(last < out_len, "output too short");
        true
    }
}
