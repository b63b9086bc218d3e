//! x prepared once per call for the quantized dot products ([`PreparedX`]):
//! f32 in block order (value `v` of word `j` of a block at `v * lanes + j`),
//! with per-group sums of x for the biases' term; or, by the precision asked
//! and the body that will run, int16 per word ([`Int16Rows`]), int16 per
//! group (`row_lanes`), bf16 pairs ([`Bf16Rows`]) or AMX tiles.

use super::isa;
use super::layout::{Layout, INT16_MAX};
use super::simd::Element;

/// x rows prepared once per call: per-group sums of x (the bias
/// contribution is `bias * sum(x over the group)`) and x in the [`XForm`]
/// of the body that will run.
pub(crate) struct PreparedX {
    /// f32 x in block order ([`XForm::F32`]; empty in the other forms).
    pub(crate) perm: Vec<f32>,
    pub(crate) group_sums: Vec<f32>,
    pub(crate) rows: usize,
    /// Words per block: 16 for [`super::blocked::avx512`], 8 for
    /// [`super::blocked::avx2`] and the portable bodies.
    pub(crate) lanes: usize,
    /// The form x takes for its body ([`super::dispatch`] picks the body by it).
    pub(crate) form: XForm,
}

/// The form of prepared x, one per kind of body.
pub(crate) enum XForm {
    /// f32 in block order (`perm`). `prescaled`: value `v` of each word
    /// scaled by `2^(-bits·v)` (the last value of a word unscaled), for
    /// [`super::blocked::avx2`]'s exact body, which then masks each weight
    /// field in place instead of shifting it down: `(q·2^(bits·v)) ·
    /// (x·2^(-bits·v))` is the same product exactly. Set only where that
    /// body reads `perm` and no scaled value would lose bits (every nonzero
    /// |x| at least 2^-100).
    F32 { prescaled: bool },
    /// x rounded to int16 per word of W, for the blocked bodies.
    Int16(Int16Rows),
    /// Int16 x with one scale per group, for [`super::row_lanes`] (its
    /// minimum rows or more).
    GroupInt16(super::row_lanes::GroupInt16Rows),
    /// bf16 x exactly, for `vdpbf16ps` against 4-bit W: exact-mode calls
    /// whose x is bf16.
    Bf16(Bf16Rows),
    /// Int16-class x as AMX tiles (bf16 hi + lo; see [`super::amx`]), for
    /// [`super::amx::MIN_ROWS`] or more rows where AMX runs.
    Amx(super::amx::AmxX),
}

impl PreparedX {
    /// Whether `perm` is prescaled for the AVX2 exact body.
    #[inline]
    pub(crate) fn prescaled(&self) -> bool {
        matches!(self.form, XForm::F32 { prescaled: true })
    }

    /// The int16-per-word rows, in that form.
    #[inline]
    pub(crate) fn int16(&self) -> Option<&Int16Rows> {
        match &self.form {
            XForm::Int16(x16) => Some(x16),
            _ => None,
        }
    }

    /// The bf16 pairs, in that form.
    #[inline]
    pub(crate) fn bf16(&self) -> Option<&Bf16Rows> {
        match &self.form {
            XForm::Bf16(xb) => Some(xb),
            _ => None,
        }
    }
}

impl PreparedX {
    /// Block order for the widest kernel this CPU runs; `int16` asks for
    /// int16 x where that kernel has it (AVX-512 VNNI, AVX2), exact f32
    /// otherwise.
    pub(crate) fn new<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        int16: bool,
    ) -> Self {
        Self::with_amx(rows, lay, int16, true)
    }

    /// As [`PreparedX::new`]; `amx` false keeps int16 x off the AMX tiles
    /// (the AVX-512 VNNI kernels then serve every row count).
    pub(crate) fn with_amx<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        int16: bool,
        amx: bool,
    ) -> Self {
        Self::with_kernels(rows, lay, int16, amx, super::row_lanes::enabled())
    }

    /// As [`PreparedX::with_amx`]; `row_lanes` false keeps int16 x of 4+
    /// rows on the per-word kernel instead of [`super::row_lanes`].
    pub(crate) fn with_kernels<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        int16: bool,
        amx: bool,
        row_lanes: bool,
    ) -> Self {
        let lanes = if isa::avx512_available() { 16 } else { 8 };
        if int16 && amx && super::amx::available() {
            let mut natural = Vec::new();
            let mut count = 0;
            for row in rows {
                let start = natural.len();
                natural.resize(start + lay.k, 0.0);
                T::load_f32(row, &mut natural[start..]);
                count += 1;
            }
            if count >= super::amx::MIN_ROWS {
                let group_sums: Vec<f32> = group_sums(&natural, lay.group_size).collect();
                let tiles = super::amx::AmxX::new(&natural, count, &group_sums, lay);
                return PreparedX {
                    perm: Vec::new(),
                    group_sums,
                    rows: count,
                    lanes,
                    form: XForm::Amx(tiles),
                };
            }
            let int16 = int16_kernel(lanes);
            return Self::build(
                natural.chunks_exact(lay.k),
                lay,
                lanes,
                int16,
                row_lanes,
                true,
            );
        }
        let int16 = int16 && int16_kernel(lanes);
        Self::build(rows, lay, lanes, int16, row_lanes, true)
    }

    /// x in blocks of `lanes` words, f32 or (`int16`, where that lane
    /// count's kernel has it) int16 per word.
    #[cfg(test)]
    pub(crate) fn with_lanes<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        lanes: usize,
        int16: bool,
    ) -> Self {
        Self::build(rows, lay, lanes, int16 && int16_kernel(lanes), false, false)
    }

    /// x in blocks of `lanes` words as this preparation makes it on a CPU
    /// of that width (exact x prescaled for the 8-lane body; int16 per
    /// word where that width's kernel has it): the benches run the 8-lane
    /// bodies on AVX-512 machines through it.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn for_width<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        lanes: usize,
        int16: bool,
    ) -> Self {
        Self::build(rows, lay, lanes, int16 && int16_kernel(lanes), false, true)
    }

    /// x in 8-word blocks, exact, scaled for [`super::blocked::avx2`]'s exact
    /// body where it runs and x allows ([`PreparedX::prescaled`]).
    #[cfg(test)]
    pub(crate) fn prescaled_with_lanes<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
    ) -> Self {
        Self::build(rows, lay, 8, false, false, true)
    }

    fn build<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        lanes: usize,
        int16: bool,
        row_lanes: bool,
        prescale: bool,
    ) -> Self {
        let k = lay.k;
        let vpw = lay.vals_per_word;
        let mut natural = vec![0.0f32; k];
        let (mut perm, mut group_sums, mut count) = (Vec::new(), Vec::new(), 0);
        let row_lanes = row_lanes && int16 && rows.len() >= super::row_lanes::min_rows();
        let mut g16 = row_lanes.then(|| super::row_lanes::GroupInt16Rows::new(lay));
        let mut x16 = (int16 && !row_lanes).then(|| Int16Rows::new(lay, lanes));
        // bf16 x is exact as bf16 pairs: the widened f32 only adds zeros.
        let bf16 = !int16
            && lanes == 16
            && lay.bits == 4
            && std::any::TypeId::of::<T>() == std::any::TypeId::of::<half::bf16>()
            && isa::avx512_bf16_available();
        let mut xb = bf16.then(|| Bf16Rows::new(lay));
        let mut prescaled = prescale && lanes == 8 && !int16 && isa::avx2_available();
        let mut blocked = Vec::new();
        for row in rows {
            T::load_f32(row, &mut natural);
            group_sums.extend(self::group_sums(&natural, lay.group_size));
            if let Some(g16) = &mut g16 {
                g16.push(&natural, lay);
            } else if x16.is_some() || xb.is_some() {
                // Block order in scratch, then rounded to int16 or paired as bf16.
                blocked.resize(k, 0.0);
                to_block_order(&natural, &mut blocked, vpw, lanes);
                if let Some(x16) = &mut x16 {
                    x16.push(&blocked);
                } else if let Some(xb) = &mut xb {
                    xb.push(&blocked);
                }
            } else {
                let start = perm.len();
                perm.resize(start + k, 0.0);
                to_block_order(&natural, &mut perm[start..], vpw, lanes);
                if prescaled && natural.iter().any(|x| *x != 0.0 && x.abs() < TINY) {
                    // Scaling back the rows before is exact: none held a tiny value.
                    scale_by_field(&mut perm[..start], lay, lanes, false);
                    prescaled = false;
                }
                if prescaled {
                    scale_by_field(&mut perm[start..], lay, lanes, true);
                }
            }
            count += 1;
        }
        let form = match (g16, x16, xb) {
            (Some(g16), _, _) => XForm::GroupInt16(g16),
            (None, Some(x16), _) => XForm::Int16(x16),
            (None, None, Some(xb)) => XForm::Bf16(xb),
            (None, None, None) => XForm::F32 { prescaled },
        };
        PreparedX {
            perm,
            group_sums,
            rows: count,
            lanes,
            form,
        }
    }
}

/// Whether the blocked kernel for x in blocks of `lanes` words takes int16 x.
fn int16_kernel(lanes: usize) -> bool {
    if lanes == 16 {
        isa::avx512_int16_available()
    } else {
        isa::avx2_int16_available()
    }
}

/// Σx over each group of `group` values (the biases' term).
fn group_sums(x: &[f32], group: usize) -> impl Iterator<Item = f32> + '_ {
    x.chunks_exact(group).map(|g| g.iter().sum::<f32>())
}

/// The smallest nonzero |x| that [`PreparedX::prescaled`] scales: times
/// 2^-24 (4-bit value 6) it stays a normal f32, so the scaling is exact.
const TINY: f32 = 7.888_609e-31; // 2^-100

/// Scales block-ordered x rows of `k` values (`lanes`-word blocks,
/// value-major) for [`PreparedX::prescaled`]: value `v` of each word by
/// `2^(-bits·v)` (`down`) or back by `2^(bits·v)`; the last value of a
/// word stays.
fn scale_by_field(dst: &mut [f32], lay: &Layout, lanes: usize, down: bool) {
    let (vals_per_word, bits) = (lay.vals_per_word, lay.bits);
    let block = lanes * vals_per_word;
    let factor = |v: usize| {
        let e = (bits as usize * v) as i32;
        if down {
            2f32.powi(-e)
        } else {
            2f32.powi(e)
        }
    };
    // At most 8 values per word (4 bits); the last one stays unscaled.
    let factors: [f32; 8] = std::array::from_fn(factor);
    for d in dst.chunks_mut(lay.k).flat_map(|row| row.chunks_mut(block)) {
        let lanes = d.len() / vals_per_word;
        for (v, f) in factors.iter().enumerate().take(vals_per_word - 1).skip(1) {
            d[v * lanes..][..lanes].iter_mut().for_each(|x| *x *= f);
        }
    }
}

fn to_block_order(src: &[f32], dst: &mut [f32], vals_per_word: usize, lanes: usize) {
    let block = lanes * vals_per_word;
    for (s, d) in src.chunks(block).zip(dst.chunks_mut(block)) {
        let lanes = s.len() / vals_per_word;
        for j in 0..lanes {
            for v in 0..vals_per_word {
                d[v * lanes + j] = s[j * vals_per_word + v];
            }
        }
    }
}

/// x rows rounded to int16, one scale per word of W (the 8 values a 4-bit
/// word holds, the 4 of an 8-bit one): `x ≈ scale · q` with
/// `scale = max|x over the word| / 32767`, so each value is off by at most
/// `scale / 2` (~1.5e-5 of the word's largest |x|).
///
/// Block order as [`PreparedX`]'s (16 lanes for this kernel, 8 for
/// [`super::blocked::avx2`]'s), but in pairs: for the block of words
/// `b0..b0 + lanes` and pair `p` (values `p` and `p + vals_per_word / 2` of
/// each word, low and high int16 of an i32), lane j sits at
/// `b0 · pairs + p · lanes + j`; the scales at `b0 + j`.
pub(crate) struct Int16Rows {
    pairs: Vec<i32>,
    scales: Vec<f32>,
    vals_per_word: usize,
    /// i32 pairs and scales per row.
    row_pairs: usize,
    row_words: usize,
    /// Words per block: 16 ([`isa::avx512_available`]) or 8 ([`isa::avx2_available`]).
    lanes: usize,
}

impl Int16Rows {
    /// No rows yet, for x against weights of layout `lay`, in blocks of
    /// `lanes` words (16 or 8).
    pub(crate) fn new(lay: &Layout, lanes: usize) -> Self {
        assert!(
            lanes == 16 || lanes == 8,
            "int16 x in blocks of 16 or 8 words"
        );
        Int16Rows {
            pairs: Vec::new(),
            scales: Vec::new(),
            vals_per_word: lay.vals_per_word,
            row_pairs: lay.words_per_row * lay.vals_per_word / 2,
            row_words: lay.words_per_row,
            lanes,
        }
    }

    /// Appends one row of x given in f32 block order with this value's
    /// lanes (as [`PreparedX`] holds exact x).
    ///
    /// # Panics
    /// Without the kernel for these lanes (AVX-512 VNNI for 16, AVX2 for
    /// 8), or when `x` is not one row long.
    pub(crate) fn push(&mut self, x: &[f32]) {
        assert_eq!(x.len(), self.row_words * self.vals_per_word);
        let (p0, s0) = (self.pairs.len(), self.scales.len());
        self.pairs.resize(p0 + self.row_pairs, 0);
        self.scales.resize(s0 + self.row_words, 0.0);
        let (pairs, scales) = (&mut self.pairs[p0..], &mut self.scales[s0..]);
        if self.lanes == 16 {
            assert!(isa::avx512_int16_available(), "int16 x needs AVX-512 VNNI");
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 was detected; the slices are the row's exact sizes.
            unsafe {
                x86::quantize_row_avx512(x, self.vals_per_word, pairs, scales)
            };
        } else {
            assert!(
                isa::avx2_int16_available(),
                "int16 x in 8 lanes needs the AVX2 int16 kernel"
            );
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 was detected; the slices are the row's exact sizes.
            unsafe {
                x86::quantize_row_avx2(x, self.vals_per_word, pairs, scales)
            };
        }
    }

    /// Checks that these are `rows` rows prepared for `lay` in blocks of `lanes`.
    pub(crate) fn check(&self, rows: usize, lay: &Layout, lanes: usize) {
        assert_eq!(self.lanes, lanes, "int16 x prepared for another kernel");
        assert_eq!(self.row_words, lay.words_per_row);
        assert_eq!(self.pairs.len(), rows * self.row_pairs);
    }

    /// Row `i`: its pairs and its per-word values.
    #[inline]
    pub(crate) fn row(&self, i: usize) -> (&[i32], &[f32]) {
        (
            &self.pairs[i * self.row_pairs..][..self.row_pairs],
            &self.scales[i * self.row_words..][..self.row_words],
        )
    }
}

/// pairs, for 4-bit W: lane j of pair p of a block holds values p and
/// p + 4 of word j as the low and high bf16 of a u32, and each word has
/// `128 · Σx` over its 8 values (f32), the offset the kernel's `128 + q`
/// weights add.
pub(crate) struct Bf16Rows {
    pairs: Vec<u32>,
    pub(crate) offsets: Vec<f32>,
    pub(crate) row_words: usize,
}

impl Bf16Rows {
    pub(crate) fn new(lay: &Layout) -> Self {
        assert_eq!(lay.bits, 4, "bf16 pairs serve 4-bit weights");
        Bf16Rows {
            pairs: Vec::new(),
            offsets: Vec::new(),
            row_words: lay.words_per_row,
        }
    }

    /// Appends one row given in f32 block order with 16 lanes, every value
    /// a bf16 widened to f32 (its low 16 bits zero, so the pairs are exact).
    pub(crate) fn push(&mut self, x: &[f32]) {
        let words = self.row_words;
        assert_eq!(x.len(), words * 8);
        let bf16 = |v: f32| v.to_bits() >> 16;
        for b0 in (0..words).step_by(16) {
            let lanes = (words - b0).min(16);
            let block = &x[b0 * 8..][..lanes * 8];
            for p in 0..4 {
                self.pairs.extend(
                    (0..lanes).map(|j| {
                        bf16(block[p * lanes + j]) | bf16(block[(p + 4) * lanes + j]) << 16
                    }),
                );
            }
            self.offsets.extend(
                (0..lanes).map(|j| 128.0 * (0..8).map(|v| block[v * lanes + j]).sum::<f32>()),
            );
        }
    }

    /// Row `i`: its pairs and its per-word values.
    #[inline]
    pub(crate) fn row(&self, i: usize) -> (&[u32], &[f32]) {
        let w = self.row_words;
        (
            &self.pairs[i * 4 * w..][..4 * w],
            &self.offsets[i * w..][..w],
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::INT16_MAX;
    use std::arch::x86_64::*;

    /// One row of x in f32 block order (16 lanes, `vpw` values per word) to
    /// int16 pairs and per-word scales ([`super::Int16Rows`]'s layout): per
    /// block, lane j's largest |x| over its word's values sets the scale;
    /// NaN in a word makes its scale NaN, and a zero or non-finite largest
    /// |x| rounds the word to zeros.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_row_avx512(
        x: &[f32],
        vpw: usize,
        pairs: &mut [i32],
        scales: &mut [f32],
    ) {
        let half = vpw / 2;
        let words = scales.len();
        let max_q = _mm512_set1_ps(INT16_MAX);
        let low = _mm512_set1_epi32(0xffff);
        for b0 in (0..words).step_by(16) {
            let lanes = (words - b0).min(16);
            let mask: __mmask16 = if lanes == 16 {
                0xffff
            } else {
                (1 << lanes) - 1
            };
            let base = b0 * vpw;
            // SAFETY (loads and stores): the mask keeps lanes..16 out; the
            // block holds vpw · lanes values, half · lanes pairs.
            let load =
                |v: usize| unsafe { _mm512_maskz_loadu_ps(mask, x.as_ptr().add(base + v * lanes)) };
            let (mut max, mut nan) = (_mm512_setzero_ps(), 0 as __mmask16);
            for v in 0..vpw {
                let xv = load(v);
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(xv, xv);
                max = _mm512_max_ps(max, _mm512_abs_ps(xv));
            }
            let finite = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(max, _mm512_setzero_ps())
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(max, _mm512_set1_ps(f32::INFINITY))
                & !nan;
            let inv = _mm512_maskz_div_ps(finite, max_q, max);
            let scale =
                _mm512_mask_mov_ps(_mm512_div_ps(max, max_q), nan, _mm512_set1_ps(f32::NAN));
            unsafe { _mm512_mask_storeu_ps(scales.as_mut_ptr().add(b0), mask, scale) };
            for p in 0..half {
                let lo = _mm512_cvtps_epi32(_mm512_mul_ps(load(p), inv));
                let hi = _mm512_cvtps_epi32(_mm512_mul_ps(load(p + half), inv));
                let pair = _mm512_or_si512(_mm512_and_si512(lo, low), _mm512_slli_epi32::<16>(hi));
                let at = b0 * half + p * lanes;
                unsafe { _mm512_mask_storeu_epi32(pairs.as_mut_ptr().add(at).cast(), mask, pair) };
            }
        }
    }

    /// One row of x in f32 block order (8 lanes, `vpw` values per word) to
    /// int16 pairs and per-word scales ([`super::Int16Rows`]'s
    /// layout), with the AVX-512 body's arithmetic: per word the largest |x|
    /// sets the scale; NaN in a word makes its scale NaN, and a zero or
    /// non-finite largest |x| rounds the word to zeros.
    ///
    /// # Safety
    /// Needs AVX2; `x` holds `scales.len() · vpw` values and `pairs`
    /// `scales.len() · vpw / 2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_row_avx2(
        x: &[f32],
        vpw: usize,
        pairs: &mut [i32],
        scales: &mut [f32],
    ) {
        let half = vpw / 2;
        let words = scales.len();
        assert!(x.len() >= words * vpw && pairs.len() >= words * half);
        let max_q = _mm256_set1_ps(INT16_MAX);
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let low = _mm256_set1_epi32(0xffff);
        let full = words / 8 * 8;
        for b0 in (0..full).step_by(8) {
            let base = b0 * vpw;
            // SAFETY (loads and stores): the block holds vpw · 8 values and
            // half · 8 pairs, inside the asserted lengths.
            let load = |v: usize| unsafe { _mm256_loadu_ps(x.as_ptr().add(base + v * 8)) };
            let (mut max, mut nan) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for v in 0..vpw {
                let xv = load(v);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(xv, xv));
                max = _mm256_max_ps(max, _mm256_and_ps(xv, abs));
            }
            let finite = _mm256_andnot_ps(
                nan,
                _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_GT_OQ>(max, _mm256_setzero_ps()),
                    _mm256_cmp_ps::<_CMP_LT_OQ>(max, _mm256_set1_ps(f32::INFINITY)),
                ),
            );
            let inv = _mm256_and_ps(finite, _mm256_div_ps(max_q, max));
            let scale = _mm256_blendv_ps(_mm256_div_ps(max, max_q), _mm256_set1_ps(f32::NAN), nan);
            unsafe { _mm256_storeu_ps(scales.as_mut_ptr().add(b0), scale) };
            for p in 0..half {
                let lo = _mm256_cvtps_epi32(_mm256_mul_ps(load(p), inv));
                let hi = _mm256_cvtps_epi32(_mm256_mul_ps(load(p + half), inv));
                let pair = _mm256_or_si256(_mm256_and_si256(lo, low), _mm256_slli_epi32::<16>(hi));
                unsafe {
                    _mm256_storeu_si256(pairs.as_mut_ptr().add(b0 * half + p * 8).cast(), pair)
                };
            }
        }
        // The short final block (lanes < 8), with the same arithmetic.
        let lanes = words - full;
        for j in 0..lanes {
            let base = full * vpw;
            let value = |v: usize| x[base + v * lanes + j];
            let nan = (0..vpw).any(|v| value(v).is_nan());
            let max = (0..vpw).fold(0.0f32, |m, v| m.max(value(v).abs()));
            let finite = !nan && max > 0.0 && max < f32::INFINITY;
            let inv = if finite { INT16_MAX / max } else { 0.0 };
            scales[full + j] = if nan { f32::NAN } else { max / INT16_MAX };
            // `vcvtps2dq` rounds to nearest even; NaN (x non-finite, `inv`
            // zero) gives i32::MIN there and 0 here: both pack to 0.
            let round = |v: f32| (v * inv).round_ties_even() as i32;
            for p in 0..half {
                pairs[full * half + p * lanes + j] =
                    (round(value(p)) & 0xffff) | (round(value(p + half)) << 16);
            }
        }
    }
}
