//! A kernel failure is reported by the evaluation that hit it and then
//! remembered: later builds use the fallback and give its exact result.
//! (One test: it permanently disables rms_norm in this process.)

mod kernels_common;

use kernels_common::{bits, normal, on_cpu};
use mlx_backend::kernels::{registry, rms_norm, FallbackReason, Kernel};
use mlx_backend::Dtype;

#[test]
fn forced_failure_errors_once_then_falls_back_exactly() {
    // CPU only: registry::force_failure is honoured by the CPU body only.
    on_cpu(|| {
        let x = normal(&[7, 512], Dtype::BF16, 0.0, 1.0, 1);
        let w = normal(&[512], Dtype::BF16, 1.0, 0.1, 2);
        let fallback = x.rms_norm_mlx(Some(&w), 1e-5).unwrap();

        registry::force_failure(Kernel::RmsNorm, true);
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
    });
}
