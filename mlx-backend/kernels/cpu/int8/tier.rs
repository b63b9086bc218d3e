//! Which integer dot-product instructions the CPU offers. An [`Int8Tier`]
//! other than scalar can only be obtained from detection, so holding one is
//! the proof that its SIMD body may run.

use std::sync::OnceLock;

/// The instruction tiers, slowest first. Every tier computes the same exact
/// integer sums; only speed differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Portable code.
    Scalar,
    /// `vpmaddubsw` + `vpmaddwd` (8-bit weights split into nibbles, so the
    /// i16 pair sums cannot saturate).
    Avx2,
    /// AVX-VNNI `vpdpbusd` (VEX, 256-bit).
    AvxVnni,
    /// AVX-512 VNNI + VL `vpdpbusd` on 256-bit registers.
    Avx512Vnni,
}

/// A tier this CPU supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Int8Tier(Kind);

impl Int8Tier {
    /// The portable tier, always available.
    pub(crate) const SCALAR: Int8Tier = Int8Tier(Kind::Scalar);

    /// Every tier this CPU can run, slowest first (tests force each in turn).
    pub(crate) fn available() -> Vec<Int8Tier> {
        [Kind::Scalar, Kind::Avx2, Kind::AvxVnni, Kind::Avx512Vnni]
            .into_iter()
            .filter(|&k| supported(k))
            .map(Int8Tier)
            .collect()
    }

    /// The fastest tier this CPU can run (probed once).
    pub(crate) fn best() -> Int8Tier {
        static BEST: OnceLock<Int8Tier> = OnceLock::new();
        *BEST.get_or_init(|| *Int8Tier::available().last().unwrap_or(&Int8Tier::SCALAR))
    }

    pub(crate) fn kind(self) -> Kind {
        self.0
    }

    /// Whether the AVX2 + FMA + F16C helpers (bias term, scales) may run:
    /// every SIMD tier includes them.
    pub(crate) fn has_avx2(self) -> bool {
        self.0 != Kind::Scalar
    }
}

fn supported(kind: Kind) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = crate::kernels::cpu::isa::has_avx2_f16c();
        match kind {
            Kind::Scalar => true,
            Kind::Avx2 => avx2,
            Kind::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
            Kind::Avx512Vnni => {
                avx2 && is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx512vl")
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        kind == Kind::Scalar
    }
}
