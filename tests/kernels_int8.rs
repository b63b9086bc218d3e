//! The quantized kernels with int8 activations (`ActivationPrecision::Int8`)
//! against MLX's ops in f32 on the same quantized weights: within the int8
//! error bound, and measurably different from the exact mode (the mode
//! reaches the kernel).

mod kernels_common;

use kernels_common::{indices, norm_rel_err, normal, quantized_weights as weights, upcast};
use mlx_backend::kernels::{
    gate_qmv_silu_mul_with, gather_gate_qmv_silu_mul_with, quantized_matmul_with, registry,
    ActivationPrecision, Kernel,
};
use mlx_backend::ops::Quantized;
use mlx_backend::{Array, Dtype};

const EXACT: ActivationPrecision = ActivationPrecision::Exact;
const INT8: ActivationPrecision = ActivationPrecision::Int8;

/// ‖int8 − f32 reference‖ / ‖reference‖: x rounds to int8 per 32-block
/// (at most d/2 = max|x|/254 per value, ~0.5% of a Gaussian x's RMS); the
/// SwiGLU product compounds two projections; bf16 output adds its rounding.
fn tolerance(dtype: Dtype, gated: bool) -> f64 {
    let base = if gated { 2e-2 } else { 1.5e-2 };
    if dtype == Dtype::BF16 {
        base + 1e-2
    } else {
        base
    }
}

/// The int8 result may not equal the exact one: a lower bound on their gap.
const MIN_GAP: f64 = 1e-4;

fn check(what: &str, int8: &Array, exact: &Array, want: &Array, tol: f64) {
    assert_eq!(int8.shape(), want.shape(), "{what}");
    let err = norm_rel_err(int8, want);
    assert!(err < tol, "{what}: int8 error {err:e} (bound {tol:e})");
    let gap = norm_rel_err(int8, exact);
    assert!(
        gap > MIN_GAP,
        "{what}: int8 equals exact ({gap:e}): mode not applied"
    );
}

#[test]
fn quantized_matmul_int8_is_within_bound() {
    let fused_before = registry::stats(Kernel::QuantizedMatmul).fused;
    let mut seed = 7000;
    let mut cases = 0;
    for dtype in [Dtype::F32, Dtype::BF16] {
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                // One row (matvec) and many (tile); k = 96 has an odd block count.
                for (lead, k, n) in [
                    (vec![1], 384, 97),
                    (vec![33], 256, 72),
                    (vec![2, 3], 96, 41),
                ] {
                    if k % group != 0 {
                        continue;
                    }
                    seed += 2;
                    let w = weights(&[], n, k, dtype, bits, group, seed);
                    let shape: Vec<i32> = lead.iter().copied().chain([k]).collect();
                    let x = normal(&shape, dtype, 0.0, 1.0, seed + 1);
                    let int8 = quantized_matmul_with(&x, &w, INT8).unwrap();
                    let exact = quantized_matmul_with(&x, &w, EXACT).unwrap();
                    let want = upcast(&w)
                        .matmul(&x.astype(Dtype::F32).unwrap(), true)
                        .unwrap();
                    assert_eq!(int8.dtype(), dtype);
                    let what = format!("{dtype} bits {bits} group {group} x {shape:?} -> {n}");
                    check(&what, &int8, &exact, &want, tolerance(dtype, false));
                    cases += 2;
                }
            }
        }
    }
    assert!(registry::stats(Kernel::QuantizedMatmul).fused - fused_before >= cases);
}

fn swiglu_reference(x: &Array, gate: &Quantized, up: &Quantized) -> Array {
    let x = x.astype(Dtype::F32).unwrap();
    let g = upcast(gate).matmul(&x, true).unwrap();
    let u = upcast(up).matmul(&x, true).unwrap();
    g.silu().unwrap().mul(&u).unwrap()
}

#[test]
fn gate_qmv_silu_mul_int8_is_within_bound() {
    let mut seed = 8000;
    for dtype in [Dtype::F32, Dtype::BF16] {
        for bits in [4, 8] {
            for group in [32, 128] {
                for (lead, k, n) in [(vec![1], 256, 96), (vec![17], 384, 40)] {
                    seed += 3;
                    let gate = weights(&[], n, k, dtype, bits, group, seed);
                    let up = weights(&[], n, k, dtype, bits, group, seed + 1);
                    let shape: Vec<i32> = lead.iter().copied().chain([k]).collect();
                    let x = normal(&shape, dtype, 0.0, 1.0, seed + 2);
                    let int8 = gate_qmv_silu_mul_with(&x, &gate, &up, INT8).unwrap();
                    let exact = gate_qmv_silu_mul_with(&x, &gate, &up, EXACT).unwrap();
                    let want = swiglu_reference(&x, &gate, &up);
                    let what = format!("{dtype} bits {bits} group {group} x {shape:?} -> {n}");
                    check(&what, &int8, &exact, &want, tolerance(dtype, true));
                }
            }
        }
    }
}

#[test]
fn gather_gate_qmv_silu_mul_int8_is_within_bound() {
    let mut seed = 9000;
    for dtype in [Dtype::F32, Dtype::BF16] {
        for bits in [4, 8] {
            for (lead, top_k) in [(vec![1], 4), (vec![19], 2)] {
                seed += 4;
                let (e, n, k, group) = (6, 40, 256, 64);
                let gate = weights(&[e], n, k, dtype, bits, group, seed);
                let up = weights(&[e], n, k, dtype, bits, group, seed + 1);
                let xs: Vec<i32> = lead.iter().copied().chain([k]).collect();
                let is: Vec<i32> = lead.iter().copied().chain([top_k]).collect();
                let x = normal(&xs, dtype, 0.0, 1.0, seed + 2);
                let idx = indices(&is, e as u32, seed + 3);
                let int8 = gather_gate_qmv_silu_mul_with(&x, &idx, &gate, &up, INT8).unwrap();
                let exact = gather_gate_qmv_silu_mul_with(&x, &idx, &gate, &up, EXACT).unwrap();
                let xe = x.astype(Dtype::F32).unwrap();
                let xe = xe
                    .expand_dims(&[xe.ndim() as i32 - 1, xe.ndim() as i32])
                    .unwrap();
                let proj = |q: &Quantized| {
                    upcast(q)
                        .gather_matmul(&xe, None, Some(&idx), true, false)
                        .unwrap()
                        .squeeze(&[-2])
                        .unwrap()
                };
                let want = proj(&gate).silu().unwrap().mul(&proj(&up)).unwrap();
                let what = format!("{dtype} bits {bits} {xs:?} top {top_k}");
                check(&what, &int8, &exact, &want, tolerance(dtype, true));
            }
        }
    }
}
