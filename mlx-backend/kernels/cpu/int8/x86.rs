//! The x86-64 bodies of the int8 dot products: one tile body, instantiated
//! per tier with that tier's integer dot instruction.

use super::tier::Kind;
use super::{Int8Tier, Q8Row, BLOCK};
use crate::kernels::cpu::layout::{Layout, QRow, QView};
use crate::kernels::cpu::rowwise::x86::lane_params;
use crate::kernels::cpu::simd::avx2::hsum;
use crate::kernels::cpu::simd::Element;
use std::arch::x86_64::*;

/// Complete dot products (biases included) of every x row with weight rows
/// `first..first + out.len() / xs.len()`, into `out` as `[rows][xs.len()]`,
/// over the whole chunks of k (a 4-bit trailing half chunk is the caller's).
/// `NX` x rows share each unpacked weight chunk.
pub(super) fn dot_range<P: Element, const NX: usize>(
    w: &QView<P>,
    first: usize,
    xs: &[Q8Row],
    out: &mut [f32],
    tier: Int8Tier,
) {
    let four = w.lay.bits == 4;
    // SAFETY: an `Int8Tier` other than scalar exists only once its CPU
    // features were detected (`Int8Tier::available`).
    unsafe {
        match tier.kind() {
            Kind::Scalar => {}
            Kind::Avx2 if four => avx2::range::<P, 4, NX>(w, first, xs, out),
            Kind::Avx2 => avx2::range::<P, 8, NX>(w, first, xs, out),
            Kind::AvxVnni if four => avx_vnni::range::<P, 4, NX>(w, first, xs, out),
            Kind::AvxVnni => avx_vnni::range::<P, 8, NX>(w, first, xs, out),
            Kind::Avx512Vnni if four => avx512_vnni::range::<P, 4, NX>(w, first, xs, out),
            Kind::Avx512Vnni => avx512_vnni::range::<P, 8, NX>(w, first, xs, out),
        }
    }
}

/// Weight rows per pass over the chunks.
const NW: usize = 4;

/// i32 lanes of `lo·xlo + hi·xhi` (4-bit: unsigned nibbles times int8 x).
#[inline]
#[target_feature(enable = "avx2")]
fn dp4_avx2(lo: __m256i, xlo: __m256i, hi: __m256i, xhi: __m256i) -> __m256i {
    // Each maddubs pair sum is at most 2·15·127, so their i16 sum cannot saturate.
    let s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
    _mm256_madd_epi16(s, _mm256_set1_epi16(1))
}

/// i32 lanes of `w·x` (8-bit weights).
#[inline]
#[target_feature(enable = "avx2")]
fn dp8_avx2(w: __m256i, x: __m256i) -> __m256i {
    // 2·255·127 would saturate maddubs' i16 sums: split w = 16·hi + lo.
    let nib = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(w, nib);
    let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
    let ones = _mm256_set1_epi16(1);
    let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x), ones);
    let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x), ones);
    _mm256_add_epi32(p_lo, _mm256_slli_epi32(p_hi, 4))
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn dp4_avx_vnni(lo: __m256i, xlo: __m256i, hi: __m256i, xhi: __m256i) -> __m256i {
    let s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xlo);
    _mm256_dpbusd_avx_epi32(s, hi, xhi)
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn dp8_avx_vnni(w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x)
}

#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
fn dp4_avx512_vnni(lo: __m256i, xlo: __m256i, hi: __m256i, xhi: __m256i) -> __m256i {
    let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo);
    _mm256_dpbusd_epi32(s, hi, xhi)
}

#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
fn dp8_avx512_vnni(w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
}

/// The bodies for one tier: `$dp4` / `$dp8` give the i32 lanes of one
/// chunk's integer dot product.
macro_rules! tier_body {
    ($tier:ident, $features:literal, $dp4:ident, $dp8:ident) => {
        mod $tier {
            use super::*;

            /// [`super::dot_range`] for this tier.
            ///
            /// # Safety
            /// The CPU must have this tier's features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn range<P: Element, const BITS: u32, const NX: usize>(
                w: &QView<P>,
                first: usize,
                xs: &[Q8Row],
                out: &mut [f32],
            ) {
                let m = xs.len();
                let rows = out.len() / m.max(1);
                // x rows outside: NX of them stay in L1 while the weight rows
                // pass. Short groups repeat their last row; extra sums are dropped.
                for i0 in (0..m).step_by(NX) {
                    let xr: [&Q8Row; NX] = std::array::from_fn(|j| &xs[(i0 + j).min(m - 1)]);
                    for r0 in (0..rows).step_by(NW) {
                        let wr: [QRow<P>; NW] =
                            std::array::from_fn(|j| w.row(first + (r0 + j).min(rows - 1)));
                        // SAFETY: this function's features are the tile's.
                        let d = unsafe { tile::<P, BITS, NX>(&wr, &xr, &w.lay) };
                        for (j, dr) in d.iter().enumerate().take(rows - r0) {
                            let o = &mut out[(r0 + j) * m + i0..];
                            for (o, v) in o.iter_mut().zip(dr).take(m - i0) {
                                *o = *v;
                            }
                        }
                    }
                }
            }

            /// `Σ scale·d·(q_w·q_x) + Σ bias·(Σ x̂)` over the whole chunks,
            /// per (weight row, x row).
            ///
            /// # Safety
            /// The CPU must have this tier's features.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn tile<P: Element, const BITS: u32, const NX: usize>(
                w: &[QRow<P>; NW],
                x: &[&Q8Row; NX],
                lay: &Layout,
            ) -> [[f32; NX]; NW] {
                let cv = if BITS == 4 { 2 * BLOCK } else { BLOCK };
                let (chunks, groups) = (lay.k / cv, lay.groups_per_row);
                for r in w {
                    assert!(
                        r.w.len() >= chunks * 8
                            && r.scales.len() >= groups
                            && r.biases.len() >= groups
                    );
                }
                for xr in x {
                    assert!(
                        xr.q.len() >= chunks * cv
                            && xr.lane_d.len() >= chunks * 8
                            && xr.group_sums.len() >= groups
                    );
                }
                let nib = _mm256_set1_epi8(0x0F);
                let mut acc = [[_mm256_setzero_ps(); NX]; NW];
                for c in 0..chunks {
                    let mut wv = [[_mm256_setzero_si256(); 2]; NW];
                    let mut sv = [_mm256_setzero_ps(); NW];
                    for r in 0..NW {
                        // SAFETY: the asserts above bound every chunk's loads.
                        let raw = unsafe { _mm256_loadu_si256(w[r].w.as_ptr().add(c * 8).cast()) };
                        wv[r] = if BITS == 4 {
                            let hi = _mm256_srli_epi16(raw, 4);
                            [_mm256_and_si256(raw, nib), _mm256_and_si256(hi, nib)]
                        } else {
                            [raw, raw]
                        };
                        sv[r] = lane_params(w[r].scales, lay, c);
                    }
                    for i in 0..NX {
                        // SAFETY: as above.
                        let (x0, x1, d) = unsafe {
                            let xq = x[i].q.as_ptr().add(c * cv);
                            let x0 = _mm256_loadu_si256(xq.cast());
                            let x1 = if BITS == 4 {
                                _mm256_loadu_si256(xq.add(BLOCK).cast())
                            } else {
                                x0
                            };
                            (x0, x1, _mm256_loadu_ps(x[i].lane_d.as_ptr().add(c * 8)))
                        };
                        for r in 0..NW {
                            let isum = if BITS == 4 {
                                $dp4(wv[r][0], x0, wv[r][1], x1)
                            } else {
                                $dp8(wv[r][0], x0)
                            };
                            let f = _mm256_cvtepi32_ps(isum);
                            acc[r][i] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, sv[r]), acc[r][i]);
                        }
                    }
                }
                // The bias term, eight groups per FMA into the same sums.
                let full = groups / 8 * 8;
                for g in (0..full).step_by(8) {
                    for r in 0..NW {
                        // SAFETY: g + 8 <= groups, asserted above.
                        let b = unsafe { P::load8(w[r].biases.as_ptr().add(g)) };
                        for i in 0..NX {
                            // SAFETY: as above.
                            let s = unsafe { _mm256_loadu_ps(x[i].group_sums.as_ptr().add(g)) };
                            acc[r][i] = _mm256_fmadd_ps(b, s, acc[r][i]);
                        }
                    }
                }
                let mut out = [[0.0f32; NX]; NW];
                for r in 0..NW {
                    for i in 0..NX {
                        let mut tail = 0.0f32;
                        for g in full..groups {
                            // SAFETY: this function's features include F16C.
                            tail += unsafe { P::widen1(w[r].biases[g]) } * x[i].group_sums[g];
                        }
                        out[r][i] = hsum(acc[r][i]) + tail;
                    }
                }
                out
            }
        }
    };
}

tier_body!(avx2, "avx2,fma,f16c", dp4_avx2, dp8_avx2);
tier_body!(
    avx_vnni,
    "avx2,fma,f16c,avxvnni",
    dp4_avx_vnni,
    dp8_avx_vnni
);
tier_body!(
    avx512_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    dp4_avx512_vnni,
    dp8_avx512_vnni
);

/// [`super::quantize_block`] in AVX2: returns `d` and `Σ q`, writes
/// `round(x / d)` in natural order (`cvtps2dq` rounds to nearest even).
///
/// # Safety
/// Needs AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block(x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> (f32, i32) {
    // SAFETY: x holds 32 values: four loads of 8.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let sign = _mm256_set1_ps(-0.0);
    let abs = v.map(|v| _mm256_andnot_ps(sign, v));
    let a = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let qi = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
    let s = _mm256_add_epi32(
        _mm256_add_epi32(qi[0], qi[1]),
        _mm256_add_epi32(qi[2], qi[3]),
    );
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)));
    // packs interleave the 128-bit lanes: dwords come out as 0,2,4,6,1,3,5,7.
    let b = _mm256_packs_epi16(
        _mm256_packs_epi32(qi[0], qi[1]),
        _mm256_packs_epi32(qi[2], qi[3]),
    );
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: q holds 32 bytes.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), b) };
    (d, sum)
}
