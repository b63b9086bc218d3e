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
    use super::super::walk::{walk, Width, XRow};
    use super::PreparedX;
    use crate::kernels::cpu::layout::Layout;
    use crate::kernels::cpu::simd::Element;
    use crate::kernels::cpu::unpack::avx512::*;
    use std::arch::x86_64::*;

    /// 512-bit vectors: 16 words per block, masks as `k` registers.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512;

    /// The constants of the scale loads: lane j's group within a block, and
    /// the groups a whole block spans.
    #[derive(Clone, Copy)]
    pub(crate) struct Scales {
        lane_group: __m512i,
        block_groups: __mmask16,
    }

    impl Width for Avx512 {
        const LANES: usize = 16;
        type F = __m512;
        type W = __m512i;
        type Mask = __mmask16;
        type Scales = Scales;
        const REGION_HINTS: bool = true;

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn zero() -> __m512 {
            _mm512_setzero_ps()
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
            _mm512_fmadd_ps(a, b, c)
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn all_lanes() -> __mmask16 {
            0xffff
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn first_lanes(n: usize) -> __mmask16 {
            ((1u32 << n) - 1) as __mmask16
        }

        /// Masked loads throughout: with the whole block's constant mask
        /// they compile to plain loads.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn load_words<const FULL: bool>(p: *const u32, mask: __mmask16) -> __m512i {
            // SAFETY: the caller's mask keeps the load inside the row.
            unsafe { _mm512_maskz_loadu_epi32(mask, p.cast()) }
        }

        /// A block spanning several groups takes them through the lane
        /// table, in one form.
        fn splits(_lay: &Layout) -> bool {
            false
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn scales_for(lay: &Layout) -> Scales {
            let log2 = lay.words_per_group_log2;
            let groups_per_block = (16u32 >> log2).max(1);
            Scales {
                lane_group: lane_groups(log2),
                block_groups: ((1u32 << groups_per_block) - 1) as __mmask16,
            }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn block_scales<P: Element, const SPLIT: bool>(
            scales: &[P],
            lay: &Layout,
            b0: usize,
            c: Scales,
        ) -> __m512 {
            let g0 = b0 >> lay.words_per_group_log2;
            // SAFETY: the block's groups lie inside the row.
            unsafe { lane_params(scales, g0, c.block_groups, c.lane_group) }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn tail_scales<P: Element>(
            scales: &[P],
            lay: &Layout,
            b0: usize,
            lanes: usize,
            c: Scales,
        ) -> __m512 {
            let log2 = lay.words_per_group_log2;
            let g0 = b0 >> log2;
            let groups = ((b0 + lanes - 1) >> log2) - g0 + 1;
            // SAFETY: the mask keeps the load inside the row's groups.
            unsafe {
                lane_params(
                    scales,
                    g0,
                    ((1u32 << groups) - 1) as __mmask16,
                    c.lane_group,
                )
            }
        }

        /// The biases sixteen groups at a time into the same accumulators
        /// (every lane is summed at the end), the last ones masked.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn finish<P: Element, const MR: usize, const NR: usize>(
            mut acc: [[__m512; NR]; MR],
            biases: [&[P]; NR],
            group_sums: [&[f32]; MR],
        ) -> [[f32; NR]; MR] {
            let groups = biases[0].len();
            let mut g = 0;
            while g < groups {
                let left = (groups - g).min(16);
                let gmask: __mmask16 = if left == 16 { 0xffff } else { (1 << left) - 1 };
                for n in 0..NR {
                    // SAFETY (both loads): the mask keeps them inside the rows.
                    let z = unsafe { load_params(biases[n].as_ptr().add(g), gmask) };
                    for i in 0..MR {
                        let sums =
                            unsafe { _mm512_maskz_loadu_ps(gmask, group_sums[i].as_ptr().add(g)) };
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

    // The walk once per target-feature set, so that every body inlines:
    // `exact` for f32 x, `vnni` for int16 x, `bf16` for bf16 pairs.
    walk!("avx512f,avx512bw,avx512vl", exact, Avx512, (4, 2));
    walk!("avx512f,avx512bw,avx512vl,avx512vnni", vnni, Avx512, (4, 2));
    walk!("avx512f,avx512bw,avx512vl,avx512bf16", bf16, Avx512, (4, 2));

    impl<'x> XRow<'x, Avx512> for &'x [f32] {
        fn row(px: &'x PreparedX, i: usize, k: usize) -> Self {
            &px.perm[i * k..][..k]
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize, const FULL: bool>(
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

    impl<'x> XRow<'x, Avx512> for I16Row<'x> {
        fn row(px: &'x PreparedX, i: usize, _k: usize) -> Self {
            let (pairs, scales) = px.int16().expect("int16 x").row(i);
            I16Row { pairs, scales }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize, const FULL: bool>(
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

    impl<'x> XRow<'x, Avx512> for Bf16Row<'x> {
        fn row(px: &'x PreparedX, i: usize, _k: usize) -> Self {
            let (pairs, offsets) = px.bf16().expect("bf16 x").row(i);
            Bf16Row { pairs, offsets }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize, const FULL: bool>(
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
}
