//! Element conversions and f32 vector primitives shared by the kernels.
//!
//! Every primitive has an AVX2(+FMA) body picked at runtime and a portable
//! body. Primitives documented as "no FMA" round exactly like the scalar
//! code, so callers may rely on bit-exact results across both paths.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use super::isa::{has_avx2_f16c, has_avx2_fma};

/// A storage dtype; all arithmetic happens in f32.
pub trait Element: Lanes + Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;

    /// Converts `src` into `dst` (over the shorter of the two).
    fn load_f32(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

impl Element for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    fn load_f32(src: &[Self], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
    }
}

impl Element for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    // `half` uses F16C for slices when the CPU has it.
    fn load_f32(src: &[Self], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        src[..n].convert_to_f32_slice(&mut dst[..n]);
    }
}

impl Element for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn load_f32(src: &[Self], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if has_avx2_f16c() {
            // SAFETY: the required CPU features were detected above.
            return unsafe { avx2::load_f32(src, dst) };
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
use avx2::Lanes;

/// Off x86-64 there are no vector lanes: every kernel takes its portable body.
#[cfg(not(target_arch = "x86_64"))]
pub trait Lanes {}
#[cfg(not(target_arch = "x86_64"))]
impl<T> Lanes for T {}

/// Hints for the cache lines of the `bytes` bytes from `start`, in order.
/// A prefetch never faults, so the region may lie past an allocation's end.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_lines(start: *const i8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in 0..bytes.div_ceil(64) {
        // SAFETY: SSE is part of x86-64; a hint reads nothing.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(64 * line)) };
    }
}

/// `Σ f32(x[i])²`, converting on the fly (reassociated; FMA allowed).
pub fn sum_squares_of<T: Element>(x: &[T]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::sum_squares_of(x) };
    }
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            let v = c[i].to_f32();
            acc[i] += v * v;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v.to_f32().powi(2)).sum();
    acc.iter().sum::<f32>() + tail
}

/// `out[i] = T(T(f32(x[i]) · s) · f32(w[i]))`: the RMSNorm scaling, each
/// product rounded to T as MLX's separate multiplies do (exact IEEE rounding).
pub fn scale_mul_to<T: Element>(x: &[T], s: f32, w: &[T], out: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::scale_mul_to(x, s, w, out) };
    }
    for ((o, x), w) in out.iter_mut().zip(x).zip(w) {
        let n = T::from_f32(x.to_f32() * s).to_f32();
        *o = T::from_f32(n * w.to_f32());
    }
}

/// `sum[i] = T(f32(x[i]) + f32(r[i]))`, returning `Σ f32(sum[i])²`
/// (the sum exactly rounded; the squares reassociated, FMA allowed).
pub fn add_to_sum_squares<T: Element>(x: &[T], r: &[T], sum: &mut [T]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::add_to_sum_squares(x, r, sum) };
    }
    for ((o, x), r) in sum.iter_mut().zip(x).zip(r) {
        *o = T::from_f32(x.to_f32() + r.to_f32());
    }
    sum_squares_of(sum)
}

/// `out[h] = Y(Σ_k f32(y[k·hidden + h]) · f32(scores[k]))` with `hidden =
/// out.len()`, k ascending from 0.0, multiply then add (no FMA): bit-identical
/// to the scalar loop.
pub fn weighted_sum_to<Y: Element, S: Element>(y: &[Y], scores: &[S], out: &mut [Y]) {
    let hidden = out.len();
    let top_k = scores.len();
    assert!(y.len() >= top_k * hidden, "weighted_sum_to: y too short");
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the required CPU features were detected above; y holds
        // top_k rows of hidden elements (asserted).
        return unsafe { avx2::weighted_sum_to(y, scores, out) };
    }
    for (h, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (k, s) in scores.iter().enumerate() {
            acc += y[k * hidden + h].to_f32() * s.to_f32();
        }
        *o = Y::from_f32(acc);
    }
}

/// `(x·a, x·b)` reading `x` once (reassociated; FMA allowed).
pub fn dot2(x: &[f32], a: &[f32], b: &[f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::dot2(x, a, b) };
    }
    (portable::dot(x, a), portable::dot(x, b))
}

/// `[x·w[0], x·w[1], x·w[2], x·w[3]]` reading `x` once (reassociated; FMA allowed).
pub fn dot4(x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if x.len() >= 16 && super::isa::avx512_available() {
        // SAFETY: AVX-512F was detected.
        return unsafe { avx512::dot4(x, w) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::dot4(x, w) };
    }
    w.map(|w| portable::dot(x, w))
}

/// `y += a·x` elementwise (FMA allowed).
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::axpy(y, a, x) };
    }
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

mod portable {
    /// Eight independent partial sums so the loop vectorises without fast-math.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0.0f32; 8];
        let mut ca = a.chunks_exact(8);
        let mut cb = b.chunks_exact(8);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y)
            .sum();
        acc.iter().sum::<f32>() + tail
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::dot4`] 16 lanes at a time; the four sums fold together
    /// before the final horizontal add.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot4(x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
        let n = w.iter().fold(x.len(), |n, w| n.min(w.len()));
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in (0..n).step_by(16) {
            let m: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                (1 << (n - i)) - 1
            };
            // SAFETY: the mask keeps every load below n, inside all five slices.
            unsafe {
                let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
                for (a, w) in acc.iter_mut().zip(&w) {
                    *a = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, w.as_ptr().add(i)), *a);
                }
            }
        }
        // Halve the four vectors pairwise into one of four 4-lane sums.
        let fold = |a: __m512, b: __m512| {
            let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b);
            let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b);
            _mm512_add_ps(lo, hi)
        };
        // [a0+a2 a1+a3 | b0+b2 b1+b3] per 128-bit quarter, then the same for c, d.
        let ab = fold(acc[0], acc[1]);
        let cd = fold(acc[2], acc[3]);
        let abcd = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
        );
        // Quarter q now holds row q's four partial sums.
        let mut parts = [0.0f32; 16];
        // SAFETY: 16 floats.
        unsafe { _mm512_storeu_ps(parts.as_mut_ptr(), abcd) };
        std::array::from_fn(|q| parts[4 * q..4 * q + 4].iter().sum())
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::Element;
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// Eight elements of a storage dtype to and from f32 lanes. Callers
    /// must have detected AVX2, FMA and F16C.
    pub trait Lanes: Sized {
        /// Widens `p[0..8]` to f32 (exact).
        ///
        /// # Safety
        /// `p` is valid for 8 reads; the CPU has the features above.
        unsafe fn load8(p: *const Self) -> __m256;
        /// Rounds `v` to the dtype (round-to-nearest-even, as `from_f32`),
        /// stores it at `p[0..8]` and returns the stored values as f32.
        ///
        /// # Safety
        /// `p` is valid for 8 writes; the CPU has the features above.
        unsafe fn round_store8(p: *mut Self, v: __m256) -> __m256;
        /// `v` rounded to the dtype and widened back (as `to_f32(from_f32(v))`).
        ///
        /// # Safety
        /// The CPU has the features above.
        unsafe fn round8(v: __m256) -> __m256;
        /// One element widened to f32 (exact), inlined into F16C code.
        ///
        /// # Safety
        /// The CPU has the features above.
        unsafe fn widen1(v: Self) -> f32;
        /// `p[0..2]` widened to f32 in lanes 0 and 1 (lanes 2, 3 unspecified).
        ///
        /// # Safety
        /// `p` is valid for 2 reads; the CPU has the features above.
        unsafe fn widen2(p: *const Self) -> __m128;
    }

    impl Lanes for f32 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(p: *const Self) -> __m256 {
            // SAFETY: the caller guarantees 8 readable elements.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn round_store8(p: *mut Self, v: __m256) -> __m256 {
            // SAFETY: the caller guarantees 8 writable elements.
            unsafe { _mm256_storeu_ps(p, v) };
            v
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn round8(v: __m256) -> __m256 {
            v
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn widen1(v: Self) -> f32 {
            v
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn widen2(p: *const Self) -> __m128 {
            // SAFETY: the caller guarantees 2 readable elements (8 bytes).
            _mm_castpd_ps(unsafe { _mm_load_sd(p.cast()) })
        }
    }

    impl Lanes for f16 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(p: *const Self) -> __m256 {
            // SAFETY: the caller guarantees 8 readable elements (16 bytes).
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn round_store8(p: *mut Self, v: __m256) -> __m256 {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            // SAFETY: the caller guarantees 8 writable elements (16 bytes).
            unsafe { _mm_storeu_si128(p.cast(), h) };
            _mm256_cvtph_ps(h)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn round8(v: __m256) -> __m256 {
            _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn widen1(v: Self) -> f32 {
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v.to_bits() as i32)))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn widen2(p: *const Self) -> __m128 {
            // SAFETY: the caller guarantees 2 readable elements (4 bytes).
            _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
                p.cast::<i32>().read_unaligned()
            }))
        }
    }

    /// f32 lanes rounded to bf16 precision (the low 16 bits cleared), as
    /// `half::bf16::from_f32`: round-to-nearest-even by adding `0x7FFF + lsb`,
    /// overflow to infinity; NaN keeps its high bits and is made quiet.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn round_bf16_bits(v: __m256) -> __m256i {
        let x = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb);
        let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let rounded = _mm256_and_si256(_mm256_add_epi32(x, bias), high);
        let quiet = _mm256_and_si256(_mm256_or_si256(x, _mm256_set1_epi32(0x0040_0000)), high);
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        _mm256_blendv_epi8(rounded, quiet, nan)
    }

    impl Lanes for bf16 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(p: *const Self) -> __m256 {
            // SAFETY: the caller guarantees 8 readable elements (16 bytes).
            let h = unsafe { _mm_loadu_si128(p.cast()) };
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn round_store8(p: *mut Self, v: __m256) -> __m256 {
            let r = round_bf16_bits(v);
            let hi16 = _mm256_srli_epi32::<16>(r);
            let packed = _mm_packus_epi32(
                _mm256_castsi256_si128(hi16),
                _mm256_extracti128_si256::<1>(hi16),
            );
            // SAFETY: the caller guarantees 8 writable elements (16 bytes).
            unsafe { _mm_storeu_si128(p.cast(), packed) };
            _mm256_castsi256_ps(r)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn round8(v: __m256) -> __m256 {
            _mm256_castsi256_ps(round_bf16_bits(v))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn widen1(v: Self) -> f32 {
            f32::from_bits((v.to_bits() as u32) << 16)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn widen2(p: *const Self) -> __m128 {
            // SAFETY: the caller guarantees 2 readable elements (4 bytes).
            let v = _mm_cvtsi32_si128(unsafe { p.cast::<i32>().read_unaligned() });
            _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), v))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn load_f32<T: Element>(src: &[T], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let (ps, pd) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps every access inside both slices.
        unsafe {
            while i + 8 <= n {
                _mm256_storeu_ps(pd.add(i), T::load8(ps.add(i)));
                i += 8;
            }
        }
        for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = s.to_f32();
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn sum_squares_of<T: Element>(x: &[T]) -> f32 {
        let n = x.len();
        let p = x.as_ptr();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: every load reads indices < n.
        unsafe {
            while i + 32 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let v = T::load8(p.add(i + 8 * j));
                    *acc = _mm256_fmadd_ps(v, v, *acc);
                }
                i += 32;
            }
            while i + 8 <= n {
                let v = T::load8(p.add(i));
                acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
                i += 8;
            }
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let tail: f32 = x[i..].iter().map(|v| v.to_f32() * v.to_f32()).sum();
        hsum(v) + tail
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_mul_to<T: Element>(x: &[T], s: f32, w: &[T], out: &mut [T]) {
        let n = x.len().min(w.len()).min(out.len());
        let (px, pw, po) = (x.as_ptr(), w.as_ptr(), out.as_mut_ptr());
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps every access inside the three slices.
        unsafe {
            while i + 8 <= n {
                let xn = T::round8(_mm256_mul_ps(T::load8(px.add(i)), vs));
                T::round_store8(po.add(i), _mm256_mul_ps(xn, T::load8(pw.add(i))));
                i += 8;
            }
        }
        for ((o, x), w) in out[i..n].iter_mut().zip(&x[i..n]).zip(&w[i..n]) {
            let xn = T::from_f32(x.to_f32() * s).to_f32();
            *o = T::from_f32(xn * w.to_f32());
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn add_to_sum_squares<T: Element>(x: &[T], r: &[T], sum: &mut [T]) -> f32 {
        let n = x.len().min(r.len()).min(sum.len());
        let (px, pr, ps) = (x.as_ptr(), r.as_ptr(), sum.as_mut_ptr());
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps every access inside the three slices.
        unsafe {
            while i + 16 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let o = i + 8 * j;
                    let v = _mm256_add_ps(T::load8(px.add(o)), T::load8(pr.add(o)));
                    let v = T::round_store8(ps.add(o), v);
                    *acc = _mm256_fmadd_ps(v, v, *acc);
                }
                i += 16;
            }
            while i + 8 <= n {
                let v = _mm256_add_ps(T::load8(px.add(i)), T::load8(pr.add(i)));
                let v = T::round_store8(ps.add(i), v);
                acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
                i += 8;
            }
        }
        let mut tail = 0.0f32;
        for ((o, x), r) in sum[i..n].iter_mut().zip(&x[i..n]).zip(&r[i..n]) {
            *o = T::from_f32(x.to_f32() + r.to_f32());
            tail += o.to_f32() * o.to_f32();
        }
        hsum(_mm256_add_ps(acc[0], acc[1])) + tail
    }

    /// See [`super::weighted_sum_to`]; `y` must hold `scores.len()` rows of
    /// `out.len()` elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum_to<Y: Element, S: Element>(y: &[Y], scores: &[S], out: &mut [Y]) {
        let hidden = out.len();
        let (py, po) = (y.as_ptr(), out.as_mut_ptr());
        let mut h = 0;
        // SAFETY: h + 32 (or + 8) <= hidden and k < scores.len() keep every
        // read inside y (top_k rows of hidden) and every write inside out.
        unsafe {
            while h + 32 <= hidden {
                let mut acc = [_mm256_setzero_ps(); 4];
                for (k, s) in scores.iter().enumerate() {
                    let vs = _mm256_set1_ps(s.to_f32());
                    let row = py.add(k * hidden + h);
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let prod = _mm256_mul_ps(Y::load8(row.add(8 * j)), vs);
                        *acc = _mm256_add_ps(*acc, prod);
                    }
                }
                for (j, acc) in acc.iter().enumerate() {
                    Y::round_store8(po.add(h + 8 * j), *acc);
                }
                h += 32;
            }
            while h + 8 <= hidden {
                let mut acc = _mm256_setzero_ps();
                for (k, s) in scores.iter().enumerate() {
                    let prod =
                        _mm256_mul_ps(Y::load8(py.add(k * hidden + h)), _mm256_set1_ps(s.to_f32()));
                    acc = _mm256_add_ps(acc, prod);
                }
                Y::round_store8(po.add(h), acc);
                h += 8;
            }
        }
        for (i, o) in out.iter_mut().enumerate().skip(h) {
            let mut acc = 0.0f32;
            for (k, s) in scores.iter().enumerate() {
                acc += y[k * hidden + i].to_f32() * s.to_f32();
            }
            *o = Y::from_f32(acc);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot2(x: &[f32], a: &[f32], b: &[f32]) -> (f32, f32) {
        let n = x.len().min(a.len()).min(b.len());
        let (px, pa, pb) = (x.as_ptr(), a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: every load reads indices < n, within all three slices.
        unsafe {
            while i + 16 <= n {
                let x0 = _mm256_loadu_ps(px.add(i));
                let x1 = _mm256_loadu_ps(px.add(i + 8));
                acc[0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(pa.add(i)), acc[0]);
                acc[1] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(pb.add(i)), acc[1]);
                acc[2] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(pa.add(i + 8)), acc[2]);
                acc[3] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(pb.add(i + 8)), acc[3]);
                i += 16;
            }
        }
        let mut ra = hsum(_mm256_add_ps(acc[0], acc[2]));
        let mut rb = hsum(_mm256_add_ps(acc[1], acc[3]));
        for j in i..n {
            ra += x[j] * a[j];
            rb += x[j] * b[j];
        }
        (ra, rb)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY: every load and store touches indices < n, within both slices.
        unsafe {
            while i + 8 <= n {
                let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), r);
                i += 8;
            }
        }
        for j in i..n {
            y[j] += a * x[j];
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4(x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
        let n = w.iter().fold(x.len(), |n, w| n.min(w.len()));
        let px = x.as_ptr();
        let pw = w.map(|w| w.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: every load reads indices < n, within all five slices.
        unsafe {
            while i + 8 <= n {
                let xv = _mm256_loadu_ps(px.add(i));
                for (a, p) in acc.iter_mut().zip(pw) {
                    *a = _mm256_fmadd_ps(xv, _mm256_loadu_ps(p.add(i)), *a);
                }
                i += 8;
            }
        }
        let mut out = [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])];
        for (o, w) in out.iter_mut().zip(w) {
            *o += x[i..n]
                .iter()
                .zip(&w[i..n])
                .map(|(a, b)| a * b)
                .sum::<f32>();
        }
        out
    }
}

#[cfg(test)]
mod tests;
