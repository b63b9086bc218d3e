//! AVX2 dot products of MLX affine-quantized weight rows with prepared x
//! rows: [`super::avx512`]'s register-blocked walk on 256-bit vectors, for
//! x86-64 CPUs without AVX-512 (AMD Zen 1–3, Intel client cores).
//!
//! x comes in block order with 8 lanes ([`PreparedX`] built where
//! AVX-512 is absent): one 256-bit load of 8 packed words lines up with 8
//! consecutive f32 of x. Each unpacked weight vector feeds up to 4 x rows
//! and each x vector up to 4 weight rows (4×1, 2×2 and 1×4 blocks by the
//! rows left: AVX2 has 16 vector registers, half of AVX-512's).
//!
//! * Exact x: a value becomes f32 through a shift, a mask and a convert,
//!   then one FMA per x row (8 multiply-adds); with x scaled per field at
//!   preparation ([`PreparedX::prescaled`], the default where this kernel
//!   runs) the shift goes: the field is masked in place and its scale
//!   lives in x, bit-identical sums.
//! * Int16 x ([`crate::kernels::cpu::prepare::Int16Rows`] with 8 lanes, the
//!   `ActivationPrecision::Int16` class: each word's values rounded against
//!   the word's own largest |x|): a 4-bit pair (values p and p + 4 of each
//!   word, the low and high int16 of a lane) is one shift and one mask,
//!   then `vpmaddwd` + `vpaddd` per x row: 16 multiply-adds per `vpmaddwd`,
//!   which Zen 3 issues twice per cycle, against the FMA's 8. Per block the
//!   int32 sums become f32 times the words' x scales.
//!
//! Per block the partial sums are scaled per lane by W's scales; the biases
//! contribute `Σ bias · (sum of x over the group)`, eight groups per FMA.
//! The short final block of a row (4-bit words not a multiple of 8) is read
//! through `vmaskmov` loads.

use std::ops::Range;

use crate::kernels::cpu::isa;
use crate::kernels::cpu::layout::{OutStrides, QView};
use crate::kernels::cpu::prepare::{PreparedX, XForm};
use crate::kernels::cpu::simd::Element;

/// `Σ_k x[i][k] · W[r][k]` (scales and biases applied) for every prepared x
/// row `i` in `xrows` and weight row `r` in `rows`, written at `strides`
/// (as [`super::avx512::dot_rows`]).
///
/// # Panics
/// Without AVX2, when `px` was not prepared with 8 lanes for `w`'s layout,
/// `rows` leaves the matrix, or `out` is too short for the strides.
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
        isa::avx2_available(),
        "blocked::avx2::dot_rows needs AVX2, FMA and F16C"
    );
    assert_eq!(px.lanes, 8, "x must be prepared with 8 lanes");
    assert!(
        matches!(px.form, XForm::F32 { .. } | XForm::Int16(_)),
        "x prepared for another kernel"
    );
    assert_eq!(px.group_sums.len(), px.rows * lay.groups_per_row);
    if !strides.check(&xrows, px.rows, w, &rows, out.len()) {
        return;
    }
    match px.int16() {
        None => assert_eq!(px.perm.len(), px.rows * lay.k),
        Some(x16) => {
            assert!(
                isa::avx2_int16_available(),
                "int16 x needs the AVX2 int16 kernel"
            );
            x16.check(px.rows, lay, 8);
        }
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX2, FMA and F16C were detected; the asserts above bound every access.
    unsafe {
        use x86::{I16Row, Prescaled};
        match (px.int16().is_some(), px.prescaled(), lay.bits) {
            (false, true, 4) => {
                x86::avx2_fma::drive::<P, Prescaled, 4>(px, xrows, w, rows, out, strides)
            }
            (false, true, _) => {
                x86::avx2_fma::drive::<P, Prescaled, 8>(px, xrows, w, rows, out, strides)
            }
            (false, false, 4) => {
                x86::avx2_fma::drive::<P, &[f32], 4>(px, xrows, w, rows, out, strides)
            }
            (false, false, _) => {
                x86::avx2_fma::drive::<P, &[f32], 8>(px, xrows, w, rows, out, strides)
            }
            (true, _, 4) => x86::avx2_fma::drive::<P, I16Row, 4>(px, xrows, w, rows, out, strides),
            (true, _, _) => x86::avx2_fma::drive::<P, I16Row, 8>(px, xrows, w, rows, out, strides),
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::super::walk::{walk, Width, XRow};
    use super::PreparedX;
    use crate::kernels::cpu::layout::Layout;
    use crate::kernels::cpu::simd::avx2::hsum;
    use crate::kernels::cpu::simd::Element;
    use crate::kernels::cpu::unpack::avx2::int16_field;
    use std::arch::x86_64::*;

    /// 256-bit vectors: 8 words per block, masks as vectors (`vmaskmov`).
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2;

    impl Width for Avx2 {
        const LANES: usize = 8;
        type F = __m256;
        type W = __m256i;
        type Mask = __m256i;
        type Scales = ();
        const REGION_HINTS: bool = false;

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn zero() -> __m256 {
            _mm256_setzero_ps()
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fmadd_ps(a, b, c)
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn all_lanes() -> __m256i {
            _mm256_set1_epi32(-1)
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn first_lanes(n: usize) -> __m256i {
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(n as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load_words<const FULL: bool>(p: *const u32, mask: __m256i) -> __m256i {
            // SAFETY: the caller's block (or mask) lies inside the row.
            unsafe {
                if FULL {
                    _mm256_loadu_si256(p.cast())
                } else {
                    _mm256_maskload_epi32(p.cast(), mask)
                }
            }
        }

        /// Groups of 4 words (4-bit, group 32): a block's lanes 0–3 and 4–7
        /// take two scales.
        fn splits(lay: &Layout) -> bool {
            lay.words_per_group_log2 < 3
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales_for(_lay: &Layout) {}

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn block_scales<P: Element, const SPLIT: bool>(
            scales: &[P],
            lay: &Layout,
            b0: usize,
            _c: (),
        ) -> __m256 {
            // SAFETY: the block's groups lie inside the row.
            unsafe {
                let at = scales.as_ptr().add(b0 >> lay.words_per_group_log2);
                if SPLIT {
                    let halves = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(P::widen2(at)), halves)
                } else {
                    _mm256_set1_ps(P::widen1(*at))
                }
            }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn tail_scales<P: Element>(
            scales: &[P],
            lay: &Layout,
            b0: usize,
            lanes: usize,
            _c: (),
        ) -> __m256 {
            // SAFETY: the block's groups lie inside the row.
            unsafe { lane_params(scales, lay, b0, lanes) }
        }

        /// The biases eight groups at a time into the same accumulators
        /// (every lane is summed at the end), the last groups one by one.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn finish<P: Element, const MR: usize, const NR: usize>(
            mut acc: [[__m256; NR]; MR],
            biases: [&[P]; NR],
            gs: [&[f32]; MR],
        ) -> [[f32; NR]; MR] {
            let groups = biases[0].len();
            let whole = groups / 8 * 8;
            for g in (0..whole).step_by(8) {
                for n in 0..NR {
                    // SAFETY: g + 8 <= groups bounds both loads.
                    let z = unsafe { P::load8(biases[n].as_ptr().add(g)) };
                    for i in 0..MR {
                        let sums = unsafe { _mm256_loadu_ps(gs[i].as_ptr().add(g)) };
                        acc[i][n] = _mm256_fmadd_ps(sums, z, acc[i][n]);
                    }
                }
            }
            let mut d = [[0.0f32; NR]; MR];
            for i in 0..MR {
                for n in 0..NR {
                    let mut tail = 0.0f32;
                    for (b, s) in biases[n][whole..].iter().zip(&gs[i][whole..]) {
                        // SAFETY: the target features include F16C.
                        tail += unsafe { P::widen1(*b) } * s;
                    }
                    d[i][n] = hsum(acc[i][n]) + tail;
                }
            }
            d
        }
    }

    walk!("avx2,fma,f16c", avx2_fma, Avx2, (4, 1));

    impl<'x> XRow<'x, Avx2> for &'x [f32] {
        fn row(px: &'x PreparedX, i: usize, k: usize) -> Self {
            &px.perm[i * k..][..k]
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize, const FULL: bool>(
            x: &[Self; MR],
            wv: &[__m256i; NR],
            b0: usize,
            lanes: usize,
            mask: __m256i,
        ) -> [[__m256; NR]; MR] {
            // SAFETY: the caller's contract.
            unsafe { exact_partial::<Self, BITS, MR, NR, FULL, false>(x, wv, b0, lanes, mask) }
        }
    }

    /// An exact x row scaled per field ([`PreparedX::prescaled`]): value
    /// `v` of a word is masked in place, `q·2^(bits·v)`, whose convert is
    /// exact and whose product with the scaled x is `q·x` exactly, so the
    /// sums are bit-identical to the plain body's with one shift fewer per
    /// value (the last value of a word is shifted down and not masked).
    #[derive(Clone, Copy)]
    pub(super) struct Prescaled<'x>(&'x [f32]);

    impl<'x> XRow<'x, Avx2> for Prescaled<'x> {
        fn row(px: &'x PreparedX, i: usize, k: usize) -> Self {
            Prescaled(&px.perm[i * k..][..k])
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize, const FULL: bool>(
            x: &[Self; MR],
            wv: &[__m256i; NR],
            b0: usize,
            lanes: usize,
            mask: __m256i,
        ) -> [[__m256; NR]; MR] {
            // SAFETY: the caller's contract.
            unsafe { exact_partial::<Self, BITS, MR, NR, FULL, true>(x, wv, b0, lanes, mask) }
        }
    }

    /// [`XRow::partial`] of exact f32 x: each value of the packed words
    /// becomes f32 (`IN_PLACE`: masked where it sits, for x scaled per
    /// field; otherwise shifted down and masked), then one FMA per x row.
    ///
    /// # Safety
    /// As [`XRow::partial`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exact_partial<
        X: Copy + AsRef<[f32]>,
        const BITS: u32,
        const MR: usize,
        const NR: usize,
        const FULL: bool,
        const IN_PLACE: bool,
    >(
        x: &[X; MR],
        wv: &[__m256i; NR],
        b0: usize,
        lanes: usize,
        mask: __m256i,
    ) -> [[__m256; NR]; MR] {
        let vpw = (32 / BITS) as usize;
        let low = (1u32 << BITS) - 1;
        let zero = _mm256_setzero_ps();
        let mut p = [[zero; NR]; MR];
        for v in 0..vpw {
            let shift = BITS as usize * v;
            let mut q = [zero; NR];
            for n in 0..NR {
                let field = if !IN_PLACE {
                    let down = _mm256_srlv_epi32(wv[n], _mm256_set1_epi32(shift as i32));
                    _mm256_and_si256(down, _mm256_set1_epi32(low as i32))
                } else if v + 1 < vpw {
                    _mm256_and_si256(wv[n], _mm256_set1_epi32((low << shift) as i32))
                } else {
                    // The top field: shifted down, nothing above it to mask.
                    _mm256_srl_epi32(wv[n], _mm_cvtsi32_si128(shift as i32))
                };
                q[n] = _mm256_cvtepi32_ps(field);
            }
            for i in 0..MR {
                // SAFETY: the caller's block lies inside the row; short
                // blocks read through the mask.
                let xv = unsafe {
                    let at = x[i].as_ref().as_ptr().add(b0 * vpw + v * lanes);
                    if FULL {
                        _mm256_loadu_ps(at)
                    } else {
                        _mm256_maskload_ps(at, mask)
                    }
                };
                for n in 0..NR {
                    p[i][n] = _mm256_fmadd_ps(q[n], xv, p[i][n]);
                }
            }
        }
        p
    }

    impl AsRef<[f32]> for Prescaled<'_> {
        fn as_ref(&self) -> &[f32] {
            self.0
        }
    }

    /// An int16 x row: pairs and per-word scales ([`crate::kernels::cpu::prepare::Int16Rows`]).
    #[derive(Clone, Copy)]
    pub(super) struct I16Row<'x> {
        pairs: &'x [i32],
        scales: &'x [f32],
    }

    impl<'x> XRow<'x, Avx2> for I16Row<'x> {
        fn row(px: &'x PreparedX, i: usize, _k: usize) -> Self {
            let (pairs, scales) = px.int16().expect("int16 x").row(i);
            I16Row { pairs, scales }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize, const FULL: bool>(
            x: &[Self; MR],
            wv: &[__m256i; NR],
            b0: usize,
            lanes: usize,
            mask: __m256i,
        ) -> [[__m256; NR]; MR] {
            let half = (16 / BITS) as usize;
            let mut s = [[_mm256_setzero_si256(); NR]; MR];
            for p in 0..half {
                // Values p and p + half of each word in the low and high int16.
                let mut q = [_mm256_setzero_si256(); NR];
                for n in 0..NR {
                    q[n] = int16_field::<BITS>(wv[n], p);
                }
                for i in 0..MR {
                    // SAFETY: as in the exact body.
                    let xv = unsafe {
                        let at = x[i].pairs.as_ptr().add(b0 * half + p * lanes);
                        if FULL {
                            _mm256_loadu_si256(at.cast())
                        } else {
                            _mm256_maskload_epi32(at, mask)
                        }
                    };
                    for n in 0..NR {
                        s[i][n] = _mm256_add_epi32(s[i][n], _mm256_madd_epi16(q[n], xv));
                    }
                }
            }
            let mut out = [[_mm256_setzero_ps(); NR]; MR];
            for i in 0..MR {
                // SAFETY: as above; the scales have one value per word.
                let d = unsafe {
                    let at = x[i].scales.as_ptr().add(b0);
                    if FULL {
                        _mm256_loadu_ps(at)
                    } else {
                        _mm256_maskload_ps(at, mask)
                    }
                };
                for n in 0..NR {
                    out[i][n] = _mm256_mul_ps(_mm256_cvtepi32_ps(s[i][n]), d);
                }
            }
            out
        }
    }

    /// 8 lanes of per-group parameters for the words `b0..b0 + lanes` (b0 a
    /// multiple of 8), lane j taking its word's group: a block spans one
    /// group, or two split between lanes 3 and 4 (4-bit, group 32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lane_params<P: Element>(
        params: &[P],
        lay: &Layout,
        b0: usize,
        lanes: usize,
    ) -> __m256 {
        let log2 = lay.words_per_group_log2;
        let (g0, g1) = (b0 >> log2, (b0 + lanes - 1) >> log2);
        if g0 == g1 {
            // SAFETY: the target features include F16C.
            _mm256_set1_ps(unsafe { P::widen1(params[g0]) })
        } else {
            let pair = &params[g0..g0 + 2];
            // SAFETY: `pair` holds 2 elements; the target features include F16C.
            let v = unsafe { P::widen2(pair.as_ptr()) };
            let idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), idx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::layout::Layout;
    use crate::kernels::cpu::test_util::{check_against_f64, random, Rng};

    /// `dot_rows` against an f64 reference (`test_util::check_against_f64`): exact x
    /// within f32 rounding, int16 x also within half a step of its word.
    fn case<P: Element>(
        rng: &mut Rng,
        (m, n, k): (usize, usize, usize),
        bits: u32,
        group: usize,
        int16: bool,
    ) {
        let lay = Layout::new(bits, group, n, k).unwrap();
        let (w, s, b, x) = random::<P>(rng, (m, n, k), &lay);
        let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
        let px = PreparedX::with_lanes(x.chunks_exact(k), &lay, 8, int16);
        assert_eq!(px.int16().is_some(), int16);
        let what = format!("m={m} n={n} k={k} bits={bits} group={group} int16={int16}");
        let unit = int16.then_some(lay.vals_per_word);
        check_against_f64(&x, &wv, unit, &what, |xr, wr, out, st| {
            dot_rows(&px, xr, &wv, wr, out, st)
        });
    }

    #[test]
    fn matches_f64_reference() {
        if !isa::avx2_available() {
            return;
        }
        let mut rng = Rng::new(0x256);
        // m covers every register block (4×1, 2×2, 1×4, the 4-row block
        // repeated, remainders); n leaves remainders of the 4- and 2-row
        // weight blocks; k = 96 at 4 bits leaves a short block of 4 words
        // after a whole one, k = 32 only the short block; group sums of
        // 18 (k = 576, group 32) and 3 groups leave a bias tail.
        for (m, n, k, bits, group) in [
            (1, 23, 576, 4, 32),
            (3, 9, 576, 8, 32),
            (17, 18, 576, 4, 64),
            (12, 7, 256, 8, 128),
            (6, 5, 96, 4, 32),
            (1, 6, 32, 4, 32),
            (2, 33, 1536, 4, 128),
            (5, 10, 384, 8, 128),
        ] {
            for int16 in [false, true] {
                if int16 && !isa::avx2_int16_available() {
                    continue;
                }
                case::<f32>(&mut rng, (m, n, k), bits, group, int16);
                case::<half::f16>(&mut rng, (m, n, k), bits, group, int16);
                case::<half::bf16>(&mut rng, (m, n, k), bits, group, int16);
            }
        }
    }

    /// The prescaled exact body's sums equal the plain body's bit for bit
    /// (every register block, short blocks, 4 and 8 bits, NaN and
    /// infinity in x), and x holding a tiny value stays unscaled.
    #[test]
    fn prescaled_body_is_bit_identical() {
        if !isa::avx2_available() {
            return;
        }
        let mut rng = Rng::new(0x5ca1e);
        for (m, n, k, bits, group) in [
            (1, 23, 576, 4, 32),
            (3, 9, 576, 8, 32),
            (6, 5, 96, 4, 32),
            (5, 10, 384, 8, 128),
            (2, 7, 4096, 4, 64),
            (1, 6, 32, 4, 32),
        ] {
            let lay = Layout::new(bits, group, n, k).unwrap();
            let (w, s, b, mut x) = random::<half::bf16>(&mut rng, (m, n, k), &lay);
            let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
            let st = OutStrides {
                x_stride: n,
                w_stride: 1,
            };
            let run = |px: &PreparedX| {
                let mut out = vec![f32::NAN; m * n];
                dot_rows(px, 0..m, &wv, 0..n, &mut out, st);
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let what = format!("m={m} n={n} k={k} bits={bits}");
            let plain = PreparedX::with_lanes(x.chunks_exact(k), &lay, 8, false);
            let scaled = PreparedX::prescaled_with_lanes(x.chunks_exact(k), &lay);
            assert!(!plain.prescaled() && scaled.prescaled(), "{what}");
            assert_eq!(run(&plain), run(&scaled), "{what}");
            x[k - 1] = f32::NAN;
            x[k / 2] = f32::INFINITY;
            let plain = PreparedX::with_lanes(x.chunks_exact(k), &lay, 8, false);
            let scaled = PreparedX::prescaled_with_lanes(x.chunks_exact(k), &lay);
            assert!(scaled.prescaled());
            assert_eq!(run(&plain), run(&scaled), "{what} with NaN and inf");
            // A value that 2^-24 would make subnormal: the last row keeps
            // every row unscaled (earlier rows are scaled back).
            x[(m - 1) * k + 3] = 1e-35;
            let scaled = PreparedX::prescaled_with_lanes(x.chunks_exact(k), &lay);
            let plain = PreparedX::with_lanes(x.chunks_exact(k), &lay, 8, false);
            let bits = |px: &PreparedX| px.perm.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(
                !scaled.prescaled() && bits(&scaled) == bits(&plain),
                "{what} tiny"
            );
        }
    }

    /// Int16 x is not exact: the rounding the reference allows is real
    /// and far below int8's (the bound above is not vacuous); NaN in x
    /// reaches its row only, in a whole block and in a short one.
    #[test]
    fn int16_rounding_is_small_but_present() {
        if !isa::avx2_int16_available() {
            return;
        }
        let mut rng = Rng::new(0x16);
        let (m, n) = (3, 40);
        for k in [576, 96] {
            let lay = Layout::new(4, 32, n, k).unwrap();
            let (w, s, b, mut x) = random::<f32>(&mut rng, (m, n, k), &lay);
            let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
            let st = OutStrides {
                x_stride: n,
                w_stride: 1,
            };
            let run = |x: &[f32], int16: bool| {
                let px = PreparedX::with_lanes(x.chunks_exact(k), &lay, 8, int16);
                let mut out = vec![f32::NAN; m * n];
                dot_rows(&px, 0..m, &wv, 0..n, &mut out, st);
                out
            };
            let (exact, rounded) = (run(&x, false), run(&x, true));
            let rel = exact
                .iter()
                .zip(&rounded)
                .map(|(e, r)| ((e - r) / e.abs().max(1.0)).abs())
                .fold(0.0f32, f32::max);
            assert!(rel > 0.0 && rel < 1e-4, "int16 relative error {rel}");
            for at in [17, k - 3] {
                let mut xn = x.clone();
                xn[k + at] = f32::NAN;
                let out = run(&xn, true);
                assert!(out[n..2 * n].iter().all(|v| v.is_nan()), "NaN at {at}");
                assert!(out[..n].iter().chain(&out[2 * n..]).all(|v| v.is_finite()));
            }
            x[0] = f32::INFINITY;
            let out = run(&x, true);
            assert!(out[..n].iter().all(|v| !v.is_finite()));
        }
    }
}
