//! `MLX_BACKEND_KERNELS` is read once, before the registry is first used.

mod kernels_common;

use kernels_common::normal;
use mlx_backend::kernels::{moe_combine, registry, rms_norm, FallbackReason, Kernel};
use mlx_backend::Dtype;

#[test]
fn env_var_switches_kernels() {
    std::env::set_var(registry::ENV_VAR, "rms_norm,-moe_combine");
    assert!(registry::is_enabled(Kernel::RmsNorm));
    assert!(!registry::is_enabled(Kernel::MoeCombine));
    let y = normal(&[1, 2, 32], Dtype::F32, 0.0, 1.0, 1);
    let s = normal(&[1, 2], Dtype::F32, 0.0, 1.0, 2);
    moe_combine(&y, &s).unwrap().eval().unwrap();
    assert_eq!(
        registry::stats(Kernel::MoeCombine).fallbacks(FallbackReason::Disabled),
        1
    );
    let x = normal(&[2, 32], Dtype::F32, 0.0, 1.0, 3);
    let w = normal(&[32], Dtype::F32, 1.0, 0.1, 4);
    rms_norm(&x, &w, 1e-5).unwrap().eval().unwrap();
    assert_eq!(registry::stats(Kernel::RmsNorm).fused, 1);
    // Reading it again changes nothing.
    std::env::set_var(registry::ENV_VAR, "moe_combine");
    assert!(!registry::is_enabled(Kernel::MoeCombine));
}
