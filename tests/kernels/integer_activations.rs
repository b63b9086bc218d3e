//! The quantized kernels with integer activations (`ActivationPrecision::Int8`
//! and `Int16`) against MLX's ops in f32 on the same quantized weights:
//! within each mode's error bound, and measurably different from the exact
//! mode (the mode reaches the kernel).

use crate::kernels_common::{
    indices, norm_rel_err, normal, on_cpu, quantized_weights as weights, upcast,
};
use mlx_backend::kernels::{
    gate_qmv_silu_mul_with, gather_gate_qmv_silu_mul_with, quantized_matmul_with, registry,
    ActivationPrecision, Kernel,
};
use mlx_backend::ops::Quantized;
use mlx_backend::{Array, Dtype};

const EXACT: ActivationPrecision = ActivationPrecision::Exact;
const MODES: [ActivationPrecision; 2] = [ActivationPrecision::Int8, ActivationPrecision::Int16];

/// ‖result − f32 reference‖ / ‖reference‖. Int8: x rounds per 32-block (at
/// most d/2 = max|x|/254 per value, ~0.5% of a Gaussian x's RMS). Int16: x
/// rounds per word of W, or per group of W's quantisation from 4 x rows on
/// (`row_lanes`): at most max|x over the word or group|/65534 per value,
/// ~1e-5 of the result per word and up to ~5e-5 per 128-value group. The
/// SwiGLU product compounds two projections; bf16 output adds its rounding.
fn tolerance(mode: ActivationPrecision, dtype: Dtype, gated: bool) -> f64 {
    let base = match (mode, gated) {
        (ActivationPrecision::Int16, false) => 1e-4,
        (ActivationPrecision::Int16, true) => 2e-4,
        (_, true) => 2e-2,
        _ => 1.5e-2,
    };
    if dtype == Dtype::BF16 {
        base + 1e-2
    } else {
        base
    }
}

/// The result may not equal the exact one: a lower bound on their gap
/// (int16 in f32; in bf16 its ~1e-5 difference mostly rounds away).
fn min_gap(mode: ActivationPrecision, dtype: Dtype) -> Option<f64> {
    match (mode, dtype) {
        (ActivationPrecision::Int16, Dtype::BF16) => None,
        (ActivationPrecision::Int16, _) => Some(1e-7),
        _ => Some(1e-4),
    }
}

fn check(
    what: &str,
    mode: ActivationPrecision,
    dtype: Dtype,
    gated: bool,
    got: &Array,
    exact: &Array,
    want: &Array,
) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let tol = tolerance(mode, dtype, gated);
    let err = norm_rel_err(got, want);
    assert!(err < tol, "{what}: {mode:?} error {err:e} (bound {tol:e})");
    if let Some(min) = min_gap(mode, dtype) {
        let gap = norm_rel_err(got, exact);
        assert!(
            gap > min,
            "{what}: {mode:?} equals exact ({gap:e}): mode not applied"
        );
    }
}

#[test]
fn quantized_matmul_is_within_bound() {
    // CPU only: integer activations are a feature of the CPU body.
    on_cpu(|| {
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
                        // 64+ rows: the AMX tiles' dequantized form, where the CPU has AMX.
                        (vec![70], 256, 40),
                    ] {
                        if k % group != 0 {
                            continue;
                        }
                        seed += 2;
                        let w = weights(&[], n, k, dtype, bits, group, seed);
                        let shape: Vec<i32> = lead.iter().copied().chain([k]).collect();
                        let x = normal(&shape, dtype, 0.0, 1.0, seed + 1);
                        let exact = quantized_matmul_with(&x, &w, EXACT).unwrap();
                        let want = upcast(&w)
                            .matmul(&x.astype(Dtype::F32).unwrap(), true)
                            .unwrap();
                        let what = format!("{dtype} bits {bits} group {group} x {shape:?} -> {n}");
                        for mode in MODES {
                            let got = quantized_matmul_with(&x, &w, mode).unwrap();
                            assert_eq!(got.dtype(), dtype);
                            check(&what, mode, dtype, false, &got, &exact, &want);
                        }
                        cases += 3;
                    }
                }
            }
        }
        assert!(registry::stats(Kernel::QuantizedMatmul).fused - fused_before >= cases);
    });
}

fn swiglu_reference(x: &Array, gate: &Quantized, up: &Quantized) -> Array {
    let x = x.astype(Dtype::F32).unwrap();
    let g = upcast(gate).matmul(&x, true).unwrap();
    let u = upcast(up).matmul(&x, true).unwrap();
    g.silu().unwrap().mul(&u).unwrap()
}

#[test]
fn gate_qmv_silu_mul_is_within_bound() {
    // CPU only: integer activations are a feature of the CPU body.
    on_cpu(|| {
        let mut seed = 8000;
        for dtype in [Dtype::F32, Dtype::BF16] {
            for bits in [4, 8] {
                for group in [32, 128] {
                    for (lead, k, n) in
                        [(vec![1], 256, 96), (vec![17], 384, 40), (vec![66], 128, 24)]
                    {
                        seed += 3;
                        let gate = weights(&[], n, k, dtype, bits, group, seed);
                        let up = weights(&[], n, k, dtype, bits, group, seed + 1);
                        let shape: Vec<i32> = lead.iter().copied().chain([k]).collect();
                        let x = normal(&shape, dtype, 0.0, 1.0, seed + 2);
                        let exact = gate_qmv_silu_mul_with(&x, &gate, &up, EXACT).unwrap();
                        let want = swiglu_reference(&x, &gate, &up);
                        let what = format!("{dtype} bits {bits} group {group} x {shape:?} -> {n}");
                        for mode in MODES {
                            let got = gate_qmv_silu_mul_with(&x, &gate, &up, mode).unwrap();
                            check(&what, mode, dtype, true, &got, &exact, &want);
                        }
                    }
                }
            }
        }
    });
}

#[test]
fn gather_gate_qmv_silu_mul_is_within_bound() {
    // CPU only: integer activations are a feature of the CPU body.
    on_cpu(|| {
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
                    for mode in MODES {
                        let got =
                            gather_gate_qmv_silu_mul_with(&x, &idx, &gate, &up, mode).unwrap();
                        check(&what, mode, dtype, true, &got, &exact, &want);
                    }
                }
            }
        }
    });
}
