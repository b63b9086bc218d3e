//! The SIMD primitives against their scalar forms.

use super::*;
use crate::kernels::cpu::test_util::Rng;

/// f32 bit patterns: random ones plus ties, overflow, infinities, NaNs
/// and subnormals.
fn patterns() -> Vec<f32> {
    let mut rng = Rng::new(0xb16b_00b5);
    let special = [
        0x0000_0000u32,
        0x8000_0000,
        0x3F80_8000, // tie, even below: stays
        0x3F81_8000, // tie, odd below: rounds up
        0x3F80_8001,
        0x7F7F_FFFF, // rounds to infinity
        0xFF7F_FFFF,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0x7F80_0001, // signalling NaN: made quiet
        0xFFFF_FFFF,
        0x0000_0001,
        0x0080_7FFF,
    ];
    let mut v: Vec<f32> = special.iter().map(|&b| f32::from_bits(b)).collect();
    v.extend((0..100_000).map(|_| f32::from_bits(rng.next_u32())));
    v.extend((0..1000).map(|i| i as f32 * 0.37 - 185.0));
    v
}

/// The vector rounding (`Lanes::round_store8` / `round8`) and widening
/// (`load_f32`) against `half`'s scalar conversions, bit for bit.
fn round_trips_like_scalar<T: Element>() {
    let src = patterns();
    let n = src.len() / 8 * 8;
    let mut got = vec![T::from_f32(0.0); n];
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        use std::arch::x86_64::_mm256_loadu_ps;
        for (i, c) in src[..n].chunks_exact(8).enumerate() {
            // SAFETY: features detected; 8 elements on each side.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                let r = T::round_store8(got.as_mut_ptr().add(8 * i), v);
                let r2 = T::round8(v);
                let (mut a, mut b) = ([0.0f32; 8], [0.0f32; 8]);
                std::arch::x86_64::_mm256_storeu_ps(a.as_mut_ptr(), r);
                std::arch::x86_64::_mm256_storeu_ps(b.as_mut_ptr(), r2);
                for j in 0..8 {
                    let want = T::from_f32(c[j]).to_f32().to_bits();
                    assert_eq!(a[j].to_bits(), want, "round_store8 {:#x}", c[j].to_bits());
                    assert_eq!(b[j].to_bits(), want, "round8 {:#x}", c[j].to_bits());
                }
            }
        }
    }
    for (g, s) in got.iter_mut().zip(&src) {
        *g = T::from_f32(*s);
    }
    // Widening, with tails of every size.
    for len in [n, n - 3, 7] {
        let mut back = vec![0.0f32; len];
        T::load_f32(&got[..len], &mut back);
        for (b, g) in back.iter().zip(&got) {
            assert_eq!(b.to_bits(), g.to_f32().to_bits());
        }
    }
    // The fused scaling rounds like the scalar expression.
    let ones = vec![T::from_f32(1.0); n - 5];
    let mut out = vec![T::from_f32(0.0); n - 5];
    scale_mul_to(&got[..n - 5], 0.75, &ones, &mut out);
    for (i, (o, g)) in out.iter().zip(&got).enumerate() {
        let want = T::from_f32(T::from_f32(g.to_f32() * 0.75).to_f32()).to_f32();
        assert_eq!(o.to_f32().to_bits(), want.to_bits(), "scale_mul_to {i}");
    }
}

/// Every length class: below 16 (AVX2), whole and partial 16-lane blocks.
#[test]
fn dot4_matches_f64() {
    let mut rng = Rng::new(0xd4);
    for n in [3, 8, 15, 16, 17, 64, 100] {
        let x: Vec<f32> = rng.elems(n, 1.0);
        let w: Vec<Vec<f32>> = (0..4).map(|_| rng.elems(n, 1.0)).collect();
        let got = dot4(&x, [&w[0], &w[1], &w[2], &w[3]]);
        for (g, wr) in got.iter().zip(&w) {
            let want: f64 = x.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert!((*g as f64 - want).abs() < 1e-5, "n {n}: {g} vs {want}");
        }
    }
}

#[test]
fn bf16_conversions_match_half() {
    round_trips_like_scalar::<bf16>();
}

#[test]
fn f16_conversions_match_half() {
    round_trips_like_scalar::<f16>();
}

#[test]
fn fused_sum_of_squares_and_add() {
    let mut rng = Rng::new(7);
    for n in [0, 1, 9, 31, 64, 1000] {
        let x: Vec<bf16> = rng.elems(n, 3.0);
        let r: Vec<bf16> = rng.elems(n, 3.0);
        let want: f64 = x.iter().map(|v| (v.to_f32() as f64).powi(2)).sum();
        let got = sum_squares_of(&x) as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want.max(1.0),
            "{n}: {got} vs {want}"
        );
        let mut sum = vec![bf16::ZERO; n];
        let ss = add_to_sum_squares(&x, &r, &mut sum) as f64;
        let mut want_ss = 0.0f64;
        for i in 0..n {
            let s = bf16::from_f32(x[i].to_f32() + r[i].to_f32());
            assert_eq!(sum[i].to_bits(), s.to_bits(), "{n}: sum {i}");
            want_ss += (s.to_f32() as f64).powi(2);
        }
        assert!(
            (ss - want_ss).abs() <= 1e-5 * want_ss.max(1.0),
            "{n}: {ss} vs {want_ss}"
        );
    }
}
