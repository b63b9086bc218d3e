//! The x86-64 bodies of the int8 dot products: one tile body, instantiated
//! per tier with that tier's integer dot instruction.

use super::tier::Kind;
use super::{Int8Tier, Q8Row, BLOCK};
use crate::kernels::cpu::quant::x86::lane_params;
use crate::kernels::cpu::quant::{Layout, QRow};
use crate::kernels::cpu::simd::avx2::hsum;
use crate::kernels::cpu::simd::Element;
use std::arch::x86_64::*;

/// [`super::scaled_tile`] over the whole chunks of the rows.
pub(super) fn scaled_tile<P: Element, const NW: usize, const NX: usize>(
    w: [&QRow<P>; NW],
    x: [&Q8Row; NX],
    lay: &Layout,
    tier: Int8Tier,
) -> [[f32; NX]; NW] {
    let four = lay.bits == 4;
    // SAFETY: an `Int8Tier` other than scalar exists only once its CPU
    // features were detected (`Int8Tier::available`).
    unsafe {
        match tier.kind() {
            Kind::Scalar => [[0.0; NX]; NW],
            Kind::Avx2 if four => avx2::tile::<P, 4, NW, NX>(w, x, lay),
            Kind::Avx2 => avx2::tile::<P, 8, NW, NX>(w, x, lay),
            Kind::AvxVnni if four => avx_vnni::tile::<P, 4, NW, NX>(w, x, lay),
            Kind::AvxVnni => avx_vnni::tile::<P, 8, NW, NX>(w, x, lay),
            Kind::Avx512Vnni if four => avx512_vnni::tile::<P, 4, NW, NX>(w, x, lay),
            Kind::Avx512Vnni => avx512_vnni::tile::<P, 8, NW, NX>(w, x, lay),
        }
    }
}

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

/// The tile body for one tier: `$dp4` / `$dp8` give the i32 lanes of one
/// chunk's integer dot product.
macro_rules! tier_body {
    ($tier:ident, $features:literal, $dp4:ident, $dp8:ident) => {
        mod $tier {
            use super::*;

            /// `Σ scale·d·(q_w·q_x)` over the whole chunks, per (weight row, x row).
            ///
            /// # Safety
            /// The CPU must have this tier's features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn tile<
                P: Element,
                const BITS: u32,
                const NW: usize,
                const NX: usize,
            >(
                w: [&QRow<P>; NW],
                x: [&Q8Row; NX],
                lay: &Layout,
            ) -> [[f32; NX]; NW] {
                let cv = if BITS == 4 { 2 * BLOCK } else { BLOCK };
                let chunks = lay.k / cv;
                for r in &w {
                    assert!(r.w.len() >= chunks * 8 && r.scales.len() >= lay.groups_per_row);
                }
                for xr in &x {
                    assert!(xr.q.len() >= chunks * cv && xr.lane_d.len() >= chunks * 8);
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
                let mut out = [[0.0f32; NX]; NW];
                for r in 0..NW {
                    for i in 0..NX {
                        out[r][i] = hsum(acc[r][i]);
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
