//! RMSNorm (optionally fused with a residual add), matching MLX rounding:
//! `astype(x32 * rsqrt(mean(x32^2) + eps), T) * w`, the weight multiply
//! being a T×T multiply (computed in f32, rounded to T). The conversions
//! happen in registers inside the row passes (AVX2/F16C when present).

use std::any::TypeId;
use std::borrow::Cow;

use half::bf16;

use crate::kernels::cpu::team::{self, SharedSlice};

use crate::kernels::cpu::{for_chunks, run_entry, typed, typed_mut, with_float, FloatKind};
use crate::kernels::registry::Kernel;

use crate::kernels::cpu::error::{check_len, KernelError};
use crate::kernels::cpu::simd::{self, Element};

use super::bf16_pairs;

/// Below this many elements threading costs more than it saves.
const PAR_MIN_ELEMS: usize = 64 * 1024;

/// `y[r,h] = T(T(x[r,h] * rsqrt(mean_h(x[r,:]^2) + eps)) * w[h])`.
///
/// Row `r` of `x` starts at `r * x_row_stride` and is contiguous; weight
/// element `h` is at `h * w_stride` (0 broadcasts one value). `out` is
/// dense `[rows, hidden]`. Each row is read twice (the second time from
/// cache) and converted in registers; nothing is allocated for a dense weight.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm<T: Element>(
    x: &[T],
    x_row_stride: usize,
    w: &[T],
    w_stride: usize,
    out: &mut [T],
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<(), KernelError> {
    check_rows("x", x.len(), x_row_stride, rows, hidden)?;
    check_len("out", out.len(), rows.checked_mul(hidden))?;
    let w = dense_weight(w, w_stride, hidden)?;
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let w = &w[..hidden];
    let row = |r: usize, out_row: &mut [T]| {
        let x_row = &x[r * x_row_stride..][..hidden];
        scale_row(x_row, simd::sum_squares_of(x_row), hidden, eps, w, out_row);
    };
    // Rows split over the CPU team when the call is large enough.
    for_chunks(
        out,
        hidden,
        rows * hidden > PAR_MIN_ELEMS,
        || (),
        |r, o, _| row(r, o),
    );
    Ok(())
}

/// `s = T(x + residual)` then `normed = rms_norm(s)`, one pass per row
/// (plus a second over `s`, from cache).
///
/// Both outputs are dense `[rows, hidden]`; the input layouts follow
/// [`rms_norm`].
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_residual<T: Element>(
    x: &[T],
    x_row_stride: usize,
    residual: &[T],
    residual_row_stride: usize,
    w: &[T],
    w_stride: usize,
    out_normed: &mut [T],
    out_sum: &mut [T],
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<(), KernelError> {
    check_rows("x", x.len(), x_row_stride, rows, hidden)?;
    check_rows(
        "residual",
        residual.len(),
        residual_row_stride,
        rows,
        hidden,
    )?;
    check_len("out_normed", out_normed.len(), rows.checked_mul(hidden))?;
    check_len("out_sum", out_sum.len(), rows.checked_mul(hidden))?;
    let w = dense_weight(w, w_stride, hidden)?;
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let w = &w[..hidden];
    let row = |r: usize, normed: &mut [T], sum: &mut [T]| {
        // The norm sees the sum as MLX's add leaves it: rounded to T.
        let ss = simd::add_to_sum_squares(
            &x[r * x_row_stride..][..hidden],
            &residual[r * residual_row_stride..][..hidden],
            sum,
        );
        scale_row(sum, ss, hidden, eps, w, normed);
    };
    if rows * hidden > PAR_MIN_ELEMS && !team::in_team() {
        let (normed, sums) = (SharedSlice::new(out_normed), SharedSlice::new(out_sum));
        team::for_units(
            rows,
            || (),
            |r, _| {
                // SAFETY: row r is this unit's alone.
                let (n, s) = unsafe {
                    (
                        normed.part(r * hidden, hidden),
                        sums.part(r * hidden, hidden),
                    )
                };
                row(r, n, s);
                Ok(())
            },
        )?;
    } else {
        for (r, (n, s)) in out_normed
            .chunks_mut(hidden)
            .zip(out_sum.chunks_mut(hidden))
            .enumerate()
        {
            row(r, n, s);
        }
    }
    Ok(())
}

/// The second pass over a row: `out = T(T(x · inv_rms) · w)`. A bf16 row
/// whose sum of squares and scale are finite (so x is finite) takes the
/// shuffle-free body, bit-identical whatever the weight holds (see
/// [`bf16_pairs::scale_mul_finite`]); the generic one is bound by its
/// widening and packing shuffles on large rows.
fn scale_row<T: Element>(x: &[T], sum_sq: f32, hidden: usize, eps: f32, w: &[T], out: &mut [T]) {
    let s = inv_rms(sum_sq, hidden, eps);
    if sum_sq.is_finite() && s.is_finite() {
        if let (Some(x), Some(w), Some(out)) = (as_bf16(x), as_bf16(w), as_bf16_mut(out)) {
            if bf16_pairs::scale_mul_finite(x, s, w, out) {
                return;
            }
        }
    }
    simd::scale_mul_to(x, s, w, out);
}

fn as_bf16<T: Element>(v: &[T]) -> Option<&[bf16]> {
    // SAFETY: T is bf16 (same type, so same layout) when the ids match.
    (TypeId::of::<T>() == TypeId::of::<bf16>())
        .then(|| unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) })
}

fn as_bf16_mut<T: Element>(v: &mut [T]) -> Option<&mut [bf16]> {
    // SAFETY: as in `as_bf16`; the borrow stays exclusive.
    (TypeId::of::<T>() == TypeId::of::<bf16>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len()) })
}

/// `1 / sqrt(mean + eps)` from a row's sum of squares.
fn inv_rms(sum_sq: f32, hidden: usize, eps: f32) -> f32 {
    1.0 / (sum_sq / hidden as f32 + eps).sqrt()
}

/// The weight as a dense row: borrowed when `w_stride == 1`, otherwise
/// gathered (a strided or broadcast weight; the C++ entry points always
/// pass dense ones).
fn dense_weight<T: Element>(
    w: &[T],
    w_stride: usize,
    hidden: usize,
) -> Result<Cow<'_, [T]>, KernelError> {
    if hidden > 0 {
        let needed = (hidden - 1)
            .checked_mul(w_stride)
            .and_then(|v| v.checked_add(1));
        match needed {
            Some(n) if n <= w.len() => {}
            _ => {
                return Err(KernelError::Shape(format!(
                    "w has {} elements, hidden {hidden} with stride {w_stride} needs more",
                    w.len()
                )));
            }
        }
    }
    Ok(if w_stride == 1 || hidden == 0 {
        Cow::Borrowed(w)
    } else {
        Cow::Owned((0..hidden).map(|h| w[h * w_stride]).collect())
    })
}

/// Checks that `rows` rows of `hidden` elements at `stride` fit in `len`.
pub(crate) fn check_rows(
    name: &str,
    len: usize,
    stride: usize,
    rows: usize,
    hidden: usize,
) -> Result<(), KernelError> {
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let needed = (rows - 1)
        .checked_mul(stride)
        .and_then(|v| v.checked_add(hidden));
    match needed {
        Some(n) if n <= len => Ok(()),
        _ => Err(KernelError::Shape(format!(
            "{name} has {len} elements, {rows} rows of {hidden} at stride {stride} need more"
        ))),
    }
}

/// Entry point from C++ (`RmsNormPrimitive`): dense `[rows, hidden]` x,
/// dense weight, dense out.
pub(crate) fn rms_norm_cpu(
    dtype: i32,
    x: &[u8],
    w: &[u8],
    out: &mut [u8],
    rows: usize,
    hidden: usize,
    eps: f32,
) -> bool {
    run_entry(Kernel::RmsNorm, || {
        with_float!(FloatKind::from_code(dtype)?, T => rms_norm::<T>(
            typed(x)?, hidden, typed(w)?, 1, typed_mut(out)?, rows, hidden, eps
        ))
    })
}

/// Entry point from C++ (`RmsNormResidualPrimitive`); all arrays dense.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rms_norm_residual_cpu(
    dtype: i32,
    x: &[u8],
    residual: &[u8],
    w: &[u8],
    normed: &mut [u8],
    sum: &mut [u8],
    rows: usize,
    hidden: usize,
    eps: f32,
) -> bool {
    run_entry(Kernel::RmsNorm, || {
        with_float!(FloatKind::from_code(dtype)?, T => rms_norm_residual::<T>(
            typed(x)?,
            hidden,
            typed(residual)?,
            hidden,
            typed(w)?,
            1,
            typed_mut(normed)?,
            typed_mut(sum)?,
            rows,
            hidden,
            eps,
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::{tol_eps, Rng};
    use half::{bf16, f16};

    fn reference<T: Element>(x: &[T], w: &[T], eps: f32) -> Vec<f32> {
        let hidden = x.len();
        let ms = x.iter().map(|v| (v.to_f32() as f64).powi(2)).sum::<f64>() / hidden as f64;
        let n = 1.0 / (ms + eps as f64).sqrt();
        x.iter()
            .zip(w)
            .map(|(v, w)| {
                let t = T::from_f32((v.to_f32() as f64 * n) as f32).to_f32() as f64;
                T::from_f32((t * w.to_f32() as f64) as f32).to_f32()
            })
            .collect()
    }

    fn assert_close<T: Element>(got: &[T], want: &[f32], what: &str) {
        let tol = 3.0 * tol_eps::<T>();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let g = g.to_f32();
            assert!(
                (g - w).abs() <= tol * w.abs() + 1e-6,
                "{what}: index {i}: got {g}, want {w}"
            );
        }
    }

    fn case<T: Element>(rows: usize, hidden: usize, w_stride: usize, rng: &mut Rng) {
        let x_stride = hidden + 7;
        let eps = 1e-5;
        let x: Vec<T> = rng.elems(rows * x_stride, 2.0);
        let w: Vec<T> = rng.elems((hidden.max(1) - 1) * w_stride + 1, 1.5);
        let w_dense: Vec<T> = (0..hidden).map(|h| w[h * w_stride]).collect();
        let mut out = vec![T::from_f32(f32::NAN); rows * hidden];
        rms_norm(&x, x_stride, &w, w_stride, &mut out, rows, hidden, eps).unwrap();
        for r in 0..rows {
            let want = reference(&x[r * x_stride..][..hidden], &w_dense, eps);
            assert_close(&out[r * hidden..][..hidden], &want, "rms_norm");
        }

        let res: Vec<T> = rng.elems(rows * hidden, 2.0);
        let mut normed = vec![T::from_f32(f32::NAN); rows * hidden];
        let mut sum = vec![T::from_f32(f32::NAN); rows * hidden];
        rms_norm_residual(
            &x,
            x_stride,
            &res,
            hidden,
            &w,
            w_stride,
            &mut normed,
            &mut sum,
            rows,
            hidden,
            eps,
        )
        .unwrap();
        for r in 0..rows {
            let s: Vec<T> = (0..hidden)
                .map(|h| T::from_f32(x[r * x_stride + h].to_f32() + res[r * hidden + h].to_f32()))
                .collect();
            for (g, w) in sum[r * hidden..][..hidden].iter().zip(&s) {
                assert_eq!(g.to_f32().to_bits(), w.to_f32().to_bits(), "residual sum");
            }
            let want = reference(&s, &w_dense, eps);
            assert_close(&normed[r * hidden..][..hidden], &want, "rms_norm_residual");
        }
    }

    fn all_cases<T: Element>() {
        let mut rng = Rng::new(0x5eed_1234);
        for hidden in [111, 500, 1024, 3072] {
            for rows in [1, 19] {
                for w_stride in [0, 1, 3] {
                    case::<T>(rows, hidden, w_stride, &mut rng);
                }
            }
        }
        // Large enough to split over the CPU team.
        case::<T>(40, 2048, 1, &mut rng);
    }

    #[test]
    fn matches_reference_f32() {
        all_cases::<f32>();
    }

    #[test]
    fn matches_reference_f16() {
        all_cases::<f16>();
    }

    #[test]
    fn matches_reference_bf16() {
        all_cases::<bf16>();
    }

    /// Rows or weights holding NaN or infinity skip the finite-only bf16
    /// body and round exactly as the generic one does.
    #[test]
    fn non_finite_bf16_matches_generic_body() {
        let mut rng = Rng::new(0xbad_f00d);
        let hidden = 40;
        for (at, bad) in [(3, f32::NAN), (17, f32::INFINITY), (39, f32::NEG_INFINITY)] {
            for in_weight in [false, true] {
                let mut x: Vec<bf16> = rng.elems(2 * hidden, 2.0);
                let mut w: Vec<bf16> = rng.elems(hidden, 1.5);
                if in_weight {
                    w[at] = bf16::from_f32(bad);
                } else {
                    x[hidden + at] = bf16::from_f32(bad);
                }
                let mut out = vec![bf16::from_f32(f32::NAN); 2 * hidden];
                rms_norm(&x, hidden, &w, 1, &mut out, 2, hidden, 1e-5).unwrap();
                for r in 0..2 {
                    let row = &x[r * hidden..][..hidden];
                    let s = inv_rms(simd::sum_squares_of(row), hidden, 1e-5);
                    let mut want = vec![bf16::ZERO; hidden];
                    simd::scale_mul_to(row, s, &w, &mut want);
                    for (g, e) in out[r * hidden..][..hidden].iter().zip(&want) {
                        assert_eq!(g.to_bits(), e.to_bits(), "bad {bad} at {at}, row {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_bad_lengths() {
        let x = vec![1.0f32; 10];
        let w = vec![1.0f32; 4];
        let mut out = vec![0.0f32; 8];
        assert!(rms_norm(&x, 4, &w, 1, &mut out, 2, 4, 1e-5).is_ok());
        assert!(rms_norm(&x, 8, &w, 1, &mut out, 2, 4, 1e-5).is_err());
        assert!(rms_norm(&x, 4, &w, 2, &mut out, 2, 4, 1e-5).is_err());
        assert!(rms_norm(&x, 4, &w, 1, &mut out[..7], 2, 4, 1e-5).is_err());
        let mut sum = vec![0.0f32; 8];
        assert!(
            rms_norm_residual(&x, 4, &x[..5], 4, &w, 1, &mut out, &mut sum, 2, 4, 1e-5).is_err()
        );
    }
}
