//! MoE combine: weighted sum of the top-k expert outputs of each token.
//! Bit-exact with a sequential f32 loop over k (multiply, then add; no FMA).
//! Each block of output lanes is accumulated over k in registers and
//! rounded once, so no f32 row buffer is needed.

use crate::kernels::cpu::{for_chunks, run_entry, typed, typed_mut, with_float, FloatKind};
use crate::kernels::registry::Kernel;

use crate::kernels::cpu::error::{check_len, KernelError};
use crate::kernels::cpu::simd::{self, Element};

/// Below this many multiply-adds threading costs more than it saves.
const PAR_MIN_WORK: usize = 64 * 1024;

/// `out[r,h] = Y(Σ_k f32(y[r,k,h]) * f32(scores[r,k]))`, k ascending from 0.0.
///
/// `y` is dense `[rows, top_k, hidden]`, `scores` `[rows, top_k]`,
/// `out` `[rows, hidden]`.
pub fn moe_combine<Y: Element, S: Element>(
    y: &[Y],
    scores: &[S],
    out: &mut [Y],
    rows: usize,
    top_k: usize,
    hidden: usize,
) -> Result<(), KernelError> {
    let per_row = top_k.checked_mul(hidden);
    check_len("y", y.len(), per_row.and_then(|p| p.checked_mul(rows)))?;
    check_len("scores", scores.len(), rows.checked_mul(top_k))?;
    check_len("out", out.len(), rows.checked_mul(hidden))?;
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let row = |r: usize, out_row: &mut [Y]| {
        simd::weighted_sum_to(
            &y[r * top_k * hidden..][..top_k * hidden],
            &scores[r * top_k..][..top_k],
            out_row,
        );
    };
    // Rows split over the CPU team when the call is large enough: its
    // helpers spin between jobs, where a thread pool wakes sleeping workers
    // (tens of µs on a call of ~100 µs).
    let split = rows * top_k * hidden > PAR_MIN_WORK;
    for_chunks(out, hidden, split, || (), |r, o, _| row(r, o));
    Ok(())
}

/// Entry point from C++ (`MoeCombinePrimitive`); all arrays dense.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_combine_cpu(
    y_dtype: i32,
    scores_dtype: i32,
    y: &[u8],
    scores: &[u8],
    out: &mut [u8],
    rows: usize,
    top_k: usize,
    hidden: usize,
) -> bool {
    run_entry(Kernel::MoeCombine, || {
        let (yk, sk) = (
            FloatKind::from_code(y_dtype)?,
            FloatKind::from_code(scores_dtype)?,
        );
        with_float!(yk, Y => with_float!(sk, S => moe_combine::<Y, S>(
            typed(y)?, typed(scores)?, typed_mut(out)?, rows, top_k, hidden
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::Rng;
    use half::{bf16, f16};

    fn case<Y: Element, S: Element>(rows: usize, top_k: usize, hidden: usize, rng: &mut Rng) {
        let y: Vec<Y> = rng.elems(rows * top_k * hidden, 4.0);
        let scores: Vec<S> = rng.elems(rows * top_k, 1.0);
        let mut out = vec![Y::from_f32(f32::NAN); rows * hidden];
        moe_combine(&y, &scores, &mut out, rows, top_k, hidden).unwrap();
        for r in 0..rows {
            for h in 0..hidden {
                let mut acc = 0.0f32;
                for k in 0..top_k {
                    let prod =
                        y[(r * top_k + k) * hidden + h].to_f32() * scores[r * top_k + k].to_f32();
                    acc += prod;
                }
                let want = Y::from_f32(acc).to_f32();
                let got = out[r * hidden + h].to_f32();
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "r={r} h={h}: {got} vs {want}"
                );
            }
        }
    }

    fn all_cases<Y: Element, S: Element>() {
        let mut rng = Rng::new(0xc0b1_17e5);
        for hidden in [1, 7, 111, 576, 4096] {
            for rows in [1, 3] {
                for top_k in [1, 2, 4, 8] {
                    case::<Y, S>(rows, top_k, hidden, &mut rng);
                }
            }
        }
        // Large enough to split over the CPU team.
        case::<Y, S>(33, 8, 2048, &mut rng);
    }

    #[test]
    fn bit_exact_f32() {
        all_cases::<f32, f32>();
    }

    #[test]
    fn bit_exact_f16_f32_scores() {
        all_cases::<f16, f32>();
    }

    #[test]
    fn bit_exact_bf16() {
        all_cases::<bf16, bf16>();
    }

    #[test]
    fn rejects_bad_lengths() {
        let y = vec![1.0f32; 2 * 3 * 4];
        let s = vec![0.5f32; 2 * 3];
        let mut out = vec![0.0f32; 2 * 4];
        assert!(moe_combine(&y, &s, &mut out, 2, 3, 4).is_ok());
        assert!(moe_combine(&y[1..], &s, &mut out, 2, 3, 4).is_err());
        assert!(moe_combine(&y, &s[1..], &mut out, 2, 3, 4).is_err());
        assert!(moe_combine(&y, &s, &mut out[1..], 2, 3, 4).is_err());
    }
}
