//! The register-blocked walk, written once for every vector width: tiles
//! of weight rows, chunks of x rows inside each tile, a register block of
//! MR x rows × NR weight rows, and per block of packed words the loads, the
//! x form's partial sums ([`XRow`]), W's scales per lane and the
//! accumulators. A width ([`Width`]: [`super::avx2`]'s 8 lanes,
//! [`super::avx512`]'s 16) supplies its registers, loads and finish; an x
//! form supplies its partial sums; [`walk!`] compiles the walk once per
//! target-feature set, so that every body inlines into it.

use crate::kernels::cpu::layout::Layout;
use crate::kernels::cpu::prepare::PreparedX;
use crate::kernels::cpu::simd::Element;

/// Software prefetch distance in bytes past the end of the weight rows
/// being read.
pub(super) const PREFETCH: usize = 4096;

/// A vector width the walk runs on.
///
/// Every method is `unsafe` and needs the width's CPU features (detected
/// by the caller); loads read inside the bounds their arguments state.
pub(super) trait Width: Copy {
    /// Packed words per block, the f32 lanes of [`Width::F`].
    const LANES: usize;
    /// f32 lanes.
    type F: Copy;
    /// Packed words.
    type W: Copy;
    /// The lanes of a short block that are read.
    type Mask: Copy;
    /// Per-call constants of [`Width::block_scales`] and [`Width::tail_scales`].
    type Scales: Copy;
    /// How the walk hints memory: `true`, a share of the NR rows' whole
    /// region per block and the rows' scales and biases once per call;
    /// `false`, each block's own bytes only (on 8 lanes the per-call hints
    /// cost more than they save, performance.md).
    const REGION_HINTS: bool;

    /// Zero in every lane.
    unsafe fn zero() -> Self::F;
    /// `a · b + c` per lane.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Every lane.
    unsafe fn all_lanes() -> Self::Mask;
    /// Lanes `0..n`.
    unsafe fn first_lanes(n: usize) -> Self::Mask;
    /// A block of packed words at `p`: all [`Width::LANES`] (`FULL`), or
    /// the lanes of `mask` (zero elsewhere).
    unsafe fn load_words<const FULL: bool>(p: *const u32, mask: Self::Mask) -> Self::W;
    /// Whether a whole block of this layout spans two groups and the walk
    /// takes [`Width::block_scales`]' `SPLIT` form.
    fn splits(lay: &Layout) -> bool;
    /// The constants of the scale loads for `lay`.
    unsafe fn scales_for(lay: &Layout) -> Self::Scales;
    /// W's scales per lane of the whole block at word `b0` of a row whose
    /// scales are `scales` (`SPLIT`: as [`Width::splits`] said).
    unsafe fn block_scales<P: Element, const SPLIT: bool>(
        scales: &[P],
        lay: &Layout,
        b0: usize,
        c: Self::Scales,
    ) -> Self::F;
    /// W's scales per lane of the short block `b0..b0 + lanes`.
    unsafe fn tail_scales<P: Element>(
        scales: &[P],
        lay: &Layout,
        b0: usize,
        lanes: usize,
        c: Self::Scales,
    ) -> Self::F;
    /// The dot products from the accumulators: the bias term
    /// `Σ bias · (sum of x over the group)` of each pair added, every lane
    /// summed.
    unsafe fn finish<P: Element, const MR: usize, const NR: usize>(
        acc: [[Self::F; NR]; MR],
        biases: [&[P]; NR],
        group_sums: [&[f32]; MR],
    ) -> [[f32; NR]; MR];
}

/// One prepared x row as the walk reads it at width `V`: f32 in block
/// order (plain or prescaled), int16 pairs with per-word scales, or bf16
/// pairs with per-word offsets.
pub(super) trait XRow<'x, V: Width>: Copy {
    /// Row `i` of `px` (`k` values).
    fn row(px: &'x PreparedX, i: usize, k: usize) -> Self;

    /// Per-lane sums `Σ_v x · q` of one block (words `b0..b0 + lanes`)
    /// for MR x rows and NR packed weight vectors, in f32 and before W's
    /// scales. `FULL` blocks may read plainly, others through `mask`
    /// (lanes `0..lanes` set).
    ///
    /// # Safety
    /// The CPU must have the implementation's target features; the block
    /// must lie inside every row.
    unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize, const FULL: bool>(
        x: &[Self; MR],
        wv: &[V::W; NR],
        b0: usize,
        lanes: usize,
        mask: V::Mask,
    ) -> [[V::F; NR]; MR];
}

/// Compiles the walk for one width and target-feature set into module
/// `$name`: `$name::drive::<P, X, BITS>` computes every x row of a range
/// against every weight row of a range. `$mr x $nr` is the widest register
/// block (taken while 4+ x rows are left; then 2×2, then 1×4).
macro_rules! walk {
    ($features:literal, $name:ident, $width:ty, ($mr:literal, $nr:literal)) => {
        pub(in $crate::kernels::cpu::blocked) mod $name {
            use super::*;
            use std::ops::Range;
            use $crate::kernels::cpu::blocked::walk::{Width, XRow, PREFETCH};
            use $crate::kernels::cpu::blocked::TILE;
            use $crate::kernels::cpu::layout::{OutStrides, QView};
            use $crate::kernels::cpu::prepare::PreparedX;
            use $crate::kernels::cpu::simd::{prefetch_lines, Element};

            /// Walks tiles of weight rows and, inside each, chunks of x rows; the
            /// register block (x rows × weight rows) shrinks with the rows left.
            ///
            /// # Safety
            /// Needs the target features; the caller checked the bounds of x, W and out.
            #[target_feature(enable = $features)]
            pub(in $crate::kernels::cpu::blocked) unsafe fn drive<
                'x,
                P: Element,
                X: XRow<'x, $width>,
                const BITS: u32,
            >(
                px: &'x PreparedX,
                xrows: Range<usize>,
                w: &QView<P>,
                rows: Range<usize>,
                out: &mut [f32],
                st: OutStrides,
            ) {
                let mut t0 = rows.start;
                while t0 < rows.end {
                    let tile = t0..rows.end.min(t0 + TILE);
                    let mut i = xrows.start;
                    while i < xrows.end {
                        let left = xrows.end - i;
                        // SAFETY (each arm): as the caller's.
                        i += unsafe {
                            match left {
                                4.. => block::<P, X, BITS, $mr, $nr>(
                                    px, w, &tile, i, &xrows, rows.start, out, st,
                                ),
                                2 | 3 => block::<P, X, BITS, 2, 2>(
                                    px, w, &tile, i, &xrows, rows.start, out, st,
                                ),
                                _ => block::<P, X, BITS, 1, 4>(
                                    px, w, &tile, i, &xrows, rows.start, out, st,
                                ),
                            }
                        };
                    }
                    t0 = tile.end;
                }
            }

            /// x rows `i0..i0 + MR` against every weight row of `tile`, `NR`
            /// weight rows at a time (a short remainder one at a time),
            /// stored at `st` with weight row `first` in column 0. Returns
            /// MR. (Its arguments stay separate: `out` and its strides in
            /// one struct measured slower, performance.md.)
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn block<
                'x,
                P: Element,
                X: XRow<'x, $width>,
                const BITS: u32,
                const MR: usize,
                const NR: usize,
            >(
                px: &'x PreparedX,
                w: &QView<P>,
                tile: &Range<usize>,
                i0: usize,
                xrows: &Range<usize>,
                first: usize,
                out: &mut [f32],
                st: OutStrides,
            ) -> usize {
                let groups = w.lay.groups_per_row;
                let x: [X; MR] = std::array::from_fn(|i| X::row(px, i0 + i, w.lay.k));
                let gs: [&[f32]; MR] =
                    std::array::from_fn(|i| &px.group_sums[(i0 + i) * groups..][..groups]);
                let i0 = i0 - xrows.start;
                let mut r = tile.start;
                while r < tile.end {
                    // SAFETY (both): `x` and `gs` hold whole rows; the caller bounded W and out.
                    r += unsafe {
                        if tile.end - r >= NR {
                            weight_rows::<P, X, BITS, MR, NR>(w, r, x, gs, i0, first, out, st)
                        } else {
                            weight_rows::<P, X, BITS, MR, 1>(w, r, x, gs, i0, first, out, st)
                        }
                    };
                }
                MR
            }

            /// Weight rows `r..r + NR` against the MR x rows, stored at output
            /// x row `i0` on. Returns NR.
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weight_rows<
                'x,
                P: Element,
                X: XRow<'x, $width>,
                const BITS: u32,
                const MR: usize,
                const NR: usize,
            >(
                w: &QView<P>,
                r: usize,
                x: [X; MR],
                gs: [&[f32]; MR],
                i0: usize,
                first: usize,
                out: &mut [f32],
                st: OutStrides,
            ) -> usize {
                // SAFETY: the caller's rows hold whole rows of x; W's rows are bounded.
                let d = unsafe {
                    if <$width as Width>::splits(&w.lay) {
                        kernel::<P, X, BITS, MR, NR, true>(w, r, x, gs)
                    } else {
                        kernel::<P, X, BITS, MR, NR, false>(w, r, x, gs)
                    }
                };
                for (i, row) in d.iter().enumerate() {
                    for (n, v) in row.iter().enumerate() {
                        out[(i0 + i) * st.x_stride + (r + n - first) * st.w_stride] = *v;
                    }
                }
                NR
            }

            /// The dot products of MR x rows with weight rows `r..r + NR`;
            /// `SPLIT` as [`Width::splits`]. Plain loops, no closures: theirs
            /// would not inherit the target features inside std's helpers.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn kernel<
                'x,
                P: Element,
                X: XRow<'x, $width>,
                const BITS: u32,
                const MR: usize,
                const NR: usize,
                const SPLIT: bool,
            >(
                w: &QView<P>,
                r: usize,
                x: [X; MR],
                gs: [&[f32]; MR],
            ) -> [[f32; NR]; MR] {
                type V = $width;
                let lay = &w.lay;
                let words = lay.words_per_row;
                let lanes = V::LANES;
                let mut rows = [w.row(r); NR];
                for (n, row) in rows.iter_mut().enumerate().skip(1) {
                    *row = w.row(r + n);
                }
                // SAFETY (every width call below): the caller detected the
                // features; the loads stay inside the rows as stated.
                let sc = unsafe { V::scales_for(lay) };
                let mut acc = [[unsafe { V::zero() }; NR]; MR];
                let full = words / lanes;
                // Rows stream from memory, and the NR rows are adjacent: the
                // hints run PREFETCH past the end of the NR rows as one
                // region (into the next register block's rows), per whole
                // block a share of the region's bytes (REGION_HINTS) or the
                // block's own bytes. Per-row hints PREFETCH past each row's
                // own position ran only ~1 KB ahead of the region's front
                // with 768-byte rows, and decode steps were slower
                // (performance.md). Hints never fault, even past the end.
                let region = NR * words * 4;
                let per_block = if V::REGION_HINTS {
                    region.div_ceil(full.max(1))
                } else {
                    NR * lanes * 4
                };
                let ahead = rows[0]
                    .w
                    .as_ptr()
                    .cast::<i8>()
                    .wrapping_add(region + PREFETCH);
                // The rows' scales and biases are adjacent too: their
                // region, PREFETCH / 4 past its end, once per call.
                if V::REGION_HINTS {
                    let params_region = NR * lay.groups_per_row * std::mem::size_of::<P>();
                    for src in [rows[0].scales, rows[0].biases] {
                        let at = src.as_ptr().cast::<i8>();
                        prefetch_lines(
                            at.wrapping_add(params_region + PREFETCH / 4),
                            params_region,
                        );
                    }
                }
                let all = unsafe { V::all_lanes() };
                for b in 0..full {
                    let b0 = lanes * b;
                    prefetch_lines(ahead.wrapping_add(b * per_block), per_block);
                    let mut wv =
                        [unsafe { V::load_words::<true>(rows[0].w.as_ptr().add(b0), all) }; NR];
                    for n in 1..NR {
                        wv[n] = unsafe { V::load_words::<true>(rows[n].w.as_ptr().add(b0), all) };
                    }
                    let p = unsafe { X::partial::<BITS, MR, NR, true>(&x, &wv, b0, lanes, all) };
                    for n in 0..NR {
                        let sv =
                            unsafe { V::block_scales::<P, SPLIT>(rows[n].scales, lay, b0, sc) };
                        for i in 0..MR {
                            acc[i][n] = unsafe { V::fmadd(p[i][n], sv, acc[i][n]) };
                        }
                    }
                }
                let b0 = lanes * full;
                if b0 < words {
                    let left = words - b0;
                    let mask = unsafe { V::first_lanes(left) };
                    let mut wv =
                        [unsafe { V::load_words::<false>(rows[0].w.as_ptr().add(b0), mask) }; NR];
                    for n in 1..NR {
                        wv[n] = unsafe { V::load_words::<false>(rows[n].w.as_ptr().add(b0), mask) };
                    }
                    let p = unsafe { X::partial::<BITS, MR, NR, false>(&x, &wv, b0, left, mask) };
                    for n in 0..NR {
                        let sv = unsafe { V::tail_scales(rows[n].scales, lay, b0, left, sc) };
                        for i in 0..MR {
                            acc[i][n] = unsafe { V::fmadd(p[i][n], sv, acc[i][n]) };
                        }
                    }
                }
                let mut biases = [rows[0].biases; NR];
                for n in 1..NR {
                    biases[n] = rows[n].biases;
                }
                unsafe { V::finish::<P, MR, NR>(acc, biases, gs) }
            }
        }
    };
}
pub(super) use walk;
