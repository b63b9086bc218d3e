//! Test data and reference arithmetic shared by the CPU kernels' tests.

use std::any::TypeId;
use std::ops::Range;

use super::layout::{Layout, OutStrides, QView};
use super::simd::Element;

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

/// `W[r][c]` of an MLX affine matrix, in f64.
pub(crate) fn weight<P: Element>(w: &QView<P>, r: usize, c: usize) -> f64 {
    let lay = &w.lay;
    let vpw = lay.vals_per_word;
    let word = w.w[r * lay.words_per_row + c / vpw];
    let q = (word >> (lay.bits as usize * (c % vpw))) & ((1 << lay.bits) - 1);
    let g = r * lay.groups_per_row + c / lay.group_size;
    w.scales[g].to_f32() as f64 * q as f64 + w.biases[g].to_f32() as f64
}

/// A random `[n, k]` matrix (packed words, scales, biases) and `m` x rows.
#[allow(clippy::type_complexity)]
pub(crate) fn random<P: Element>(
    rng: &mut Rng,
    (m, n, k): (usize, usize, usize),
    lay: &Layout,
) -> (Vec<u32>, Vec<P>, Vec<P>, Vec<f32>) {
    let max_q = ((1u32 << lay.bits) - 1) as f32;
    let groups = n * lay.groups_per_row;
    (
        (0..n * lay.words_per_row).map(|_| rng.next_u32()).collect(),
        rng.elems(groups, 0.3 / max_q),
        rng.elems(groups, 0.15),
        rng.elems(m * k, 1.0),
    )
}

/// Runs `dot(x rows, weight rows, out, strides)` over a sub-range of
/// `x`'s rows (`[m, k]`) and of `w`'s, written transposed into a
/// poisoned buffer with a padded stride, and checks it against an f64
/// reference: within f32 rounding (1e-5 of Σ|x·W|) plus, for x rounded
/// to int16 with one scale per `rounding_unit` values, half a step
/// (`max|x over the unit| / 32767 / 2`) per value; the padding stays
/// untouched.
pub(crate) fn check_against_f64<P: Element>(
    x: &[f32],
    wv: &QView<P>,
    rounding_unit: Option<usize>,
    what: &str,
    dot: impl Fn(Range<usize>, Range<usize>, &mut [f32], OutStrides),
) {
    let (n, k) = (wv.lay.n, wv.lay.k);
    let m = x.len() / k;
    let half_step = |xi: usize, c: usize| -> f64 {
        let Some(unit) = rounding_unit else {
            return 0.0;
        };
        let values = &x[xi * k + c / unit * unit..][..unit];
        values.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64)) / 32767.0 / 2.0
    };
    let (xr, wr) = (m / 3..m, 1..n);
    let stride = xr.len() + 3;
    let mut out = vec![f32::NAN; wr.len() * stride];
    let st = OutStrides {
        x_stride: 1,
        w_stride: stride,
    };
    dot(xr.clone(), wr.clone(), &mut out, st);
    for (i, xi) in xr.clone().enumerate() {
        for (j, r) in wr.clone().enumerate() {
            let (mut want, mut mag, mut rounding) = (0.0f64, 0.0f64, 0.0f64);
            for c in 0..k {
                let wc = weight(wv, r, c);
                let t = x[xi * k + c] as f64 * wc;
                want += t;
                mag += t.abs();
                rounding += wc.abs() * half_step(xi, c);
            }
            let got = out[i + j * stride] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * mag + rounding,
                "{what} x row {xi} w row {r}: {got} vs {want}"
            );
        }
    }
    for j in 0..wr.len() {
        assert!(out[j * stride + xr.len()..][..3].iter().all(|v| v.is_nan()));
    }
}
