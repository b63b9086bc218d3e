//! The bf16 scaling pass without shuffles: 16 bf16 values load as one
//! 256-bit vector whose 32-bit lanes each hold an (even, odd) pair; a shift
//! and a mask give the even and the odd elements as f32 lanes, and a shift
//! and an or join the rounded results back in place. The generic AVX2 body
//! widens and packs 8 values at a time through the shuffle port instead,
//! which bounds it on large rows.
//!
//! Only for finite x and scale (the caller checks); the weight may hold
//! anything. The round-to-nearest-even skips the generic body's quiet-NaN
//! blend because every NaN here comes out of a multiply whose inputs are
//! widened bf16 values (low 16 bits zero) or finite: the multiply returns
//! a quiet NaN with those bits still zero (or the default NaN), and adding
//! at most `0x8000` to them cannot carry into the high half, so the NaN
//! rounds to itself, as the blend would make it. Results are
//! bit-identical to `simd::scale_mul_to`.

use half::bf16;

/// `out[i] = bf16(bf16(f32(x[i]) · s) · f32(w[i]))` when AVX2 is present;
/// returns false (writing nothing) otherwise. `x` and `s` must be finite
/// (their product may overflow to infinity); `w` may hold NaN or infinity.
pub(crate) fn scale_mul_finite(x: &[bf16], s: f32, w: &[bf16], out: &mut [bf16]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::cpu::isa::has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        unsafe { avx2::scale_mul_finite(x, s, w, out) };
        return true;
    }
    let _ = (x, s, w, out);
    false
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use half::bf16;
    use std::arch::x86_64::*;

    /// f32 bits rounded to bf16 (low 16 bits cleared), nearest-even by
    /// adding `0x7FFF + lsb`; overflow carries into infinity. A NaN input
    /// must have its low 16 bits zero (then it is returned as it is).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn round_finite(v: __m256) -> __m256i {
        let x = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let biased = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
        _mm256_and_si256(biased, _mm256_set1_epi32(0xFFFF_0000u32 as i32))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scale_mul_finite(x: &[bf16], s: f32, w: &[bf16], out: &mut [bf16]) {
        let n = x.len().min(w.len()).min(out.len());
        let (px, pw, po) = (x.as_ptr(), w.as_ptr(), out.as_mut_ptr());
        let vs = _mm256_set1_ps(s);
        let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let mut i = 0;
        // SAFETY: i + 16 <= n keeps every 32-byte access inside the slices.
        unsafe {
            while i + 16 <= n {
                let xv = _mm256_loadu_si256(px.add(i).cast());
                let wv = _mm256_loadu_si256(pw.add(i).cast());
                let (x_even, x_odd) = (_mm256_slli_epi32::<16>(xv), _mm256_and_si256(xv, high));
                let (w_even, w_odd) = (_mm256_slli_epi32::<16>(wv), _mm256_and_si256(wv, high));
                let n_even = round_finite(_mm256_mul_ps(_mm256_castsi256_ps(x_even), vs));
                let n_odd = round_finite(_mm256_mul_ps(_mm256_castsi256_ps(x_odd), vs));
                let y_even = round_finite(_mm256_mul_ps(
                    _mm256_castsi256_ps(n_even),
                    _mm256_castsi256_ps(w_even),
                ));
                let y_odd = round_finite(_mm256_mul_ps(
                    _mm256_castsi256_ps(n_odd),
                    _mm256_castsi256_ps(w_odd),
                ));
                let packed = _mm256_or_si256(_mm256_srli_epi32::<16>(y_even), y_odd);
                _mm256_storeu_si256(po.add(i).cast(), packed);
                i += 16;
            }
        }
        for ((o, x), w) in out[i..n].iter_mut().zip(&x[i..n]).zip(&w[i..n]) {
            let xn = bf16::from_f32(x.to_f32() * s).to_f32();
            *o = bf16::from_f32(xn * w.to_f32());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::simd;
    use crate::kernels::cpu::test_util::Rng;

    /// The shuffle-free body against `simd::scale_mul_to`, bit for bit;
    /// false (nothing compared) without AVX2.
    fn matches_generic_body(x: &[bf16], scale: f32, w: &[bf16], what: &str) -> bool {
        let n = x.len();
        let mut want = vec![bf16::NAN; n];
        let mut got = vec![bf16::NAN; n];
        simd::scale_mul_to(x, scale, w, &mut want);
        if !scale_mul_finite(x, scale, w, &mut got) {
            return false;
        }
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{what} i={i} w={}", w[i]);
        }
        true
    }

    #[test]
    fn bit_identical_to_the_generic_body() {
        let mut rng = Rng::new(0xbf16_0001);
        for n in [1, 15, 16, 17, 111, 576, 4096, 4099] {
            for scale in [1e-3f32, 0.7, 3.0, 1e30] {
                let x: Vec<bf16> = rng.elems(n, 4.0);
                let w: Vec<bf16> = rng.elems(n, 2.0);
                if !matches_generic_body(&x, scale, &w, &format!("n={n} s={scale}")) {
                    return; // no AVX2 here: nothing to compare
                }
            }
        }
    }

    /// Weights holding NaN (quiet, signalling, negative, the largest
    /// payload) or infinity, and scales whose product overflows to
    /// infinity before meeting a zero weight (the default NaN).
    #[test]
    fn non_finite_weights_are_bit_identical_to_the_generic_body() {
        let mut rng = Rng::new(0xbf16_0002);
        let specials = [
            0x7FC0u16, 0x7F81, 0xFFC0, 0xFF81, 0x7FFF, 0xFFFF, 0x7F80, 0xFF80, 0, 0x8000,
        ];
        for n in [16, 37, 576] {
            for scale in [0.7f32, 3.0e38] {
                let x: Vec<bf16> = rng.elems(n, 4.0);
                let mut w: Vec<bf16> = rng.elems(n, 2.0);
                for (i, bits) in specials.iter().cycle().take(n / 3).enumerate() {
                    w[(i * 7) % n] = bf16::from_bits(*bits);
                }
                if !matches_generic_body(&x, scale, &w, &format!("n={n} s={scale}")) {
                    return; // no AVX2 here: nothing to compare
                }
            }
        }
    }
}
