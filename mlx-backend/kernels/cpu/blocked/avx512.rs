//! AVX-512 dot products of MLX affine-quantized weight rows with f32 x rows,
//! register-blocked: each unpacked weight vector feeds up to 4 x rows and
//! each x vector up to 4 weight rows (4×2 blocks ran 25 → 32 GMAC/s at 8
//! and 64 rows in exact mode against the 8×1 blocks they replaced; int16
//! the same), so one kernel serves decode (1 row), batched decode and
//! prefill (many rows) alike.
//!
//! x comes in block order with 16 lanes ([`PreparedX`] built where
//! [`available`]): one 512-bit load of 16 packed words lines up with 16
//! consecutive f32 of x. A 4-bit value becomes f32 through one shift and one
//! `vpermps` from the table `0.0..=15.0` (the permute reads only the low four
//! bits, so no mask); an 8-bit value through one byte shuffle and a convert.
//! Per block the partial sums are scaled per lane; the biases contribute
//! `Σ bias · (sum of x over the group)`, sixteen groups per FMA into the
//! same accumulators. The short final block of a row is read through masks.
//!
//! With int16 x ([`Int16Rows`], `ActivationPrecision::Int16`, AVX-512 VNNI)
//! each word's values are rounded to int16 against the word's own largest
//! |x| and meet the weights in pairs through `vpdpwssd` (32 multiply-adds
//! per instruction against the FMA's 16; a 4-bit pair is one shift and one
//! mask); per block the int32 sums become f32 times the words' x scales,
//! then the same per-lane weight scales and bias term as exact x.
//!
//! With bf16 x against 4-bit W in exact mode ([`Bf16Rows`], AVX-512 BF16)
//! the pairs are bf16 and meet the weights through `vdpbf16ps` (32
//! multiply-adds into f32 per instruction, the products exact): a 4-bit
//! value q becomes the bf16 of `128 + q` by one shift and one
//! `vpternlogd` (`0x4300 | q`: 128's exponent with q as the mantissa), and
//! `128 · Σx` over each word comes off the word's sum before W's scales.
//! The exact f32 body spends a shift, a `vpermps` and an FMA per 16
//! multiply-adds, which bounds it on Zen 4's double-pumped 512-bit units.

use std::ops::Range;

use super::TILE;
use crate::kernels::cpu::isa;
use crate::kernels::cpu::layout::{OutStrides, QView};
use crate::kernels::cpu::prepare::{PreparedX, XForm};
use crate::kernels::cpu::simd::Element;

/// `Σ_k x[i][k] · W[r][k]` (scales and biases applied) for every prepared x
/// row `i` in `xrows` and weight row `r` in `rows`.
///
/// # Panics
/// When `px` was not prepared with 16 lanes for `w`'s layout, `rows` leaves
/// the matrix, or `out` is too short for the strides.
pub(crate) fn dot_rows<P: Element>(
    px: &PreparedX,
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    strides: OutStrides,
) {
    let lay = &w.lay;
    assert!(
        isa::avx512_available(),
        "blocked::avx512::dot_rows needs AVX-512F and AVX-512BW"
    );
    assert_eq!(px.lanes, 16, "x must be prepared with 16 lanes");
    assert_eq!(px.group_sums.len(), px.rows * lay.groups_per_row);
    if !strides.check(&xrows, px.rows, w, &rows, out.len()) {
        return;
    }
    assert!(
        matches!(
            px.form,
            XForm::F32 { .. } | XForm::Int16(_) | XForm::Bf16(_)
        ),
        "x prepared for another body"
    );
    if let Some(xb) = px.bf16() {
        assert!(
            isa::avx512_bf16_available() && lay.bits == 4,
            "bf16 pairs need AVX-512 BF16 and 4-bit W"
        );
        assert_eq!(xb.row_words, lay.words_per_row);
        assert_eq!(xb.offsets.len(), px.rows * xb.row_words);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU features were detected; the asserts bound every access.
        unsafe {
            x86::bf16::drive::<P, x86::Bf16Row, 4>(px, xrows, w, rows, out, strides)
        };
        return;
    }
    match px.int16() {
        None => assert_eq!(px.perm.len(), px.rows * lay.k),
        Some(x16) => {
            assert!(isa::avx512_int16_available(), "int16 x needs AVX-512 VNNI");
            x16.check(px.rows, lay, 16);
        }
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU features were detected; the asserts above bound every access.
    unsafe {
        use x86::I16Row;
        match (px.int16().is_some(), lay.bits) {
            (false, 4) => x86::exact::drive::<P, &[f32], 4>(px, xrows, w, rows, out, strides),
            (false, _) => x86::exact::drive::<P, &[f32], 8>(px, xrows, w, rows, out, strides),
            (true, 4) => x86::vnni::drive::<P, I16Row, 4>(px, xrows, w, rows, out, strides),
            (true, _) => x86::vnni::drive::<P, I16Row, 8>(px, xrows, w, rows, out, strides),
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{OutStrides, PreparedX, QView, TILE};
    use crate::kernels::cpu::layout::Layout;
    use crate::kernels::cpu::simd::{prefetch_lines, Element};
    use crate::kernels::cpu::unpack::avx512::*;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Software prefetch distance in bytes for the weight rows.
    const PREFETCH: usize = 4096;

    /// One prepared x row as the kernel reads it: f32 in block order, or
    /// int16 pairs with per-word scales.
    pub(super) trait XRow<'x>: Copy {
        fn row(px: &'x PreparedX, i: usize, k: usize) -> Self;

        /// Per-lane sums `Σ_v x · q` of one block (words `b0..b0 + lanes`,
        /// `mask` their lanes) for MR x rows and NR packed weight vectors,
        /// in f32 and before W's scales.
        ///
        /// # Safety
        /// The CPU must have the implementation's target features; `mask`
        /// must keep the x loads inside the rows.
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR];
    }

    impl<'x> XRow<'x> for &'x [f32] {
        fn row(px: &'x PreparedX, i: usize, k: usize) -> Self {
            &px.perm[i * k..][..k]
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR] {
            let vpw = (32 / BITS) as usize;
            let xbase = b0 * vpw;
            let table = nibble_values();
            let zero = _mm512_setzero_ps();
            let mut p = [[zero; NR]; MR];
            let mut q = [zero; NR];
            for v in 0..vpw {
                for n in 0..NR {
                    q[n] = unpack::<BITS>(wv[n], v, table);
                }
                for i in 0..MR {
                    let at = xbase + v * lanes;
                    // SAFETY: the caller's mask bounds the load.
                    let xv = unsafe { _mm512_maskz_loadu_ps(mask, x[i].as_ptr().add(at)) };
                    for n in 0..NR {
                        p[i][n] = _mm512_fmadd_ps(q[n], xv, p[i][n]);
                    }
                }
            }
            p
        }
    }

    /// An int16 x row: pairs and per-word scales ([`super::Int16Rows`]).
    #[derive(Clone, Copy)]
    pub(super) struct I16Row<'x> {
        pairs: &'x [i32],
        scales: &'x [f32],
    }

    impl<'x> XRow<'x> for I16Row<'x> {
        fn row(px: &'x PreparedX, i: usize, _k: usize) -> Self {
            let (pairs, scales) = px.int16().expect("int16 x").row(i);
            I16Row { pairs, scales }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR] {
            let half = (16 / BITS) as usize;
            let mut s = [[_mm512_setzero_si512(); NR]; MR];
            for p in 0..half {
                // Values p and p + half of each word in the low and high int16.
                let q: [__m512i; NR] = std::array::from_fn(|n| int16_field::<BITS>(wv[n], p));
                for i in 0..MR {
                    let at = b0 * half + p * lanes;
                    // SAFETY: the caller's mask bounds the load.
                    let xv = unsafe { _mm512_maskz_loadu_epi32(mask, x[i].pairs.as_ptr().add(at)) };
                    for n in 0..NR {
                        s[i][n] = dpwssd(s[i][n], q[n], xv);
                    }
                }
            }
            let mut out = [[_mm512_setzero_ps(); NR]; MR];
            for i in 0..MR {
                // SAFETY: as above.
                let d = unsafe { _mm512_maskz_loadu_ps(mask, x[i].scales.as_ptr().add(b0)) };
                for n in 0..NR {
                    out[i][n] = _mm512_mul_ps(_mm512_cvtepi32_ps(s[i][n]), d);
                }
            }
            out
        }
    }

    /// A bf16 x row: pairs and per-word offsets ([`super::Bf16Rows`]).
    #[derive(Clone, Copy)]
    pub(super) struct Bf16Row<'x> {
        pairs: &'x [u32],
        offsets: &'x [f32],
    }

    impl<'x> XRow<'x> for Bf16Row<'x> {
        fn row(px: &'x PreparedX, i: usize, _k: usize) -> Self {
            let (pairs, offsets) = px.bf16().expect("bf16 x").row(i);
            Bf16Row { pairs, offsets }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR] {
            debug_assert_eq!(BITS, 4);
            let field = _mm512_set1_epi32(0x000F_000F);
            let exponent = _mm512_set1_epi32(0x4300_4300);
            let mut s = [[_mm512_setzero_ps(); NR]; MR];
            for p in 0..4 {
                let shift = _mm512_set1_epi32(4 * p as i32);
                // (w >> 4p) & 0x000F000F | 0x43004300: bf16 128 + q, twice.
                let q: [__m512i; NR] = std::array::from_fn(|n| {
                    _mm512_ternarylogic_epi32::<0xEA>(
                        _mm512_srlv_epi32(wv[n], shift),
                        field,
                        exponent,
                    )
                });
                for i in 0..MR {
                    let at = b0 * 4 + p * lanes;
                    // SAFETY: the caller's mask bounds the load.
                    let xv = unsafe {
                        _mm512_maskz_loadu_epi32(mask, x[i].pairs.as_ptr().add(at).cast())
                    };
                    for n in 0..NR {
                        s[i][n] = dpbf16(s[i][n], q[n], xv);
                    }
                }
            }
            for i in 0..MR {
                // SAFETY: as above.
                let o = unsafe { _mm512_maskz_loadu_ps(mask, x[i].offsets.as_ptr().add(b0)) };
                for v in s[i].iter_mut() {
                    *v = _mm512_sub_ps(*v, o);
                }
            }
            s
        }
    }

    /// The register-blocked walk, compiled once per target-feature set so
    /// that every body inlines: `exact` for f32 x, `vnni` for int16 x.
    macro_rules! chain {
        ($features:literal, $name:ident) => {
            pub(super) mod $name {
                use super::*;

                /// Walks tiles of weight rows and, inside each, chunks of x rows; the
                /// register block (x rows × weight rows) shrinks with the rows left.
                #[target_feature(enable = $features)]
                pub(crate) unsafe fn drive<'x, P: Element, X: XRow<'x>, const BITS: u32>(
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
                            // SAFETY (each arm): the caller checked the bounds of x, W and out.
                            i += unsafe {
                                match left {
                                    4.. => block::<P, X, BITS, 4, 2>(
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

                /// x rows `i0..i0 + MR` against every weight row of `tile`, `NR` weight
                /// rows at a time (a short remainder one at a time). Returns MR.
                #[allow(clippy::too_many_arguments)]
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn block<
                    'x,
                    P: Element,
                    X: XRow<'x>,
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
                        r += if tile.end - r >= NR {
                            unsafe {
                                weight_rows::<P, X, BITS, MR, NR>(w, r, x, gs, i0, first, out, st)
                            }
                        } else {
                            unsafe {
                                weight_rows::<P, X, BITS, MR, 1>(w, r, x, gs, i0, first, out, st)
                            }
                        };
                    }
                    MR
                }

                /// Weight rows `r..r + NR` against the MR x rows, stored at output x
                /// row `i0` on. Returns NR.
                #[allow(clippy::too_many_arguments)]
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn weight_rows<
                    'x,
                    P: Element,
                    X: XRow<'x>,
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
                    let words = w.lay.words_per_row;
                    let wr: [&[u32]; NR] =
                        std::array::from_fn(|n| &w.w[(r + n) * words..][..words]);
                    let pr: [(&[P], &[P]); NR] = std::array::from_fn(|n| {
                        let row = w.row(r + n);
                        (row.scales, row.biases)
                    });
                    // SAFETY: the slices above hold whole rows of W and of its params.
                    let d = unsafe { kernel::<P, X, BITS, MR, NR>(&w.lay, wr, pr, x, gs) };
                    for (i, row) in d.iter().enumerate() {
                        for (n, v) in row.iter().enumerate() {
                            out[(i0 + i) * st.x_stride + (r + n - first) * st.w_stride] = *v;
                        }
                    }
                    NR
                }

                /// One block of 16 (or `lanes`) words of every weight row, added into
                /// `acc` scaled per lane by W's scales.
                ///
                /// # Safety
                /// The masks must keep every load inside its row (all ones for a whole block).
                #[allow(clippy::too_many_arguments)]
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn block_step<
                    'x,
                    P: Element,
                    X: XRow<'x>,
                    const BITS: u32,
                    const MR: usize,
                    const NR: usize,
                >(
                    w: &[&[u32]; NR],
                    params: &[(&[P], &[P]); NR],
                    x: &[X; MR],
                    b0: usize,
                    lanes: usize,
                    mask: __mmask16,
                    g0: usize,
                    gmask: __mmask16,
                    lane_group: __m512i,
                    acc: &mut [[__m512; NR]; MR],
                ) {
                    let mut wv = [_mm512_setzero_si512(); NR];
                    for n in 0..NR {
                        // SAFETY (all loads below): the caller's masks bound them.
                        wv[n] =
                            unsafe { _mm512_maskz_loadu_epi32(mask, w[n].as_ptr().add(b0).cast()) };
                    }
                    // SAFETY: the caller's masks bound the x loads.
                    let p = unsafe { X::partial::<BITS, MR, NR>(x, &wv, b0, lanes, mask) };
                    for n in 0..NR {
                        let sv = unsafe { lane_params(params[n].0, g0, gmask, lane_group) };
                        for i in 0..MR {
                            acc[i][n] = _mm512_fmadd_ps(p[i][n], sv, acc[i][n]);
                        }
                    }
                }

                /// The dot products of MR x rows with NR weight rows. No closures in
                /// here: they would not inherit the target features once inlined into
                /// std's helpers.
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn kernel<
                    'x,
                    P: Element,
                    X: XRow<'x>,
                    const BITS: u32,
                    const MR: usize,
                    const NR: usize,
                >(
                    lay: &Layout,
                    w: [&[u32]; NR],
                    params: [(&[P], &[P]); NR],
                    x: [X; MR],
                    group_sums: [&[f32]; MR],
                ) -> [[f32; NR]; MR] {
                    let words = lay.words_per_row;
                    let log2 = lay.words_per_group_log2;
                    // Lane j's group, relative to the block's first group.
                    let lane_group = lane_groups(log2);
                    let zero = _mm512_setzero_ps();
                    let mut acc = [[zero; NR]; MR];
                    // Whole blocks with constant masks (plain loads once inlined), then
                    // the short final block, if any.
                    let full = words / 16;
                    let groups_per_block = (16 >> log2).max(1);
                    let gmask_full: __mmask16 = (1 << groups_per_block) - 1;
                    // Rows stream from memory, and the NR rows are adjacent: the
                    // hints run PREFETCH past the end of the NR rows as one region
                    // (into the next register block's rows), a share of the
                    // region's bytes per whole block. Per-row hints PREFETCH past
                    // each row's own position ran only ~1 KB ahead of the region
                    // with 768-byte rows, and the batch-1 sweep of the default
                    // model's matrices took ~8 ms against ~6–7 now on a Zen 4
                    // (`tests::sweep_from_memory`). Hints never fault, even past
                    // the end.
                    let region = NR * words * 4;
                    let per_block = region.div_ceil(full.max(1));
                    let ahead = w[0].as_ptr().cast::<i8>().wrapping_add(region + PREFETCH);
                    // The rows' scales and biases are adjacent too: their region,
                    // PREFETCH / 4 past its end, once per call (a few lines; the
                    // per-block hints of each row's params were 8 per block at
                    // NR = 4, mostly for lines already asked for).
                    let params_region = NR * lay.groups_per_row * std::mem::size_of::<P>();
                    for src in [params[0].0, params[0].1] {
                        let at = src.as_ptr().cast::<i8>();
                        prefetch_lines(
                            at.wrapping_add(params_region + PREFETCH / 4),
                            params_region,
                        );
                    }
                    // (`row_lanes`' `Prefetch`, which drips a list of regions, in
                    // place of these two loops made the sweep ~25% slower.)
                    for b in 0..full {
                        let b0 = 16 * b;
                        prefetch_lines(ahead.wrapping_add(b * per_block), per_block);
                        // SAFETY: whole blocks lie inside every row.
                        unsafe {
                            block_step::<P, X, BITS, MR, NR>(
                                &w,
                                &params,
                                &x,
                                b0,
                                16,
                                0xffff,
                                b0 >> log2,
                                gmask_full,
                                lane_group,
                                &mut acc,
                            )
                        };
                    }
                    let b0 = 16 * full;
                    if b0 < words {
                        let lanes = words - b0;
                        let g0 = b0 >> log2;
                        let groups = ((b0 + lanes - 1) >> log2) - g0 + 1;
                        // SAFETY: the masks keep each load inside its row.
                        unsafe {
                            block_step::<P, X, BITS, MR, NR>(
                                &w,
                                &params,
                                &x,
                                b0,
                                lanes,
                                (1 << lanes) - 1,
                                g0,
                                (1 << groups) - 1,
                                lane_group,
                                &mut acc,
                            )
                        };
                    }
                    // Biases: Σ bias·(sum of x over the group), sixteen groups at a time
                    // into the same accumulators (every lane is summed at the end).
                    let groups = lay.groups_per_row;
                    let mut g = 0;
                    while g < groups {
                        let left = (groups - g).min(16);
                        let gmask: __mmask16 = if left == 16 { 0xffff } else { (1 << left) - 1 };
                        for n in 0..NR {
                            let z = unsafe { load_params(params[n].1.as_ptr().add(g), gmask) };
                            for i in 0..MR {
                                let sums = unsafe {
                                    _mm512_maskz_loadu_ps(gmask, group_sums[i].as_ptr().add(g))
                                };
                                acc[i][n] = _mm512_fmadd_ps(sums, z, acc[i][n]);
                            }
                        }
                        g += left;
                    }
                    let mut d = [[0.0f32; NR]; MR];
                    for i in 0..MR {
                        for n in 0..NR {
                            d[i][n] = _mm512_reduce_add_ps(acc[i][n]);
                        }
                    }
                    d
                }
            }
        };
    }
    chain!("avx512f,avx512bw,avx512vl", exact);
    chain!("avx512f,avx512bw,avx512vl,avx512vnni", vnni);
    chain!("avx512f,avx512bw,avx512vl,avx512bf16", bf16);
}
