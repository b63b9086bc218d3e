//! Element conversions and f32 vector primitives shared by the kernels.
//!
//! Every primitive has an AVX2(+FMA) body picked at runtime and a portable
//! body. Primitives documented as "no FMA" round exactly like the scalar
//! code, so callers may rely on bit-exact results across both paths.

use half::{bf16, f16, slice::HalfFloatSliceExt};

/// A storage dtype; all arithmetic happens in f32.
pub trait Element: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;

    /// Converts `src` into `dst` (over the shorter of the two).
    fn load_f32(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    /// Rounds `src` into `dst` (over the shorter of the two).
    fn store_f32(src: &[f32], dst: &mut [Self]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(*s);
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
    fn store_f32(src: &[f32], dst: &mut [Self]) {
        Self::load_f32(src, dst);
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
    fn store_f32(src: &[f32], dst: &mut [Self]) {
        let n = src.len().min(dst.len());
        dst[..n].convert_from_f32_slice(&src[..n]);
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
}

/// True when the AVX2+FMA bodies may run (std caches the CPUID probe).
#[inline]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Sum of squares (reassociated; FMA allowed).
pub fn sum_squares(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::dot(x, x) };
    }
    portable::dot(x, x)
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
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::dot4(x, w) };
    }
    w.map(|w| portable::dot(x, w))
}

/// `x[i] *= s`, elementwise, exact IEEE rounding.
pub fn scale_in_place(x: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::scale_in_place(x, s) };
    }
    x.iter_mut().for_each(|v| *v *= s);
}

/// `x[i] *= w[i]`, elementwise, exact IEEE rounding.
pub fn mul_in_place(x: &mut [f32], w: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::mul_in_place(x, w) };
    }
    x.iter_mut().zip(w).for_each(|(v, w)| *v *= w);
}

/// `x[i] += y[i]`, elementwise, exact IEEE rounding.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::add_in_place(x, y) };
    }
    x.iter_mut().zip(y).for_each(|(v, y)| *v += y);
}

/// `acc[i] = acc[i] + y[i] * s` with a separate multiply and add (no FMA),
/// so results are bit-identical to the scalar expression.
pub fn axpy_no_fma(acc: &mut [f32], y: &[f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the required CPU features were detected above.
        return unsafe { avx2::axpy_no_fma(acc, y, s) };
    }
    acc.iter_mut().zip(y).for_each(|(a, y)| *a += y * s);
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
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: every load reads indices < n, within both slices.
        unsafe {
            while i + 32 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let o = i + 8 * j;
                    *acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(pa.add(o)),
                        _mm256_loadu_ps(pb.add(o)),
                        *acc,
                    );
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i)),
                    _mm256_loadu_ps(pb.add(i)),
                    acc[0],
                );
                i += 8;
            }
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let tail: f32 = a[i..n].iter().zip(&b[i..n]).map(|(x, y)| x * y).sum();
        hsum(v) + tail
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

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_in_place(x: &mut [f32], s: f32) {
        let n = x.len();
        let px = x.as_mut_ptr();
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps every access inside `x`.
        unsafe {
            while i + 8 <= n {
                _mm256_storeu_ps(px.add(i), _mm256_mul_ps(_mm256_loadu_ps(px.add(i)), vs));
                i += 8;
            }
        }
        x[i..].iter_mut().for_each(|v| *v *= s);
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mul_in_place(x: &mut [f32], w: &[f32]) {
        let n = x.len().min(w.len());
        let (px, pw) = (x.as_mut_ptr(), w.as_ptr());
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps every access inside both slices.
        unsafe {
            while i + 8 <= n {
                let r = _mm256_mul_ps(_mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(pw.add(i)));
                _mm256_storeu_ps(px.add(i), r);
                i += 8;
            }
        }
        x[i..n].iter_mut().zip(&w[i..n]).for_each(|(v, w)| *v *= w);
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn add_in_place(x: &mut [f32], y: &[f32]) {
        let n = x.len().min(y.len());
        let (px, py) = (x.as_mut_ptr(), y.as_ptr());
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps every access inside both slices.
        unsafe {
            while i + 8 <= n {
                let r = _mm256_add_ps(_mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(px.add(i), r);
                i += 8;
            }
        }
        x[i..n].iter_mut().zip(&y[i..n]).for_each(|(v, y)| *v += y);
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_no_fma(acc: &mut [f32], y: &[f32], s: f32) {
        let n = acc.len().min(y.len());
        let (pa, py) = (acc.as_mut_ptr(), y.as_ptr());
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps every access inside both slices.
        unsafe {
            while i + 8 <= n {
                let prod = _mm256_mul_ps(_mm256_loadu_ps(py.add(i)), vs);
                _mm256_storeu_ps(pa.add(i), _mm256_add_ps(_mm256_loadu_ps(pa.add(i)), prod));
                i += 8;
            }
        }
        acc[i..n]
            .iter_mut()
            .zip(&y[i..n])
            .for_each(|(a, y)| *a += y * s);
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::Element;
    use std::any::TypeId;

    /// xorshift64*: deterministic, dependency-free test data.
    pub struct Rng(u64);

    impl Rng {
        pub fn new(seed: u64) -> Self {
            Rng(seed | 1)
        }
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub fn next_u32(&mut self) -> u32 {
            (self.next_u64() >> 32) as u32
        }
        /// Uniform in `[-amp, amp]`, never zero once rounded to T.
        pub fn elem<T: Element>(&mut self, amp: f32) -> T {
            loop {
                let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
                let v = T::from_f32((2.0 * u - 1.0) * amp);
                if v.to_f32() != 0.0 {
                    return v;
                }
            }
        }
        pub fn elems<T: Element>(&mut self, n: usize, amp: f32) -> Vec<T> {
            (0..n).map(|_| self.elem(amp)).collect()
        }
    }

    /// Relative precision of T (one ulp at 1.0 for f16/bf16, a few for f32).
    pub fn tol_eps<T: Element>() -> f32 {
        let id = TypeId::of::<T>();
        if id == TypeId::of::<half::f16>() {
            1.0 / 1024.0
        } else if id == TypeId::of::<half::bf16>() {
            1.0 / 128.0
        } else {
            1e-6
        }
    }
}
