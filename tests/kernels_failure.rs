//! A kernel failure is reported by the evaluation that hit it and then
//! remembered: later builds use the fallback and give its exact result,
//! until the failure is cleared. (One test: the failure is process-wide.)

mod kernels_common;

use kernels_common::{bits, normal, on_cpu};
use mlx_backend::kernels::{registry, rms_norm, test_hooks, FallbackReason, Kernel};
use mlx_backend::Dtype;

#[test]
fn forced_failure_errors_once_then_falls_back_exactly() {
    // CPU only: a forced failure is honoured by the CPU body only.
    on_cpu(|| {
        let x = normal(&[7, 512], Dtype::BF16, 0.0, 1.0, 1);
        let w = normal(&[512], Dtype::BF16, 1.0, 0.1, 2);
        let fallback = x.rms_norm_mlx(Some(&w), 1e-5).unwrap();

        test_hooks::force_failure(Kernel::RmsNorm, true);
        let first = rms_norm(&x, &w, 1e-5).unwrap();
        let err = first.eval().unwrap_err();
        assert!(err.message.contains("rms_norm"), "{err}");
        assert!(registry::has_failed(Kernel::RmsNorm));
        let failure = registry::last_failure().unwrap();
        assert_eq!(failure.kernel, Kernel::RmsNorm);

        let before = registry::stats(Kernel::RmsNorm).fallbacks(FallbackReason::PreviouslyFailed);
        let second = rms_norm(&x, &w, 1e-5).unwrap();
        assert_eq!(
            registry::stats(Kernel::RmsNorm).fallbacks(FallbackReason::PreviouslyFailed),
            before + 1
        );
        assert_eq!(bits(&second), bits(&fallback));
        // Other kernels are unaffected.
        assert!(!registry::has_failed(Kernel::MoeCombine));

        // Once the failure is forgotten, builds use the body again.
        test_hooks::clear_failure(Kernel::RmsNorm);
        assert!(!registry::has_failed(Kernel::RmsNorm));
        let fused_before = registry::stats(Kernel::RmsNorm).fused;
        let third = rms_norm(&x, &w, 1e-5).unwrap();
        third.eval().unwrap();
        assert_eq!(registry::stats(Kernel::RmsNorm).fused, fused_before + 1);
    });
}
