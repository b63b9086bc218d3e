//! Single-query attention of decode rows, by KV head: the query heads that
//! share one KV head (grouped-query attention) read its keys and values
//! once, and with AVX-512 and a head size of 64 or 128 the sums stay in
//! registers: per key, one load of the key for every head's dot product,
//! and one load of the value row for every head's weighted sum.
//!
//! Why: one head at a time (the portable form below) reloaded each key
//! and value row per query head, kept the value sums in memory and issued
//! its cache hints per head; a decode step of a batch of 8 spent ~17% of
//! its time there (`decoder_layer`'s attention stage, per-stage timers).

use crate::kernels::cpu::simd;
use crate::kernels::cpu::vector_math::{exp_shifted_sum, weighted_rows};

/// `out[h] = softmax(scale · q[h] · Kᵀ) · V` for the query heads
/// `queries [heads, d]` against `keys, values [S, d]` (`S ≥ 1`), into
/// `out [heads, d]`; `scores` is scratch.
pub(crate) fn attend_heads(
    queries: &[f32],
    keys: &[f32],
    values: &[f32],
    d: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let heads = queries.len() / d;
    assert!(d > 0 && queries.len() == heads * d && out.len() == heads * d);
    assert!(keys.len() == values.len() && keys.len().is_multiple_of(d) && !keys.is_empty());
    prefetch(keys, values);
    #[cfg(target_arch = "x86_64")]
    if matches!(d, 64 | 128) && crate::kernels::cpu::isa::avx512_available() {
        // Up to 4 heads of 64 (16 + 4 registers of sums and values), 2 of 128.
        let most = if d == 64 { 4 } else { 2 };
        for (q, o) in queries.chunks(most * d).zip(out.chunks_mut(most * d)) {
            // SAFETY: AVX-512F was detected; the asserts above bound the rows.
            unsafe {
                match (d, q.len() / d) {
                    (64, 4) => x86::attend::<4, 4>(q, keys, values, scale, scores, o),
                    (64, 3) => x86::attend::<4, 3>(q, keys, values, scale, scores, o),
                    (64, 2) => x86::attend::<4, 2>(q, keys, values, scale, scores, o),
                    (64, _) => x86::attend::<4, 1>(q, keys, values, scale, scores, o),
                    (_, 2) => x86::attend::<8, 2>(q, keys, values, scale, scores, o),
                    (_, _) => x86::attend::<8, 1>(q, keys, values, scale, scores, o),
                }
            }
        }
        return;
    }
    for (q, o) in queries.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        attend_one(q, keys, values, scale, scores, o);
    }
}

/// The KV rows come from L3 or memory: ask for all of them up front (a
/// hint; ~5% of the attention stage at batch 8, alternating runs).
fn prefetch(keys: &[f32], values: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..keys.len().min(values.len())).step_by(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: prefetches of addresses inside the two slices.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(keys.as_ptr().add(line).cast());
            _mm_prefetch::<_MM_HINT_T0>(values.as_ptr().add(line).cast());
        }
    }
}

/// One head: scores four keys at a time, softmax, weighted value rows.
fn attend_one(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = q.len();
    scores.clear();
    for quad in keys.chunks(4 * d) {
        // A short final group repeats its last key; the extra sums are dropped.
        let n = quad.len() / d;
        let w = [0, 1, 2, 3].map(|j| &quad[j.min(n - 1) * d..][..d]);
        let s = simd::dot4(q, w);
        scores.extend(s.iter().take(n).map(|v| scale * v));
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_shifted_sum(scores, max);
    let inv = 1.0 / sum;
    scores.iter_mut().for_each(|p| *p *= inv);
    out.iter_mut().for_each(|o| *o = 0.0);
    weighted_rows(out, scores, values);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::exp_shifted_sum;
    use std::arch::x86_64::*;

    /// `H` heads of `16·R` values against every key: the scores of key j
    /// for all heads from one load of the key, then per head the softmax
    /// weights, then the weighted value rows summed in `H·R` registers
    /// (each value row loaded once) and scaled by `1 / Σ weights`.
    #[allow(clippy::needless_range_loop)] // register arrays indexed by head and chunk
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn attend<const R: usize, const H: usize>(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scale: f32,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let d = 16 * R;
        let s = keys.len() / d;
        // SAFETY (all loads and stores): q and out hold H rows of d, keys
        // and values s rows of d, scores H·s values after the resize.
        let qv: [[__m512; R]; H] = std::array::from_fn(|h| {
            std::array::from_fn(|c| unsafe { _mm512_loadu_ps(q.as_ptr().add(h * d + 16 * c)) })
        });
        scores.clear();
        scores.resize(H * s, 0.0);
        let sp = scores.as_mut_ptr();
        for j in 0..s {
            let kv: [__m512; R] = std::array::from_fn(|c| unsafe {
                _mm512_loadu_ps(keys.as_ptr().add(j * d + 16 * c))
            });
            for h in 0..H {
                let mut acc = _mm512_mul_ps(qv[h][0], kv[0]);
                for c in 1..R {
                    acc = _mm512_fmadd_ps(qv[h][c], kv[c], acc);
                }
                unsafe { *sp.add(h * s + j) = scale * _mm512_reduce_add_ps(acc) };
            }
        }
        let mut inv = [0.0f32; H];
        for (h, inv) in inv.iter_mut().enumerate() {
            let row = &mut scores[h * s..][..s];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            *inv = 1.0 / exp_shifted_sum(row, max);
        }
        let sp = scores.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); R]; H];
        for j in 0..s {
            let vv: [__m512; R] = std::array::from_fn(|c| unsafe {
                _mm512_loadu_ps(values.as_ptr().add(j * d + 16 * c))
            });
            for h in 0..H {
                let p = _mm512_set1_ps(unsafe { *sp.add(h * s + j) });
                for c in 0..R {
                    acc[h][c] = _mm512_fmadd_ps(p, vv[c], acc[h][c]);
                }
            }
        }
        for h in 0..H {
            let iv = _mm512_set1_ps(inv[h]);
            for c in 0..R {
                unsafe {
                    _mm512_storeu_ps(
                        out.as_mut_ptr().add(h * d + 16 * c),
                        _mm512_mul_ps(acc[h][c], iv),
                    )
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::Rng;

    /// f64 softmax attention of one head.
    fn reference(q: &[f32], keys: &[f32], values: &[f32], scale: f32) -> Vec<f64> {
        let d = q.len();
        let s: Vec<f64> = keys
            .chunks_exact(d)
            .map(|k| {
                scale as f64
                    * k.iter()
                        .zip(q)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
            })
            .collect();
        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        (0..d)
            .map(|c| {
                e.iter()
                    .zip(values.chunks_exact(d))
                    .map(|(p, v)| p * v[c] as f64)
                    .sum::<f64>()
                    / sum
            })
            .collect()
    }

    /// Every register form (d 64 and 128, 1–7 heads so that the 4- and
    /// 2-head chunks leave remainders) and a head size without one (80),
    /// against f64, over key counts from 1 up.
    #[test]
    fn matches_f64_reference() {
        let mut rng = Rng::new(21);
        for d in [64, 128, 80] {
            for heads in 1..=7 {
                for s in [1, 2, 5, 17, 83] {
                    let q: Vec<f32> = rng.elems(heads * d, 1.0);
                    let keys: Vec<f32> = rng.elems(s * d, 1.0);
                    let values: Vec<f32> = rng.elems(s * d, 2.0);
                    let mut out = vec![f32::NAN; heads * d];
                    let scale = 1.0 / (d as f32).sqrt();
                    attend_heads(&q, &keys, &values, d, scale, &mut Vec::new(), &mut out);
                    for h in 0..heads {
                        let want = reference(&q[h * d..][..d], &keys, &values, scale);
                        for (c, (got, want)) in out[h * d..][..d].iter().zip(&want).enumerate() {
                            assert!(
                                (*got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "d={d} heads={heads} s={s} head {h} [{c}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
