//! Sixteen lanes at a time (AVX-512), for attention and the gate kernels:
//! - `exp`, for softmax and SiLU, where a scalar libm `expf` per value was
//!   a tenth of a 512-token prefill: within 2 ulp of the exact value
//!   (`tests::matches_f64_exp`); NaN propagates, overflow gives +inf and
//!   underflow 0, as `f32::exp`;
//! - the probability-weighted sum of value rows of one query.
//!
//! Without AVX-512 the scalar forms run.

/// `x[i] = exp(x[i] - shift)`; returns the sum of the new values (the
/// softmax denominator when `shift` is the row's maximum).
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::qdot512::available() {
        // SAFETY: AVX-512F was detected.
        return unsafe { x86::exp_shifted_sum(x, shift) };
    }
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - shift).exp();
        sum += *v;
    }
    sum
}

/// `out[i] = silu(g[i]) · u[i]` in f32, rounding as the unfused ops do in
/// f32: `sig = 1 / (1 + exp(-g))`, then `g · sig`, then `· u`.
pub fn swiglu_f32(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = out.len().min(g.len()).min(u.len());
    #[cfg(target_arch = "x86_64")]
    if super::qdot512::available() {
        // SAFETY: AVX-512F was detected; n bounds all three slices.
        return unsafe { x86::swiglu(&g[..n], &u[..n], &mut out[..n]) };
    }
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        let sig = 1.0 / (1.0 + (-g).exp());
        *o = g * sig * u;
    }
}

/// `out += Σ_j p[j] · rows[j]` over the rows of `rows` (`[p.len(), d]`,
/// d = `out.len()`): the value side of a single query's attention, with the
/// sums in registers where AVX-512 runs and d is a multiple of 16.
pub fn weighted_rows(out: &mut [f32], p: &[f32], rows: &[f32]) {
    let d = out.len();
    assert!(rows.len() >= p.len() * d, "rows too short");
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16) && d <= 256 && super::qdot512::available() {
        // SAFETY: AVX-512F was detected; rows holds p.len() rows of d.
        return unsafe { x86::weighted_rows(out, p, rows) };
    }
    for (pj, row) in p.iter().zip(rows.chunks_exact(d)) {
        super::simd::axpy(out, *pj, row);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// exp of 16 lanes: `2^n · p(r)` with `n = round(x·log2 e)`, `r = x − n·ln 2`
    /// (in two parts) and p the degree-7 Taylor polynomial (|r| ≤ ln2/2, so
    /// the truncation is below 2⁻²⁴); `vscalefps` applies 2^n with the
    /// overflow and underflow of f32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp16(x: __m512) -> __m512 {
        // max/min return their second operand for NaN, so NaN passes.
        let x = _mm512_min_ps(
            _mm512_set1_ps(89.0),
            _mm512_max_ps(_mm512_set1_ps(-104.0), x),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        for c in [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    /// Lanes `0..len` of `mask`.
    #[inline]
    fn mask(len: usize) -> __mmask16 {
        if len >= 16 {
            0xffff
        } else {
            (1 << len) - 1
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
        let s = _mm512_set1_ps(shift);
        let mut sum = _mm512_setzero_ps();
        for i in (0..x.len()).step_by(16) {
            let m = mask(x.len() - i);
            // SAFETY: the mask keeps the accesses inside x.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p), s));
                _mm512_mask_storeu_ps(p, m, e);
                sum = _mm512_mask_add_ps(sum, m, sum, e);
            }
        }
        _mm512_reduce_add_ps(sum)
    }

    /// [`super::weighted_rows`]: 16 registers of sums (d ≤ 256).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted_rows(out: &mut [f32], p: &[f32], rows: &[f32]) {
        let d = out.len();
        let regs = d / 16;
        let mut acc = [_mm512_setzero_ps(); 16];
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm512_set1_ps(pj);
            // SAFETY: row j holds d = 16·regs values.
            let row = unsafe { rows.as_ptr().add(j * d) };
            for (w, a) in acc.iter_mut().enumerate().take(regs) {
                *a = _mm512_fmadd_ps(pv, unsafe { _mm512_loadu_ps(row.add(16 * w)) }, *a);
            }
        }
        for (w, a) in acc.iter().enumerate().take(regs) {
            // SAFETY: 16·w + 16 ≤ d.
            unsafe {
                let o = out.as_mut_ptr().add(16 * w);
                _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), *a));
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
        let one = _mm512_set1_ps(1.0);
        for i in (0..out.len()).step_by(16) {
            let m = mask(out.len() - i);
            // SAFETY: the three slices have out.len() elements; the mask
            // keeps the accesses inside them.
            unsafe {
                let gv = _mm512_maskz_loadu_ps(m, g.as_ptr().add(i));
                let uv = _mm512_maskz_loadu_ps(m, u.as_ptr().add(i));
                let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
                let sig = _mm512_div_ps(one, _mm512_add_ps(one, e));
                let o = _mm512_mul_ps(_mm512_mul_ps(gv, sig), uv);
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::simd::test_util::Rng;

    /// Distance in units in the last place between two finite f32 of one sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn matches_f64_exp() {
        let mut rng = Rng::new(0xe8);
        let mut xs: Vec<f32> = rng.elems(4000, 30.0);
        xs.extend(rng.elems::<f32>(4000, 1.0));
        xs.extend([
            0.0, -0.0, 1e-30, -1e-30, 88.7, 88.8, -87.3, -103.0, -104.5, -200.0,
        ]);
        let want: Vec<f32> = xs.iter().map(|&x| (x as f64).exp() as f32).collect();
        let mut got = xs.clone();
        let sum = exp_shifted_sum(&mut got, 0.0);
        for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
            if w.is_infinite() {
                assert_eq!(g, w, "exp({x})");
            } else if *w < f32::MIN_POSITIVE {
                assert!(*g < 2.0 * f32::MIN_POSITIVE, "exp({x}) = {g}, want {w}");
            } else {
                assert!(ulps(*g, *w) <= 2, "exp({x}) = {g}, want {w}");
            }
        }
        let finite: f64 = got
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| v as f64)
            .sum();
        assert!(sum.is_infinite() || ((sum as f64 - finite) / finite).abs() < 1e-5);
        // The shift, NaN and the infinities.
        let mut edge = [3.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
        exp_shifted_sum(&mut edge, 1.0);
        assert!(ulps(edge[0], std::f32::consts::E.powi(2)) <= 2);
        assert!(edge[1].is_nan());
        assert_eq!(edge[2], f32::INFINITY);
        assert_eq!(edge[3], 0.0);
        assert_eq!(edge[4], 1.0);
    }

    #[test]
    fn weighted_rows_matches_f64() {
        let mut rng = Rng::new(0x3e);
        for d in [16, 48, 64, 256, 40] {
            for n in [1, 5, 33] {
                let p: Vec<f32> = rng.elems(n, 1.0);
                let rows: Vec<f32> = rng.elems(n * d, 2.0);
                let start: Vec<f32> = rng.elems(d, 1.0);
                let mut out = start.clone();
                weighted_rows(&mut out, &p, &rows);
                for c in 0..d {
                    let want = start[c] as f64
                        + (0..n)
                            .map(|j| p[j] as f64 * rows[j * d + c] as f64)
                            .sum::<f64>();
                    assert!((out[c] as f64 - want).abs() < 1e-5, "d {d} n {n} col {c}");
                }
            }
        }
    }

    #[test]
    fn swiglu_matches_scalar() {
        let mut rng = Rng::new(0x5110);
        for n in [1, 15, 16, 17, 100] {
            let g: Vec<f32> = rng.elems(n, 8.0);
            let u: Vec<f32> = rng.elems(n, 2.0);
            let mut out = vec![f32::NAN; n];
            swiglu_f32(&g, &u, &mut out);
            for i in 0..n {
                let (g, u) = (g[i] as f64, u[i] as f64);
                let want = g / (1.0 + (-g).exp()) * u;
                let tol = 4.0 * f32::EPSILON as f64 * want.abs().max(1e-30);
                assert!((out[i] as f64 - want).abs() <= tol, "{g} {u}: {}", out[i]);
            }
        }
    }
}
