//! quantized_matmul against MLX's quantized_matmul computed in f32 on the
//! same quantized values.

use crate::kernels_common::{
    assert_fallback_counted, cuda_qmm_limit, eval_or_note_mlx_failure, norm_rel_err, normal,
    on_cpu, on_each_device, Tally,
};
use mlx_backend::kernels::{quantized_matmul, registry, FallbackReason, Kernel};
use mlx_backend::ops::{quantize, Quantized};
use mlx_backend::{Array, Dtype};

fn tolerance(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::BF16 => 1e-2,
        Dtype::F16 => 2e-3,
        _ => 1e-5,
    }
}

fn weights(n: i32, k: i32, dtype: Dtype, bits: i32, group: i32, seed: u64) -> Quantized {
    quantize(&normal(&[n, k], dtype, 0.0, 0.05, seed), group, bits).unwrap()
}

/// MLX's quantized_matmul in f32 on the f32-upcast scales/biases and x.
fn f32_reference(x: &Array, w: &Quantized) -> Array {
    let up = Quantized {
        scales: w.scales.astype(Dtype::F32).unwrap(),
        biases: w.biases.astype(Dtype::F32).unwrap(),
        ..w.clone()
    };
    up.matmul(&x.astype(Dtype::F32).unwrap(), true).unwrap()
}

#[test]
fn matches_mlx_quantized_matmul() {
    on_each_device(|_dev| {
        let mut tally = Tally::new(Kernel::QuantizedMatmul);
        let mut seed = 2000;
        for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            for bits in [4, 8] {
                for group in [32, 64, 128] {
                    // Decode rows (≤ 4) and many rows (the CUDA body's tiled
                    // kernels): odd row and column counts, partial tiles.
                    for (lead, k, n) in [
                        (vec![1], 256, 96),
                        (vec![33], 384, 72),
                        (vec![2, 3], 128, 41),
                        (vec![1, 1, 1], 512, 7),
                        (vec![5], 128, 8),
                        (vec![7], 256, 200),
                        (vec![3, 43], 384, 130),
                        (vec![513], 256, 72),
                    ] {
                        seed += 2;
                        let w = weights(n, k, dtype, bits, group, seed);
                        let shape: Vec<i32> = lead.iter().copied().chain([k]).collect();
                        let x = normal(&shape, dtype, 0.0, 1.0, seed + 1);
                        let case = format!("{dtype} bits {bits} group {group} x {shape:?} -> {n}");
                        let got = quantized_matmul(&x, &w).unwrap();
                        let limit = cuda_qmm_limit(&x, group);
                        tally.record(limit);
                        if !eval_or_note_mlx_failure(Kernel::QuantizedMatmul, &got, limit, &case) {
                            continue;
                        }
                        // The reference on the CPU (MLX's own CUDA qmm rejects some shapes).
                        let want = on_cpu(|| f32_reference(&x, &w));
                        want.eval()
                            .unwrap_or_else(|e| panic!("{case}, the reference: {e}"));
                        assert_eq!(got.shape(), want.shape());
                        assert_eq!(got.dtype(), dtype);
                        let err = norm_rel_err(&got, &want);
                        assert!(err < tolerance(dtype), "{case}: {err:e}");
                    }
                }
            }
        }
        tally.check();
    });
}

#[test]
fn views_are_made_dense() {
    on_each_device(|_dev| {
        let w = weights(64, 256, Dtype::F32, 4, 32, 1);
        let x = normal(&[256, 5], Dtype::F32, 0.0, 1.0, 3)
            .transpose(&[])
            .unwrap();
        let got = quantized_matmul(&x, &w).unwrap();
        assert!(norm_rel_err(&got, &w.matmul(&x, true).unwrap()) < 1e-5);
    });
}

#[test]
fn bad_inputs_are_op_errors() {
    on_each_device(|_dev| {
        let w = weights(32, 128, Dtype::F32, 4, 64, 10);
        let x = normal(&[1, 128], Dtype::F32, 0.0, 1.0, 11);
        let with = |group_size: i32, bits: i32| Quantized {
            group_size,
            bits,
            ..w.clone()
        };
        let e = quantized_matmul(&x, &with(48, 4)).unwrap_err();
        assert!(
            e.message.contains("group size must be 32, 64 or 128"),
            "{e}"
        );
        assert!(e.message.starts_with("quantized_matmul"), "{e}");
        let e = quantized_matmul(&x, &with(64, 7)).unwrap_err();
        assert!(e.message.contains("bits must be one of"), "{e}");
        let e = quantized_matmul(&x, &with(64, 8)).unwrap_err();
        assert!(e.message.contains("packed words"), "{e}");
        let e = quantized_matmul(&x, &with(32, 4)).unwrap_err();
        assert!(e.message.contains("scales must have shape"), "{e}");
        let x_bad = normal(&[1, 96], Dtype::F32, 0.0, 1.0, 12);
        assert!(quantized_matmul(&x_bad, &w).is_err());
        let ints = Array::from_slice(&[1i32; 128], &[1, 128]).unwrap();
        assert!(quantized_matmul(&ints, &w).is_err());
    });
}

#[test]
fn ineligible_inputs_fall_back_counted() {
    on_each_device(|_dev| {
        let k = 256;
        let stats = || registry::stats(Kernel::QuantizedMatmul);
        // 3-bit: a valid MLX quantization the kernel does not cover.
        let w3 = weights(16, k, Dtype::F32, 3, 64, 20);
        let x = normal(&[2, k], Dtype::F32, 0.0, 1.0, 21);
        let before = stats();
        let got = quantized_matmul(&x, &w3).unwrap();
        assert_fallback_counted(
            Kernel::QuantizedMatmul,
            &before,
            FallbackReason::UnsupportedQuantization,
        );
        assert!(norm_rel_err(&got, &w3.matmul(&x, true).unwrap()) < 1e-6);
        // f32 scales with f16 x: MLX promotes to f32; the kernel does not cover it.
        let w32 = weights(16, k, Dtype::F32, 4, 64, 22);
        let x16 = x.astype(Dtype::F16).unwrap();
        let before = stats();
        let got = quantized_matmul(&x16, &w32).unwrap();
        assert_fallback_counted(
            Kernel::QuantizedMatmul,
            &before,
            FallbackReason::UnsupportedDtype,
        );
        assert_eq!(got.dtype(), Dtype::F32);
    });
}

#[test]
fn f32_x_with_half_scales_promotes_like_mlx() {
    on_each_device(|_dev| {
        for (dtype, bits) in [(Dtype::F16, 4), (Dtype::BF16, 8)] {
            let w = weights(48, 256, dtype, bits, 32, 30);
            let mut tally = Tally::new(Kernel::QuantizedMatmul);
            for rows in [1, 9] {
                let x = normal(&[rows, 256], Dtype::F32, 0.0, 1.0, 31);
                let got = quantized_matmul(&x, &w).unwrap();
                tally.record(cuda_qmm_limit(&x, 32));
                assert_eq!(got.dtype(), Dtype::F32);
                let err = norm_rel_err(&got, &f32_reference(&x, &w));
                assert!(err < 1e-5, "{dtype} rows {rows}: {err:e}");
            }
            tally.check();
        }
    });
}
