//! Registry behaviour: fallbacks with typed reasons and counters, switches,
//! warmup. Tests here share the global registry, so they run one at a time.

mod kernels_common;

use kernels_common::{assert_fallback_counted, bits, fused_expected, normal, on_each_device};
use mlx_backend::kernels::{
    self, gate_qmv_silu_mul, moe_combine, registry, rms_norm, AttentionDims, FallbackReason,
    Kernel, ModelDims, MoeDims,
};
use mlx_backend::ops::{quantize, QuantSpec};
use mlx_backend::Dtype;
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn three_bit_falls_back_counted_unsupported_quantization() {
    on_each_device(|_dev| {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let (k, n) = (256, 64);
        let gate = quantize(&normal(&[n, k], Dtype::F32, 0.0, 0.05, 1), 64, 3).unwrap();
        let up = quantize(&normal(&[n, k], Dtype::F32, 0.0, 0.05, 2), 64, 3).unwrap();
        let x = normal(&[2, k], Dtype::F32, 0.0, 1.0, 3);
        let before = registry::stats(Kernel::GateQmvSiluMul);
        let got = gate_qmv_silu_mul(&x, &gate, &up).unwrap();
        assert_fallback_counted(
            Kernel::GateQmvSiluMul,
            &before,
            FallbackReason::UnsupportedQuantization,
        );
        assert_eq!(registry::stats(Kernel::GateQmvSiluMul).fused, before.fused);
        // The fallback is exactly MLX's unfused graph.
        let g = gate.matmul(&x, true).unwrap();
        let u = up.matmul(&x, true).unwrap();
        let want = g.silu().unwrap().mul(&u).unwrap();
        assert_eq!(bits(&got), bits(&want));
    });
}

#[test]
fn mixed_dtypes_fall_back_counted_unsupported_dtype() {
    on_each_device(|_dev| {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let x = normal(&[3, 128], Dtype::F32, 0.0, 1.0, 10);
        let w = normal(&[128], Dtype::F16, 1.0, 0.1, 11);
        let before = registry::stats(Kernel::RmsNorm);
        let got = rms_norm(&x, &w, 1e-5).unwrap();
        assert_fallback_counted(Kernel::RmsNorm, &before, FallbackReason::UnsupportedDtype);
        assert_eq!(bits(&got), bits(&x.rms_norm_mlx(Some(&w), 1e-5).unwrap()));
    });
}

#[test]
fn disabled_kernel_falls_back_counted_disabled() {
    on_each_device(|_dev| {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let y = normal(&[2, 4, 64], Dtype::BF16, 0.0, 1.0, 20);
        let s = normal(&[2, 4], Dtype::F32, 0.0, 1.0, 21);
        registry::set_enabled(Kernel::MoeCombine, false);
        let before = registry::stats(Kernel::MoeCombine);
        let fallback = moe_combine(&y, &s).unwrap();
        registry::set_enabled(Kernel::MoeCombine, true);
        let fused = moe_combine(&y, &s).unwrap();
        let after = registry::stats(Kernel::MoeCombine);
        if fused_expected(Kernel::MoeCombine) {
            assert_eq!(
                after.fallbacks(FallbackReason::Disabled),
                before.fallbacks(FallbackReason::Disabled) + 1
            );
            assert_eq!(after.fused, before.fused + 1);
        } else {
            // No body on this backend: both builds fall back for that, switch or not.
            let reason = FallbackReason::NoKernelForDevice;
            assert_eq!(after.fallbacks(reason), before.fallbacks(reason) + 2);
        }
        assert!(!before.enabled && after.enabled);
        assert_eq!(fallback.shape(), fused.shape());
        assert_eq!(
            bits(&fallback),
            bits(&fused),
            "fused kernel and fallback agree here"
        );
    });
}

#[test]
fn invalid_calls_count_nothing() {
    on_each_device(|_dev| {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let before = registry::snapshot();
        let y = normal(&[4, 64], Dtype::F32, 0.0, 1.0, 30);
        assert!(moe_combine(&y, &normal(&[4], Dtype::F32, 0.0, 1.0, 31)).is_err());
        assert!(rms_norm(&y, &normal(&[65], Dtype::F32, 0.0, 1.0, 32), 1e-5).is_err());
        assert_eq!(registry::snapshot(), before);
    });
}

#[test]
fn warmup_runs_every_enabled_kernel() {
    on_each_device(|_dev| {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let before = registry::snapshot();
        let report = kernels::warmup().unwrap();
        let expected: usize = Kernel::ALL
            .iter()
            .map(|&k| kernels::warmup_specs(k).len())
            .sum();
        assert_eq!(report.ran + report.skipped, expected);
        let after = registry::snapshot();
        for k in Kernel::ALL {
            // Kernels without a body on this backend are skipped.
            if registry::is_enabled(k) && fused_expected(k) {
                assert!(
                    after.get(k).fused > before.get(k).fused,
                    "{k} did not run fused"
                );
            }
        }
        let dims = ModelDims {
            hidden_size: 256,
            intermediate_size: 512,
            dtype: Dtype::BF16,
            quant: Some(QuantSpec {
                bits: 4,
                group_size: 32,
            }),
            moe: Some(MoeDims {
                num_experts: 8,
                top_k: 2,
                intermediate_size: 128,
            }),
            attention: Some(AttentionDims {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 64,
            }),
        };
        let report = kernels::warmup_for_model(&dims).unwrap();
        if Kernel::ALL.into_iter().any(fused_expected) {
            assert!(report.ran >= 5, "{report:?}");
        } else {
            // No kernel has a body on this backend: every spec is skipped.
            assert_eq!(report.ran, 0, "{report:?}");
        }
    });
}
