//! The row-at-a-time quantized bodies: two weight rows against one x row
//! (AVX2, or scalar), a row dequantized to f32, and the biases' term; they
//! serve where no blocked body runs and for shapes the blocked bodies leave.

use super::layout::{Layout, QRow};
use super::simd::Element;

/// Writes transposed `tmp` (`[n][m]`) into rows `dst_row(r)` of `out` (`[.., n]`).
pub(crate) fn scatter_rows<T: Element>(
    tmp: &[T],
    out: &mut [T],
    m: usize,
    n: usize,
    dst_row: impl Fn(usize) -> usize,
) {
    for (j, col) in tmp.chunks_exact(m).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            out[dst_row(r) * n + j] = v;
        }
    }
}

/// `(Σ scale·(x·q))` of two rows with one x (biases excluded, see [`bias_term`]).
pub(crate) fn qdot2_scaled<T: Element>(
    g: &QRow<T>,
    u: &QRow<T>,
    xp: &[f32],
    lay: &Layout,
    avx: bool,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: `avx` comes from runtime detection of AVX2, FMA and F16C.
        return unsafe {
            if lay.bits == 4 {
                x86::qdot2::<T, 4>(g, u, xp, lay)
            } else {
                x86::qdot2::<T, 8>(g, u, xp, lay)
            }
        };
    }
    let _ = avx;
    (qdot_scalar(g, xp, lay, 0), qdot_scalar(u, xp, lay, 0))
}

/// `Σ bias · (sum of x over the group)`: the bias part of a row's dot product.
/// `avx`: eight groups at a time (F16C widens f16 biases).
pub(crate) fn bias_term<T: Element>(biases: &[T], sums: &[f32], avx: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: `avx` comes from runtime detection of AVX2, FMA and F16C.
        return unsafe { x86::bias_term(biases, sums) };
    }
    let _ = avx;
    biases.iter().zip(sums).map(|(b, s)| b.to_f32() * s).sum()
}

/// `Σ scale * (x·q)` over the blocks from `first_block` on (no bias).
fn qdot_scalar<T: Element>(row: &QRow<T>, xp: &[f32], lay: &Layout, first_block: usize) -> f32 {
    let (vpw, mask, bits) = (lay.vals_per_word, lay.mask(), lay.bits as usize);
    let words = &row.w[first_block * 8..];
    let xs = &xp[first_block * 8 * vpw..];
    let mut acc = 0.0f32;
    for (b, (wb, xb)) in words.chunks(8).zip(xs.chunks(8 * vpw)).enumerate() {
        let lanes = wb.len();
        for (j, &word) in wb.iter().enumerate() {
            let mut d = 0.0f32;
            for v in 0..vpw {
                d += xb[v * lanes + j] * ((word >> (bits * v)) & mask) as f32;
            }
            let group = lay.group_of_word((first_block + b) * 8 + j);
            acc += row.scales[group].to_f32() * d;
        }
    }
    acc
}

/// Dequantizes one weight row to f32 in block order.
pub(crate) fn dequant<T: Element>(row: &QRow<T>, lay: &Layout, dst: &mut [f32], avx: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: `avx` comes from runtime detection of AVX2, FMA and F16C.
        return unsafe {
            if lay.bits == 4 {
                x86::dequant::<T, 4>(row, lay, dst)
            } else {
                x86::dequant::<T, 8>(row, lay, dst)
            }
        };
    }
    let _ = avx;
    dequant_scalar(row, lay, 0, dst);
}

fn dequant_scalar<T: Element>(row: &QRow<T>, lay: &Layout, first_block: usize, dst: &mut [f32]) {
    let (vpw, mask, bits) = (lay.vals_per_word, lay.mask(), lay.bits as usize);
    let words = &row.w[first_block * 8..];
    let out = &mut dst[first_block * 8 * vpw..];
    for (b, (wb, ob)) in words.chunks(8).zip(out.chunks_mut(8 * vpw)).enumerate() {
        let lanes = wb.len();
        for (j, &word) in wb.iter().enumerate() {
            let group = lay.group_of_word((first_block + b) * 8 + j);
            let (s, z) = (row.scales[group].to_f32(), row.biases[group].to_f32());
            for v in 0..vpw {
                ob[v * lanes + j] = s * ((word >> (bits * v)) & mask) as f32 + z;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{dequant_scalar, qdot_scalar, Layout, QRow};
    use crate::kernels::cpu::simd::{avx2::hsum, Element};
    use std::arch::x86_64::*;

    /// Per-lane group parameter for block `b`: a block of 8 words spans at
    /// most two groups (4-bit, group 32), split between lanes 3 and 4.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn lane_params<T: Element>(params: &[T], lay: &Layout, b: usize) -> __m256 {
        let (g0, g1) = (lay.group_of_word(b * 8), lay.group_of_word(b * 8 + 7));
        if g0 == g1 {
            // SAFETY: this function's target features include F16C.
            _mm256_set1_ps(unsafe { T::widen1(params[g0]) })
        } else {
            // A block spans at most two groups: g1 = g0 + 1.
            let pair = &params[g0..g0 + 2];
            // SAFETY: `pair` holds 2 elements; the target features include F16C.
            let v = unsafe { T::widen2(pair.as_ptr()) };
            let idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), idx)
        }
    }

    /// [`super::bias_term`], eight groups per FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn bias_term<T: Element>(biases: &[T], sums: &[f32]) -> f32 {
        let n = biases.len().min(sums.len());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` bounds both loads.
            acc = unsafe {
                _mm256_fmadd_ps(
                    T::load8(biases.as_ptr().add(i)),
                    _mm256_loadu_ps(sums.as_ptr().add(i)),
                    acc,
                )
            };
            i += 8;
        }
        let mut total = hsum(acc);
        for (b, s) in biases[i..n].iter().zip(&sums[i..n]) {
            // SAFETY: this function's target features include F16C.
            total += unsafe { T::widen1(*b) } * s;
        }
        total
    }

    /// Unpacked value `v` of each of the 8 words, as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn unpack<const BITS: u32>(w: __m256i, v: usize) -> __m256 {
        let shift = _mm256_set1_epi32((BITS as usize * v) as i32);
        let mask = _mm256_set1_epi32(((1u32 << BITS) - 1) as i32);
        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, shift), mask))
    }

    /// # Safety
    /// Needs AVX2, FMA and F16C; `xp` must hold `lay.k` values and rows `lay.words_per_row` words.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn qdot2<T: Element, const BITS: u32>(
        g: &QRow<T>,
        u: &QRow<T>,
        xp: &[f32],
        lay: &Layout,
    ) -> (f32, f32) {
        let vpw = (32 / BITS) as usize;
        let full = lay.words_per_row / 8;
        assert!(g.w.len() >= full * 8 && u.w.len() >= full * 8 && xp.len() >= full * 8 * vpw);
        let (mut acc_g, mut acc_u) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..full {
            // SAFETY: the assert above bounds every block's loads.
            let (wg, wu, xb) = unsafe {
                (
                    _mm256_loadu_si256(g.w.as_ptr().add(b * 8).cast()),
                    _mm256_loadu_si256(u.w.as_ptr().add(b * 8).cast()),
                    xp.as_ptr().add(b * 8 * vpw),
                )
            };
            // Two partial sums per projection hide FMA latency.
            let mut pg = [_mm256_setzero_ps(); 2];
            let mut pu = [_mm256_setzero_ps(); 2];
            for v in 0..vpw {
                // SAFETY: v < vpw keeps the load inside this block of xp.
                let x = unsafe { _mm256_loadu_ps(xb.add(8 * v)) };
                pg[v & 1] = _mm256_fmadd_ps(unpack::<BITS>(wg, v), x, pg[v & 1]);
                pu[v & 1] = _mm256_fmadd_ps(unpack::<BITS>(wu, v), x, pu[v & 1]);
            }
            let sg = lane_params(g.scales, lay, b);
            let su = lane_params(u.scales, lay, b);
            acc_g = _mm256_fmadd_ps(_mm256_add_ps(pg[0], pg[1]), sg, acc_g);
            acc_u = _mm256_fmadd_ps(_mm256_add_ps(pu[0], pu[1]), su, acc_u);
        }
        (
            hsum(acc_g) + qdot_scalar(g, xp, lay, full),
            hsum(acc_u) + qdot_scalar(u, xp, lay, full),
        )
    }

    /// # Safety
    /// Needs AVX2, FMA and F16C; `dst` must hold `lay.k` values and the row `lay.words_per_row` words.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dequant<T: Element, const BITS: u32>(
        row: &QRow<T>,
        lay: &Layout,
        dst: &mut [f32],
    ) {
        let vpw = (32 / BITS) as usize;
        let full = lay.words_per_row / 8;
        assert!(row.w.len() >= full * 8 && dst.len() >= full * 8 * vpw);
        for b in 0..full {
            // SAFETY: the assert above bounds the load.
            let w = unsafe { _mm256_loadu_si256(row.w.as_ptr().add(b * 8).cast()) };
            let s = lane_params(row.scales, lay, b);
            let z = lane_params(row.biases, lay, b);
            for v in 0..vpw {
                let val = _mm256_fmadd_ps(unpack::<BITS>(w, v), s, z);
                // SAFETY: the assert above bounds the store.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add((b * vpw + v) * 8), val) };
            }
        }
        dequant_scalar(row, lay, full, dst);
    }
}
