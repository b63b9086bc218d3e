//! Which instruction sets the CPU bodies may use on this machine: CPUID
//! probes (std caches them) and the environment switches that turn a body
//! off. Every body asks here, so the choice between them is made against
//! one answer.

/// Whether the environment variable `name` switches a CPU path off
/// (`0`, `off` or `false`); callers read it once.
pub(crate) fn switched_off(name: &str) -> bool {
    matches!(std::env::var(name).as_deref(), Ok("0" | "off" | "false"))
}

/// True when the AVX2+FMA bodies may run (std caches the CPUID probe).
#[inline]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the fused conversion kernels may run: AVX2 and FMA, plus F16C
/// for the f16 conversions (std caches the CPUID probe).
#[inline]
pub fn has_avx2_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma() && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the AVX-512 bodies may run (AVX-512F, BW and VL).
#[inline]
pub(crate) fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the AVX-512 int16-x body may run (`vpdpwssd`, AVX-512 VNNI).
#[inline]
pub(crate) fn avx512_int16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512_available() && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when bf16 x may meet 4-bit W through `vdpbf16ps`
/// ([`super::prepare::Bf16Rows`]): AVX-512 BF16 runs and
/// `MLX_BACKEND_BF16_DOT` is not `0`/`off`/`false` (read once).
pub(crate) fn avx512_bf16_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            avx512_available()
                && is_x86_feature_detected!("avx512bf16")
                && !switched_off("MLX_BACKEND_BF16_DOT")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// True when the AVX2 blocked bodies may run (AVX2, FMA and F16C).
#[inline]
pub(crate) fn avx2_available() -> bool {
    has_avx2_f16c()
}

/// True when int16-class x in 8 lanes may take `vpmaddwd`: AVX2 runs and
/// `MLX_BACKEND_INT16_AVX2` is not `0`/`off`/`false` (read once; off,
/// int16-class x computes exactly on CPUs without AVX-512). Where AVX-512
/// runs, x is prepared in 16 lanes and this body is not used.
pub(crate) fn avx2_int16_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| avx2_available() && !switched_off("MLX_BACKEND_INT16_AVX2"))
}
