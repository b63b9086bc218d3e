//! Sixteen lanes at a time (AVX-512), or eight (AVX2 + FMA), for attention
//! and the gate kernels:
//! - `exp`, for softmax and SiLU, where a scalar libm `expf` per value was
//!   a tenth of a 512-token prefill: within 2 ulp of the exact value
//!   (`tests::matches_f64_exp`); NaN propagates, overflow gives +inf and
//!   underflow 0, as `f32::exp`;
//! - the probability-weighted sum of value rows of one query.
//!
//! Without either the scalar forms run.

/// `x[i] = exp(x[i] - shift)`; returns the sum of the new values (the
/// softmax denominator when `shift` is the row's maximum).
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::isa::avx512_available() {
        // SAFETY: AVX-512F was detected.
        return unsafe { x86::exp_shifted_sum(x, shift) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::isa::has_avx2_fma() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { avx2::exp_shifted_sum(x, shift) };
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
    if super::isa::avx512_available() {
        // SAFETY: AVX-512F was detected; n bounds all three slices.
        return unsafe { x86::swiglu(&g[..n], &u[..n], &mut out[..n]) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::isa::has_avx2_fma() {
        // SAFETY: AVX2 and FMA were detected; n bounds all three slices.
        return unsafe { avx2::swiglu(&g[..n], &u[..n], &mut out[..n]) };
    }
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        let sig = 1.0 / (1.0 + (-g).exp());
        *o = g * sig * u;
    }
}

/// `out += Σ_j p[j] · rows[j]` over the rows of `rows` (`[p.len(), d]`,
/// d = `out.len()`): the value side of a single query's attention, with the
/// sums in registers where AVX-512 runs and d is a multiple of 16, or AVX2
/// runs and d is a multiple of 8 (64 columns per pass).
pub fn weighted_rows(out: &mut [f32], p: &[f32], rows: &[f32]) {
    let d = out.len();
    assert!(rows.len() >= p.len() * d, "rows too short");
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16) && d <= 256 && super::isa::avx512_available() {
        // SAFETY: AVX-512F was detected; rows holds p.len() rows of d.
        return unsafe { x86::weighted_rows(out, p, rows) };
    }
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(8) && super::isa::has_avx2_fma() {
        // SAFETY: AVX2 and FMA were detected; rows holds p.len() rows of d.
        return unsafe { avx2::weighted_rows(out, p, rows) };
    }
    for (pj, row) in p.iter().zip(rows.chunks_exact(d)) {
        super::simd::axpy(out, *pj, row);
    }
}

/// The vector exp's constants, shared by its AVX-512 and AVX2 bodies.
#[cfg(target_arch = "x86_64")]
mod exp_consts {
    /// Inputs are clamped to `[MIN, MAX]`: exp overflows above 88.73 and
    /// is below the smallest denormal under −103.98.
    pub(super) const MIN: f32 = -104.0;
    pub(super) const MAX: f32 = 89.0;
    /// ln 2 in two parts, for `r = x − n·ln 2` without cancellation.
    pub(super) const LN2_HI: f32 = 0.693_145_75;
    pub(super) const LN2_LO: f32 = 1.428_606_8e-6;
    /// The degree-7 Taylor polynomial of exp, highest coefficient first.
    pub(super) const TAYLOR: [f32; 8] = [
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
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
        use super::exp_consts::*;
        // max/min return their second operand for NaN, so NaN passes.
        let x = _mm512_min_ps(_mm512_set1_ps(MAX), _mm512_max_ps(_mm512_set1_ps(MIN), x));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(TAYLOR[0]);
        for c in &TAYLOR[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
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

/// The AVX2 + FMA bodies: the AVX-512 ones on 8 lanes. Without
/// `vscalefps`, 2^n is applied as two exact multiplications by normal
/// powers of two (`n` split in halves), so overflow and underflow round
/// once, as there.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `2^n` for integral `n` in [-75, 64], as f32 bits.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn pow2(n: __m256i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            n,
            _mm256_set1_epi32(127),
        )))
    }

    /// exp of 8 lanes, as `super::x86::exp16`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp8(x: __m256) -> __m256 {
        use super::exp_consts::*;
        // max/min return their second operand for NaN, so NaN passes.
        let x = _mm256_min_ps(_mm256_set1_ps(MAX), _mm256_max_ps(_mm256_set1_ps(MIN), x));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(TAYLOR[0]);
        for c in &TAYLOR[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        // n in [-150, 129]: two halves, each a normal power of two.
        let ni = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(n2))
    }

    /// Up to 8 values from `src` (zeros above), and a store of as many.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn load(src: &[f32]) -> __m256 {
        let mut v = [0.0f32; 8];
        let n = src.len().min(8);
        v[..n].copy_from_slice(&src[..n]);
        // SAFETY: 8 values in the array.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn store(dst: &mut [f32], v: __m256) {
        let mut a = [0.0f32; 8];
        // SAFETY: 8 values into the array.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
        let n = dst.len().min(8);
        dst[..n].copy_from_slice(&a[..n]);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
        let s = _mm256_set1_ps(shift);
        let mut sum = _mm256_setzero_ps();
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: 8 values.
            unsafe {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), s));
                _mm256_storeu_ps(c.as_mut_ptr(), e);
                sum = _mm256_add_ps(sum, e);
            }
        }
        let tail = chunks.into_remainder();
        let mut total = crate::kernels::cpu::simd::avx2::hsum(sum);
        if !tail.is_empty() {
            let e = exp8(_mm256_sub_ps(load(tail), s));
            store(tail, e);
            total += tail.iter().sum::<f32>();
        }
        total
    }

    /// [`super::weighted_rows`]: 64 columns (8 registers of sums) per pass
    /// over the rows, d a multiple of 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_rows(out: &mut [f32], p: &[f32], rows: &[f32]) {
        let d = out.len();
        for c0 in (0..d).step_by(64) {
            let regs = (d - c0).min(64) / 8;
            let mut acc = [_mm256_setzero_ps(); 8];
            for (j, &pj) in p.iter().enumerate() {
                let pv = _mm256_set1_ps(pj);
                // SAFETY: row j holds d values; c0 + 8·regs ≤ d.
                let row = unsafe { rows.as_ptr().add(j * d + c0) };
                for (w, a) in acc.iter_mut().enumerate().take(regs) {
                    *a = _mm256_fmadd_ps(pv, unsafe { _mm256_loadu_ps(row.add(8 * w)) }, *a);
                }
            }
            for (w, a) in acc.iter().enumerate().take(regs) {
                // SAFETY: c0 + 8·w + 8 ≤ d.
                unsafe {
                    let o = out.as_mut_ptr().add(c0 + 8 * w);
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), *a));
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
        let one = _mm256_set1_ps(1.0);
        let f = |gv: __m256, uv: __m256| {
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            let sig = _mm256_div_ps(one, _mm256_add_ps(one, e));
            _mm256_mul_ps(_mm256_mul_ps(gv, sig), uv)
        };
        let n = out.len();
        let whole = n / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 ≤ n, the length of all three slices.
            unsafe {
                let o = f(
                    _mm256_loadu_ps(g.as_ptr().add(i)),
                    _mm256_loadu_ps(u.as_ptr().add(i)),
                );
                _mm256_storeu_ps(out.as_mut_ptr().add(i), o);
            }
        }
        if whole < n {
            store(&mut out[whole..], f(load(&g[whole..]), load(&u[whole..])));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::Rng;

    /// Distance in units in the last place between two finite f32 of one sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// `exp_shifted_sum` as dispatched, and the AVX2 body on its own where
    /// it runs (an AVX-512 machine dispatches past it).
    fn exp_bodies() -> Vec<fn(&mut [f32], f32) -> f32> {
        let mut bodies: Vec<fn(&mut [f32], f32) -> f32> = vec![exp_shifted_sum];
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::cpu::isa::has_avx2_fma() {
            // SAFETY: AVX2 and FMA were detected.
            bodies.push(|x, s| unsafe { avx2::exp_shifted_sum(x, s) });
        }
        bodies
    }

    #[test]
    fn matches_f64_exp() {
        for exp_shifted_sum in exp_bodies() {
            exp_case(exp_shifted_sum);
        }
    }

    fn exp_case(exp_shifted_sum: fn(&mut [f32], f32) -> f32) {
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
        // Ten values: a short tail after a whole vector of eight.
        let mut edge = [
            3.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0,
            0.5,
            0.5,
            0.5,
            0.5,
            f32::NAN,
        ];
        exp_shifted_sum(&mut edge, 1.0);
        assert!(edge[9].is_nan());
        assert!(ulps(edge[0], std::f32::consts::E.powi(2)) <= 2);
        assert!(edge[1].is_nan());
        assert_eq!(edge[2], f32::INFINITY);
        assert_eq!(edge[3], 0.0);
        assert_eq!(edge[4], 1.0);
    }

    #[test]
    fn weighted_rows_matches_f64() {
        type Body = fn(&mut [f32], &[f32], &[f32]);
        let mut bodies: Vec<Body> = vec![weighted_rows];
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::cpu::isa::has_avx2_fma() {
            // SAFETY (when d is a multiple of 8, checked below): AVX2 and FMA were detected.
            bodies.push(|o, p, r| unsafe { avx2::weighted_rows(o, p, r) });
        }
        let mut rng = Rng::new(0x3e);
        for (b, weighted_rows) in bodies.into_iter().enumerate() {
            for d in [16usize, 48, 64, 256, 40, 136, 8] {
                if b > 0 && !d.is_multiple_of(8) {
                    continue;
                }
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
    }

    #[test]
    fn swiglu_matches_scalar() {
        type Body = fn(&[f32], &[f32], &mut [f32]);
        let mut bodies: Vec<Body> = vec![swiglu_f32];
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::cpu::isa::has_avx2_fma() {
            // SAFETY: AVX2 and FMA were detected; the slices have one length.
            bodies.push(|g, u, o| unsafe { avx2::swiglu(g, u, o) });
        }
        let mut rng = Rng::new(0x5110);
        for swiglu_f32 in bodies {
            for n in [1, 7, 8, 9, 15, 16, 17, 100] {
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
}
