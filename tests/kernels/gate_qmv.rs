//! gate-QMV-SiLU-mul against MLX's quantized_matmul / gather_qmm + silu + multiply.

use crate::kernels_common::{
    cuda_qmv_limit, eval_or_note_mlx_failure, indices, norm_rel_err, normal, on_cpu,
    on_each_device, quantized_weights as weights, upcast, Tally,
};
use mlx_backend::kernels::{gate_qmv_silu_mul, gather_gate_qmv_silu_mul, Kernel};
use mlx_backend::ops::Quantized;
use mlx_backend::{Array, Dtype};

fn tolerance(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::BF16 => 2e-2,
        Dtype::F16 => 5e-3,
        _ => 1e-4,
    }
}

/// MLX's ops run in f32 on the f32-upcast inputs (identical quantized
/// values): the higher-precision reference. MLX's CPU quantized matmul in
/// bf16 rounds partial sums to bf16, so its bf16 result is not a reference.
fn f32_reference(x: &Array, gate: &Quantized, up: &Quantized) -> Array {
    dense_reference(&x.astype(Dtype::F32).unwrap(), &upcast(gate), &upcast(up))
}

fn dense_reference(x: &Array, gate: &Quantized, up: &Quantized) -> Array {
    let g = gate.matmul(x, true).unwrap();
    let u = up.matmul(x, true).unwrap();
    g.silu().unwrap().mul(&u).unwrap()
}

fn indexed_reference(x: &Array, idx: &Array, gate: &Quantized, up: &Quantized) -> Array {
    let n = x.ndim() as i32;
    let xe = x.expand_dims(&[n - 1, n]).unwrap();
    let proj = |q: &Quantized| {
        q.gather_matmul(&xe, None, Some(idx), true, false)
            .unwrap()
            .squeeze(&[-2])
            .unwrap()
    };
    proj(gate).silu().unwrap().mul(&proj(up)).unwrap()
}

// One test per activation dtype: each is a process of its own on the GPU
// harness, where MLX compiles its fallbacks' kernels on first use.
#[test]
fn dense_matches_quantized_matmul_f32() {
    dense_matches_quantized_matmul(Dtype::F32, 1000);
}

#[test]
fn dense_matches_quantized_matmul_f16() {
    dense_matches_quantized_matmul(Dtype::F16, 2000);
}

#[test]
fn dense_matches_quantized_matmul_bf16() {
    dense_matches_quantized_matmul(Dtype::BF16, 3000);
}

fn dense_matches_quantized_matmul(dtype: Dtype, first_seed: u64) {
    on_each_device(|_dev| {
        let mut tally = Tally::new(Kernel::GateQmvSiluMul);
        let mut seed = first_seed;
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                for (lead, k, n) in [
                    (vec![1], 256, 96),
                    (vec![33], 384, 72),
                    (vec![2, 3], 128, 40),
                ] {
                    seed += 3;
                    let gate = weights(&[], n, k, dtype, bits, group, seed);
                    let up = weights(&[], n, k, dtype, bits, group, seed + 1);
                    let shape: Vec<i32> = lead.iter().copied().chain([k]).collect();
                    let x = normal(&shape, dtype, 0.0, 1.0, seed + 2);
                    let got = gate_qmv_silu_mul(&x, &gate, &up).unwrap();
                    let limit = cuda_qmv_limit(&x, group);
                    tally.record(limit);
                    let case = format!("{dtype} bits {bits} group {group} x {shape:?}");
                    if !eval_or_note_mlx_failure(Kernel::GateQmvSiluMul, &got, limit, &case) {
                        continue;
                    }
                    // The reference on the CPU (MLX's own CUDA qmm rejects some shapes).
                    let want = on_cpu(|| f32_reference(&x, &gate, &up));
                    assert_eq!(got.shape(), want.shape());
                    assert_eq!(got.dtype(), dtype);
                    let err = norm_rel_err(&got, &want);
                    if std::env::var("SHOW_ERR").is_ok() {
                        let mlx = norm_rel_err(&dense_reference(&x, &gate, &up), &want);
                        eprintln!("{dtype} bits {bits} group {group} {shape:?}: kernel {err:.2e}, MLX {dtype} ops {mlx:.2e}");
                    }
                    assert!(
                        err < tolerance(dtype),
                        "{dtype} bits {bits} group {group} x {shape:?} -> {n}: {err:e}"
                    );
                }
            }
        }
        tally.check();
    });
}

#[test]
fn expert_indexed_matches_gather_qmm_f32() {
    expert_indexed_matches_gather_qmm(Dtype::F32, 5000);
}

#[test]
fn expert_indexed_matches_gather_qmm_f16() {
    expert_indexed_matches_gather_qmm(Dtype::F16, 6000);
}

#[test]
fn expert_indexed_matches_gather_qmm_bf16() {
    expert_indexed_matches_gather_qmm(Dtype::BF16, 7000);
}

fn expert_indexed_matches_gather_qmm(dtype: Dtype, first_seed: u64) {
    on_each_device(|_dev| {
        let mut tally = Tally::new(Kernel::GateQmvSiluMul);
        let mut seed = first_seed;
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                for (lead, top_k) in [(vec![1], 4), (vec![19], 2), (vec![2, 5], 3)] {
                    seed += 4;
                    let (e, n, k) = (6, 40, 256);
                    let gate = weights(&[e], n, k, dtype, bits, group, seed);
                    let up = weights(&[e], n, k, dtype, bits, group, seed + 1);
                    let xs: Vec<i32> = lead.iter().copied().chain([k]).collect();
                    let is: Vec<i32> = lead.iter().copied().chain([top_k]).collect();
                    let x = normal(&xs, dtype, 0.0, 1.0, seed + 2);
                    let idx = indices(&is, e as u32, seed + 3);
                    let got = gather_gate_qmv_silu_mul(&x, &idx, &gate, &up).unwrap();
                    let limit = cuda_qmv_limit(&x, group);
                    tally.record(limit);
                    let case = format!("{dtype} bits {bits} group {group} {xs:?} top {top_k}");
                    if !eval_or_note_mlx_failure(Kernel::GateQmvSiluMul, &got, limit, &case) {
                        continue;
                    }
                    let x32 = x.astype(Dtype::F32).unwrap();
                    let want =
                        on_cpu(|| indexed_reference(&x32, &idx, &upcast(&gate), &upcast(&up)));
                    let mut want_shape = is.clone();
                    want_shape.push(n);
                    assert_eq!(got.shape(), want_shape);
                    let err = norm_rel_err(&got, &want);
                    assert!(
                        err < tolerance(dtype),
                        "{dtype} bits {bits} group {group} {xs:?} top {top_k}: {err:e}"
                    );
                }
            }
        }
        tally.check();
    });
}

#[test]
fn views_are_made_dense() {
    on_each_device(|_dev| {
        let gate = weights(&[], 64, 256, Dtype::F32, 4, 32, 1);
        let up = weights(&[], 64, 256, Dtype::F32, 4, 32, 2);
        let x = normal(&[256, 5], Dtype::F32, 0.0, 1.0, 3)
            .transpose(&[])
            .unwrap();
        let got = gate_qmv_silu_mul(&x, &gate, &up).unwrap();
        assert!(norm_rel_err(&got, &dense_reference(&x, &gate, &up)) < 1e-4);
    });
}

#[test]
fn bad_quantization_parameters_are_op_errors() {
    on_each_device(|_dev| {
        let gate = weights(&[], 32, 128, Dtype::F32, 4, 64, 10);
        let x = normal(&[1, 128], Dtype::F32, 0.0, 1.0, 11);
        let with = |group_size: i32, bits: i32| Quantized {
            group_size,
            bits,
            ..gate.clone()
        };
        let e = gate_qmv_silu_mul(&x, &with(48, 4), &with(48, 4)).unwrap_err();
        assert!(
            e.message
                .contains("group size must be 32, 64 or 128, got 48"),
            "{e}"
        );
        let e = gate_qmv_silu_mul(&x, &with(64, 7), &with(64, 7)).unwrap_err();
        assert!(e.message.contains("bits must be one of"), "{e}");
        // Packed words that do not match K at these bits.
        let e = gate_qmv_silu_mul(&x, &with(64, 8), &with(64, 8)).unwrap_err();
        assert!(e.message.contains("packed words"), "{e}");
        let x_bad = normal(&[1, 96], Dtype::F32, 0.0, 1.0, 12);
        assert!(gate_qmv_silu_mul(&x_bad, &gate, &gate).is_err());
        let e = gate_qmv_silu_mul(&x, &gate, &with(32, 4)).unwrap_err();
        assert!(e.message.contains("share quantization"), "{e}");
        let stacked = weights(&[3], 32, 128, Dtype::F32, 4, 64, 13);
        let bad_idx = indices(&[2, 2], 3, 14);
        let e = gather_gate_qmv_silu_mul(&x, &bad_idx, &stacked, &stacked).unwrap_err();
        assert!(e.message.contains("indices must have shape"), "{e}");
    });
}
